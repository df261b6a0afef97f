package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// funcServer is a Server made of funcs (nil: nothing to do) for tests.
type funcServer struct {
	serve func(ctx context.Context, t fsm.Takeover, state int32) error
	stop  func(why StopReason) error
	fault func(reason string, err error)
}

func (s *funcServer) Serve(ctx context.Context, t fsm.Takeover, state int32) error {
	if s.serve == nil {
		return nil
	}
	return s.serve(ctx, t, state)
}

func (s *funcServer) Stop(why StopReason) error {
	if s.stop == nil {
		return nil
	}
	return s.stop(why)
}

func (s *funcServer) Fault(reason string, err error) {
	if s.fault != nil {
		s.fault(reason, err)
	}
}

// serverOf is cfg's funcServer, made one if it has none (tests that wrap
// what a harness installed).
func serverOf(cfg *Config) *funcServer {
	if s, ok := cfg.Server.(*funcServer); ok {
		return s
	}
	s := &funcServer{}
	cfg.Server = s
	return s
}

// takeovers collects Server.Serve calls so tests wait on the event itself.
type takeovers struct {
	ch chan int32
}

func newTakeovers() *takeovers { return &takeovers{ch: make(chan int32, 16)} }

func (tk *takeovers) onLeader(_ context.Context, _ fsm.Takeover, state int32) error {
	tk.ch <- state
	return nil
}

func (tk *takeovers) wait(t testing.TB) int32 {
	t.Helper()
	select {
	case s := <-tk.ch:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover within 10s")
		return 0
	}
}

func startNode(t testing.TB, dir, addr string, tk *takeovers) *Node {
	t.Helper()
	n, err := New(testDefaults(Config{
		NodeID: "n1", DataDir: dir, RaftBind: addr, Bootstrap: true,
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond, Server: &funcServer{serve: tk.onLeader},
	}))
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	return n
}

func reg(i int) fsm.Registration {
	return fsm.Registration{
		ID:       fsm.MonID{MonName: fmt.Sprintf("10.77.%d.%d", i/250, i%250+1), My: fsm.MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}},
		Priv:     [16]byte{byte(i), byte(i >> 8)},
		Node:     "n1",
		Callback: netip.MustParseAddr("127.0.0.1"),
		Added:    time.Unix(1700000000, 0).UTC(),
	}
}

// lockdOn is the lock manager on node's loopback, as the NSM service
// names the caller of an SM_UNMON.
func lockdOn(node string) fsm.Owner {
	return fsm.Owner{Node: node, Callback: netip.MustParseAddr("127.0.0.1")}
}

// TestRestartRaisesStateByTwoAndKeepsRegistrations: a node restarted on
// its data directory is a rebooted server (DESIGN.md invariant 2): the
// takeover after the restart raises sm_state by exactly 2, odd, and every
// acknowledged registration is still there (invariant 1).
func TestRestartRaisesStateByTwoAndKeepsRegistrations(t *testing.T) {
	dir, addr := t.TempDir(), testutil.FreeAddr(t, "127.0.0.1")
	tk := newTakeovers()
	n := startNode(t, dir, addr, tk)
	s1 := tk.wait(t)
	if s1 != 1 {
		t.Fatalf("first takeover of a new cluster: sm_state %d, want 1", s1)
	}
	ctx := context.Background()
	for i := range 20 {
		st, err := n.Registry().Monitor(ctx, reg(i))
		if err != nil || st != s1 {
			t.Fatalf("Monitor %d: state %d err %v", i, st, err)
		}
	}
	if _, err := n.Registry().Unmonitor(ctx, reg(3).ID, lockdOn("n1")); err != nil {
		t.Fatal(err)
	}
	digest := n.fsm.Digest()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n2 := startNode(t, dir, addr, tk)
	defer n2.Close()
	s2 := tk.wait(t)
	if s2 != s1+2 {
		t.Errorf("sm_state after restart %d, want %d", s2, s1+2)
	}
	if got := n2.fsm.Len(); got != 19 {
		t.Errorf("registrations after restart: %d, want 19", got)
	}
	if _, ok := n2.fsm.Get(reg(3).ID); ok {
		t.Error("unmonitored registration came back after restart")
	}
	if n2.fsm.Digest() == digest {
		t.Error("state digest unchanged although a takeover was applied")
	}
}

