//go:build linux

package cluster

import (
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/slowfs"
	"github.com/nsmd/nsmd/internal/testutil"
)

// slowDisks mounts a slow passthrough (internal/slowfs) per node; each
// starts with no delay.
func slowDisks(t *testing.T, n int) ([]string, []*slowfs.FS) {
	t.Helper()
	if why := slowfs.Usable(); why != "" {
		t.Skip(why)
	}
	var dirs []string
	var fss []*slowfs.FS
	for range n {
		f, err := slowfs.Mount(t.TempDir(), t.TempDir())
		if err != nil {
			t.Skipf("cannot mount a FUSE slow disk here: %v", err)
		}
		// Registered before the nodes' cleanups, so it runs after them.
		t.Cleanup(func() {
			if err := f.Unmount(); err != nil {
				t.Error(err)
			}
		})
		dirs, fss = append(dirs, f.Dir), append(fss, f)
	}
	return dirs, fss
}

// slowDiskTimings are the agent's default timings, set here whatever
// tcpCluster's are: shorter ones would not outlast a vote on a slow disk
// (two fsyncs of the stable store).
func slowDiskTimings(c *Config) {
	c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 300*time.Millisecond, 300*time.Millisecond, 150*time.Millisecond
	if testing.Verbose() {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", c.NodeID)
	}
}

