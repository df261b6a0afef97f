// Command nsmd is a clustered Network Status Monitor (NSM, ONC RPC program
// 100024): a drop-in replacement for rpc.statd and sm-notify whose
// registrations and sm_state are replicated by raft across nodes.
//
//	nsmd agent --config /etc/nsmd.yaml      run one node
//	nsmd dev                                 a 3-node cluster in one process on loopback
//	nsmd status --admin 127.0.0.1:8024       a node's view of the cluster
//	nsmd version                             build version, revision and Go version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nsmd/nsmd/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := rootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nsmd:", err)
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "nsmd",
		Short:         "Clustered Network Status Monitor (rpc.statd replacement)",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       readBuildInfo().String(), // nsmd --version
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(versionCmd(), agentCmd(), devCmd(), tlsCmd(), statusCmd(), membersCmd(), registrationsCmd(), clientsCmd(), transferCmd(), pingCmd(), importStatdCmd(), exportStatdCmd(), drillCmd(), benchCmd())
	return root
}

// configFlags registers one flag per config key and returns a loader that
// applies defaults < --config file < NSMD_* env < flags given.
func configFlags(fs *pflag.FlagSet) func() (config.Config, error) {
	def := config.Default()
	path := fs.String("config", "", "YAML config file (keys are the flag names with _ for -)")
	for _, f := range config.Fields() {
		v, _ := def.Get(f.Key)
		fl := fs.VarPF(&keyValue{key: f.Key, kind: f.Kind, val: v}, f.Flag(), "", f.Help+" [env "+f.Env()+"]")
		if f.Kind == "bool" {
			fl.NoOptDefVal = "true" // --witness, not --witness true
		}
	}
	return func() (config.Config, error) {
		c := config.Default()
		if *path != "" {
			if err := c.LoadFile(*path); err != nil {
				return c, err
			}
		}
		if err := c.ApplyEnv(os.LookupEnv); err != nil {
			return c, err
		}
		var errs []error
		fs.Visit(func(f *pflag.Flag) {
			if f.Name == "config" {
				return
			}
			if err := c.Set(f.Name, f.Value.String()); err != nil {
				errs = append(errs, fmt.Errorf("--%s: %w", f.Name, err))
			}
		})
		if err := errors.Join(errs...); err != nil {
			return c, err
		}
		return c, c.Validate()
	}
}

// keyValue is the flag of one config key: typed in help (bool, int,
// duration, ...) and checked as it is parsed, by the same code as the YAML
// and the environment (config.Set).
type keyValue struct {
	key, kind, val string
}

func (v *keyValue) String() string { return v.val }

func (v *keyValue) Type() string {
	if v.kind == "list" {
		return "strings"
	}
	return v.kind
}

func (v *keyValue) Set(s string) error {
	c := config.Default()
	if err := c.Set(v.key, s); err != nil {
		return err
	}
	v.val = s
	return nil
}

func newLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "debug":
		lv = slog.LevelDebug
	case "warn":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func agentCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run one nsmd node",
		Args:  cobra.NoArgs,
	}
	load := configFlags(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := load()
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		log := newLogger(os.Stderr, cfg.LogLevel, cfg.LogFormat)
		if err := checkCapabilities(cfg, log); err != nil {
			return fmt.Errorf("capabilities: %w", err)
		}
		a, err := startAgent(cfg, agentOptions{Logger: log, RaftMetrics: true})
		if err != nil {
			return err
		}
		sd, err := startSystemdNotify(a, os.Getenv, os.Getpid(), log)
		if err != nil {
			log.Warn("no systemd notifications", "err", err)
		}
		defer sd.stop()
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		for {
			select {
			case <-hup:
				if err := a.Reload(); err != nil {
					log.Error("reload on SIGHUP failed; keeping the loaded certificates and token", "err", err)
				}
				continue
			case <-cmd.Context().Done():
			}
			break
		}
		log.Info("shutting down")
		sd.stopping()
		return a.Close()
	}
	return cmd
}
