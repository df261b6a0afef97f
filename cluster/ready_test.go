package cluster

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// Readiness (ready.go) with real raft over TCP on loopback.

// takeoverGate holds takeovers before they are proposed: a leader stamps
// its Takeover with Config.Now, so a Now that blocks while the gate is
// shut keeps the takeover of the term that just began from being proposed.
type takeoverGate struct {
	mu      sync.Mutex
	shut    chan struct{} // closed to let held takeovers go; nil: open
	entered chan string   // id of each node whose takeover is held
}

func newTakeoverGate() *takeoverGate { return &takeoverGate{entered: make(chan string, 16)} }

func (g *takeoverGate) now(id string) func() time.Time {
	return func() time.Time {
		g.mu.Lock()
		shut := g.shut
		g.mu.Unlock()
		if shut != nil {
			g.entered <- id
			<-shut
		}
		return time.Now()
	}
}

func (g *takeoverGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

func (g *takeoverGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

// held waits until a node's takeover is held by the gate and returns its id.
func (g *takeoverGate) held(t *testing.T) string {
	t.Helper()
	select {
	case id := <-g.entered:
		return id
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover reached the gate within 10s")
		return ""
	}
}

// gatedTCP is the raft TCP transport with a switch that holds back
// AppendEntries carrying log entries (heartbeats pass), so that an entry
// stays in flight; pipelining is refused so that every one comes here.
type gatedTCP struct {
	*raft.NetworkTransport
	mu   sync.Mutex
	shut chan struct{} // closed to let held entries go; nil: open
}

func newGatedTCP(t *testing.T, addr string) *gatedTCP {
	t.Helper()
	tr, err := raft.NewTCPTransport(addr, nil, 4, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return &gatedTCP{NetworkTransport: tr}
}

func (g *gatedTCP) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

func (g *gatedTCP) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if len(args.Entries) > 0 {
		g.mu.Lock()
		shut := g.shut
		g.mu.Unlock()
		if shut != nil {
			<-shut
		}
	}
	return g.NetworkTransport.AppendEntries(id, target, args, resp)
}

func (g *gatedTCP) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

func (g *gatedTCP) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

// rnode is one node of a readiness test cluster.
type rnode struct {
	id, dir, raftAddr string
	n                 *Node
	trans             *gatedTCP
}

// rcluster is a static-voter cluster over raft's TCP transport on
// loopback whose takeovers can be held (gate) and whose replication can be
// held (each node's gatedTCP).
type rcluster struct {
	t         *testing.T
	nodes     []*rnode
	voters    map[string]string
	gate      *takeoverGate
	takeovers chan takeoverEvent
	tune      func(*Config)
}

// newReadyCluster allocates size nodes; the test opens them (start) and
// runs them (Node.Start), or startAll does both.
func newReadyCluster(t *testing.T, size int, tune func(*Config)) *rcluster {
	t.Helper()
	c := &rcluster{t: t, voters: map[string]string{}, gate: newTakeoverGate(),
		takeovers: make(chan takeoverEvent, 64), tune: tune}
	for i := range size {
		rn := &rnode{id: fmt.Sprintf("n%d", i+1), dir: t.TempDir(), raftAddr: testutil.FreeAddr(t, "127.0.0.1")}
		c.nodes = append(c.nodes, rn)
		c.voters[rn.id] = rn.raftAddr
	}
	return c
}

// startAll opens and runs every node.
func (c *rcluster) startAll() {
	c.t.Helper()
	for i := range c.nodes {
		c.start(i).Start()
	}
}

// start opens node i on its data directory and returns before its
// goroutines run (Start is called at the end), so that a test sees the
// state raft restored at start-up.
func (c *rcluster) start(i int) *Node {
	c.t.Helper()
	rn := c.nodes[i]
	rn.trans = newGatedTCP(c.t, rn.raftAddr)
	cfg := testDefaults(Config{
		NodeID: rn.id, DataDir: rn.dir, RaftBind: rn.raftAddr, Transport: rn.trans, Voters: c.voters,
		Bootstrap: len(c.nodes) == 1,
		// Slower than raft's test defaults: three nodes under -race in one
		// process must not start elections of their own.
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond,
		Now:                c.gate.now(rn.id),
		Server: &funcServer{serve: func(_ context.Context, _ fsm.Takeover, state int32) error {
			c.takeovers <- takeoverEvent{node: rn.id, state: state, at: time.Now()}
			return nil
		}},
	})
	if len(c.nodes) == 1 {
		cfg.Voters = nil
	}
	if c.tune != nil {
		c.tune(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", rn.id, err)
	}
	rn.n = n
	c.t.Cleanup(func() { c.kill(i, n) })
	return n
}

// kill stops node i as a crash would; n guards against a node restarted since.
func (c *rcluster) kill(i int, n *Node) {
	c.gate.release() // a held takeover would keep the leader loop from stopping
	c.nodes[i].trans.release()
	n.Kill()
}

func (c *rcluster) waitTakeover() takeoverEvent {
	c.t.Helper()
	select {
	case ev := <-c.takeovers:
		return ev
	case <-time.After(10 * time.Second):
		c.t.Fatal("no takeover within 10s")
		return takeoverEvent{}
	}
}

// index returns the index of node id.
func (c *rcluster) index(id string) int {
	for i, rn := range c.nodes {
		if rn.id == id {
			return i
		}
	}
	c.t.Fatalf("no node %q", id)
	return -1
}

// allSee waits until every node in nodes knows leader id in term.
func (c *rcluster) allSee(id string, term uint64, nodes ...*rnode) {
	c.t.Helper()
	testutil.WaitFor(c.t, 5*time.Second, fmt.Sprintf("every node following %s in term %d", id, term), func() bool {
		for _, rn := range nodes {
			if _, l := rn.n.raft.LeaderWithID(); string(l) != id || rn.n.raft.CurrentTerm() != term {
				return false
			}
		}
		return true
	})
}

// allReady waits until every node in nodes is ready with sm_state state.
func (c *rcluster) allReady(state int32, nodes ...*rnode) {
	c.t.Helper()
	testutil.WaitFor(c.t, 5*time.Second, fmt.Sprintf("every node ready with sm_state %d", state), func() bool {
		for _, rn := range nodes {
			if !rn.n.Ready() || rn.n.fsm.State() != state {
				return false
			}
		}
		return true
	})
}

// noneReady fails if any of nodes is ready.
func noneReady(t *testing.T, when string, nodes ...*rnode) {
	t.Helper()
	for _, rn := range nodes {
		st, tt := rn.n.fsm.Incarnation()
		if rn.n.Ready() {
			_, l := rn.n.raft.LeaderWithID()
			t.Fatalf("%s: %s is ready (leader %q, term %d, takeover term %d, sm_state %d)",
				when, rn.id, l, rn.n.raft.CurrentTerm(), tt, st)
		}
	}
}

// A fresh node is not ready before its first takeover is applied (sm_state
// 0), also while it already leads; it is from the takeover on. Killed and
// restarted on its data directory (with a snapshot holding the old
// incarnation's state), it is not ready while it leads the new term with
// the old state, until the new takeover is applied.
func TestReadyOnlyOnceTheTermsTakeoverIsApplied(t *testing.T) {
	c := newReadyCluster(t, 1, nil)
	rn := c.nodes[0]
	c.gate.hold()
	c.start(0)
	noneReady(t, "just opened", rn)
	rn.n.Start()
	c.gate.held(t) // elected; the takeover is being stamped, not proposed
	if _, l := rn.n.raft.LeaderWithID(); l != "n1" || rn.n.fsm.State() != 0 {
		t.Fatalf("at the held takeover: leader %q, sm_state %d; want n1, 0", l, rn.n.fsm.State())
	}
	noneReady(t, "leading, takeover held", rn)
	c.gate.release()
	ev := c.waitTakeover() // OnLeader runs after the takeover is applied here
	if !rn.n.Ready() || ev.state != 1 || rn.n.fsm.TakeoverTerm() != rn.n.raft.CurrentTerm() {
		t.Fatalf("after the first takeover: ready %v, sm_state %d, takeover term %d, raft term %d",
			rn.n.Ready(), ev.state, rn.n.fsm.TakeoverTerm(), rn.n.raft.CurrentTerm())
	}
	if allocs := testing.AllocsPerRun(100, func() { rn.n.Ready() }); allocs != 0 {
		t.Errorf("Ready allocates %v times per call", allocs) // it runs for every NSM call
	}
	oldTerm := rn.n.raft.CurrentTerm()
	if err := rn.n.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	c.kill(0, rn.n)

	c.gate.hold()
	n := c.start(0)
	if st, tt := n.fsm.Incarnation(); st != 1 || tt != oldTerm {
		t.Fatalf("restarted from the snapshot: sm_state %d, takeover term %d; want 1, %d", st, tt, oldTerm)
	}
	noneReady(t, "restarted, old incarnation restored", rn)
	n.Start()
	c.gate.held(t)
	if _, l := n.raft.LeaderWithID(); l != "n1" || n.raft.CurrentTerm() <= oldTerm || n.fsm.State() != 1 {
		t.Fatalf("at the held takeover after restart: leader %q, term %d (old %d), sm_state %d", l, n.raft.CurrentTerm(), oldTerm, n.fsm.State())
	}
	noneReady(t, "leading the new term with the old sm_state", rn)
	c.gate.release()
	if ev := c.waitTakeover(); ev.state != 3 || !n.Ready() {
		t.Fatalf("after the restart's takeover: sm_state %d, ready %v; want 3, true", ev.state, n.Ready())
	}
}

// A follower restarted on its data directory, while the cluster moved on
// to a new term and incarnation, is not ready — not with the previous
// incarnation's state its snapshot holds, not once it hears the new
// leader — until it has applied the new term's takeover.
func TestReadyOnARestartedFollowerOnlyOnceItAppliedTheCurrentTakeover(t *testing.T) {
	c := newReadyCluster(t, 3, nil)
	c.startAll()
	first := c.waitTakeover()
	c.allReady(first.state, c.nodes...)
	li := c.index(first.node)
	fi, oi := (li+1)%3, (li+2)%3 // the follower to restart, the other one
	f := c.nodes[fi]
	oldTerm := f.n.raft.CurrentTerm()
	if err := f.n.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot on %s: %v", f.id, err)
	}
	c.kill(fi, f.n)

	// The other two move on: a new leader, a new incarnation.
	if err := c.nodes[li].n.TransferLeadership(c.nodes[oi].id); err != nil {
		t.Fatalf("transfer to %s: %v", c.nodes[oi].id, err)
	}
	next := c.waitTakeover()
	if next.node != c.nodes[oi].id || next.state != first.state+2 {
		t.Fatalf("takeover after the transfer: %+v, want %s with %d", next, c.nodes[oi].id, first.state+2)
	}

	n := c.start(fi)
	if st, tt := n.fsm.Incarnation(); st != first.state || tt != oldTerm {
		t.Fatalf("restarted follower: sm_state %d, takeover term %d; want the snapshot's %d, %d", st, tt, first.state, oldTerm)
	}
	noneReady(t, "restarted follower before its first heartbeat", f)
	// Sample as fast as possible from the start: ready only with the
	// current incarnation's state.
	stop := make(chan struct{})
	bad := make(chan string, 1)
	var samples, notReady atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				close(bad)
				return
			default:
			}
			samples.Add(1)
			if !n.Ready() {
				notReady.Add(1)
				continue
			}
			if st := n.fsm.State(); st != next.state {
				bad <- fmt.Sprintf("ready with sm_state %d, current incarnation is %d", st, next.state)
				close(bad)
				return
			}
		}
	}()
	n.Start()
	c.allReady(next.state, f)
	close(stop)
	if msg, ok := <-bad; ok {
		t.Fatal(msg)
	}
	if term := n.raft.CurrentTerm(); term == oldTerm || n.fsm.TakeoverTerm() != term {
		t.Fatalf("ready in term %d (old %d) with takeover term %d", term, oldTerm, n.fsm.TakeoverTerm())
	}
	t.Logf("restarted follower: %d of %d samples not ready", notReady.Load(), samples.Load())
}

