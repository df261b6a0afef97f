package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/timeline"
)

// machine stands in for a serving node's host in these tests: what its
// kernel serves, and its watchdog as the kernel keeps it (a ping on every
// keepalive and timeout change, one more when the process dies without
// the magic close, a reset at the deadline). A node "serves" from its
// OnLeader until its OnFollower succeeded; a killed node's host keeps
// serving until its watchdog resets it, as a real kernel keeps nfsd and
// the mount after nsmd died.
type machine struct {
	mu       sync.Mutex
	timeout  time.Duration
	armed    bool
	deadline time.Time
	feeds    int
	starves  int
	resetReq bool
	// serving intervals: from..until (until zero: still serving)
	from, until time.Time
	stopErr     error         // what OnFollower returns
	stopBlock   chan struct{} // OnFollower waits for it to close
	onStop      func() error  // OnFollower's work (nfsd's stop sending SM_UNMON)
	leaderErr   error         // what OnLeader returns
	reset       time.Time
	disarms     int
	// crashed: the process died; the host only keeps what it had (the
	// node's calls after that are the test's Kill, not a process's).
	crashed bool
}

func (m *machine) ping() { m.deadline = time.Now().Add(m.timeout) }

// checkLocked resets the machine once its armed watchdog's deadline has
// passed: it stops serving then, and nothing its process does after that
// happens.
func (m *machine) checkLocked() {
	if m.crashed || !m.armed || m.deadline.IsZero() || time.Now().Before(m.deadline) {
		return
	}
	m.crashed = true
	if !m.from.IsZero() && m.until.IsZero() {
		m.until, m.reset = m.deadline, m.deadline
	}
}

func (m *machine) Arm() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkLocked()
	if m.crashed {
		return nil
	}
	m.armed = true
	m.ping()
	return nil
}

func (m *machine) Feed() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkLocked()
	if m.crashed {
		return nil
	}
	if !m.armed {
		return errors.New("not armed")
	}
	m.feeds++
	m.ping()
	return nil
}

// Starve shrinks the timeout so a death's ping cannot move the deadline
// (the fence package does this on a real device).
func (m *machine) Starve() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkLocked()
	if m.crashed {
		return nil
	}
	m.starves++
	left := time.Until(m.deadline).Truncate(time.Second)
	if left >= time.Second {
		m.timeout = left
		m.ping()
	}
	return nil
}

func (m *machine) ResetSoon() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkLocked()
	if m.crashed {
		return nil
	}
	m.resetReq = true
	m.timeout = time.Second
	m.ping()
	return nil
}

func (m *machine) Disarm() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkLocked()
	if m.crashed {
		return nil
	}
	m.disarms++
	m.armed = false
	m.deadline = time.Time{}
	return nil
}

func (m *machine) Release() error { return m.Disarm() }

// died plays the process's death: an armed watchdog is pinged once more by
// the kernel's close, and the host keeps serving until the deadline.
func (m *machine) died() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.crashed = true
	if m.armed {
		m.ping()
		if !m.from.IsZero() && m.until.IsZero() {
			m.until = m.deadline // reset then
			m.reset = m.deadline
		}
	}
}

func (m *machine) serveFrom(at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.from, m.until = at, time.Time{}
}

func (m *machine) stopped(at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkLocked()
	if m.until.IsZero() && !m.crashed {
		m.until = at
	}
}

// servedUntil is when this host stopped serving (reset or stopped); zero:
// it still serves (or serves forever: no watchdog stops it).
func (m *machine) servedUntil() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkLocked()
	return m.until
}

// fencedCluster is a test cluster whose nodes serve on machines with
// watchdogs (fenceTimeout 0: no watchdog, fencing off unless agent).
type fencedCluster struct {
	*tcluster
	machines map[string]*machine
}

func newFencedCluster(t *testing.T, size int, fenceTimeout time.Duration, tune func(*Config)) *fencedCluster {
	return newFencedClusterEach(t, size, func(string) time.Duration { return fenceTimeout }, tune)
}