// TestConcurrentWritesAreGroupedAndEachWaitsForItsCommit: 64 writers at
// once; every write returns only after its own commit (it is readable from
// the FSM when Monitor returns) and log entries carry more than one command.
func TestConcurrentWritesAreGroupedAndEachWaitsForItsCommit(t *testing.T) {
	tk := newTakeovers()
	n := startNode(t, t.TempDir(), testutil.FreeAddr(t, "127.0.0.1"), tk)
	defer n.Close()
	tk.wait(t)
	before := n.raft.LastIndex()
	const writers, each = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				r := reg(w*each + i)
				if _, err := n.Registry().Monitor(context.Background(), r); err != nil {
					errs <- err
					return
				}
				if _, ok := n.fsm.Get(r.ID); !ok {
					errs <- fmt.Errorf("registration %s not applied when Monitor returned", r.ID.MonName)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := n.fsm.Len(); got != writers*each {
		t.Fatalf("registrations %d, want %d", got, writers*each)
	}
	entries := n.raft.LastIndex() - before
	if entries >= writers*each {
		t.Errorf("%d writes took %d log entries: no group commit", writers*each, entries)
	}
	t.Logf("%d writes in %d log entries", writers*each, entries)
}

// TestWriteOnClosedNodeFails: writes after Close fail fast, never hang.
func TestWriteOnClosedNodeFails(t *testing.T) {
	tk := newTakeovers()
	n := startNode(t, t.TempDir(), testutil.FreeAddr(t, "127.0.0.1"), tk)
	tk.wait(t)
	n.Close()
	if _, err := n.Registry().Monitor(context.Background(), reg(1)); err == nil {
		t.Fatal("Monitor on a closed node succeeded")
	}
}

func BenchmarkMonitor(b *testing.B) {
	for _, conc := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("writers=%d", conc), func(b *testing.B) {
			tk := newTakeovers()
			n := startNode(b, b.TempDir(), testutil.FreeAddr(b, "127.0.0.1"), tk)
			defer n.Close()
			tk.wait(b)
			var mu sync.Mutex
			next := 0
			b.SetParallelism(max(1, conc/runtime.GOMAXPROCS(0))) // goroutines = conc
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					mu.Lock()
					i := next
					next++
					mu.Unlock()
					if _, err := n.Registry().Monitor(context.Background(), reg(i)); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		})
	}
}

// fixedVIP is a FloatingAddr with a lifetime and nothing behind it.
type fixedVIP struct{ life time.Duration }

func (fixedVIP) Acquire(context.Context) error { return nil }
func (fixedVIP) Release() error                { return nil }
func (fixedVIP) Held() bool                    { return false }
func (f fixedVIP) Lifetime() time.Duration     { return f.life }

// TestVIPWaitCoversThePreviousHoldersLifetime (invariant 3): the new
// leader may take the VIP only after lease + lifetime + margin from the
// later of its last contact with the old leader and its election minus the
// heartbeat timeout (the asymmetric cut), and never before its own start.
func TestVIPWaitCoversThePreviousHoldersLifetime(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 5, 0, 0, 0, time.UTC)
	n := &Node{started: t0, cfg: Config{VIP: fixedVIP{2 * time.Second}, LeaderLeaseTimeout: 250 * time.Millisecond, HeartbeatTimeout: 500 * time.Millisecond}}
	wait := 250*time.Millisecond + 2*time.Second + vipMargin
	for name, tc := range map[string]struct {
		lastContact, elected time.Time
		want                 time.Time
	}{
		"symmetric: last contact is later": {t0.Add(10 * time.Second), t0.Add(10*time.Second + 600*time.Millisecond), t0.Add(10*time.Second + 100*time.Millisecond + wait)},
		"asymmetric: cut long before":      {t0.Add(2 * time.Second), t0.Add(30 * time.Second), t0.Add(29*time.Second + 500*time.Millisecond + wait)},
		"never heard of a leader":          {time.Time{}, t0.Add(100 * time.Millisecond), t0.Add(wait)},
	} {
		if got := n.vipNotBefore(tc.lastContact, tc.elected); !got.Equal(tc.want) {
			t.Errorf("%s: not before %v, want %v", name, got.Sub(t0), tc.want.Sub(t0))
		}
	}
	n.cfg.VIP = fixedVIP{0}
	if got := n.vipNotBefore(t0, t0); !got.IsZero() {
		t.Errorf("lifetime 0 (socket VIP): wait until %v, want no wait", got)
	}
}

