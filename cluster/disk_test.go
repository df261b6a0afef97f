package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// smallDisk mounts a tmpfs of sizeMB on a new directory: a real disk that
// fills up (ENOSPC), which the test can fill and free. Needs root.
func smallDisk(t *testing.T, sizeMB int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs as a data directory that fills up")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", sizeMB), "nsmd-test-disk", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes a filler file until the disk is full; the returned func
// frees it.
func fill(t *testing.T, dir string) func() {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			break
		}
	}
	f.Close()
	return func() { os.Remove(p) }
}

// diskCluster starts nodes on raft over TCP; dirs[i] is node i's data dir.
// Their log is in bolt: these tests fill 8 MiB disks, and raft-wal
// preallocates 64 MiB segments (it cannot open there; its own full-disk
// case is TestRaftWALRepairedAfterAFullDisk).
func diskCluster(t *testing.T, dirs []string) ([]*tcpNode, chan takeoverEvent) {
	return tcpCluster(t, dirs, func(c *Config) { c.LogStore = LogStoreBolt })
}

// tcpCluster starts len(dirs) nodes with raft over TCP on loopback
// (static voters, 300 ms timeouts); tune adjusts each node's config.
func tcpCluster(t *testing.T, dirs []string, tune func(*Config)) ([]*tcpNode, chan takeoverEvent) {
	t.Helper()
	nodes := make([]*tcpNode, len(dirs))
	voters := map[string]string{}
	ports := testutil.FreePorts(t, len(nodes))
	for i := range nodes {
		nodes[i] = &tcpNode{id: fmt.Sprintf("n%d", i+1), addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i]))}
		voters[nodes[i].id] = nodes[i].addr
	}
	took := make(chan takeoverEvent, 64)
	for i, tn := range nodes {
		cfg := testDefaults(Config{
			NodeID: tn.id, DataDir: dirs[i], RaftBind: tn.addr, NSMAddr: "127.0.0.1:1", Voters: voters,
			HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
			LeaderLeaseTimeout: 150 * time.Millisecond, ClusterKey: []byte("k"), HoldTimeout: 500 * time.Millisecond,
			DiskProbeInterval: 50 * time.Millisecond,
			Server: &funcServer{serve: func(_ context.Context, _ fsm.Takeover, s int32) error {
				took <- takeoverEvent{node: tn.id, state: s, at: time.Now()}
				return nil
			}},
		})
		tune(&cfg)
		n, err := New(cfg)
		if err != nil {
			t.Fatalf("start %s: %v", tn.id, err)
		}
		tn.n = n
		t.Cleanup(func() { killWithin(t, tn, 15*time.Second) })
	}
	for _, tn := range nodes {
		tn.n.Start()
	}
	return nodes, took
}

func nextTakeover(t *testing.T, took chan takeoverEvent, d time.Duration) takeoverEvent {
	t.Helper()
	select {
	case ev := <-took:
		return ev
	case <-time.After(d):
		t.Fatalf("no takeover within %v", d)
	}
	return takeoverEvent{}
}

func mon(n *Node, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := n.Registry().Monitor(ctx, fsm.Registration{ID: monID(i)})
	return err
}

func monID(i int) fsm.MonID {
	return fsm.MonID{MonName: fmt.Sprintf("host%06d.a-longer-name-to-fill-pages.example.com", i), My: fsm.MyID{MyName: "lockd", Prog: 100021, Vers: 3, Proc: 16}}
}

// countCandidacies counts the times n enters the candidate state.
func countCandidacies(t *testing.T, n *Node) *atomic.Int64 {
	var c atomic.Int64
	ch := make(chan raft.Observation, 64)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		s, ok := o.Data.(raft.RaftState)
		return ok && s == raft.Candidate
	})
	n.raft.RegisterObserver(obs)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				c.Add(1)
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { n.raft.DeregisterObserver(obs); close(done) })
	return &c
}

