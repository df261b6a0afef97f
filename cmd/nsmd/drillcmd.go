package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/bench/drill"
)

// drillCmd is `nsmd drill`: flags, then package drill.
func drillCmd() *cobra.Command {
	var (
		admins, killCmd, report string
		o                       drill.Options
		kill, asJSON            bool
		auth                    admin.Auth
	)
	cmd := &cobra.Command{
		Use:   "drill",
		Short: "Run a failover drill against a live cluster and time it",
		Long: `drill finds the leader, causes a failover and times, from the fault:
  1. a new leader elected (another node's /v1/status says role=leader),
  2. the VIP answering NSM NULL over UDP (from the new holder),
  3. SM_STAT on the VIP returning the new sm_state,
  4. the new leader's SM_NOTIFY fan-out complete (notify.pending = 0).

The fault is a planned leadership transfer unless --kill (POST /v1/drill/crash
on the leader, which must run with drill_crash: true, as nsmd dev does) or
--kill-cmd (a shell command given NSMD_LEADER_ID and NSMD_LEADER_ADMIN).

--admin takes one or more admin addresses (comma separated). Nodes not given
are found from /v1/members by probing their NSM host with the given admin
ports, which finds every node of nsmd dev from one address; otherwise list
all admin addresses. Between runs the drill waits (up to --timeout) for the
cluster to be healthy and for a killed node to come back (nsmd dev restarts
it after --restart-after; systemd does with Restart=on-failure); if it does
not and another leader kill would leave no quorum, the drill stops early and
says so.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, a := range strings.Split(admins, ",") {
				if a = strings.TrimSpace(a); a != "" {
					o.Admins = append(o.Admins, a)
				}
			}
			switch {
			case kill:
				o.Fault = drill.FaultKill
			case killCmd != "":
				o.Fault, o.KillCmd = drill.FaultKillCmd, killCmd
			default:
				o.Fault = drill.FaultTransfer
			}
			o.Auth = &auth
			o.Progress = cmd.ErrOrStderr()
			o.TTY = isTerminal(o.Progress)
			rep, err := drill.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if err := printResult(out, asJSON, rep, func(w io.Writer) error { return drill.Print(w, rep) }); err != nil {
				return err
			}
			if report != "" {
				if err := drill.WriteReportFile(report, rep); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "report written to %s\n", report)
			}
			if n := rep.Failed(); n > 0 {
				return fmt.Errorf("drill: %d of %d runs did not reach every milestone within %v", n, len(rep.Runs), o.Timeout)
			}
			return nil
		},
	}
	def := os.Getenv("NSMD_ADMIN")
	if def == "" {
		def = "127.0.0.1:8024"
	}
	f := cmd.Flags()
	f.StringVar(&admins, "admin", def, "admin API address(es) of the cluster's nodes, comma separated [env NSMD_ADMIN]")
	f.StringVar(&o.VIP, "vip", "", "NSM address on the VIP (host:port; default: status vip + the leader's NSM port)")
	f.BoolVar(&kill, "kill", false, "crash the leader (POST /v1/drill/crash; needs drill_crash: true) instead of a planned transfer")
	f.StringVar(&killCmd, "kill-cmd", "", "shell command that kills the leader (env NSMD_LEADER_ID, NSMD_LEADER_ADMIN)")
	f.IntVar(&o.Runs, "runs", 1, "number of failovers")
	f.DurationVar(&o.Timeout, "timeout", 30*time.Second, "per run: how long to wait for every milestone (and for health between runs)")
	f.DurationVar(&o.Poll, "poll", 20*time.Millisecond, "polling interval")
	f.StringVar(&report, "report", "", "write a self-contained HTML report to this file")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	authFlags(f, &auth)
	cmd.MarkFlagsMutuallyExclusive("kill", "kill-cmd")
	return cmd
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