// In a term whose leader has not committed its takeover — not yet
// proposed, then proposed and in flight — no node is ready, the new
// leader included; every node is once it committed.
func TestReadyNowhereWhileTheNewLeadersTakeoverIsNotCommitted(t *testing.T) {
	c := newReadyCluster(t, 3, nil)
	c.startAll()
	first := c.waitTakeover()
	c.allReady(first.state, c.nodes...)
	li := c.index(first.node)
	ti := (li + 1) % 3
	target := c.nodes[ti]

	c.gate.hold()
	if err := c.nodes[li].n.TransferLeadership(target.id); err != nil {
		t.Fatalf("transfer to %s: %v", target.id, err)
	}
	if id := c.gate.held(t); id != target.id {
		t.Fatalf("takeover held on %s, want %s", id, target.id)
	}
	term := target.n.raft.CurrentTerm()
	c.allSee(target.id, term, c.nodes...)
	noneReady(t, "new term, takeover not proposed", c.nodes...)

	// Let the takeover be proposed but not replicated: in flight.
	before := target.n.raft.LastIndex()
	target.trans.hold()
	c.gate.release()
	testutil.WaitFor(t, 5*time.Second, "the takeover stored on the leader", func() bool { return target.n.raft.LastIndex() > before })
	noneReady(t, "takeover in flight", c.nodes...)
	if st := target.n.fsm.State(); st != first.state {
		t.Fatalf("leader applied sm_state %d before its takeover committed", st)
	}

	target.trans.release()
	ev := c.waitTakeover()
	if ev.node != target.id || ev.state != first.state+2 {
		t.Fatalf("takeover %+v, want %s with %d", ev, target.id, first.state+2)
	}
	c.allReady(ev.state, c.nodes...)
}