// newFencedClusterEach is newFencedCluster with each node's own watchdog
// timeout (0: that node runs with fence_watchdog off). Every node serves
// storage (an on_leader hook).
func newFencedClusterEach(t *testing.T, size int, timeoutOf func(id string) time.Duration, tune func(*Config)) *fencedCluster {
	fc := &fencedCluster{machines: map[string]*machine{}}
	for i := range size {
		id := fmt.Sprintf("n%d", i+1)
		fc.machines[id] = &machine{timeout: timeoutOf(id)}
	}
	fc.tcluster = newTestCluster(t, size, func(cfg *Config) {
		m := fc.machines[cfg.NodeID]
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 300*time.Millisecond, 300*time.Millisecond, 150*time.Millisecond
		cfg.ServesStorage = true
		if ft := timeoutOf(cfg.NodeID); ft > 0 {
			cfg.Watchdog, cfg.FenceTimeout = m, ft
		}
		srv := serverOf(cfg)
		prevLeader := srv.serve
		srv.serve = func(ctx context.Context, tk fsm.Takeover, state int32) error {
			m.mu.Lock()
			err := m.leaderErr
			m.mu.Unlock()
			m.serveFrom(time.Now())
			perr := prevLeader(ctx, tk, state) // the harness's takeover event
			if err != nil {
				m.stopped(time.Now())
				return err
			}
			return perr
		}
		srv.stop = func(StopReason) error {
			m.mu.Lock()
			err, block, work := m.stopErr, m.stopBlock, m.onStop
			m.mu.Unlock()
			if block != nil {
				<-block
			}
			if work != nil && err == nil {
				err = work()
			}
			if err == nil {
				m.stopped(time.Now())
			}
			return err
		}
		if tune != nil {
			tune(cfg)
		}
	})
	return fc
}

// killNode kills node i as SIGKILL would: its host keeps what it served
// until its watchdog resets it.
func (fc *fencedCluster) killNode(i int) {
	fc.machines[fc.nodes[i].id].died()
	fc.kill(i)
}

func TestSuccessorWaitsUntilAKilledServersWatchdogMustHaveResetIt(t *testing.T) {
	const fenceTimeout = 2 * time.Second
	fc := newFencedCluster(t, 3, fenceTimeout, nil)
	first := fc.waitTakeover(10 * time.Second)
	li := nodeIndex(fc.tcluster, first.node)
	old := fc.machines[first.node]
	testutil.WaitFor(t, 5*time.Second, "the leader feeds its watchdog", func() bool {
		old.mu.Lock()
		defer old.mu.Unlock()
		return old.armed && old.feeds > 0
	})
	fc.killNode(li)
	next := fc.waitTakeover(20 * time.Second)
	resetAt := old.servedUntil()
	if resetAt.IsZero() {
		t.Fatal("the killed leader's host was not serving")
	}
	if next.at.Before(resetAt) {
		t.Fatalf("%s started serving at %s, %v before %s's watchdog reset it: two servers", next.node, next.at.Format(time.StampMilli), resetAt.Sub(next.at), first.node)
	}
	w := fc.nodes[nodeIndex(fc.tcluster, next.node)].n.FenceStatus().LastWait
	if w == nil || len(w.Nodes) != 2 {
		t.Fatalf("last wait = %+v, want two other serving nodes", w)
	}
	for _, p := range w.Nodes {
		want := "clean"
		if p.Node == first.node {
			want = "watchdog"
		}
		if p.By != want {
			t.Errorf("%s proven stopped by %q, want %q", p.Node, p.By, want)
		}
	}
	t.Logf("reset at +%v after the kill's ping; successor served %v after that", fenceTimeout, next.at.Sub(resetAt).Round(time.Millisecond))
}