// monFor sends SM_MONs to whichever node leads for d and returns their
// latencies (failures during a change of leader are skipped).
func monFor(nodes []*tcpNode, d time.Duration, from int) []time.Duration {
	var lat []time.Duration
	deadline := time.Now().Add(d)
	for i := from; time.Now().Before(deadline); i++ {
		var l *Node
		for _, tn := range nodes {
			if tn.n.IsLeader() {
				l = tn.n
			}
		}
		if l == nil {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		start := time.Now()
		if err := mon(l, i); err == nil {
			lat = append(lat, time.Since(start))
		}
	}
	return lat
}

// monLoad runs writers monFor loops at once for d (write pressure) and
// returns every latency.
func monLoad(nodes []*tcpNode, d time.Duration, writers, from int) []time.Duration {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := monFor(nodes, d, from+w*1_000_000)
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}

// equalSlowDisk: every disk gets slowFsync, well over the threshold, but
// a vote (six fsyncs with bolt) still fits the election timeout, so a
// transfer between slow nodes can complete: the drill of a shared array
// that slowed down, not of one that stopped.
const slowFsync = 60 * time.Millisecond

func equalSlowTimings(c *Config) {
	slowDiskTimings(c)
	c.DiskSlowThreshold = 25 * time.Millisecond
	c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
}

func p50(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestSlowDiskLeaderStepsAside: in a 3-node cluster the leader's fsyncs
// start taking 200 ms. It says so (Disk().Slow), hands leadership to a
// healthy node (one takeover), never takes it back while slow, and the
// cluster's SM_MONs are fast again; with the disk fast again it is
// eligible again. Negative control: with the check off
// (DiskSlowThreshold 0) the slow leader keeps leading and every SM_MON
// takes its fsync.
func TestSlowDiskLeaderStepsAside(t *testing.T) {
	const delay = 200 * time.Millisecond
	for _, tc := range []struct {
		name      string
		threshold time.Duration
	}{{"step-aside", testDiskSlowThreshold}, {"off-negative-control", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			dirs, fss := slowDisks(t, 3)
			nodes, took := tcpGossipCluster(t, dirs, func(c *Config) {
				c.DiskSlowThreshold = tc.threshold
				slowDiskTimings(c)
			})
			first := nextTakeover(t, took, 5*time.Second)
			var slow *tcpNode
			var slowFS *slowfs.FS
			for i, tn := range nodes {
				if tn.id == first.node {
					slow, slowFS = tn, fss[i]
				}
			}
			if err := mon(slow.n, 0); err != nil {
				t.Fatal(err)
			}
			cands := countCandidacies(t, slow.n)
			slowFS.SetDelay(delay)
			start := time.Now()

			if tc.threshold == 0 { // the check off
				lat := monFor(nodes, 4*time.Second, 1)
				select {
				case ev := <-took:
					t.Fatalf("takeover by %s with the check off", ev.node)
				default:
				}
				if !slow.n.IsLeader() {
					t.Fatal("the slow leader lost leadership with the check off")
				}
				if got := p50(lat); got < delay {
					t.Fatalf("SM_MON p50 %v on a leader whose fsync takes %v", got, delay)
				}
				if slow.n.Disk().Slow {
					t.Fatal("Disk().Slow with the check off")
				}
				t.Logf("check off: %s kept leading for 4 s; %d SM_MONs, p50 %v", slow.id, len(lat), p50(lat))
				return
			}

			lat := monFor(nodes, 500*time.Millisecond, 1)
			next := nextTakeover(t, took, 10*time.Second)
			stepped := time.Since(start)
			if next.node == slow.id || next.state != first.state+2 {
				t.Fatalf("takeover by %s with %d after the slow leader; want another node with %d", next.node, next.state, first.state+2)
			}
			if st := slow.n.Disk(); !st.Slow || st.WriteP50 <= testDiskSlowThreshold {
				t.Fatalf("slow node's disk status %+v", st)
			}
			c0 := cands.Load()
			after := monFor(nodes, 2*time.Second, 10000)
			select {
			case ev := <-took:
				t.Fatalf("another takeover (%s) while the slow node stayed slow", ev.node)
			default:
			}
			if slow.n.IsLeader() || cands.Load() != c0 {
				t.Fatalf("slow node leads=%v, candidacies %d → %d", slow.n.IsLeader(), c0, cands.Load())
			}
			if got := p50(after); got >= testDiskSlowThreshold {
				t.Fatalf("SM_MON p50 %v after the step-aside", got)
			}
			t.Logf("slow leader %s handed over to %s %v after its fsyncs took %v (SM_MON p50 %v on it before); then %d SM_MONs, p50 %v, no election",
				slow.id, next.node, stepped.Round(time.Millisecond), delay, p50(lat), len(after), p50(after))

			slowFS.SetDelay(0)
			testutil.WaitFor(t, 10*time.Second, "the disk is fast again", func() bool { return !slow.n.Disk().Slow })
		})
	}
}

// TestSlowFollowersElectOneWhenTheLeaderDies: both followers' disks are
// slow (they stay out of elections) and the healthy leader dies; one of
// them must still take over — a slow leader beats none. Negative control:
// without the last resort nobody campaigns and the cluster stays
// leaderless.
func TestSlowFollowersElectOneWhenTheLeaderDies(t *testing.T) {
	// A vote is three stable-store commits (six fsyncs with bolt), so a
	// delay near raft's election timeout stops elections altogether: a
	// 40 ms delay with a 20 ms threshold keeps a vote at ~250 ms, under
	// the 1 s election timeout here.
	const delay = 40 * time.Millisecond
	for _, tc := range []struct {
		name         string
		noLastResort bool
	}{{"last-resort", false}, {"no-last-resort-negative-control", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dirs, fss := slowDisks(t, 3)
			nodes, took := tcpCluster(t, dirs, func(c *Config) {
				c.noSlowLastResort = tc.noLastResort
				c.DiskSlowThreshold = 20 * time.Millisecond
				if testing.Verbose() {
					c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", c.NodeID)
				}
				c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
			})
			first := nextTakeover(t, took, 10*time.Second)
			var leader *tcpNode
			var slow []*tcpNode
			for i, tn := range nodes {
				if tn.id == first.node {
					leader = tn
					continue
				}
				slow = append(slow, tn)
				fss[i].SetDelay(delay)
			}
			testutil.WaitFor(t, 10*time.Second, "both followers judge their disks slow", func() bool {
				return slow[0].n.Disk().Slow && slow[1].n.Disk().Slow
			})
			killWithin(t, leader, 15*time.Second)
			killed := time.Now()
			if tc.noLastResort {
				select {
				case ev := <-took:
					t.Fatalf("takeover by %s without the last resort", ev.node)
				case <-time.After(5 * time.Second):
				}
				for _, tn := range slow {
					if tn.n.IsLeader() {
						t.Fatalf("%s leads without the last resort", tn.id)
					}
				}
				t.Logf("without the last resort: no leader 5 s after the healthy leader died")
				return
			}
			ev := nextTakeover(t, took, 20*time.Second)
			if ev.node == leader.id || ev.state != first.state+2 {
				t.Fatalf("takeover %+v after %s died; want a slow node with %d", ev, leader.id, first.state+2)
			}
			t.Logf("healthy leader %s died; slow %s took over after %v", leader.id, ev.node, time.Since(killed).Round(time.Millisecond))
		})
	}
}

