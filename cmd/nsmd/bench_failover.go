package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/bench/drill"
)

// benchFailoverOptions: the drill to repeat, and where. With Drill.Admins
// empty the bench brings its own in-process cluster (the nsmd dev layout
// on free ports): for a kill, a fresh one per run, since a killed
// in-process node does not come back and the next kill would leave no
// quorum; for a transfer, one for all runs.
type benchFailoverOptions struct {
	Drill    drill.Options
	Nodes    int    // own cluster: nodes
	VIP      string // own cluster: loopback VIP
	DataDir  string // own cluster: parent of the node directories
	LogLevel string // own cluster
	LogTo    io.Writer
}

// benchFailoverReport is the drill's report plus the figure the bench is
// about: fault → the VIP answers SM_STAT with the new state.
type benchFailoverReport struct {
	*drill.Report
	Cluster  string     `json:"cluster"` // "given" or what the bench started
	Failover drill.Stat `json:"failover"`
}

func runBenchFailover(ctx context.Context, o benchFailoverOptions) (*benchFailoverReport, error) {
	var (
		rep *drill.Report
		err error
	)
	cluster := "given (--admin)"
	if len(o.Drill.Admins) > 0 {
		rep, err = drill.Run(ctx, o.Drill)
	} else {
		cluster = fmt.Sprintf("in-process, %d nodes on 127.0.0.1-%d, VIP %s", o.Nodes, o.Nodes, o.VIP)
		if o.Drill.Fault == drill.FaultKill {
			cluster += ", a fresh cluster for each run"
		}
		rep, err = benchOwnClusterDrill(ctx, o)
	}
	if err != nil {
		return nil, err
	}
	return &benchFailoverReport{Report: rep, Cluster: cluster, Failover: rep.Stats[drill.MilestoneState]}, nil
}

// benchOwnClusterDrill runs the drill against clusters of its own.
func benchOwnClusterDrill(ctx context.Context, o benchFailoverOptions) (*drill.Report, error) {
	if o.Drill.Fault == drill.FaultKillCmd {
		return nil, errors.New("bench failover: --kill-cmd needs a cluster of yours (--admin)")
	}
	if o.Nodes < 2 {
		return nil, fmt.Errorf("bench failover: --nodes %d: a failover needs two or more", o.Nodes)
	}
	ips := []string{o.VIP}
	for i := range o.Nodes {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", i+1))
	}
	ports, err := freePortsOn(ips, 4)
	if err != nil {
		return nil, fmt.Errorf("bench failover: %w", err)
	}
	dir, err := os.MkdirTemp(o.DataDir, "nsmd-bench-failover-")
	if err != nil {
		return nil, fmt.Errorf("bench failover: %w", err)
	}
	defer os.RemoveAll(dir)
	log := newLogger(o.LogTo, o.LogLevel, "text")
	level := o.LogLevel
	if level == "none" { // raft logs every refused dial to a killed peer
		log, level = newLogger(io.Discard, "error", "text"), "error"
	}
	// start brings up cluster number i in its own data directory.
	start := func(i int) (*devCluster, drill.Options, error) {
		d, err := startDev(devOptions{
			Nodes: o.Nodes, DataDir: fmt.Sprintf("%s/cluster%d", dir, i), VIP: o.VIP, LogLevel: level,
			NSMPort: ports[0], RaftPort: ports[1], AdminPort: ports[2], GossipPort: ports[3],
		}, agentOptions{Logger: log})
		if err != nil {
			return nil, drill.Options{}, fmt.Errorf("bench failover: start a cluster: %w", err)
		}
		do := o.Drill
		do.Admins = nil
		for _, a := range d.agents {
			do.Admins = append(do.Admins, a.AdminURL())
		}
		do.VIP = net.JoinHostPort(o.VIP, strconv.Itoa(ports[0]))
		return d, do, nil
	}

	if o.Drill.Fault != drill.FaultKill { // transfers: one cluster survives them all
		d, do, err := start(1)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		return drill.Run(ctx, do)
	}

	runs := max(o.Drill.Runs, 1)
	var all *drill.Report
	for i := 1; i <= runs; i++ {
		d, do, err := start(i)
		if err != nil {
			if all == nil {
				return nil, err
			}
			all.Stopped = err.Error()
			break
		}
		do.Runs = 1
		if do.Progress != nil && runs > 1 {
			fmt.Fprintf(do.Progress, "cluster %d/%d up\n", i, runs)
		}
		rep, err := drill.Run(ctx, do)
		d.Close()
		if err != nil {
			if all == nil {
				return nil, err
			}
			all.Stopped = fmt.Sprintf("run %d: %v", i, err)
			break
		}
		got := rep.Runs
		if all == nil {
			all = rep
			all.Runs = nil
			all.Asked = runs
		}
		for _, r := range got {
			r.Run = i
			all.Runs = append(all.Runs, r)
		}
		if rep.Stopped != "" {
			all.Stopped = rep.Stopped
			break
		}
		if ctx.Err() != nil {
			all.Stopped = "interrupted"
			break
		}
	}
	all.Stats = drill.Stats(all.Runs)
	return all, nil
}