// A witness that leads commits no takeover: while it leads, no node is
// ready. (The witness here is made to believe every other voter is a
// witness too, so it keeps leading until the test hands leadership on; it
// starts once the servers have elected one of them, so it cannot win the
// first election.)
func TestReadyNowhereWhileAWitnessLeads(t *testing.T) {
	c := newReadyCluster(t, 3, func(cfg *Config) {
		cfg.Witness = cfg.NodeID == "n3"
		cfg.Witnesses = []string{"n3"}
		if cfg.Witness {
			cfg.Witnesses = []string{"n1", "n2"} // no serving voter to hand off to
		}

	})
	c.start(0).Start()
	c.start(1).Start()
	first := c.waitTakeover()
	c.start(2).Start()
	c.allReady(first.state, c.nodes...)
	ld, w := c.nodes[c.index(first.node)], c.nodes[2]

	if err := ld.n.raft.LeadershipTransferToServer(raft.ServerID(w.id), raft.ServerAddress(w.raftAddr)).Error(); err != nil {
		t.Fatalf("raft transfer to the witness: %v", err)
	}
	testutil.WaitFor(t, 5*time.Second, "the witness leading", func() bool { return w.n.IsLeader() })
	term := w.n.raft.CurrentTerm()
	c.allSee(w.id, term, c.nodes...)
	noneReady(t, "witness leads", c.nodes...)

	if err := w.n.raft.LeadershipTransferToServer(raft.ServerID(ld.id), raft.ServerAddress(ld.raftAddr)).Error(); err != nil {
		t.Fatalf("raft transfer from the witness: %v", err)
	}
	ev := c.waitTakeover()
	if ev.node != ld.id || ev.state != first.state+2 {
		t.Fatalf("takeover %+v, want %s with %d", ev, ld.id, first.state+2)
	}
	c.allReady(ev.state, c.nodes...)
}

