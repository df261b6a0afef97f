package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/internal/testutil"
)

// newPairWithWitness is two serving nodes (n1, n2) and a witness (n3).
func newPairWithWitness(t *testing.T) *tcluster {
	return newTestCluster(t, 3, func(c *Config) {
		c.Witness = c.NodeID == "n3"
		c.Witnesses = []string{"n3"}
		// Slower than the harness default: under -race, 100 ms timeouts
		// let any voter (the witness too) start elections of its own.
		c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 400*time.Millisecond, 400*time.Millisecond, 200*time.Millisecond
	})
}

// noTakeoverBy fails if a queued OnLeader call came from node id.
func noTakeoverBy(t *testing.T, c *tcluster, id string) {
	t.Helper()
	for {
		select {
		case ev := <-c.takeovers:
			if ev.node == id {
				t.Fatalf("witness %s took over (sm_state %d)", id, ev.state)
			}
		default:
			return
		}
	}
}

// A witness that wins an election passes leadership on at once; the
// serving node it passes it to commits the only Takeover (sm_state +2),
// and the witness never runs OnLeader.
func TestWitnessThatWinsAnElectionHandsLeadershipToAServingNode(t *testing.T) {
	c := newPairWithWitness(t)
	first := c.waitTakeover(5 * time.Second)
	if first.node == "n3" {
		t.Fatalf("the witness took over: %+v", first)
	}
	_, ld := c.leader(5 * time.Second)
	w := c.nodes[2]

	// Make the witness win, bypassing TransferLeadership's guard: raft's
	// own transfer is what an election lost to the witness looks like.
	if err := ld.n.raft.LeadershipTransferToServer(raft.ServerID(w.id), w.addr).Error(); err != nil {
		t.Fatalf("raft transfer to the witness: %v", err)
	}
	next := c.waitTakeover(10 * time.Second)
	if next.node == "n3" {
		t.Fatalf("the witness took over: %+v", next)
	}
	if next.state != first.state+2 {
		t.Fatalf("sm_state after the witness interlude: %d, want exactly one takeover (%d)", next.state, first.state+2)
	}
	if got := w.n.Handoffs(); got < 1 {
		t.Fatalf("witness hand-offs: %d, want at least the one it was made to win", got)
	}
	if w.n.Leading() || w.n.VIPHeld() {
		t.Fatal("the witness says it leads or holds the VIP")
	}
	// The new leader's previous VIP holder is the last serving leader, not
	// the witness that led in between.
	_, nl := c.leader(5 * time.Second)
	if nl.id != ld.id {
		nl.n.lcMu.Lock()
		prev := nl.n.prevLeader
		nl.n.lcMu.Unlock()
		if prev != ld.id {
			t.Fatalf("%s's previous leader is %q, want the serving %s (not the witness)", nl.id, prev, ld.id)
		}
	}
	noTakeoverBy(t, c, "n3")
	c.converge(5 * time.Second)
}

// With one server killed, the pair keeps a quorum through the witness
// and the other server takes over.
func TestPairWithWitnessSurvivesTheServingLeadersCrash(t *testing.T) {
	c := newPairWithWitness(t)
	first := c.waitTakeover(5 * time.Second)
	li, _ := c.leader(5 * time.Second)
	c.kill(li)
	next := c.waitTakeover(10 * time.Second)
	if next.node == "n3" || next.node == first.node {
		t.Fatalf("after killing %s the takeover was by %s", first.node, next.node)
	}
	if next.state != first.state+2 {
		t.Fatalf("sm_state %d, want %d", next.state, first.state+2)
	}
	noTakeoverBy(t, c, "n3")
}

// TransferLeadership never picks a witness: named, it is refused; unnamed,
// a serving voter is chosen.
func TestTransferLeadershipNeverPicksAWitness(t *testing.T) {
	c := newPairWithWitness(t)
	first := c.waitTakeover(5 * time.Second)
	_, ld := c.leader(5 * time.Second)
	if err := ld.n.TransferLeadership("n3"); !errors.Is(err, ErrWitnessTarget) {
		t.Fatalf("transfer to the witness: %v, want ErrWitnessTarget", err)
	}
	if err := ld.n.TransferLeadership("n9"); !errors.Is(err, ErrUnknownTarget) {
		t.Fatalf("transfer to an unknown node: %v, want ErrUnknownTarget", err)
	}
	state := first.state
	for range 3 {
		_, ld = c.leader(5 * time.Second)
		if err := ld.n.TransferLeadership(""); err != nil {
			t.Fatalf("transfer from %s: %v", ld.id, err)
		}
		ev := c.waitTakeover(10 * time.Second)
		if ev.node == "n3" || ev.node == ld.id {
			t.Fatalf("transfer from %s went to %s", ld.id, ev.node)
		}
		if ev.state != state+2 {
			t.Fatalf("sm_state %d, want %d", ev.state, state+2)
		}
		state = ev.state
	}
	_, ld = c.leader(5 * time.Second)
	other := "n1"
	if ld.id == "n1" {
		other = "n2"
	}
	if err := ld.n.TransferLeadership(other); err != nil {
		t.Fatalf("transfer to %s: %v", other, err)
	}
	if ev := c.waitTakeover(10 * time.Second); ev.node != other {
		t.Fatalf("transfer to %s: taken over by %s", other, ev.node)
	}
}