// TestTheVIPMovesOnlyOnceTheOldServerIsProvenStopped: the VIP's own wait
// (none here: lifetime 0) ends at once, the fence wait for a killed server
// lasts its watchdog's bound; the successor takes the address only when
// that proof came, right before it serves, and its timeline shows the
// proof. Taken at the start of the wait (as the address's own wait
// allows), clients would be refused for the whole wait.
func TestTheVIPMovesOnlyOnceTheOldServerIsProvenStopped(t *testing.T) {
	vips := map[string]*lifeVIP{}
	var mu sync.Mutex
	fc := newFencedCluster(t, 3, 2*time.Second, func(cfg *Config) {
		mu.Lock()
		defer mu.Unlock()
		vips[cfg.NodeID] = &lifeVIP{}
		cfg.VIP = vips[cfg.NodeID]
	})
	first := fc.waitTakeover(10 * time.Second)
	fc.killNode(nodeIndex(fc.tcluster, first.node))
	next := fc.waitTakeover(20 * time.Second)
	n := fc.nodes[nodeIndex(fc.tcluster, next.node)].n
	tl := n.LastTimeline()
	elected, fenced, vipAt := tl.At(timeline.Elected), tl.At(timeline.Fenced), tl.At(timeline.VIP)
	mu.Lock()
	taken := time.Unix(0, vips[next.node].taken.Load())
	mu.Unlock()
	if fenced.IsZero() {
		t.Fatalf("%s's timeline has no fence proof: %+v", next.node, tl.Reached())
	}
	if w := n.FenceStatus().LastWait; fencedBy(w, first.node).By != "watchdog" {
		t.Fatalf("%s proven stopped by %+v, want its watchdog's bound", first.node, fencedBy(w, first.node))
	}
	if taken.Before(fenced) {
		t.Fatalf("%s took the VIP %v after its election, %v before %s was proven stopped", next.node, taken.Sub(elected).Round(time.Millisecond), fenced.Sub(taken).Round(time.Millisecond), first.node)
	}
	if vipAt.Before(fenced) || next.at.Before(vipAt) {
		t.Fatalf("timeline out of order: fenced %s, VIP %s, served %s", fenced.Format(time.StampMilli), vipAt.Format(time.StampMilli), next.at.Format(time.StampMilli))
	}
	t.Logf("elected → proven stopped %v, → VIP %v, → serving %v", fenced.Sub(elected).Round(time.Millisecond), vipAt.Sub(fenced).Round(time.Millisecond), next.at.Sub(vipAt).Round(time.Millisecond))
}

// With fencing off everywhere (no watchdog, no agent) a killed server
// promised nothing: the successor serves only once an operator confirms
// it off. The negative control, the successor waiting by its own settings
// (off: nothing), serves beside the killed server whose host still serves.
func TestWithFencingOffASuccessorServesOnlyOnceAnOperatorConfirms(t *testing.T) {
	t.Run("promise", func(t *testing.T) {
		fc := newFencedCluster(t, 3, 0, nil)
		first := fc.waitTakeover(10 * time.Second)
		fc.killNode(nodeIndex(fc.tcluster, first.node))
		li, ln := fc.leader(10 * time.Second)
		testutil.WaitFor(t, 5*time.Second, "the new leader to wait for the killed server", func() bool {
			return slices.Contains(ln.n.Promises().Unproven, first.node)
		})
		select {
		case ev := <-fc.takeovers:
			t.Fatalf("%s served beside the killed %s, which promised nothing and was not confirmed off", ev.node, first.node)
		case <-time.After(3 * time.Second):
		}
		var follower *tnode
		for i, tn := range fc.nodes {
			if i != li && tn.alive {
				follower = tn
			}
		}
		if err := follower.n.ConfirmOff(context.Background(), first.node, "test operator"); err != nil {
			t.Fatalf("confirm through the follower %s: %v", follower.id, err)
		}
		confirmedAt := time.Now()
		next := fc.waitTakeover(10 * time.Second)
		if next.at.Before(confirmedAt.Add(-time.Second)) {
			t.Fatalf("%s served at %v, before the confirmation at %v", next.node, next.at, confirmedAt)
		}
		w := fc.nodes[nodeIndex(fc.tcluster, next.node)].n.FenceStatus().LastWait
		if p := fencedBy(w, first.node); p.By != "confirmed" || !strings.Contains(p.Detail, "test operator") {
			t.Fatalf("%s proven stopped by %+v, want the operator's confirmation", first.node, p)
		}
		// The live third server, which promised nothing either, was asked
		// (with fencing off on the asker too) and answered.
		for _, p := range w.Nodes {
			if p.Node != first.node && p.By != "clean" {
				t.Errorf("the live %s proven stopped by %+v, want its answer", p.Node, p)
			}
		}
		if len(w.Nodes) != 2 {
			t.Errorf("the wait named %d nodes, want both other servers", len(w.Nodes))
		}
	})
	t.Run("control: own settings only", func(t *testing.T) {
		fc := newFencedCluster(t, 3, 0, func(cfg *Config) { cfg.ownSettingsOnly = true })
		first := fc.waitTakeover(10 * time.Second)
		fc.killNode(nodeIndex(fc.tcluster, first.node))
		next := fc.waitTakeover(20 * time.Second)
		if until := fc.machines[first.node].servedUntil(); !until.IsZero() && !next.at.Before(until) {
			t.Fatalf("the control would miss it: old host stopped at %v, successor at %v", until, next.at)
		}
		t.Logf("caught: %s serves from %s while the killed %s still does", next.node, next.at.Format(time.StampMilli), first.node)
	})
}