// TestVerySlowFollowerDiskIsJudgedSlow: a follower whose fsyncs take 500 ms
// writes fewer than slowMinSamples times in slowWindow (its probes alone
// take that long); it must still judge its disk slow (from its last
// writes), and fast again once the delay is gone. Found by the checked
// schedules: a 432 ms disk was never judged slow.
func TestVerySlowFollowerDiskIsJudgedSlow(t *testing.T) {
	dirs, fss := slowDisks(t, 3)
	nodes, took := tcpCluster(t, dirs, func(c *Config) {
		c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 300*time.Millisecond, 300*time.Millisecond, 150*time.Millisecond
		c.DiskProbeInterval = 5 * time.Second // the agent's
	})
	first := nextTakeover(t, took, 10*time.Second)
	for i, tn := range nodes {
		if tn.id == first.node {
			continue
		}
		fss[i].SetDelay(500 * time.Millisecond)
		start := time.Now()
		testutil.WaitFor(t, 15*time.Second, tn.id+" judges its 500 ms disk slow", func() bool { return tn.n.Disk().Slow })
		t.Logf("%s: disk slow after %v (%+v)", tn.id, time.Since(start).Round(10*time.Millisecond), tn.n.Disk())
		fss[i].SetDelay(0)
		testutil.WaitFor(t, 15*time.Second, tn.id+" judges its disk fast again", func() bool { return !tn.n.Disk().Slow })
		return
	}
}

// TestEveryDiskSlowMovesNoLeadership: every node's fsyncs slow down at
// once (a shared array's hiccup) while clients keep writing. No node is
// healthier than the leader, so leadership stays: no takeover while every
// disk is slow, the leader says why once (the declined metric), and no
// follower campaigns. Negative control: with the rule before the one
// policy (a slow leader hands to any serving voter) the same drill moves
// leadership between equally slow nodes.
func TestEveryDiskSlowMovesNoLeadership(t *testing.T) {
	const delay = slowFsync
	const watch = 8 * time.Second
	for _, tc := range []struct {
		name string
		old  bool
	}{{"stays", false}, {"old-rule-negative-control", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dirs, fss := slowDisks(t, 3)
			var logs testutil.LockedBuffer
			nodes, took := tcpGossipCluster(t, dirs, func(c *Config) {
				equalSlowTimings(c)
				if !testing.Verbose() {
					c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", c.NodeID)
				}
			})
			// On a failure, what moved leadership: a transfer, or an
			// election (a starved heartbeat).
			defer func() {
				if t.Failed() {
					for _, w := range []string{"slow", "handed", "transfer", "election"} {
						for _, l := range logs.Lines(w) {
							t.Log(strings.TrimSpace(l))
						}
					}
				}
			}()
			nextTakeover(t, took, 10*time.Second)
			var leader *tcpNode
			for _, tn := range nodes {
				tn.n.disk.mu.Lock()
				tn.n.disk.slowState.anySuccessor = tc.old
				tn.n.disk.mu.Unlock()
			}
			// An election before the fault (a starved heartbeat at start)
			// is not what this test counts.
			testutil.WaitFor(t, 5*time.Second, "a settled leader", func() bool {
				for _, tn := range nodes {
					if tn.n.IsLeader() && tn.n.Leading() {
						leader = tn
						return true
					}
				}
				return false
			})
			if err := mon(leader.n, 0); err != nil {
				t.Fatal(err)
			}
			var cands []interface{ Load() int64 }
			for _, tn := range nodes {
				cands = append(cands, countCandidacies(t, tn.n))
			}
			for len(took) > 0 {
				<-took
			}
			for _, f := range fss {
				f.SetDelay(delay)
			}
			start := time.Now()
			lat := monLoad(nodes, watch, 8, 1)
			var moves []takeoverEvent
			for len(took) > 0 {
				moves = append(moves, <-took)
			}
			everySlow := true
			for _, tn := range nodes {
				everySlow = everySlow && tn.n.Disk().Slow
			}
			if !everySlow {
				for _, tn := range nodes {
					t.Logf("%s: %+v", tn.id, tn.n.Disk())
				}
				t.Fatal("not every disk was judged slow: the drill did not make the condition")
			}
			if tc.old {
				if len(moves) == 0 {
					t.Fatalf("negative control: the old rule moved no leadership in %v with every disk slow", watch)
				}
				t.Logf("old rule: %d takeovers in %v with every disk slow (%v)", len(moves), watch, moves)
				return
			}
			if len(moves) > 0 {
				t.Fatalf("%d takeovers with every disk equally slow: %+v", len(moves), moves)
			}
			// (Whether the leader still leads at the end is not asked: on
			// a starved machine its lease can lapse with every fsync slow,
			// and it steps down with nobody to take over — no takeover,
			// which is what counts.)
			for i, c := range cands {
				if got := c.Load(); got != 0 {
					t.Fatalf("%s campaigned %d times with its disk slow", nodes[i].id, got)
				}
			}
			if got := testutil.MetricValue(t, leader.n.metrics.transferDeclined.WithLabelValues(moveSlowDisk.String())); got != 1 {
				t.Fatalf("declined hand-offs on the slow leader: %v, want 1 (said once per episode)", got)
			}
			t.Logf("every fsync +%v for %v: %s kept leading, no takeover, %d SM_MONs (p50 %v)",
				delay, time.Since(start).Round(time.Millisecond), leader.id, len(lat), p50(lat))
		})
	}
}