// TestCutOffLeaderStopsBeingReadyWithinItsLease: a leader cut off from
// both followers keeps raft's leader role for a while (until its lease
// check), and a process resumed from SIGSTOP keeps it until raft notices;
// Ready must not wait for either: it needs a quorum's confirmation within
// the lease (leaseLoop). Asserted: the cut-off leader is not Ready within
// two leases of the cut, and it is never Ready once another node has
// taken over.
func TestCutOffLeaderStopsBeingReadyWithinItsLease(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.waitTakeover(5 * time.Second)
	li, l := c.leader(5 * time.Second)
	testutil.WaitFor(t, 5*time.Second, "the leader is ready", l.n.Ready)
	lease := l.n.cfg.LeaderLeaseTimeout
	cut := time.Now()
	c.partition(li)
	testutil.WaitFor(t, 2*lease+50*time.Millisecond, "the cut-off leader stops being ready", func() bool { return !l.n.Ready() })
	t.Logf("cut-off leader not ready %v after the cut (lease %v); raft still says leader: %v", time.Since(cut).Round(time.Millisecond), lease, l.n.raft.State() == raft.Leader)
	ev := c.waitTakeover(5 * time.Second)
	if l.n.Ready() {
		t.Fatalf("old leader %s ready after %s took over", l.id, ev.node)
	}
	c.heal()
}

