package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// takeoverEvent is one OnLeader call: who took over with which state.
type takeoverEvent struct {
	node  string
	state int32
	at    time.Time
}

// tnode is one node of a test cluster: a Node, its raft transport (in
// memory, so links can be cut) and a real TCP oncrpc server on its NSM
// address serving ForwardProgram, so forwarding runs over real sockets.
type tnode struct {
	id      string
	dir     string
	addr    raft.ServerAddress
	nsmAddr string
	trans   *raft.InmemTransport
	n       *Node
	srv     *oncrpc.Server
	alive   bool
	// nt sends SM_NOTIFY when n serves a term, as the agent composes it
	// (a Subscriber); stopDeliver ends its callback deliverer, if any.
	nt          *nsm.Notifier
	stopDeliver context.CancelFunc
}

// tcluster is an in-process cluster with raft over in-memory transports.
type tcluster struct {
	t         testing.TB
	nodes     []*tnode
	voters    map[string]string
	peerNSM   map[string]string
	takeovers chan takeoverEvent
	followers chan takeoverEvent // OnFollower calls

	// notify configures every node's notifier; deliver, when set, gives
	// every node a callback deliverer (both composed as the agent does).
	notify  nsm.NotifierConfig
	deliver *nsm.DelivererConfig

	mu      sync.Mutex
	cut     map[[2]int]bool // links cut by partition()
	tuneCfg func(*Config)
	// beforeStart, when set, runs between New (raft runs, linked to the
	// others) and Start of every node started.
	beforeStart func(*Node)
}

func newTestCluster(t testing.TB, size int, tune func(*Config)) *tcluster {
	t.Helper()
	return newTestClusterWith(t, size, tune, nil)
}

// newTestClusterWith is newTestCluster with set run on the cluster before
// its nodes start (the notifier's and the deliverer's settings).
func newTestClusterWith(t testing.TB, size int, tune func(*Config), set func(*tcluster)) *tcluster {
	t.Helper()
	c := &tcluster{t: t, voters: map[string]string{}, peerNSM: map[string]string{},
		takeovers: make(chan takeoverEvent, 256), followers: make(chan takeoverEvent, 256),
		cut: map[[2]int]bool{}, tuneCfg: tune,
		notify: nsm.NotifierConfig{Name: "nfs.test", InitialRTO: 50 * time.Millisecond,
			MaxRTO: 200 * time.Millisecond, Window: 2 * time.Second}}
	if set != nil {
		set(c)
	}
	for i := range size {
		tn := &tnode{id: fmt.Sprintf("n%d", i+1), dir: t.TempDir(), addr: raft.ServerAddress(fmt.Sprintf("inmem-n%d", i+1))}
		tn.nsmAddr = testutil.FreeAddr(t, "127.0.0.1")
		c.nodes = append(c.nodes, tn)
		c.voters[tn.id] = string(tn.addr)
		c.peerNSM[tn.id] = tn.nsmAddr
	}
	for i := range c.nodes {
		c.start(i)
	}
	t.Cleanup(func() {
		for i, tn := range c.nodes {
			if tn.alive {
				c.kill(i)
			}
		}
	})
	return c
}

func (c *tcluster) start(i int) {
	c.t.Helper()
	tn := c.nodes[i]
	_, tn.trans = raft.NewInmemTransport(tn.addr)
	cfg := testDefaults(Config{NodeID: tn.id, DataDir: tn.dir, RaftBind: "127.0.0.1:1"})
	cfg.NSMAddr, cfg.Voters, cfg.PeerNSMAddrs, cfg.Transport = tn.nsmAddr, c.voters, c.peerNSM, tn.trans
	cfg.HeartbeatTimeout, cfg.ElectionTimeout = 300*time.Millisecond, 300*time.Millisecond
	cfg.LeaderLeaseTimeout, cfg.HoldTimeout = 150*time.Millisecond, 2*time.Second
	cfg.ClusterKey = []byte("test-cluster-key") // inmem raft addresses carry no IPs to match
	cfg.staticRecords = true                    // every member applies serving records (no gossip to say so)
	cfg.Server = &funcServer{
		serve: func(_ context.Context, _ fsm.Takeover, state int32) error {
			c.takeovers <- takeoverEvent{node: tn.id, state: state, at: time.Now()}
			return nil
		},
		stop: func(StopReason) error { c.followers <- takeoverEvent{node: tn.id, at: time.Now()}; return nil },
	}
	nt, err := nsm.NewNotifier(c.notify)
	if err != nil {
		c.t.Fatal(err)
	}
	tn.nt = nt
	var n *Node // set before Start, the first Serving
	cfg.Subscribers = append(cfg.Subscribers, Subscriber{Serving: func(ctx context.Context, state int32) {
		nt.Run(ctx, state, n.View().Targets())
	}})
	if c.deliver != nil {
		d := nsm.NewDeliverer(*c.deliver)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); d.Run(ctx) }()
		tn.stopDeliver = func() { cancel(); <-done }
		cfg.Subscribers = append(cfg.Subscribers, Subscriber{Applied: func(ev Applied) {
			d.Applied(tn.id, ev.Cmd, ev.Result, ev.Replay)
		}})
	}
	if c.tuneCfg != nil {
		c.tuneCfg(&cfg)
	}
	n, err = New(cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", tn.id, err)
	}
	tn.n = n
	ln, err := net.Listen("tcp", tn.nsmAddr)
	if err != nil {
		c.t.Fatalf("listen %s: %v", tn.nsmAddr, err)
	}
	tn.srv = oncrpc.NewServer(oncrpc.Programs{ForwardProgram: n}, oncrpc.ServerConfig{})
	go tn.srv.ServeTCP(ln)
	tn.alive = true
	c.relink()
	if c.beforeStart != nil {
		c.beforeStart(n)
	}
	n.Start()
}

