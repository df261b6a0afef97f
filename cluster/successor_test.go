package cluster

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/internal/testutil"
)

// TestSuccessorPolicy pins who may take leadership from this node, by
// reason. The "old" column is what the transfer sites did before there
// was one policy (the slow-disk rule: any serving voter gossip sees
// alive); the rows where it differs are the ones the policy exists for.
func TestSuccessorPolicy(t *testing.T) {
	ms := func(d time.Duration) uint32 { return uint32(d.Microseconds()) }
	fast := diskReport{P50us: ms(time.Millisecond)}
	slow := diskReport{Slow: true, P50us: ms(200 * time.Millisecond)}
	slower := diskReport{Slow: true, P50us: ms(400 * time.Millisecond)}
	down := diskReport{Down: true}
	suspect := diskReport{Suspect: true, P50us: ms(time.Millisecond)}
	// Not judged slow, but not twice as fast as a 200 ms leader either.
	borderline := diskReport{P50us: ms(150 * time.Millisecond)}
	unmeasured := diskReport{}
	c := func(id string, alive bool, d *diskReport) candidate {
		cd := candidate{srv: raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress("addr-" + id), Suffrage: raft.Voter}, alive: alive}
		if d != nil {
			cd.disk, cd.known = *d, true
		}
		return cd
	}
	ids := func(ss []raft.Server) []string { return serverIDs(ss) }
	for _, tc := range []struct {
		name string
		why  moveReason
		self diskReport
		cs   []candidate
		want []string
		old  []string // the old slow-disk rule's targets, when it differs
	}{
		{"slow: every other node as slow or slower moves nothing", moveSlowDisk, slow,
			[]candidate{c("a", true, &slow), c("b", true, &slower)}, nil, []string{"a", "b"}},
		{"slow: only the measured-faster node", moveSlowDisk, slow,
			[]candidate{c("a", true, &slow), c("b", true, &fast), c("c", true, &down)}, []string{"b"}, []string{"a", "b", "c"}},
		{"slow: a node under the line but not twice as fast is not healthier", moveSlowDisk, slow,
			[]candidate{c("a", true, &borderline)}, nil, []string{"a"}},
		{"slow: a disk with a slow write just now is not measured fast yet", moveSlowDisk, slow,
			[]candidate{c("a", true, &suspect)}, nil, []string{"a"}},
		{"slow: no report (no gossip, older version) is not measured", moveSlowDisk, slow,
			[]candidate{c("a", true, nil), c("b", true, &unmeasured)}, nil, []string{"a", "b"}},
		{"slow: a silent faster node only when no live one is faster", moveSlowDisk, slow,
			[]candidate{c("a", false, &fast), c("b", true, &fast), c("c", true, &slow)}, []string{"b"}, []string{"b", "c"}},
		{"slow: gossip lags raft: a silent faster node when it is the only one", moveSlowDisk, slow,
			[]candidate{c("a", false, &fast), c("b", true, &slow)}, []string{"a"}, []string{"b"}},
		{"slow: this node not measured slow: nothing is faster", moveSlowDisk, unmeasured,
			[]candidate{c("a", true, &fast)}, nil, nil},
		{"unwritable: any node not known unwritable, healthy first", moveDiskDown, down,
			[]candidate{c("a", true, &down), c("b", true, &slow), c("c", true, nil), c("d", true, &fast)}, []string{"d", "c", "b"}, nil},
		{"failed takeover: alive, disk not slow or unwritable", moveFailedTakeover, fast,
			[]candidate{c("a", true, &slow), c("b", false, &fast), c("c", true, &down), c("d", true, &fast), c("e", true, nil)}, []string{"d", "e"}, nil},
		{"failed takeover: nobody healthy stays", moveFailedTakeover, fast,
			[]candidate{c("a", true, &slow), c("b", false, &fast)}, nil, nil},
		{"witness: every server, alive then healthiest first", moveWitness, fast,
			[]candidate{c("a", true, &slow), c("b", false, &fast), c("c", true, &fast)}, []string{"c", "a", "b"}, nil},
		{"operator and shutdown: every server", moveShutdown, slow,
			[]candidate{c("a", true, &slow), c("b", true, &down)}, []string{"a", "b"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ids(successorsFor(tc.why, tc.self, tc.cs))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("successors for %s: %v, want %v", tc.why, got, tc.want)
			}
			if tc.old == nil {
				return
			}
			// Negative control: the old rule would have moved here.
			var old []string
			for _, cd := range tc.cs {
				if cd.alive {
					old = append(old, string(cd.srv.ID))
				}
			}
			if len(old) == 0 {
				for _, cd := range tc.cs {
					old = append(old, string(cd.srv.ID))
				}
			}
			if !slices.Equal(old, tc.old) || slices.Equal(old, got) {
				t.Fatalf("old rule's targets %v (table says %v): the row does not show what changed", old, tc.old)
			}
		})
	}
}