// fencedBy is how w proved node stopped (zero when w does not name it).
func fencedBy(w *FenceWait, node string) FencedPeer {
	if w == nil {
		return FencedPeer{}
	}
	for _, p := range w.Nodes {
		if p.Node == node {
			return p
		}
	}
	return FencedPeer{}
}

func TestSuccessorServesAtOnceAfterACleanStop(t *testing.T) {
	fc := newFencedCluster(t, 3, 5*time.Second, nil)
	first := fc.waitTakeover(10 * time.Second)
	li := nodeIndex(fc.tcluster, first.node)
	start := time.Now()
	if err := fc.nodes[li].n.TransferLeadership(""); err != nil {
		t.Fatal(err)
	}
	next := fc.waitTakeover(10 * time.Second)
	if took := next.at.Sub(start); took > 3*time.Second {
		t.Fatalf("planned move took %v: the successor waited for a fence instead of the clean stop", took)
	}
	if stopped := fc.machines[first.node].servedUntil(); stopped.IsZero() || next.at.Before(stopped) {
		t.Fatalf("successor served at %v, old stopped at %v", next.at, stopped)
	}
	w := fc.nodes[nodeIndex(fc.tcluster, next.node)].n.FenceStatus().LastWait
	if w == nil {
		t.Fatalf("%s served at %v, after %s, and recorded no fence wait", next.node, next.at, first.node)
	}
	for _, p := range w.Nodes {
		if p.By != "clean" {
			t.Errorf("%s proven stopped by %q after a planned move, want clean", p.Node, p.By)
		}
	}
	m := fc.machines[first.node]
	m.mu.Lock()
	armed := m.armed
	m.mu.Unlock()
	if armed {
		t.Error("the old leader's watchdog is still armed after its clean stop")
	}
}

func TestFenceAgentLetsTheSuccessorServeBeforeTheWatchdogWait(t *testing.T) {
	var calls atomic.Int32
	var fenced sync.Map
	fc := &fencedCluster{}
	fc = newFencedCluster(t, 3, 30*time.Second, func(cfg *Config) {
		cfg.FenceAgent = func(ctx context.Context, node string, onAttempt func(int, error)) error {
			for try := 1; ; try++ {
				n := calls.Add(1)
				if n <= 2 { // the device fails twice, then works
					onAttempt(try, errors.New("device busy"))
					continue
				}
				fenced.Store(node, time.Now())
				fc.machines[node].stopped(time.Now()) // powered off
				return nil
			}
		}
	})
	first := fc.waitTakeover(10 * time.Second)
	killedAt := time.Now()
	fc.killNode(nodeIndex(fc.tcluster, first.node))
	next := fc.waitTakeover(20 * time.Second)
	if took := next.at.Sub(killedAt); took > 10*time.Second {
		t.Fatalf("successor served %v after the kill: it waited for the 30 s watchdog bound, not the agent", took)
	}
	at, ok := fenced.Load(first.node)
	if !ok || next.at.Before(at.(time.Time)) {
		t.Fatalf("successor served at %v before the agent fenced %s (%v)", next.at, first.node, at)
	}
	w := fc.nodes[nodeIndex(fc.tcluster, next.node)].n.FenceStatus().LastWait
	if w == nil {
		t.Fatalf("%s served at %v, after %s, and recorded no fence wait", next.node, next.at, first.node)
	}
	for _, p := range w.Nodes {
		if p.Node == first.node && p.By != "agent" {
			t.Errorf("%s proven stopped by %q, want agent", p.Node, p.By)
		}
	}
}

