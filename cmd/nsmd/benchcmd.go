package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/bench"
	"github.com/nsmd/nsmd/bench/drill"
)

// benchCmd is `nsmd bench`: load and timing tools an operator points at
// any NSM server (nsmd or rpc.statd) or cluster.
func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: SM_MON load, notify fan-out, failover distribution",
		Long: `bench measures an NSM server or an nsmd cluster:

  nsmd bench mon --addr HOST[:PORT] -c CONNS -n CALLS   SM_MON (and SM_UNMON) load, latency, errors
  nsmd bench notify --hosts N [--sm-notify]             takeover fan-out to N fake client statds (root)
  nsmd bench failover --runs K                          repeated leader kills, failover distribution
  nsmd bench compare --kind mon|failover --this F,… --prev F,…
                                                        this build's reports beside the previous release's

Every subcommand prints a table, or JSON with --json, and draws a chart
with --plot FILE.svg.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(benchMonCmd(), benchNotifyCmd(), benchFailoverCmd(), benchCompareCmd())
	return cmd
}

// printResult writes rep as indented JSON (--json) or as the command's
// table; the drill and every bench subcommand print this way.
func printResult(w io.Writer, asJSON bool, rep any, table func(io.Writer) error) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return table(w)
}

func benchMonCmd() *cobra.Command {
	var (
		o              bench.MonOptions
		addr, monBase  string
		source, plot   string
		asJSON, noPriv bool
	)
	cmd := &cobra.Command{
		Use:   "mon --addr HOST[:PORT] -c CONNS -n CALLS",
		Short: "SM_MON load against any NSM server (nsmd or rpc.statd): throughput, latency, errors",
		Long: `mon sends SM_MON calls with distinct mon_names (127.x.y.z literals counting
up from --mon-base, so they never leave the loopback network even if the
server later notifies them), my_id 100021/3/16 as Linux lockd does, and a
random 16-byte priv per call, from privileged source ports when allowed.
With --unmon every other call of a caller is SM_UNMON of a name it
monitored earlier in the run. Each of the -c connections carries --depth
callers, each with one call outstanding.

Without a port in --addr the port comes from the portmapper on HOST:111.
rpc.statd accepts SM_MON only from 127.0.0.1: run it on the same host.

The latency of a call is from its send to its answer; calls that time out
are counted, not timed. Failed calls make the exit status non-zero after
the report.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			var err error
			if o.MonBase, err = netip.ParseAddr(monBase); err != nil {
				return fmt.Errorf("--mon-base: %w", err)
			}
			if source != "" {
				if o.Source, err = netip.ParseAddr(source); err != nil {
					return fmt.Errorf("--source: %w", err)
				}
			}
			if cmd.Flags().Changed("duration") && !cmd.Flags().Changed("calls") {
				o.Calls = 0
			}
			o.Privileged = !noPriv
			hostport, from, err := bench.Target(ctx, addr, o.Net, 3*time.Second)
			if err != nil {
				return fmt.Errorf("bench mon: %w", err)
			}
			o.Addr = hostport
			o.Progress = cmd.ErrOrStderr()
			o.TTY = isTerminal(o.Progress)
			rep, err := bench.RunMon(ctx, o)
			if err != nil {
				return err
			}
			rep.PortFrom = from
			out := cmd.OutOrStdout()
			if err := printResult(out, asJSON, rep, func(w io.Writer) error { return bench.PrintMon(w, rep) }); err != nil {
				return err
			}
			if plot != "" {
				if err := writeSVGFile(plot, bench.LatencySVG(rep)); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "latency histogram written to %s\n", plot)
			}
			if rep.Failed > 0 {
				return fmt.Errorf("bench mon: %d of %d calls failed", rep.Failed, rep.Calls)
			}
			if rep.Stopped != "" {
				return fmt.Errorf("bench mon: %s", rep.Stopped)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "127.0.0.1", "NSM server: HOST:PORT, or HOST to ask its portmapper")
	f.StringVar(&o.Net, "proto", "tcp", "tcp | udp")
	f.IntVarP(&o.Conns, "conns", "c", 1, "connections (TCP) or sockets (UDP)")
	f.IntVar(&o.Depth, "depth", 1, "outstanding calls per connection")
	f.IntVarP(&o.Calls, "calls", "n", 1000, "measured calls (all connections together)")
	f.DurationVar(&o.Duration, "duration", 0, "measure for this long instead of -n")
	f.IntVar(&o.Warmup, "warmup", 0, "calls made before measuring (not counted)")
	f.BoolVar(&o.Unmon, "unmon", false, "make half of the calls SM_UNMON of names monitored earlier in the run")
	f.StringVar(&monBase, "mon-base", "127.1.0.1", "first mon_name (an address in 127.0.0.0/8; later ones count up)")
	f.StringVar(&o.MyName, "my-name", "127.0.0.1", "my_name of the lock manager registering")
	f.BoolVar(&noPriv, "no-privileged", false, "do not bind source ports below 1024")
	f.StringVar(&source, "source", "", "source address (default: chosen by the kernel; 127.0.0.1 to a loopback server)")
	f.DurationVar(&o.Timeout, "timeout", 5*time.Second, "per call (UDP: including retransmits)")
	f.DurationVar(&o.Retransmit, "retransmit", 500*time.Millisecond, "UDP: first retransmit interval")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	f.StringVar(&plot, "plot", "", "write a latency histogram to this SVG file")
	cmd.MarkFlagsMutuallyExclusive("calls", "duration")
	return cmd
}