// TestDiskReportSameForGossip: a report is re-advertised when a flag
// changes or its median leaves its power-of-two bucket.
func TestDiskReportSameForGossip(t *testing.T) {
	base := diskReport{P50us: 300}
	for _, tc := range []struct {
		o    diskReport
		same bool
	}{
		{diskReport{P50us: 300}, true},
		{diskReport{P50us: 500}, true}, // 256..511
		{diskReport{P50us: 600}, false},
		{diskReport{P50us: 300, Slow: true}, false},
		{diskReport{P50us: 300, Suspect: true}, false},
		{diskReport{P50us: 300, Down: true}, false},
		{diskReport{}, false},
	} {
		if got := base.sameForGossip(tc.o); got != tc.same {
			t.Errorf("%+v vs %+v: same %v, want %v", base, tc.o, got, tc.same)
		}
	}
}

// TestDiskReportSuspectNeedsAShareOfSlowWrites: one stalled fsync among
// many fast ones leaves a disk a hand-off target; a quarter of the last
// 2 s over the threshold (a disk slowing down) does not.
func TestDiskReportSuspectNeedsAShareOfSlowWrites(t *testing.T) {
	now := time.Now()
	report := func(fast, slow int) diskReport {
		d := &diskHealth{ok: true}
		d.slowState.threshold = 50 * time.Millisecond
		for i := range fast + slow {
			dur := time.Millisecond
			if i >= fast {
				dur = 80 * time.Millisecond
			}
			d.slowState.samples = append(d.slowState.samples, writeSample{now.Add(-time.Second), dur})
		}
		return d.report(now)
	}
	if r := report(40, 1); r.Suspect {
		t.Fatalf("one stalled write in 41: %+v", r)
	}
	if r := report(30, 10); !r.Suspect {
		t.Fatalf("10 slow writes in 40: %+v, want suspect", r)
	}
	if r := report(0, 1); r.Suspect {
		t.Fatalf("a single write, slow: %+v (want at least %d)", r, suspectMinWrites)
	}
	// Outside the window they no longer count.
	d := &diskHealth{ok: true}
	d.slowState.threshold = 50 * time.Millisecond
	d.slowState.samples = []writeSample{{now.Add(-3 * time.Second), time.Second}, {now.Add(-3 * time.Second), time.Second}}
	if r := d.report(now); r.Suspect {
		t.Fatalf("slow writes older than the window: %+v", r)
	}
}