func TestAFailingFenceAgentKeepsTheSuccessorFromServing(t *testing.T) {
	var tries atomic.Int32
	fc := newFencedCluster(t, 3, 2*time.Second, func(cfg *Config) {
		cfg.FenceAgent = func(ctx context.Context, node string, onAttempt func(int, error)) error {
			for try := 1; ; try++ {
				tries.Add(1)
				onAttempt(try, errors.New("no route to the power switch"))
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
	})
	first := fc.waitTakeover(10 * time.Second)
	fc.killNode(nodeIndex(fc.tcluster, first.node))
	select {
	case ev := <-fc.takeovers:
		t.Fatalf("%s served although no fence succeeded", ev.node)
	case <-time.After(6 * time.Second): // well past the 2 s watchdog bound
	}
	if tries.Load() < 3 {
		t.Fatalf("the agent was tried %d times, want retries", tries.Load())
	}
}

func TestAFailedStopResetsTheNodeAndTheSuccessorDoesNotTrustIt(t *testing.T) {
	fc := newFencedCluster(t, 3, 2*time.Second, nil)
	first := fc.waitTakeover(10 * time.Second)
	li := nodeIndex(fc.tcluster, first.node)
	old := fc.machines[first.node]
	old.mu.Lock()
	old.stopErr = errors.New("umount: target is busy")
	old.mu.Unlock()
	if err := fc.nodes[li].n.TransferLeadership(""); err != nil {
		t.Fatal(err)
	}
	// The harness cannot power the old node's process off when its fake
	// watchdog fires: a takeover by it afterwards is that artefact.
	next := fc.waitTakeover(20 * time.Second)
	for next.node == first.node {
		next = fc.waitTakeover(20 * time.Second)
	}
	testutil.WaitFor(t, 5*time.Second, "the stop to fail", func() bool { return fc.nodes[li].n.FenceStatus().StopFailed })
	until := old.servedUntil()
	old.mu.Lock()
	resetReq, reset := old.resetReq, old.reset
	old.mu.Unlock()
	// On a busy machine the watchdog may have fired before the stop even
	// failed; either way the node was reset, not trusted.
	if !resetReq && reset.IsZero() {
		t.Fatal("a failed stop did not ask the watchdog to reset the node")
	}
	if until.IsZero() || next.at.Before(until) {
		old.mu.Lock()
		t.Logf("old %s: armed %v deadline %v crashed %v feeds %d starves %d from %v", first.node, old.armed, old.deadline, old.crashed, old.feeds, old.starves, old.from)
		old.mu.Unlock()
		t.Fatalf("%s served at %v, before the node whose stop failed was reset (%v)", next.node, next.at, until)
	}
}

func TestAPartitionedLeaderStopsFeedingItsWatchdog(t *testing.T) {
	fc := newFencedCluster(t, 3, 3*time.Second, nil)
	first := fc.waitTakeover(10 * time.Second)
	li := nodeIndex(fc.tcluster, first.node)
	m := fc.machines[first.node]
	testutil.WaitFor(t, 5*time.Second, "fed", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.feeds > 0 })
	// The stop hangs, as an unmount behind a hung disk would: only the
	// watchdog can end this node's serving.
	block := make(chan struct{})
	defer close(block)
	m.mu.Lock()
	m.stopBlock = block
	m.mu.Unlock()
	cut := time.Now()
	fc.partition(li)
	testutil.WaitFor(t, 5*time.Second, "starved", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.starves > 0 })
	m.mu.Lock()
	feeds, deadline := m.feeds, m.deadline
	m.mu.Unlock()
	// No event says "no more feeds": watch for a while.
	testutil.HoldsFor(t, time.Second, 20*time.Millisecond, "a starved watchdog", func() (bool, string) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.feeds != feeds {
			return false, fmt.Sprintf("fed %d more times after losing its quorum", m.feeds-feeds)
		}
		if m.deadline.After(deadline) {
			return false, fmt.Sprintf("starving moved the reset deadline from %v to %v", deadline, m.deadline)
		}
		return true, ""
	})
	if bound := cut.Add(300*time.Millisecond + 3*time.Second + time.Second); deadline.After(bound) {
		t.Fatalf("reset deadline %v is after cut + heartbeat timeout + fence timeout (%v)", deadline, bound)
	}
}