// freePortsOn finds n distinct ports, each free for TCP and UDP on
// every ip.
func freePortsOn(ips []string, n int) ([]int, error) {
	var out []int
	for range 200 {
		if len(out) == n {
			return out, nil
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		free := true
		for _, ip := range ips {
			addr := net.JoinHostPort(ip, strconv.Itoa(p))
			if l, err := net.Listen("tcp", addr); err == nil {
				l.Close()
			} else {
				free = false
			}
			if pc, err := net.ListenPacket("udp", addr); err == nil {
				pc.Close()
			} else {
				free = false
			}
		}
		for _, q := range out {
			free = free && q != p
		}
		if free {
			out = append(out, p)
		}
	}
	return nil, fmt.Errorf("no %d ports free on all of %s", n, strings.Join(ips, ", "))
}

// printBenchFailover writes the headline (fault → VIP SM_STAT with the
// new state), the distribution of every milestone, and failed runs.
func printBenchFailover(w io.Writer, rep *benchFailoverReport) error {
	fmt.Fprintf(w, "\nbench failover: %s, %d of %d runs, VIP %s, cluster %s, polling every %s\n\n",
		drill.FaultLabel(rep.Fault), len(rep.Runs), rep.Asked, rep.VIP, rep.Cluster, drill.FormatMS(rep.PollMS))
	verb := "kill"
	if rep.Fault == drill.FaultTransfer {
		verb = "transfer"
	}
	st := rep.Failover
	if st.N == 0 {
		fmt.Fprintf(w, "%s → VIP answers SM_STAT with the new state: never reached\n", verb)
	} else {
		fmt.Fprintf(w, "%s → VIP answers SM_STAT with the new state: p50 %s  p90 %s  max %s  (min %s, %d runs)\n",
			verb, drill.FormatMS(st.P50MS), drill.FormatMS(st.P90MS), drill.FormatMS(st.MaxMS), drill.FormatMS(st.MinMS), st.N)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MILESTONE (since the fault)\tRUNS\tMIN\tP50\tP90\tMAX\t")
	for _, s := range rep.Stats {
		if s.N == 0 {
			fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t\n", s.Label)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", s.Label, s.N, drill.FormatMS(s.MinMS), drill.FormatMS(s.P50MS), drill.FormatMS(s.P90MS), drill.FormatMS(s.MaxMS))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.Runs {
		if !r.Complete() {
			fmt.Fprintf(w, "run %d FAILED: %s\n", r.Run, dash(r.Err))
		}
	}
	if rep.Stopped != "" {
		fmt.Fprintf(w, "\nstopped early: %s\n", rep.Stopped)
	}
	return nil
}

func benchFailoverCmd() *cobra.Command {
	var (
		o                benchFailoverOptions
		admins, killCmd  string
		plot, report     string
		transfer, asJSON bool
		auth             adminAuth
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
			for _, a := range strings.Split(admins, ",") {
				if a = strings.TrimSpace(a); a != "" {
					o.Drill.Admins = append(o.Drill.Admins, a)
				}
			}
			switch {
			case transfer:
				o.Drill.Fault = drill.FaultTransfer
			case killCmd != "":
				o.Drill.Fault, o.Drill.KillCmd = drill.FaultKillCmd, killCmd
			default:
				o.Drill.Fault = drill.FaultKill
			}
			o.Drill.Auth = drillAuth{&auth}
			o.Drill.Progress = cmd.ErrOrStderr()
			o.Drill.TTY = isTerminal(o.Drill.Progress)
			o.LogTo = cmd.ErrOrStderr()
			rep, err := runBenchFailover(cmd.Context(), o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if err := printResult(out, asJSON, rep, func(w io.Writer) error { return printBenchFailover(w, rep) }); err != nil {
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
	auth.flags(f)
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
