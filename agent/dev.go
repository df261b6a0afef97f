package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nsmd/nsmd/config"
)

// Dev is N agents in one process on 127.0.0.1..N with a loopback VIP:
// `nsmd dev`, and the cluster of tests, benches and drills. It owns its
// nodes: one killed by a crash drill is started again on its data
// directory after RestartAfter (a rebooted server), so `nsmd drill --kill
// --runs N` completes every run.
type Dev struct {
	agents []*Agent // guarded by mu once the cluster runs (restarts replace entries)
	cfgs   []config.Config
	opts   []Options
	after  time.Duration
	log    *slog.Logger

	mu     sync.Mutex
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup // restarts in progress
}

// DevOptions lay out a Dev: node i is node<i> on 127.0.0.i, every node on
// the same ports.
type DevOptions struct {
	Nodes      int
	DataDir    string
	VIP        string
	NSMPort    int
	RaftPort   int
	AdminPort  int // 0: no admin API
	GossipPort int
	LogLevel   string
	// RaftProfile is every node's raft_profile ("": the default).
	RaftProfile string
	// RestartAfter > 0 starts a node killed by a crash drill again after
	// that long; 0 leaves it down.
	RestartAfter time.Duration
	// Tune lets a test adjust each node's config before it starts.
	Tune func(*config.Config)
}

// StartDev starts the nodes of o, each with opts (Crash is the cluster's
// own), and returns once every node runs (not yet once a leader is
// elected).
func StartDev(o DevOptions, opts Options) (*Dev, error) {
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
		// A development cluster: its admin APIs on 127.0.0.x stay open
		// to every local user, so nsmd commands need no token.
		c.AdminLocalTokenFile = config.AdminLocalTokenNone
		// Nor is a local user's rate of new hosts bounded: nsmd bench
		// drives it from unprivileged ports when not run as root.
		c.MonUnprivBurst = -1
		c.LogLevel = o.LogLevel
		if o.RaftProfile != "" {
			c.RaftProfile = o.RaftProfile
		}
		if o.Tune != nil {
			o.Tune(&c)
		}
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("node %s: %w", c.NodeID, err)
		}
		cfgs[i] = c
	}
	d := &Dev{cfgs: cfgs, after: o.RestartAfter, log: opts.Logger, done: make(chan struct{})}
	for i, c := range cfgs {
		nodeOpts := opts
		nodeOpts.Crash = func(a *Agent) { // one node of this process, not the process
			a.Kill()
			d.restartLater(i)
		}
		d.opts = append(d.opts, nodeOpts)
		a, err := Start(c, nodeOpts)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("start %s: %w", c.NodeID, err)
		}
		d.agents = append(d.agents, a)
	}
	return d, nil
}

// Agent returns node i's current agent (a restart replaces it).
func (d *Dev) Agent(i int) *Agent {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.agents[i]
}

// Agents are the current agents, in node order.
func (d *Dev) Agents() []*Agent {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.agents)
}

// restartLater starts node i again on its data directory after d.after,
// retrying every second while its ports are still being released.
func (d *Dev) restartLater(i int) {
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
			a, err := Start(d.cfgs[i], d.opts[i])
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

// Close stops every node (each hands leadership over if it leads).
func (d *Dev) Close() error {
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