func TestAFailedOnLeaderHandsLeadershipOnAndNotifiesNobody(t *testing.T) {
	fc := newFencedCluster(t, 3, 2*time.Second, nil)
	first := fc.waitTakeover(10 * time.Second)
	li := nodeIndex(fc.tcluster, first.node)
	// The node leadership moves to fails to start serving.
	target := fc.nodes[(li+1)%3]
	m := fc.machines[target.id]
	m.mu.Lock()
	m.leaderErr = errors.New("rpc.nfsd failed")
	m.mu.Unlock()
	if err := fc.nodes[li].n.TransferLeadership(target.id); err != nil {
		t.Fatal(err)
	}
	bad := fc.waitTakeover(10 * time.Second)
	if bad.node != target.id {
		t.Fatalf("%s took over, want %s", bad.node, target.id)
	}
	next := fc.waitTakeover(15 * time.Second)
	if next.node == bad.node {
		t.Fatalf("%s served after its on_leader failed instead of handing on", bad.node)
	}
	bt := fc.nodes[nodeIndex(fc.tcluster, bad.node)]
	bn := bt.n
	if st, _ := bt.nt.Current(); st == bad.state {
		t.Fatalf("%s notified clients with sm_state %d after a failed on_leader", bad.node, st)
	}
	if bn.FenceStatus().Serving {
		t.Fatalf("%s still says it serves after stopping", bad.node)
	}
}

func TestARestartedNodeSaysItServesUntilItsStopAtStartSucceeded(t *testing.T) {
	release := make(chan struct{})
	var started atomic.Bool
	fc := newFencedCluster(t, 3, 2*time.Second, func(cfg *Config) {
		if cfg.NodeID == "n3" {
			cfg.StopAtStart = true
			srv := serverOf(cfg)
			stop := srv.stop
			srv.stop = func(why StopReason) error {
				if why != StopStart {
					return stop(why)
				}
				started.Store(true)
				<-release
				return nil
			}
		}
	})
	n3 := fc.nodes[2]
	testutil.WaitFor(t, 5*time.Second, "stop at start running", started.Load)
	if !askServing(t, n3.id, n3.nsmAddr) || !n3.n.FenceStatus().Serving {
		t.Fatal("n3 says it does not serve while its stop at start still runs")
	}
	close(release)
	testutil.WaitFor(t, 5*time.Second, "n3 says it does not serve", func() bool {
		return !n3.n.FenceStatus().Serving && (n3.n.IsLeader() || !askServing(t, n3.id, n3.nsmAddr))
	})
	m := fc.machines["n3"]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.disarms == 0 || (m.armed && m.from.IsZero()) {
		t.Error("the watchdog a previous process may have left running was not disarmed after the stop")
	}
}

// askServing asks the test cluster's node id at addr, as a peer would
// (with the test cluster's key).
func askServing(t testing.TB, id, addr string) bool {
	t.Helper()
	n := &Node{cfg: Config{PeerNSMAddrs: map[string]string{id: addr}, ClusterKey: []byte("test-cluster-key")}}
	v, err := n.askServing(context.Background(), id)
	if err != nil {
		return true // cannot ask: not proven stopped
	}
	return v
}

func nodeIndex(c *tcluster, id string) int {
	for i, tn := range c.nodes {
		if tn.id == id {
			return i
		}
	}
	c.t.Fatalf("no node %s", id)
	return -1
}