// TestFollowerReadStateNeverGoesBackAcrossATransfer: SM_STAT on a
// follower is confirmed by the leader (ReadState). A planned transfer
// elects within one round trip, before the third node hears of the new
// term; its local view would still be the old leader's, fresh and ready.
// Asserted: once the new leader has answered the new state, every
// ReadState the third node starts returns it (or no answer), never the
// previous one — checked around ten transfers.
func TestFollowerReadStateNeverGoesBackAcrossATransfer(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.waitTakeover(5 * time.Second)
	for round := range 10 {
		li, l := c.leader(5 * time.Second)
		target := c.nodes[(li+1)%3]
		third := c.nodes[(li+2)%3]
		testutil.WaitFor(t, 5*time.Second, "the third node is ready", third.n.Ready)
		old := l.n.View().State()
		stop := make(chan struct{})
		var newSeen atomic.Int64 // unix nanos when the new state was first answered by the new leader
		var bad atomic.Value
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				started := time.Now().UnixNano()
				st, err := third.n.Registry().ReadState(context.Background())
				if err == nil && st == old && newSeen.Load() != 0 && started > newSeen.Load() {
					bad.Store(fmt.Sprintf("round %d: %s answered %d, started after the new leader answered a newer state", round, third.id, st))
				}
			}
		}()
		// The new leader cannot reach the third node yet: the third keeps
		// its old, still fresh view of the old leader (as for a node that
		// just has not heard of the new term).
		ti, thi := (li+1)%3, (li+2)%3
		c.mu.Lock()
		c.cut[[2]int{min(ti, thi), max(ti, thi)}] = true
		c.mu.Unlock()
		c.relink()
		if err := l.n.TransferLeadership(target.id); err != nil {
			t.Fatalf("transfer to %s: %v", target.id, err)
		}
		ev := c.waitTakeover(5 * time.Second)
		if st, err := c.nodes[indexOf(c, ev.node)].n.Registry().ReadState(context.Background()); err == nil && st > old {
			newSeen.Store(time.Now().UnixNano())
		}
		time.Sleep(50 * time.Millisecond) // keep reading on the third node for a while: the window is after the takeover
		close(stop)
		wg.Wait()
		c.heal()
		if b := bad.Load(); b != nil {
			t.Fatal(b)
		}
	}
}

func indexOf(c *tcluster, id string) int {
	for i, tn := range c.nodes {
		if tn.id == id {
			return i
		}
	}
	return -1
}