func benchNotifyCmd() *cobra.Command {
	o := bench.NotifyOptions{}
	var asJSON, child bool
	var plot string
	cmd := &cobra.Command{
		Use:   "notify",
		Short: "Measure the SM_NOTIFY fan-out after a takeover (N fake client hosts in a private network namespace)",
		Long: `notify creates a network namespace (nsmd-bench-<pid>, removed at exit), and in
it stands up N fake client hosts — each a statd and a portmapper on port 111
at its own 127.x.y.z address on the namespace's lo — and a 3-node nsmd
cluster in this process with the VIP 127.0.0.100. It registers every host
(SM_MON from 127.0.0.1 through the VIP, mon_name = the host's address),
makes the leader fail (--fault kill: crash it in-process; transfer: a
leadership transfer), and reports the time from the new leader's takeover
until every live host has SM_NOTIFY with the new state: a progress line per
second on stderr, then per-host p50/p90/p99/max, and retransmissions.
--dead-pct makes that share of the hosts dead: registered and retried, but
never answering. With --dead-mode silent (the default) a dead host's port
111 drops every datagram, as a host that is down does; with refused nothing
listens there and the kernel answers ICMP port unreachable. Note on refused:
all the fake hosts share one kernel, and on Linux ≥ 6.14 a UDP datagram to
a port with no matching socket scans every socket bound to that port (the
fallback lookup by port alone), so each datagram to a dead host costs the
sender a walk over the thousands of live hosts' port-111 sockets — an
artifact of the simulation that real dead hosts do not impose.

--sm-notify then runs the real sm-notify on the same host list (an
rpc.statd state directory written for it) and reports the ratio.

Needs root (network namespaces, port 111).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			if child {
				return bench.NotifyChild(cmd.Context(), os.Stderr)
			}
			if os.Geteuid() != 0 {
				return errors.New("bench notify needs root: it creates a network namespace and binds port 111 on many addresses")
			}
			if o.SMNotify {
				if _, err := exec.LookPath(o.SMNotifyPath); err != nil {
					return fmt.Errorf("--sm-notify: %w (install nfs-common, or give --sm-notify-path)", err)
				}
			}
			if o.CPUProfile != "" {
				abs, err := filepath.Abs(o.CPUProfile)
				if err != nil {
					return fmt.Errorf("--cpuprofile: %w", err)
				}
				o.CPUProfile = abs
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("cannot find my own executable to re-run in the namespace: %w", err)
			}
			args := append(strings.Fields(cmd.CommandPath())[1:], "--netns-child")
			rep, err := bench.NotifyInNetns(cmd.Context(), o, exe, args, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if plot != "" {
				if err := os.WriteFile(plot, []byte(bench.NotifySVG(rep)), 0o644); err != nil {
					return fmt.Errorf("--plot: %w", err)
				}
			}
			if asJSON {
				return printResult(cmd.OutOrStdout(), true, rep, nil)
			}
			bench.PrintNotify(cmd.OutOrStdout(), rep)
			if plot != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "plot: %s\n", plot)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Hosts, "hosts", 1000, "fake client hosts to register and notify")
	f.Float64Var(&o.DeadPct, "dead-pct", 0, "percentage of the hosts that never answer (registered, spread evenly over the list)")
	f.StringVar(&o.DeadMode, "dead-mode", bench.DeadSilent, "how a dead host does not answer: silent (its port 111 drops everything, like a host that is down) | refused (nothing listens: ICMP port unreachable; see the note in --help)")
	f.StringVar(&o.Fakes, "fakes", bench.FakesAuto, "how the fake hosts get sockets: per-host (port 111 on each host's address; one or two sockets per host) | wildcard (a few sockets on 0.0.0.0 answering from each call's destination address: past the open-file limit) | auto (per-host when the open-file limit allows)")
	f.StringVar(&o.Fault, "fault", bench.FaultKill, "how the leader goes: kill (in-process crash, like SIGKILL) | transfer (leadership transfer)")
	f.BoolVar(&o.SMNotify, "sm-notify", false, "also run the real sm-notify on the same host list and print the ratio")
	f.StringVar(&o.SMNotifyPath, "sm-notify-path", "/usr/sbin/sm-notify", "the sm-notify to run")
	f.DurationVar(&o.SMNotifyTimeout, "sm-notify-timeout", 3*time.Minute, "stop waiting for sm-notify after this")
	f.DurationVar(&o.Timeout, "timeout", time.Minute, "stop waiting for nsmd's fan-out after this (from the takeover)")
	f.IntVar(&o.Conns, "conns", 16, "TCP connections used to register the hosts (each pipelines 64 calls)")
	f.StringVar(&o.LogLevel, "log-level", "off", "the in-process cluster's log level: off | error | warn | info | debug")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the fan-out (fault to last live host, whole process: cluster and fake hosts) to this file")
	f.StringVar(&plot, "plot", "", "write an SVG timeline (notified hosts over time) to this file")
	f.BoolVar(&child, "netns-child", false, "internal: the process inside the namespace")
	f.MarkHidden("netns-child")
	return cmd
}

func benchFailoverCmd() *cobra.Command {
	var (
		o                bench.FailoverOptions
		admins, killCmd  string
		plot, report     string
		transfer, asJSON bool
		auth             admin.Auth
	)
	cmd := &cobra.Command{
		Use:   "failover [--admin ADDRS] --runs K",
		Short: "Repeated leader kills (or transfers) and the distribution of failover times",
		Long: `failover repeats the failover drill of 'nsmd drill' (the same milestones,
measured the same way) and reports their distribution, above all the time
from the fault until the VIP answers SM_STAT with the new sm_state.

The fault is a crash of the leader (POST /v1/drill/crash) unless
--transfer or --kill-cmd. Without --admin the bench starts its own
in-process cluster in the nsmd dev layout on free ports: a fresh one for
each kill (a killed in-process node never comes back), one for all
transfers. With --admin it drives your cluster; for repeated kills its
nodes must come back (e.g. systemd Restart=always) or the drill stops
when another kill would leave no quorum.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Drill.Admins = append(o.Drill.Admins, splitList(admins)...)
			switch {
			case transfer:
				o.Drill.Fault = drill.FaultTransfer
			case killCmd != "":
				o.Drill.Fault, o.Drill.KillCmd = drill.FaultKillCmd, killCmd
			default:
				o.Drill.Fault = drill.FaultKill
			}
			o.Drill.Auth = &auth
			o.Drill.Progress = cmd.ErrOrStderr()
			o.Drill.TTY = isTerminal(o.Drill.Progress)
			o.LogTo = cmd.ErrOrStderr()
			rep, err := bench.RunFailover(cmd.Context(), o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if err := printResult(out, asJSON, rep, func(w io.Writer) error { return bench.PrintFailover(w, rep) }); err != nil {
				return err
			}
			if plot != "" {
				if err := writeSVGFile(plot, drill.TimelineSVG(rep.Report)); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "timeline written to %s\n", plot)
			}
			if report != "" {
				if err := drill.WriteReportFile(report, rep.Report); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "report written to %s\n", report)
			}
			if n := rep.Failed(); n > 0 {
				return fmt.Errorf("bench failover: %d of %d runs did not reach every milestone within %v", n, len(rep.Runs), o.Drill.Timeout)
			}
			if len(rep.Runs) < rep.Asked {
				return fmt.Errorf("bench failover: %d of %d runs: %s", len(rep.Runs), rep.Asked, rep.Stopped)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&admins, "admin", "", "admin API address(es) of your cluster, comma separated (default: start an in-process cluster)")
	authFlags(f, &auth)
	f.StringVar(&o.Drill.VIP, "vip-addr", "", "with --admin: NSM address on the VIP (host:port; default: status vip + the leader's NSM port)")
	f.BoolVar(&transfer, "transfer", false, "planned leadership transfer instead of a crash")
	f.StringVar(&killCmd, "kill-cmd", "", "with --admin: shell command that kills the leader (env NSMD_LEADER_ID, NSMD_LEADER_ADMIN)")
	f.IntVar(&o.Drill.Runs, "runs", 20, "number of failovers")
	f.DurationVar(&o.Drill.Timeout, "timeout", 30*time.Second, "per run: how long to wait for every milestone (and for health before it)")
	f.DurationVar(&o.Drill.Poll, "poll", 20*time.Millisecond, "polling interval (each time includes up to one)")
	f.IntVar(&o.Nodes, "nodes", 3, "own cluster: number of nodes")
	f.StringVar(&o.VIP, "vip", "127.0.0.100", "own cluster: loopback VIP")
	f.StringVar(&o.DataDir, "data-dir", "", "own cluster: where to put the temporary node directories (default: the system temp dir)")
	f.StringVar(&o.LogLevel, "log-level", "none", "own cluster: node log level (none | debug | info | warn | error)")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	f.StringVar(&plot, "plot", "", "write the failover timeline to this SVG file")
	f.StringVar(&report, "report", "", "write the drill's self-contained HTML report to this file")
	cmd.MarkFlagsMutuallyExclusive("transfer", "kill-cmd")
	return cmd
}