// The last server of a pair stops (SIGTERM) with its peer gone: nobody to
// hand over to. Its on_follower stops nfsd, whose lockd sends SM_UNMON to
// this node: the term must end while raft still commits (the witness
// makes the quorum), or the stop hangs and the watchdog resets the node.
func TestTheLastServerStopsCleanlyWhileItsSMUnmonStillCommits(t *testing.T) {
	fc := newFencedCluster(t, 3, 2*time.Second, func(cfg *Config) {
		cfg.Witnesses = []string{"n3"}
		cfg.Witness = cfg.NodeID == "n3"
	})
	first := fc.waitTakeover(10 * time.Second)
	li := nodeIndex(fc.tcluster, first.node)
	fc.kill(1 - li) // the pair's other server (n1 ↔ n2)
	tn := fc.nodes[li]
	m := fc.machines[tn.id]
	// lockd monitors a client through this node (its SM_MON).
	reg := testReg("10.77.0.50", tn.id, 7)
	reg.ID.My.MyName = tn.id
	ctx0, cancel0 := context.WithTimeout(context.Background(), 5*time.Second)
	if _, err := tn.n.Registry().Monitor(ctx0, reg); err != nil {
		t.Fatal(err)
	}
	cancel0()
	var unmonErr error
	m.mu.Lock()
	m.onStop = func() error {
		time.Sleep(300 * time.Millisecond) // rpc.nfsd 0's work before lockd's SM_UNMON
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, unmonErr = tn.n.Registry().UnmonitorAll(ctx, fsm.MyID{MyName: tn.id, Prog: 100021, Vers: 3, Proc: 16}, fsm.Owner{Node: tn.id})
		return unmonErr
	}
	m.mu.Unlock()
	start := time.Now()
	tn.alive = false
	if err := tn.n.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	tn.srv.Shutdown(ctx)
	cancel()
	if unmonErr != nil {
		t.Fatalf("SM_UNMON during the last server's stop failed: %v (its stop would hang)", unmonErr)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.until.IsZero() || m.crashed || m.armed {
		t.Fatalf("the last server did not stop cleanly: stopped %v, reset %v, armed %v", m.until, m.crashed, m.armed)
	}
	t.Logf("stopped cleanly %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}

// forgingPeer answers SERVING "not serving" with a MAC made by mac from
// the asker's nonce (nil: no MAC).
type forgingPeer struct {
	mac func(nonce []byte) []byte
}

func (f forgingPeer) ServeRPC(_ context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	var args servingArgs
	if err := args.UnmarshalXDR(c.Args); err != nil {
		return err
	}
	out := servingRes{Serving: false}
	if f.mac != nil {
		out.MAC = f.mac(args.Nonce)
	}
	out.MarshalXDR(res)
	return nil
}

// startPeer serves the forward program with h on a loopback port until
// the test ends, and returns its address.
func startPeer(t *testing.T, h oncrpc.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := oncrpc.NewServer(oncrpc.Programs{ForwardProgram: h}, oncrpc.ServerConfig{})
	go srv.ServeTCP(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return ln.Addr().String()
}

// TestForgedNotServingAnswersAreNotBelieved: a new leader starts serving
// once the old server answers that it does not serve, so that answer must
// come from that node, now. Whoever can reach the asker's TCP connection
// to a peer's NSM port — a host on the cluster network that spoofs the
// peer, a replay of an answer recorded earlier — could otherwise make two
// servers serve. "Not serving" without a MAC, with another key's, made for
// another nonce (a replay) or by another node is not believed (the asker
// keeps asking, then fences); the control, the right MAC, is.
func TestForgedNotServingAnswersAreNotBelieved(t *testing.T) {
	key := []byte("test-cluster-key")
	recorded := make([]byte, servingNonceLen) // an answer to an earlier question
	for _, tc := range []struct {
		name    string
		mac     func(nonce []byte) []byte
		believe bool
	}{
		{"no MAC", nil, false},
		{"another key", func(nonce []byte) []byte { return servingMAC([]byte("other-key"), "n1", nonce, false) }, false},
		{"replayed", func([]byte) []byte { return servingMAC(key, "n1", recorded, false) }, false},
		{"another node's", func(nonce []byte) []byte { return servingMAC(key, "n2", nonce, false) }, false},
		{"MAC says serving", func(nonce []byte) []byte { return servingMAC(key, "n1", nonce, true) }, false},
		{"control: n1's own", func(nonce []byte) []byte { return servingMAC(key, "n1", nonce, false) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asker := &Node{cfg: Config{NodeID: "n3", PeerNSMAddrs: map[string]string{"n1": startPeer(t, forgingPeer{tc.mac})}, ClusterKey: key}}
			serving, err := asker.askServing(context.Background(), "n1")
			switch {
			case tc.believe && (err != nil || serving):
				t.Fatalf("n1's own answer: serving %v, err %v; want believed: not serving", serving, err)
			case !tc.believe && !errors.Is(err, errServingUnproven):
				t.Fatalf("a forged answer gave serving %v, err %v; want errServingUnproven", serving, err)
			}
		})
	}
}