// TestFullDiskSingleNodeStaysOutOfElectionsAndRecovers: a lone node whose
// data directory fills up refuses SM_MON (never acknowledges what it could
// not store), holds no election while full — before, 115 elections in
// 50 s — says so (Disk, metric), and once space returns elects itself and
// serves again with the next odd state.
func TestFullDiskSingleNodeStaysOutOfElectionsAndRecovers(t *testing.T) {
	dir := smallDisk(t, 8)
	nodes, took := diskCluster(t, []string{dir})
	n := nodes[0].n
	first := nextTakeover(t, took, 5*time.Second)
	if err := mon(n, 0); err != nil {
		t.Fatal(err)
	}
	cands := countCandidacies(t, n)
	free := fill(t, dir)
	testutil.WaitFor(t, 5*time.Second, "the probe finds the full disk", func() bool { return !n.Disk().Writable })
	// Bolt writes into pages it already has until it needs new ones: an
	// SM_MON acknowledged now was fsynced and is durable. Write until one
	// fails; every acknowledged one must survive.
	var acked []int
	failedAt := -1
	for i := 1; i < 20000; i++ {
		if err := mon(n, i); err != nil {
			failedAt = i
			break
		}
		acked = append(acked, i)
	}
	if failedAt < 0 {
		t.Fatal("20,000 SM_MONs acknowledged on a full 8 MiB disk")
	}
	term := n.raft.CurrentTerm()
	c0 := cands.Load()
	// Nothing may happen for a while: election timeouts are 300 ms (raft
	// waits up to twice that), so 3 s is ≥ 5 missed chances to campaign.
	testutil.HoldsFor(t, 3*time.Second, 20*time.Millisecond, "a full node out of elections", func() (bool, string) {
		got := n.raft.CurrentTerm()
		return got == term && cands.Load() == c0, fmt.Sprintf("full node campaigned: term %d → %d, %d candidacies", term, got, cands.Load()-c0)
	})
	if err := mon(n, failedAt); err == nil {
		t.Fatal("SM_MON acknowledged by a full node that should have stepped down")
	}
	t.Logf("full disk: %d SM_MONs acknowledged (durable) until #%d failed; then 3 s with term %d, 0 candidacies; disk %+v", len(acked), failedAt, term, n.Disk())

	free()
	ev := nextTakeover(t, took, 5*time.Second)
	if ev.state != first.state+2 {
		t.Fatalf("after recovery sm_state %d, want %d", ev.state, first.state+2)
	}
	if err := mon(n, 3); err != nil {
		t.Fatalf("SM_MON after recovery: %v", err)
	}
	if !n.Disk().Writable {
		t.Fatal("Disk() still says unwritable after recovery")
	}
	for _, i := range acked {
		if _, ok := n.fsm.Get(monID(i)); !ok {
			t.Fatalf("acknowledged SM_MON %d lost", i)
		}
	}
}

// TestFullDiskLeaderStepsAsideAndTheOthersKeepServing: in a 3-node
// cluster the leader's disk fills; its next write fails, raft steps it
// down, one healthy node takes over (one state bump), and while the full
// node stays full it never campaigns, the cluster keeps acknowledging
// SM_MONs with no further bump; freed, it catches up.
func TestFullDiskLeaderStepsAsideAndTheOthersKeepServing(t *testing.T) {
	dirs := []string{smallDisk(t, 8), smallDisk(t, 8), smallDisk(t, 8)}
	nodes, took := diskCluster(t, dirs)
	first := nextTakeover(t, took, 5*time.Second)
	var full *tcpNode
	fullDir := ""
	for i, tn := range nodes {
		if tn.id == first.node {
			full, fullDir = tn, dirs[i]
		}
	}
	cands := countCandidacies(t, full.n)
	free := fill(t, fullDir)
	// The probe finds the full disk and hands leadership away (or raft
	// steps the leader down at its first failed write).
	next := nextTakeover(t, took, 5*time.Second)
	if next.node == full.id || next.state != first.state+2 {
		t.Fatalf("takeover by %s with %d after the full leader; want another node with %d", next.node, next.state, first.state+2)
	}
	var leader *tcpNode
	for _, tn := range nodes {
		if tn.id == next.node {
			leader = tn
		}
	}
	c0 := cands.Load()
	term := leader.n.raft.CurrentTerm()
	deadline := time.Now().Add(1500 * time.Millisecond)
	acked := 0
	for i := 1; time.Now().Before(deadline); i++ {
		if err := mon(leader.n, i); err != nil {
			t.Fatalf("SM_MON %d on the healthy leader: %v", i, err)
		}
		acked++
	}
	select {
	case ev := <-took:
		t.Fatalf("another takeover while the full node stayed full: %+v", ev)
	default:
	}
	if got := leader.n.raft.CurrentTerm(); got != term || cands.Load() != c0 {
		t.Fatalf("term %d → %d, full node candidacies %d → %d", term, got, c0, cands.Load())
	}
	if full.n.Disk().Writable {
		t.Fatal("full node says its disk is writable")
	}
	t.Logf("leader %s full: %s took over (sm_state %d → %d); %d SM_MONs acknowledged in 1.5 s with no further election", full.id, next.node, first.state, next.state, acked)

	free()
	want := leader.n.fsm.AppliedIndex()
	testutil.WaitFor(t, 10*time.Second, "the freed node catches up", func() bool {
		return full.n.Disk().Writable && full.n.fsm.AppliedIndex() >= want
	})
	if full.n.fsm.Digest() != leader.n.fsm.Digest() {
		// Digests compare equal state at equal index; wait for both.
		testutil.WaitFor(t, 5*time.Second, "equal digests", func() bool {
			return full.n.fsm.AppliedIndex() == leader.n.fsm.AppliedIndex() && full.n.fsm.Digest() == leader.n.fsm.Digest()
		})
	}
}

