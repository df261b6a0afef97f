package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/config"
)

// devCluster is N agents in one process on 127.0.0.1..N with a loopback VIP.
// It owns its nodes: one killed by a crash drill is started again on its
// data directory after RestartAfter (a rebooted server), so
// `nsmd drill --kill --runs N` completes every run.
type devCluster struct {
	agents []*agent // guarded by mu once the cluster runs (restarts replace entries)
	cfgs   []config.Config
	opts   []agentOptions
	after  time.Duration
	log    *slog.Logger

	mu     sync.Mutex
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup // restarts in progress
}

type devOptions struct {
	Nodes      int
	DataDir    string
	VIP        string
	NSMPort    int
	RaftPort   int
	AdminPort  int
	GossipPort int
	LogLevel   string
	// RestartAfter > 0 starts a node killed by a crash drill again after
	// that long; 0 leaves it down.
	RestartAfter time.Duration
	// Tune lets a test adjust each node's config before it starts.
	Tune func(*config.Config)
}

func startDev(o devOptions, opts agentOptions) (*devCluster, error) {
	if o.Nodes < 1 || o.Nodes > 9 {
		return nil, fmt.Errorf("--nodes must be 1..9, not %d", o.Nodes)
	}
	cfgs := make([]config.Config, o.Nodes)
	for i := range o.Nodes {
		ip := fmt.Sprintf("127.0.0.%d", i+1)
		c := config.Default()
		c.NodeID = fmt.Sprintf("node%d", i+1)
		c.DataDir = filepath.Join(o.DataDir, c.NodeID)
		c.Bind = ip
		c.RaftPort = o.RaftPort
		c.NSMAddr = net.JoinHostPort(ip, strconv.Itoa(o.NSMPort))
		c.AdminAddr = ""
		if o.AdminPort > 0 {
			c.AdminAddr = net.JoinHostPort(ip, strconv.Itoa(o.AdminPort))
		}
		c.GossipPort = o.GossipPort
		c.BootstrapExpect = o.Nodes // the cluster forms once all of them see each other
		// Every node joins the others (retrying until one answers), so a
		// node restarted after a crash drill finds the cluster again.
		for j := range o.Nodes {
			if j != i {
				c.Join = append(c.Join, net.JoinHostPort(fmt.Sprintf("127.0.0.%d", j+1), strconv.Itoa(o.GossipPort)))
			}
		}
		c.VIPMode = config.VIPLoopback
		c.VIP = o.VIP + "/32"
		c.Rpcbind = config.RpcbindOff
		// The nodes of one process share one kernel: none of them may
		// take this machine's nfsd tracking pipe.
		c.NFSv4Tracking = config.TrackingOff
		c.DrillCrash = true // nsmd drill --kill works out of the box
		c.LogLevel = o.LogLevel
		if o.Tune != nil {
			o.Tune(&c)
		}
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("node %s: %w", c.NodeID, err)
		}
		cfgs[i] = c
	}
	d := &devCluster{cfgs: cfgs, after: o.RestartAfter, log: opts.Logger, done: make(chan struct{})}
	for i, c := range cfgs {
		nodeOpts := opts
		nodeOpts.Crash = func(a *agent) { // one node of this process, not the process
			a.kill()
			d.restartLater(i)
		}
		d.opts = append(d.opts, nodeOpts)
		a, err := startAgent(c, nodeOpts)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("start %s: %w", c.NodeID, err)
		}
		d.agents = append(d.agents, a)
	}
	return d, nil
}

// agent returns node i's current agent (a restart replaces it).
func (d *devCluster) agent(i int) *agent {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.agents[i]
}

// restartLater starts node i again on its data directory after d.after,
// retrying every second while its ports are still being released.
func (d *devCluster) restartLater(i int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.after <= 0 || d.closed {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		wait := d.after
		for attempt := 1; ; attempt++ {
			t := time.NewTimer(wait)
			select {
			case <-d.done:
				t.Stop()
				return
			case <-t.C:
			}
			a, err := startAgent(d.cfgs[i], d.opts[i])
			if err != nil {
				d.log.Warn("dev: cannot restart a killed node yet", "node", d.cfgs[i].NodeID, "attempt", attempt, "err", err)
				wait = time.Second
				continue
			}
			d.mu.Lock()
			if d.closed {
				d.mu.Unlock()
				a.Close()
				return
			}
			d.agents[i] = a
			d.mu.Unlock()
			d.log.Info("dev: restarted a node killed by a crash drill (a rebooted server: same data, sm_state rises)", "node", d.cfgs[i].NodeID, "after", d.after)
			return
		}
	}()
}

func (d *devCluster) Close() error {
	d.mu.Lock()
	if !d.closed {
		d.closed = true
		close(d.done)
	}
	d.mu.Unlock()
	d.wg.Wait()
	d.mu.Lock()
	agents := slices.Clone(d.agents)
	d.mu.Unlock()
	var errs []error
	for _, a := range agents {
		errs = append(errs, a.Close())
	}
	return errors.Join(errs...)
}

func devCmd() *cobra.Command {
	var o devOptions
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
			log := newLogger(os.Stderr, o.LogLevel, "text")
			d, err := startDev(o, agentOptions{Logger: log})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "\nnsmd dev cluster: %d nodes, data in %s\n", len(d.agents), o.DataDir)
			fmt.Fprintf(out, "  VIP (NSM, UDP+TCP):  %s port %d   (only the leader answers there)\n", o.VIP, o.NSMPort)
			for _, a := range d.agents {
				fmt.Fprintf(out, "  %s  NSM %s  admin %s\n", a.cfg.NodeID, a.NSMAddr(), a.AdminURL())
			}
			adm := d.agents[0].adminLn.Addr().String()
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
	f.DurationVar(&o.RestartAfter, "restart-after", 2*time.Second, "start a node killed by a crash drill again after this long (0: leave it down)")
	return cmd
}