// relink connects every pair of live nodes whose link is not cut.
func (c *tcluster) relink() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, a := range c.nodes {
		if !a.alive {
			continue
		}
		a.trans.DisconnectAll()
		for j, b := range c.nodes {
			if i == j || !b.alive || c.cut[[2]int{min(i, j), max(i, j)}] {
				continue
			}
			a.trans.Connect(b.addr, b.trans)
		}
	}
}

// kill stops node i as a crash would (no transfer, no leave).
func (c *tcluster) kill(i int) {
	tn := c.nodes[i]
	if !tn.alive {
		return
	}
	tn.alive = false
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	tn.srv.Shutdown(ctx)
	cancel()
	tn.n.Kill()
	if tn.stopDeliver != nil {
		tn.stopDeliver()
	}
	c.relink()
}

// partition cuts node i off from every other node (both directions).
func (c *tcluster) partition(i int) {
	c.mu.Lock()
	for j := range c.nodes {
		if j != i {
			c.cut[[2]int{min(i, j), max(i, j)}] = true
		}
	}
	c.mu.Unlock()
	c.relink()
}

func (c *tcluster) heal() {
	c.mu.Lock()
	c.cut = map[[2]int]bool{}
	c.mu.Unlock()
	c.relink()
}

// waitTakeover waits for the next OnLeader call.
func (c *tcluster) waitTakeover(timeout time.Duration) takeoverEvent {
	c.t.Helper()
	select {
	case ev := <-c.takeovers:
		return ev
	case <-time.After(timeout):
		c.t.Fatalf("no takeover within %v", timeout)
		return takeoverEvent{}
	}
}

// leader returns the live node that currently leads (and has taken over),
// waiting up to timeout.
func (c *tcluster) leader(timeout time.Duration) (int, *tnode) {
	c.t.Helper()
	var li int
	var ld *tnode
	testutil.WaitFor(c.t, timeout, "a live node that leads and has taken over", func() bool {
		for i, tn := range c.nodes {
			if tn.alive && tn.n.Leading() && tn.n.IsLeader() {
				li, ld = i, tn
				return true
			}
		}
		return false
	})
	return li, ld
}

// converge waits until every live node has applied the leader's last index
// and returns the leader's FSM digest after checking all are equal
// (DESIGN.md invariant 6).
func (c *tcluster) converge(timeout time.Duration) [32]byte {
	c.t.Helper()
	_, ld := c.leader(timeout)
	if err := ld.n.raft.Barrier(timeout).Error(); err != nil {
		c.t.Fatalf("barrier: %v", err)
	}
	want := ld.n.View().AppliedIndex()
	testutil.WaitForSeen(c.t, timeout, fmt.Sprintf("every live node to apply the leader's index %d", want), func() (bool, string) {
		for _, tn := range c.nodes {
			if tn.alive && tn.n.View().AppliedIndex() < want {
				return false, fmt.Sprintf("%s applied %d", tn.id, tn.n.View().AppliedIndex())
			}
		}
		return true, ""
	})
	d := ld.n.fsm.Digest()
	for _, tn := range c.nodes {
		if tn.alive && tn.n.View().AppliedIndex() == want && tn.n.fsm.Digest() != d {
			c.t.Errorf("%s FSM digest differs from the leader's at index %d", tn.id, want)
		}
	}
	return d
}

// testReg is a registration for host i taken by node.
func testReg(host string, node string, cookie byte) fsm.Registration {
	return fsm.Registration{
		ID:   fsm.MonID{MonName: host, My: fsm.MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}},
		Priv: [16]byte{cookie}, Node: node,
		Added: time.Unix(1700000000, 0).UTC(),
	}
}

// askVIPHeld asks the node serving the forwarding program at addr
// whether it holds the VIP (fwdProcVIPHeld), as a new leader does.
func askVIPHeld(t testing.TB, addr string) bool {
	t.Helper()
	cl, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var held boolRes
	if err := cl.Call(context.Background(), ForwardProgram.Prog, ForwardProgram.Vers, fwdProcVIPHeld, oncrpc.Void{}, &held); err != nil {
		t.Fatal(err)
	}
	return held.V
}