// killWithin kills a node and fails the test, with every goroutine's
// stack, if that takes longer than d (a wedged raft goroutine would
// otherwise hang the package until go test's timeout, with no name).
func killWithin(t *testing.T, tn *tcpNode, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { tn.n.Kill(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Errorf("node %s did not stop within %v; goroutines:\n%s", tn.id, d, buf)
	}
}

// TestFollowerWithFlappingDiskIsReplicatedToAgain: a follower whose disk
// fills and frees eight times while clients keep writing answers the
// leader's AppendEntries with Success=false each time. With raft's
// pipelined replication (MaxRPCsInFlight ≥ 2) that response could wedge
// the leader's replication goroutine for good (hashicorp/raft #612: the
// pipeline's decoder stops, the sender parks on a channel nobody reads):
// the follower got heartbeats but never another entry, and the leader's
// Shutdown hung. Asserted: after the last flap the follower catches up to
// the leader's applied index, and every node shuts down promptly.
func TestFollowerWithFlappingDiskIsReplicatedToAgain(t *testing.T) {
	dirs := []string{smallDisk(t, 8), smallDisk(t, 8), smallDisk(t, 8)}
	nodes, took := diskCluster(t, dirs)
	first := nextTakeover(t, took, 5*time.Second)
	var leader, victim *tcpNode
	victimDir := ""
	for i, tn := range nodes {
		switch {
		case tn.id == first.node:
			leader = tn
		case victim == nil:
			victim, victimDir = tn, dirs[i]
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var writers sync.WaitGroup
	var acked atomic.Int64
	for w := range 8 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := w * 1_000_000; ctx.Err() == nil; i++ {
				if mon(leader.n, i) == nil {
					acked.Add(1)
				}
			}
		}()
	}
	defer func() { cancel(); writers.Wait() }()
	for flap := range 8 {
		free := fill(t, victimDir)
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("flap %d: the follower sees its full disk", flap), func() bool { return !victim.n.Disk().Writable })
		free()
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("flap %d: the follower sees space again", flap), func() bool { return victim.n.Disk().Writable })
	}
	cancel()
	writers.Wait()
	want := leader.n.fsm.AppliedIndex()
	testutil.WaitFor(t, 10*time.Second, "the flapped follower catches up", func() bool { return victim.n.fsm.AppliedIndex() >= want })
	t.Logf("8 disk-full flaps on follower %s under 8 writers (%d SM_MONs acknowledged); it caught up to index %d", victim.id, acked.Load(), want)
	for _, tn := range nodes {
		killWithin(t, tn, 10*time.Second)
	}
}

// TestStableWritesAfterCloseAreDropped: a term write that reaches the
// stable store after the node closed its stores (a heartbeat answered on
// the transport's own goroutine as raft shut down) is dropped instead of
// failing — raft panics on a failed term write — and a write before the
// close still reaches the store.
func TestStableWritesAfterCloseAreDropped(t *testing.T) {
	store, err := raftboltdb.NewBoltStore(filepath.Join(t.TempDir(), "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{}
	if n.metrics, err = newMetrics(prometheus.NewRegistry(), n); err != nil {
		t.Fatal(err)
	}
	g := guardedStable{StableStore: store, d: newDiskHealth(n, t.TempDir()), gate: &storeGate{}}
	if err := g.SetUint64([]byte("CurrentTerm"), 2); err != nil {
		t.Fatal(err)
	}
	if v, err := store.GetUint64([]byte("CurrentTerm")); err != nil || v != 2 {
		t.Fatalf("term before the close: %d, %v; want 2", v, err)
	}
	g.gate.close()
	store.Close()
	// The store itself refuses (what made raft panic)...
	if err := store.SetUint64([]byte("CurrentTerm"), 3); err == nil {
		t.Fatal("a closed bolt store took a write: the test shows nothing")
	}
	// ...the guarded one drops it.
	if err := g.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatalf("term write after the close: %v", err)
	}
	if err := g.Set([]byte("LastVoteCand"), []byte("n2")); err != nil {
		t.Fatalf("write after the close: %v", err)
	}
}
