package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/bench/drill"
	"github.com/nsmd/nsmd/internal/freeport"
)

// FailoverOptions: the drill to repeat, and where. With Drill.Admins
// empty the bench brings its own in-process cluster (the nsmd dev layout
// on free ports): for a kill, a fresh one per run, since a killed
// in-process node does not come back and the next kill would leave no
// quorum; for a transfer, one for all runs.
type FailoverOptions struct {
	Drill    drill.Options
	Nodes    int    // own cluster: nodes
	VIP      string // own cluster: loopback VIP
	DataDir  string // own cluster: parent of the node directories
	LogLevel string // own cluster: node log level; "none": no logs
	LogTo    io.Writer
}

// FailoverReport is the drill's report plus the figure the bench is
// about: fault → the VIP answers SM_STAT with the new state.
type FailoverReport struct {
	*drill.Report
	Cluster  string     `json:"cluster"` // "given" or what the bench started
	Failover drill.Stat `json:"failover"`
}

func RunFailover(ctx context.Context, o FailoverOptions) (*FailoverReport, error) {
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
		rep, err = ownClusterDrill(ctx, o)
	}
	if err != nil {
		return nil, err
	}
	return &FailoverReport{Report: rep, Cluster: cluster, Failover: rep.Stats[drill.MilestoneState]}, nil
}

// ownClusterDrill runs the drill against clusters of its own.
func ownClusterDrill(ctx context.Context, o FailoverOptions) (*drill.Report, error) {
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
	ports, err := freeport.Ports(ips, 4)
	if err != nil {
		return nil, fmt.Errorf("bench failover: %w", err)
	}
	dir, err := os.MkdirTemp(o.DataDir, "nsmd-bench-failover-")
	if err != nil {
		return nil, fmt.Errorf("bench failover: %w", err)
	}
	defer os.RemoveAll(dir)
	level := o.LogLevel
	if level == "none" { // raft logs every refused dial to a killed peer
		level = ""
	}
	// start brings up cluster number i in its own data directory.
	start := func(i int) (*agent.Dev, drill.Options, error) {
		d, err := startCluster(agent.DevOptions{
			Nodes: o.Nodes, DataDir: fmt.Sprintf("%s/cluster%d", dir, i), VIP: o.VIP, LogLevel: level,
			NSMPort: ports[0], RaftPort: ports[1], AdminPort: ports[2], GossipPort: ports[3],
		}, o.LogTo)
		if err != nil {
			return nil, drill.Options{}, fmt.Errorf("bench failover: start a cluster: %w", err)
		}
		do := o.Drill
		do.Admins = nil
		for _, a := range d.Agents() {
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

// PrintFailover writes the headline (fault → VIP SM_STAT with the
// new state), the distribution of every milestone, and failed runs.
func PrintFailover(w io.Writer, rep *FailoverReport) error {
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