// TestSlowLeaderHandsOverOnlyToAFasterNode: three servers and a witness;
// the leader's disk and one other server's turn slow at once. Leadership
// goes to the one server whose disk is fast — not to the other slow one,
// not to the witness — and stays there.
func TestSlowLeaderHandsOverOnlyToAFasterNode(t *testing.T) {
	const delay = slowFsync
	dirs, fss := slowDisks(t, 4)
	var logs testutil.LockedBuffer
	nodes, took := tcpGossipCluster(t, dirs, func(c *Config) {
		equalSlowTimings(c)
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", c.NodeID)
		c.Witness = c.NodeID == "n4"
		c.Witnesses = []string{"n4"}
	})
	witness := nodes[3]
	nextTakeover(t, took, 10*time.Second)
	// The leader when the fault starts (an election at start on a starved
	// machine is not what this test is about).
	var first takeoverEvent
	testutil.WaitFor(t, 5*time.Second, "a settled serving leader", func() bool {
		for _, tn := range nodes[:3] {
			if tn.n.IsLeader() && tn.n.Leading() {
				first = takeoverEvent{node: tn.id, state: tn.n.fsm.State()}
				return true
			}
		}
		return false
	})
	for len(took) > 0 {
		<-took
	}
	var leader, slow, fast *tcpNode
	for i, tn := range nodes[:3] {
		switch {
		case tn.id == first.node:
			leader = tn
			fss[i].SetDelay(delay)
		case slow == nil:
			slow = tn
			fss[i].SetDelay(delay)
		default:
			fast = tn
		}
	}
	start := time.Now()
	lat := monLoad(nodes, 500*time.Millisecond, 4, 1)
	next := nextTakeover(t, took, 15*time.Second)
	if next.node != fast.id || next.state != first.state+2 {
		t.Fatalf("takeover %+v after %s and %s turned slow; want the fast %s with %d", next, leader.id, slow.id, fast.id, first.state+2)
	}
	after := monLoad(nodes, 3*time.Second, 4, 10_000_000)
	for len(took) > 0 {
		if ev := <-took; ev.node != fast.id {
			t.Fatalf("takeover by %s (%+v) after the hand-over to the fast node", ev.node, ev)
		}
	}
	// Every slow-disk transfer went to the fast node: none to the other
	// slow one, none to the witness. (The witness may still win an
	// election on a starved machine and hand on; that is no transfer.)
	handed := logs.Lines("data directory slow: handed leadership over")
	if len(handed) == 0 {
		t.Fatalf("no slow-disk transfer logged; log:\n%s", logs.String())
	}
	for _, l := range handed {
		if !strings.Contains(l, " to="+fast.id+" ") {
			t.Fatalf("a slow-disk transfer not to the fast %s: %s", fast.id, l)
		}
	}
	if got := witness.n.Handoffs(); got != 0 {
		t.Logf("the witness won %d election(s) and handed on (a starved heartbeat, not a transfer)", got)
	}
	if !leader.n.Disk().Slow || !slow.n.Disk().Slow || fast.n.Disk().Slow {
		t.Fatalf("disks: leader %+v, slow %+v, fast %+v", leader.n.Disk(), slow.n.Disk(), fast.n.Disk())
	}
	t.Logf("%s and %s slow (+%v): %s handed over to the fast %s after %v; SM_MON p50 %v before, %v after (%d)",
		leader.id, slow.id, delay, leader.id, fast.id, time.Since(start).Round(time.Millisecond), p50(lat), p50(after), len(after))
}