// TestWALLogStoreRestartsAndDirectoriesKeepTheirStore: a new data
// directory gets raft-wal by default (auto); with raft's log in raft-wal a
// restarted node keeps every acknowledged registration and rises by two,
// as with bolt; a data directory never silently changes its log store (it
// would come up with an empty log): auto keeps the one it has, a named one
// that differs is refused.
func TestWALLogStoreRestartsAndDirectoriesKeepTheirStore(t *testing.T) {
	start := func(dir, addr, store string, tk *takeovers) (*Node, error) {
		n, err := New(testDefaults(Config{
			NodeID: "n1", DataDir: dir, RaftBind: addr, Bootstrap: true, LogStore: store,
			HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
			LeaderLeaseTimeout: 150 * time.Millisecond, Server: &funcServer{serve: tk.onLeader},
		}))
		if err == nil {
			n.Start()
		}
		return n, err
	}
	dir, addr, tk := t.TempDir(), testutil.FreeAddr(t, "127.0.0.1"), newTakeovers()
	n, err := start(dir, addr, "", tk)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.LogStore(); got != LogStoreWAL {
		t.Fatalf("a new data directory with the default log store got %q, want wal", got)
	}
	s1 := tk.wait(t)
	ctx := context.Background()
	for i := range 20 {
		if _, err := n.Registry().Monitor(ctx, reg(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.Registry().Unmonitor(ctx, reg(7).ID, lockdOn("n1")); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal")); len(segs) == 0 {
		t.Fatal("no raft-wal segment files in the data directory")
	}
	n, err = start(dir, addr, "wal", tk)
	if err != nil {
		t.Fatal(err)
	}
	if s2 := tk.wait(t); s2 != s1+2 {
		t.Errorf("sm_state after restart %d, want %d", s2, s1+2)
	}
	if got := n.fsm.Len(); got != 19 {
		t.Errorf("registrations after restart: %d, want 19", got)
	}
	n.Close()
	n, err = start(dir, addr, "auto", tk)
	if err != nil {
		t.Fatal(err)
	}
	tk.wait(t)
	if got, regs := n.LogStore(), n.fsm.Len(); got != LogStoreWAL || regs != 19 {
		t.Errorf("auto on a raft-wal directory: store %q with %d registrations, want wal with 19", got, regs)
	}
	n.Close()

	if _, err := start(dir, addr, "bolt", tk); err == nil || !strings.Contains(err.Error(), "raft_log_store bolt, but") || !strings.Contains(err.Error(), "log store is wal") {
		t.Fatalf("bolt on a raft-wal directory: %v, want a refusal naming the directory's store", err)
	}
	boltDir := t.TempDir()
	b, err := start(boltDir, addr, "bolt", tk)
	if err != nil {
		t.Fatal(err)
	}
	tk.wait(t)
	if _, err := b.Registry().Monitor(ctx, reg(1)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := start(boltDir, addr, "wal", tk); err == nil || !strings.Contains(err.Error(), "raft_log_store wal, but") || !strings.Contains(err.Error(), "log store is bolt") {
		t.Fatalf("wal on a bolt directory: %v, want a refusal naming the directory's store", err)
	}
	// The default keeps an existing bolt directory in bolt, log and all.
	b, err = start(boltDir, addr, "", tk)
	if err != nil {
		t.Fatal(err)
	}
	tk.wait(t)
	if got, regs := b.LogStore(), b.fsm.Len(); got != LogStoreBolt || regs != 1 {
		t.Errorf("the default on a bolt directory: store %q with %d registrations, want bolt with 1", got, regs)
	}
	b.Close()
	if segs, _ := filepath.Glob(filepath.Join(boltDir, "wal", "*.wal")); len(segs) != 0 {
		t.Errorf("raft-wal segments %v in a bolt directory", segs)
	}
}

// TestRestartedNodeKnowsThePreviousLeader: raft runs from New on, so a
// restarted node hears the leader before Start registers its leader
// observer. It must still know that leader: elected next, it asks it
// whether the VIP is released (a refused NSM port: gone) instead of
// waiting out the VIP's lifetime (seen as a 2.5 s failover in the e2e
// SIGKILL runs with raft_profile fast).
func TestRestartedNodeKnowsThePreviousLeader(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.waitTakeover(10 * time.Second)
	li, lead := c.leader(5 * time.Second)
	f := (li + 1) % 3
	c.kill(f)
	c.beforeStart = func(n *Node) {
		ch := make(chan raft.Observation, 4)
		obs := raft.NewObserver(ch, true, func(o *raft.Observation) bool {
			lo, ok := o.Data.(raft.LeaderObservation)
			return ok && lo.LeaderID != ""
		})
		n.raft.RegisterObserver(obs)
		defer n.raft.DeregisterObserver(obs)
		if _, id := n.raft.LeaderWithID(); id != "" {
			return
		}
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("the restarted node heard no leader")
		}
	}
	c.start(f)
	n := c.nodes[f].n
	// Start's observer goroutine records it; no later leader change
	// happens to tell it again.
	testutil.WaitForSeen(t, 5*time.Second, "the restarted node to know the leader it heard before Start", func() (bool, string) {
		n.lcMu.Lock()
		defer n.lcMu.Unlock()
		return n.prevLeader == lead.id, fmt.Sprintf("previous leader %q, want %s", n.prevLeader, lead.id)
	})
}

// lifeVIP is a FloatingAddr whose lifetime a test can change.
type lifeVIP struct {
	life  atomic.Int64
	held  atomic.Bool
	taken atomic.Int64 // Unix ns of the first Acquire
}

func (v *lifeVIP) Acquire(context.Context) error {
	v.taken.CompareAndSwap(0, time.Now().UnixNano())
	v.held.Store(true)
	return nil
}
func (v *lifeVIP) Release() error          { v.held.Store(false); return nil }
func (v *lifeVIP) Held() bool              { return v.held.Load() }
func (v *lifeVIP) Lifetime() time.Duration { return time.Duration(v.life.Load()) }

// TestLeaderOustedBeforeTheVIPDoesNotVouchForIt: the holder dies (nobody
// can ask it), the next leader waits out its VIP lifetime and loses
// leadership before taking the VIP. Asked by the leader after it (to which
// it is the last leader seen), it must answer "held": it never released
// the VIP, the dead holder's copy may still be up. It answered "not held",
// and in a checked schedule (seed 11, default profile) the leader after it
// took the VIP 159 ms before a SIGSTOPped holder's copy expired.
func TestLeaderOustedBeforeTheVIPDoesNotVouchForIt(t *testing.T) {
	vips := map[string]*lifeVIP{}
	var mu sync.Mutex
	c := newTestCluster(t, 3, func(cfg *Config) {
		mu.Lock()
		defer mu.Unlock()
		if vips[cfg.NodeID] == nil {
			vips[cfg.NodeID] = &lifeVIP{}
		}
		cfg.VIP = vips[cfg.NodeID]
	})
	c.waitTakeover(10 * time.Second) // lifetime 0: taken at once
	ai, _ := c.leader(5 * time.Second)
	mu.Lock()
	for _, v := range vips {
		v.life.Store(int64(time.Minute)) // from now on a holder's copy outlives it by a minute
	}
	mu.Unlock()
	c.kill(ai)
	bi, b := c.leader(10 * time.Second)
	testutil.WaitFor(t, 5*time.Second, b.id+" committed its takeover (and waits for the VIP)", b.n.Leading)
	if b.n.VIPHeld() {
		t.Fatalf("%s took the VIP at once; a dead holder's copy outlives it by a minute", b.id)
	}
	c.partition(bi) // its lease runs out: it steps down, VIP not taken
	testutil.WaitFor(t, 5*time.Second, b.id+" stepped down", func() bool { return !b.n.IsLeader() && !b.n.Leading() })
	if !askVIPHeld(t, b.nsmAddr) {
		t.Fatalf("%s, ousted while waiting for a dead holder's VIP to expire, answers not held", b.id)
	}
}
