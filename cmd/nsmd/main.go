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
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nsmd/nsmd/agent"
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
		Version:       agent.Build().String(), // nsmd --version
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(versionCmd(), agentCmd(), devCmd(), tlsCmd(), statusCmd(), membersCmd(), registrationsCmd(), clientsCmd(), transferCmd(), servicesCmd(), moveCmd(), fenceCmd(), pingCmd(), importStatdCmd(), exportStatdCmd(), drillCmd(), benchCmd())
	return root
}

// configFlags registers one flag per config key and returns a loader that
// applies defaults < --config file < NSMD_* env < flags given.
func configFlags(fs *pflag.FlagSet) func() (config.Config, error) {
	def := config.Default()
	path := fs.String("config", "", "YAML config file (keys are the flag names with _ for -; also services:, the list of NFS services, which only the file can set)")
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

func agentCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run one nsmd node",
		Long: `agent runs one nsmd node. Every setting below is a flag, a key of the
--config file (the flag's name with _ for -) and an NSMD_ variable; flags
override the environment, which overrides the file.

` + config.ServicesHelp + `.`,
		Args: cobra.NoArgs,
	}
	load := configFlags(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := load()
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		log := agent.NewLogger(os.Stderr, cfg.LogLevel, cfg.LogFormat)
		if err := agent.CheckCapabilities(cfg, log); err != nil {
			return fmt.Errorf("capabilities: %w", err)
		}
		a, err := agent.Start(cfg, agent.Options{Logger: log, RaftMetrics: true})
		if err != nil {
			return err
		}
		sd, err := agent.StartSystemdNotify(a, os.Getenv, os.Getpid(), log)
		if err != nil {
			log.Warn("no systemd notifications", "err", err)
		}
		defer sd.Stop()
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
		sd.Stopping()
		return a.Close()
	}
	return cmd
}

func devCmd() *cobra.Command {
	var o agent.DevOptions
	var logStore string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local cluster in one process on 127.0.0.1..N with a loopback VIP",
		Long: `dev starts N nodes (default 3) in this process, node i on 127.0.0.i,
sharing the VIP 127.0.0.100 in loopback mode: only the current leader
answers NSM there. Data lives in a temporary directory unless --data-dir
is given (then a restart keeps registrations and raises sm_state).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.DataDir == "" {
				dir, err := os.MkdirTemp("", "nsmd-dev-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				o.DataDir = dir
			}
			if logStore != "auto" {
				o.Tune = func(c *config.Config) { c.RaftLogStore = logStore }
			}
			log := agent.NewLogger(os.Stderr, o.LogLevel, "text")
			d, err := agent.StartDev(o, agent.Options{Logger: log})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			agents := d.Agents()
			fmt.Fprintf(out, "\nnsmd dev cluster: %d nodes, data in %s\n", len(agents), o.DataDir)
			fmt.Fprintf(out, "  VIP (NSM, UDP+TCP):  %s port %d   (only the leader answers there)\n", o.VIP, o.NSMPort)
			for _, a := range agents {
				fmt.Fprintf(out, "  %s  NSM %s  admin %s\n", a.Config().NodeID, a.NSMAddr(), a.AdminURL())
			}
			adm := agents[0].AdminAddr()
			fmt.Fprintf(out, "\nTry:\n")
			fmt.Fprintf(out, "  bin/nsmd status --admin %s\n", adm)
			fmt.Fprintf(out, "  bin/nsmd members --admin %s\n", adm)
			fmt.Fprintf(out, "  bin/nsmd ping --addr %s:%d          # NULL + SM_STAT on the VIP\n", o.VIP, o.NSMPort)
			fmt.Fprintf(out, "  bin/nsmd transfer-leadership --admin <leader's admin>   # planned failover\n")
			fmt.Fprintf(out, "  bin/nsmd drill --admin %s [--kill] --report drill.html   # measured failover drill\n", adm)
			fmt.Fprintf(out, "Ctrl-C stops the cluster.\n\n")
			<-cmd.Context().Done()
			log.Info("stopping dev cluster")
			return d.Close()
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Nodes, "nodes", 3, "number of nodes")
	f.StringVar(&o.DataDir, "data-dir", "", "keep node data here (default: a temporary directory removed on exit)")
	f.StringVar(&o.VIP, "vip", "127.0.0.100", "loopback VIP")
	f.IntVar(&o.NSMPort, "nsm-port", 6620, "NSM port on every node and on the VIP")
	f.IntVar(&o.RaftPort, "raft-port", 7300, "raft port on every node")
	f.IntVar(&o.AdminPort, "admin-port", 8024, "admin API port on every node")
	f.IntVar(&o.GossipPort, "gossip-port", 7946, "gossip port on every node")
	f.StringVar(&o.LogLevel, "log-level", "info", "debug | info | warn | error")
	f.StringVar(&o.RaftProfile, "raft-profile", config.Default().RaftProfile, "raft_profile of every node: fast | default | wan (docs/running.md)")
	f.DurationVar(&o.RestartAfter, "restart-after", 2*time.Second, "start a node killed by a crash drill again after this long (0: leave it down)")
	f.StringVar(&logStore, "raft-log-store", "auto", "auto | wal | bolt: raft's log store on every node (as raft_log_store)")
	return cmd
}

func versionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print nsmd's version, VCS revision and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := agent.Build()
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(b)
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), b.String())
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