// tcpGossipCluster is tcpCluster with gossip on loopback, so that every
// node sees the others' disk reports (the successor policy needs them).
func tcpGossipCluster(t *testing.T, dirs []string, tune func(*Config)) ([]*tcpNode, chan takeoverEvent) {
	t.Helper()
	ports := map[string]int{}
	for i := range dirs {
		ports[fmt.Sprintf("n%d", i+1)] = testutil.FreePort(t)
	}
	nodes, took := tcpCluster(t, dirs, func(c *Config) {
		c.Gossip.Bind, c.Gossip.Port = "127.0.0.1", ports[c.NodeID]
		c.Logger = gossipTestLogger().With("node", c.NodeID)
		for id, p := range ports {
			if id != c.NodeID {
				c.Gossip.Join = append(c.Gossip.Join, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			}
		}
		tune(c)
	})
	testutil.WaitFor(t, 10*time.Second, "every node has every other node's disk report", func() bool {
		for _, a := range nodes {
			for _, b := range nodes {
				if _, ok := a.n.member.diskOf(b.id); a != b && !ok {
					return false
				}
			}
		}
		return true
	})
	return nodes, took
}

// TestFailedTakeoverStepsAsideToAHealthyServer: after its takeover failed
// a leader hands leadership to a server gossip sees alive whose disk is
// not slow: not to a server that says its disk is slow, not to the
// witness.
func TestFailedTakeoverStepsAsideToAHealthyServer(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()}
	nodes, took := tcpGossipCluster(t, dirs, func(c *Config) {
		// The scenario needs one leader from the first takeover to the
		// step-aside: at 300 ms a loaded machine starved the heartbeats
		// past the 150 ms lease and the leader stepped down on its own.
		c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
		c.Witness = c.NodeID == "n4"
		c.Witnesses = []string{"n4"}
	})
	witness := nodes[3]
	first := nextTakeover(t, took, 10*time.Second)
	var leader, slow, healthy *tcpNode
	for _, tn := range nodes[:3] {
		switch {
		case tn.id == first.node:
			leader = tn
		case slow == nil:
			slow = tn
		default:
			healthy = tn
		}
	}
	if leader == nil {
		t.Fatalf("first takeover by %s, not a server", first.node)
	}
	// Every write of slow's is over a 1 µs threshold: it judges its disk
	// slow, as a real slow disk would make it, and says so in gossip.
	slow.n.disk.mu.Lock()
	slow.n.disk.slowState.threshold = time.Microsecond
	slow.n.disk.mu.Unlock()
	testutil.WaitFor(t, 10*time.Second, "the leader hears that "+slow.id+"'s disk is slow", func() bool {
		r, ok := leader.n.member.diskOf(slow.id)
		return ok && r.Slow
	})
	if got := serverIDs(leader.n.successors(moveFailedTakeover)); !slices.Equal(got, []string{healthy.id}) {
		t.Fatalf("successors after a failed takeover: %v, want only %s", got, healthy.id)
	}
	// (The witness may have won the first election and handed on: count
	// from here.)
	witnessBefore := witness.n.Handoffs()
	// ("" with no error: the transfer timed out on a starved machine and
	// leadership left all the same; the takeover below says to whom.)
	to, err := leader.n.stepAsideAfterFailedTakeover()
	if err != nil || (to != "" && string(to) != healthy.id) {
		t.Fatalf("step aside: to %q, %v; want %s", to, err, healthy.id)
	}
	if ev := nextTakeover(t, took, 10*time.Second); ev.node != healthy.id || ev.state != first.state+2 {
		t.Fatalf("takeover %+v after the step-aside; want %s with %d", ev, healthy.id, first.state+2)
	}
	if got := witness.n.Handoffs() - witnessBefore; got != 0 {
		t.Fatalf("the witness led and handed on %d times after the step-aside", got)
	}

	// Now the old leader's disk turns slow too: no other server is
	// healthy, the new leader keeps leading.
	leader.n.disk.mu.Lock()
	leader.n.disk.slowState.threshold = time.Microsecond
	leader.n.disk.mu.Unlock()
	testutil.WaitFor(t, 10*time.Second, "the new leader hears that "+leader.id+"'s disk is slow", func() bool {
		r, ok := healthy.n.member.diskOf(leader.id)
		return ok && r.Slow
	})
	_, err = healthy.n.stepAsideAfterFailedTakeover()
	if !errors.Is(err, ErrNoSuccessor) {
		t.Fatalf("step aside with every other server slow: %v, want ErrNoSuccessor", err)
	}
	select {
	case ev := <-took:
		t.Fatalf("takeover %+v though no server was healthier", ev)
	default:
	}
}