// A leader that lost leadership answers "still held" to a new leader's
// VIP question until its Server.Stop (the on_follower hook: unmount the
// shared disk) has returned, so the new leader does not mount it too.
func TestOldLeaderSaysHeldUntilOnFollowerReturned(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan string, 4)
	c := newTestCluster(t, 3, func(cfg *Config) {
		id := cfg.NodeID
		serverOf(cfg).stop = func(StopReason) error {
			select {
			case entered <- id:
			default:
			}
			<-release
			return nil
		}
	})
	// Runs before the cluster's cleanup (LIFO): a test that fails before
	// it releases must not leave node shutdown waiting in OnFollower.
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	c.waitTakeover(5 * time.Second)
	_, ld := c.leader(5 * time.Second)
	asked := func() bool { return askVIPHeld(t, ld.nsmAddr) }
	if err := ld.n.TransferLeadership(""); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-entered:
		if id != ld.id {
			t.Fatalf("OnFollower ran on %s, want the old leader %s", id, ld.id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnFollower not called on the old leader")
	}
	if ld.n.IsLeader() {
		t.Fatal("old leader still leads")
	}
	if !asked() {
		t.Fatal("old leader answered not held while its OnFollower still runs")
	}
	unblock()
	testutil.WaitFor(t, 5*time.Second, "the old leader to answer not held once its OnFollower returned", func() bool { return !asked() })
}

// The witness's hand-off target after a serving leader's crash: gossip may
// still list the dead node alive, and servingVoters re-sorts every round.
// The policy must not pick a node whose transfer just failed while another
// exists, and must prefer a node that answers a ping. The rotation the
// witness used before (an index advanced on failure, over a list re-sorted
// between rounds) is run through the same rounds as the negative control:
// it picks the dead node twice, which is what cost a kernel drill 8.5 s.
func TestHandoffTargetPassesOverADeadNode(t *testing.T) {
	s1 := raft.Server{ID: "s1", Address: "a1", Suffrage: raft.Voter}
	s2 := raft.Server{ID: "s2", Address: "a2", Suffrage: raft.Voter}
	now := time.Unix(1000, 0)

	// Each round: the targets in servingVoters' order and whether the
	// transfer to the picked one succeeds (only s2 is alive).
	rounds := [][]raft.Server{{s1, s2}, {s2, s1}}
	works := func(s raft.Server) bool { return s.ID == "s2" }

	policy := func(targets []raft.Server, failed map[raft.ServerID]time.Time, at time.Time) raft.Server {
		s, ok := handoffTarget(targets, nil, failed, at)
		if !ok {
			t.Fatal("no target picked from a non-empty list")
		}
		return s
	}
	next := 0
	rotation := func(targets []raft.Server, _ map[raft.ServerID]time.Time, _ time.Time) raft.Server {
		return targets[next%len(targets)]
	}
	run := func(pick func([]raft.Server, map[raft.ServerID]time.Time, time.Time) raft.Server) (picks []raft.ServerID) {
		failed := map[raft.ServerID]time.Time{}
		for i, targets := range rounds {
			at := now.Add(time.Duration(i) * time.Second)
			s := pick(targets, failed, at)
			picks = append(picks, s.ID)
			if works(s) {
				return picks
			}
			failed[s.ID] = at
			next++
		}
		return picks
	}
	if got := run(policy); len(got) != 2 || got[1] != "s2" {
		t.Fatalf("handoffTarget picked %v, want s1 then s2", got)
	}
	if got := run(rotation); len(got) == 2 && got[1] == "s2" {
		t.Fatalf("negative control: the old rotation picked %v; the rounds no longer reproduce the drill's double pick", got)
	}

	// A ping answered by s2 alone sends the first transfer there.
	if s, _ := handoffTarget([]raft.Server{s1, s2}, map[string]bool{"s2": true}, nil, now); s.ID != "s2" {
		t.Fatalf("with only s2 answering the ping: picked %s", s.ID)
	}
	// Nobody answers (a partition): still try, fresh targets first.
	if s, _ := handoffTarget([]raft.Server{s1, s2}, map[string]bool{}, map[raft.ServerID]time.Time{"s1": now}, now); s.ID != "s2" {
		t.Fatalf("with no answers and s1 failed just now: picked %s", s.ID)
	}
	// Every target failed lately: the one that failed longest ago.
	failed := map[raft.ServerID]time.Time{"s1": now.Add(-time.Second), "s2": now.Add(-2 * time.Second)}
	if s, _ := handoffTarget([]raft.Server{s1, s2}, nil, failed, now); s.ID != "s2" {
		t.Fatalf("with both failed lately: picked %s, want s2 (failed longest ago)", s.ID)
	}
	// A lone target is tried again after its failure: nothing else exists.
	if s, ok := handoffTarget([]raft.Server{s1}, nil, map[raft.ServerID]time.Time{"s1": now}, now); !ok || s.ID != "s1" {
		t.Fatalf("lone target: %v %v", s.ID, ok)
	}
	if _, ok := handoffTarget(nil, nil, nil, now); ok {
		t.Fatal("a target picked from an empty list")
	}
}

// membership.answering pings over real gossip on loopback: every live
// member answers; a member killed a moment ago (gossip may still list it
// alive) does not.
func TestGossipAnsweringLeavesOutAKilledMember(t *testing.T) {
	_, nodes := formGossipCluster(t, "n1", "n2", "n3")
	ctx := context.Background()
	got := nodes[0].member.answering(ctx, []string{"n2", "n3"})
	if !got["n2"] || !got["n3"] {
		t.Fatalf("before the kill: answering %v, want n2 and n3 (the check cannot tell a live node)", got)
	}
	if err := nodes[2].Kill(); err != nil {
		t.Fatalf("kill n3: %v", err)
	}
	got = nodes[0].member.answering(ctx, []string{"n2", "n3"})
	if !got["n2"] || got["n3"] {
		t.Fatalf("after killing n3: answering %v, want n2 only", got)
	}
}