// testDiskSlowThreshold is the slow-disk threshold a test node runs with
// unless its test says otherwise: the agent's default.
const testDiskSlowThreshold = 50 * time.Millisecond

// testRaftHandshakesPerHost is the agent's raft_handshakes_per_host: a
// member dials a handful of connections at a time (raft's pool of 4, a
// heartbeat, a snapshot).
const testRaftHandshakesPerHost = 8

// testDefaults fills every setting cfg leaves zero with the value a test
// node runs with — New takes no defaults, package config gives the agent
// its values —, so that a test names only what it is about. Fields filled
// here are not the test's subject; one that means something at zero
// (DiskSlowThreshold: off) is set after this.
func testDefaults(cfg Config) Config {
	durations := []struct {
		p *time.Duration
		v time.Duration
	}{
		{&cfg.GracePeriod, 90 * time.Second},
		{&cfg.HeartbeatTimeout, 500 * time.Millisecond},
		{&cfg.ElectionTimeout, 500 * time.Millisecond},
		{&cfg.LeaderLeaseTimeout, 250 * time.Millisecond},
		{&cfg.StandDownWait, time.Second},
		{&cfg.DiskProbeInterval, 5 * time.Second},
		{&cfg.DiskSlowThreshold, testDiskSlowThreshold},
		{&cfg.HoldTimeout, 5 * time.Second},
		{&cfg.HookTimeout, 30 * time.Second},
		{&cfg.Gossip.ReconcileEvery, 2 * time.Second},
	}
	for _, d := range durations {
		if *d.p == 0 {
			*d.p = d.v
		}
	}
	if cfg.SnapshotThreshold == 0 {
		cfg.SnapshotThreshold = 200_000
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = 100_000
	}
	if cfg.MaxInflightEntries == 0 {
		cfg.MaxInflightEntries = 1
	}
	if cfg.RaftHandshakesPerHost == 0 {
		cfg.RaftHandshakesPerHost = testRaftHandshakesPerHost
	}
	if cfg.Version == "" {
		cfg.Version = DefaultVersion
	}
	if cfg.LogStore == "" {
		cfg.LogStore = LogStoreAuto
	}
	if cfg.Gossip.ClusterID == "" {
		cfg.Gossip.ClusterID = DefaultClusterID
	}
	return cfg
}

// TestNewRefusesZeroSettings: New takes no defaults; a zero duration or
// count is refused with the setting's name, and nothing is created.
func TestNewRefusesZeroSettings(t *testing.T) {
	valid := func() Config {
		return testDefaults(Config{NodeID: "n1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:1"})
	}
	for _, tc := range []struct {
		name string
		zero func(*Config)
	}{
		{"GracePeriod", func(c *Config) { c.GracePeriod = 0 }},
		{"HeartbeatTimeout", func(c *Config) { c.HeartbeatTimeout = 0 }},
		{"ElectionTimeout", func(c *Config) { c.ElectionTimeout = 0 }},
		{"LeaderLeaseTimeout", func(c *Config) { c.LeaderLeaseTimeout = 0 }},
		{"SnapshotThreshold", func(c *Config) { c.SnapshotThreshold = 0 }},
		{"TrailingLogs", func(c *Config) { c.TrailingLogs = 0 }},
		{"MaxInflightEntries", func(c *Config) { c.MaxInflightEntries = 0 }},
		{"StandDownWait", func(c *Config) { c.StandDownWait = 0 }},
		{"DiskProbeInterval", func(c *Config) { c.DiskProbeInterval = 0 }},
		{"HoldTimeout", func(c *Config) { c.HoldTimeout = 0 }},
		{"HookTimeout", func(c *Config) { c.HookTimeout = 0 }},
		{"Version", func(c *Config) { c.Version = "" }},
		{"LogStore", func(c *Config) { c.LogStore = "" }},
		{"DiskSlowThreshold", func(c *Config) { c.DiskSlowThreshold = -time.Millisecond }},
		{"Gossip.ClusterID", func(c *Config) { c.Gossip.Port, c.Gossip.ClusterID = 7946, "" }},
		{"Gossip.ReconcileEvery", func(c *Config) { c.Gossip.Port, c.Gossip.ReconcileEvery = 7946, 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.zero(&cfg)
			n, err := New(cfg)
			if err == nil {
				n.Kill()
				t.Fatalf("New took a config without %s", tc.name)
			}
			if !strings.Contains(err.Error(), tc.name) {
				t.Errorf("error %q does not name %s", err, tc.name)
			}
			if ents, _ := os.ReadDir(cfg.DataDir); len(ents) != 0 {
				t.Errorf("refused config left %d files in the data directory", len(ents))
			}
		})
	}
	cfg := valid()
	cfg.DiskSlowThreshold = 0 // off: a meaning, not a missing value
	if err := cfg.Validate(); err != nil {
		t.Errorf("DiskSlowThreshold 0 (off) refused: %v", err)
	}
}