// writeSVGFile writes one standalone SVG document (as drawn by
// drill.TimelineSVG or bench.LatencySVG) to path.
func writeSVGFile(path, svg string) error {
	if err := os.WriteFile(path, []byte(`<?xml version="1.0" encoding="UTF-8"?>`+"\n"+svg+"\n"), 0o644); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

func benchCompareCmd() *cobra.Command {
	var kind, this, prev string
	cmd := &cobra.Command{
		Use:   "compare --kind mon|failover --this FILES --prev FILES",
		Short: "This build's bench reports beside another build's, taken in the same run",
		Long: `compare reads the JSON reports (--json) of 'nsmd bench mon' or 'nsmd bench
failover' taken by two builds on the same machine in the same minutes,
alternated, and prints each figure's median and worst for both and the
ratio of the medians (this / previous). A machine's figures move by half
or double between days; only a same-run ratio tells a regression from a
slower machine.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := bench.Compare(kind, splitList(this), splitList(prev))
			if err != nil {
				return err
			}
			return c.WriteTable(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&kind, "kind", "mon", "what the reports are: mon or failover")
	f.StringVar(&this, "this", "", "this build's reports (comma-separated JSON files)")
	f.StringVar(&prev, "prev", "", "the other build's reports (comma-separated JSON files)")
	return cmd
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
