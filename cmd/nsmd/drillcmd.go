package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/bench/drill"
)

// drillCmd is `nsmd drill`: flags, then package drill.
func drillCmd() *cobra.Command {
	var (
		admins, killCmd, report string
		fault                   string
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

--fault names the fault instead: transfer (the default), kill (= --kill),
nsmd-kill (kill -9 of the leader's nsmd), nsmd-hang (SIGSTOP of it for
--hang-for, then SIGCONT), partition (the leader's raft, gossip and NSM
traffic to and from the other members dropped for --cut-for by an nft table
of its own, inet ` + drill.NFTTable + `, deleted afterwards; clients still reach it)
and freeze (--freeze-cmd, --freeze-for, then --thaw-cmd: the hypervisor
pauses the leader's machine). nsmd-kill, nsmd-hang and partition run on the
leader's machine through --node-cmd, a prefix such as 'ssh root@{addr}'
({node}: the leader's node id, {addr}: the host of its admin address, each
quoted as one shell word); they find nsmd's PID in --nsmd-pidfile or from
systemd (systemctl show -p MainPID), never by name. On nsmd dev (one
process) only transfer, kill and nsmd-kill (both its in-process crash) run.
After each run the report says how the new leader had the old one proven
stopped (its fence.last_wait: clean, agent or watchdog, and when) and
whether the old server was reset, restarted or kept running.

--service S drills one service of a cluster with services: the fault hits
the server S runs on instead of the leader (transfer: a planned move of S to
another server that declares it, POST /v1/services/move), and the drill times
1. S placed anew (a new epoch), 2. S's address answering NSM NULL, 3. SM_STAT
there returning S's new state (2 × epoch + 1), 4. its new server reporting it
serving. Each run also lists the other services that moved, marking those that
were not on the faulted server (a move of one service must not move others).

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
			o.Admins = append(o.Admins, splitList(admins)...)
			var err error
			if o.Fault, err = drillFault(cmd.Flags(), fault, kill, killCmd); err != nil {
				return err
			}
			o.KillCmd = killCmd
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
	f.StringVar(&o.Service, "service", "", "drill this service (services:): fault the server it runs on and time the service's move")
	f.DurationVar(&o.Timeout, "timeout", 30*time.Second, "per run: how long to wait for every milestone (and for health between runs)")
	f.DurationVar(&o.Poll, "poll", 20*time.Millisecond, "polling interval")
	f.StringVar(&report, "report", "", "write a self-contained HTML report to this file")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	authFlags(f, &auth)
	f.StringVar(&fault, "fault", "", "the fault: "+strings.Join(drill.Faults(), ", ")+" (default transfer; --kill is kill)")
	f.StringVar(&o.Node.NodeCmd, "node-cmd", "", "prefix that runs a command on the leader's machine for nsmd-kill, nsmd-hang, partition ({node}, {addr}; e.g. 'ssh root@{addr}')")
	f.StringVar(&o.Node.PIDFile, "nsmd-pidfile", "", "nsmd's PID file on the nodes, {node} and {addr} filled in (nsmd-kill, nsmd-hang; default: systemctl show -p MainPID --nsmd-unit)")
	f.StringVar(&o.Node.Unit, "nsmd-unit", "nsmd", "nsmd's systemd unit on the nodes (nsmd-kill, nsmd-hang without --nsmd-pidfile)")
	f.DurationVar(&o.Node.HangFor, "hang-for", 0, "nsmd-hang: how long nsmd stays stopped (default: the leader's fence_timeout + 3s, 8s without a watchdog)")
	f.DurationVar(&o.Node.CutFor, "cut-for", 0, "partition: how long the cluster links stay cut (default as --hang-for)")
	f.StringVar(&o.Node.FreezeCmd, "freeze-cmd", "", "freeze: command that pauses the leader's machine, run here ({node}, {addr}; e.g. 'virsh suspend {node}')")
	f.StringVar(&o.Node.ThawCmd, "thaw-cmd", "", "freeze: command that resumes it ({node}, {addr}; e.g. 'virsh resume {node}')")
	f.DurationVar(&o.Node.FreezeFor, "freeze-for", 0, "freeze: how long the machine stays paused (default as --hang-for)")
	cmd.MarkFlagsMutuallyExclusive("kill", "kill-cmd")
	return cmd
}

// drillFault settles the fault from --fault, --kill and --kill-cmd, and
// refuses flags the fault does not use.
func drillFault(f *pflag.FlagSet, fault string, kill bool, killCmd string) (string, error) {
	switch {
	case f.Changed("fault") && kill:
		return "", fmt.Errorf("--fault %s and --kill: give one (--kill is --fault kill)", fault)
	case f.Changed("fault") && f.Changed("kill-cmd"):
		return "", fmt.Errorf("--fault %s and --kill-cmd: give one (--kill-cmd runs the operator's own command; --fault a built-in one)", fault)
	case fault == drill.FaultKillCmd:
		return "", errors.New("--fault kill-cmd: give --kill-cmd CMD (the operator's own command) instead")
	case kill:
		fault = drill.FaultKill
	case killCmd != "":
		fault = drill.FaultKillCmd
	case fault == "":
		fault = drill.FaultTransfer
	}
	if fault != drill.FaultKillCmd && !slices.Contains(drill.Faults(), fault) {
		return "", fmt.Errorf("--fault %q: not one of %s", fault, strings.Join(drill.Faults(), ", "))
	}
	uses := map[string][]string{
		"node-cmd":     {drill.FaultNSMDKill, drill.FaultNSMDHang, drill.FaultPartition},
		"nsmd-pidfile": {drill.FaultNSMDKill, drill.FaultNSMDHang},
		"nsmd-unit":    {drill.FaultNSMDKill, drill.FaultNSMDHang},
		"hang-for":     {drill.FaultNSMDHang},
		"cut-for":      {drill.FaultPartition},
		"freeze-cmd":   {drill.FaultFreeze},
		"thaw-cmd":     {drill.FaultFreeze},
		"freeze-for":   {drill.FaultFreeze},
	}
	for _, name := range []string{"node-cmd", "nsmd-pidfile", "nsmd-unit", "hang-for", "cut-for", "freeze-cmd", "thaw-cmd", "freeze-for"} {
		if f.Changed(name) && !slices.Contains(uses[name], fault) {
			return "", fmt.Errorf("--%s is for --fault %s, not %s", name, strings.Join(uses[name], " or "), fault)
		}
	}
	if fault == drill.FaultFreeze && (!f.Changed("freeze-cmd") || !f.Changed("thaw-cmd")) {
		return "", errors.New("--fault freeze pauses the leader's machine through its hypervisor: give --freeze-cmd and --thaw-cmd (e.g. 'virsh suspend {node}' and 'virsh resume {node}')")
	}
	return fault, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
