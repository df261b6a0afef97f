package cluster

import (
	"context"
	"fmt"
	"net"
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
}

// tcluster is an in-process cluster with raft over in-memory transports.
type tcluster struct {
	t         testing.TB
	nodes     []*tnode
	voters    map[string]string
	peerNSM   map[string]string
	takeovers chan takeoverEvent
	followers chan takeoverEvent // OnFollower calls

	mu      sync.Mutex
	cut     map[[2]int]bool // links cut by partition()
	tuneCfg func(*Config)
	// beforeStart, when set, runs between New (raft runs, linked to the
	// others) and Start of every node started.
	beforeStart func(*Node)
}

func newTestCluster(t testing.TB, size int, tune func(*Config)) *tcluster {
	t.Helper()
	c := &tcluster{t: t, voters: map[string]string{}, peerNSM: map[string]string{},
		takeovers: make(chan takeoverEvent, 256), followers: make(chan takeoverEvent, 256),
		cut: map[[2]int]bool{}, tuneCfg: tune}
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
	cfg := Config{
		NodeID: tn.id, DataDir: tn.dir, RaftBind: "127.0.0.1:1", NSMAddr: tn.nsmAddr,
		Voters: c.voters, PeerNSMAddrs: c.peerNSM, Transport: tn.trans,
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond, HoldTimeout: 2 * time.Second,
		ClusterKey: []byte("test-cluster-key"), // inmem raft addresses carry no IPs to match
		Notifier: nsm.NotifierConfig{Name: "nfs.test", InitialRTO: 50 * time.Millisecond,
			MaxRTO: 200 * time.Millisecond, Window: 2 * time.Second},
		OnLeader: func(_ context.Context, _ fsm.Takeover, state int32) error {
			c.takeovers <- takeoverEvent{node: tn.id, state: state, at: time.Now()}
			return nil
		},
		OnFollower: func() error { c.followers <- takeoverEvent{node: tn.id, at: time.Now()}; return nil },
	}
	if c.tuneCfg != nil {
		c.tuneCfg(&cfg)
	}
	n, err := New(cfg)
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
	want := ld.n.FSM().AppliedIndex()
	testutil.WaitForSeen(c.t, timeout, fmt.Sprintf("every live node to apply the leader's index %d", want), func() (bool, string) {
		for _, tn := range c.nodes {
			if tn.alive && tn.n.FSM().AppliedIndex() < want {
				return false, fmt.Sprintf("%s applied %d", tn.id, tn.n.FSM().AppliedIndex())
			}
		}
		return true, ""
	})
	d := ld.n.FSM().Digest()
	for _, tn := range c.nodes {
		if tn.alive && tn.n.FSM().AppliedIndex() == want && tn.n.FSM().Digest() != d {
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
