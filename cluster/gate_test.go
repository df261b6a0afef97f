package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	itest "github.com/nsmd/nsmd/internal/testutil"
)

// unregLog records the Unregister and UnregisterAll commands one node
// applies (a Subscriber).
type unregLog struct {
	mu   sync.Mutex
	cmds []fsm.Command
}

func (l *unregLog) observe(ev Applied) {
	switch c := ev.Cmd; c.(type) {
	case fsm.Unregister, fsm.UnregisterAll:
		l.mu.Lock()
		l.cmds = append(l.cmds, c)
		l.mu.Unlock()
	}
}

// take returns and forgets what was recorded.
func (l *unregLog) take() []fsm.Command {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.cmds
	l.cmds = nil
	return out
}

// ownedRegs registers, through node n, count registrations made by n's
// own lockd (tag names the hosts) and returns their MonIDs.
func ownedRegs(t *testing.T, n *Node, tag string, count int) []fsm.MonID {
	t.Helper()
	var ids []fsm.MonID
	for i := range count {
		r := fsm.Registration{
			ID:       fsm.MonID{MonName: fmt.Sprintf("%s-%d", tag, i), My: fsm.MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}},
			Node:     n.cfg.NodeID,
			Callback: netip.MustParseAddr("127.0.0.1"),
			Added:    time.Unix(1700000000, 0).UTC(),
		}
		if _, err := n.Registry().Monitor(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	return ids
}

// monNames lists the MonNames registered on n, after it applied everything
// the leader committed.
func monNames(n *Node) []string {
	var out []string
	for _, r := range n.fsm.Registrations(fsm.MonID{}, 0, "") {
		out = append(out, r.ID.MonName)
	}
	return out
}

// TestUnmonFromAnotherNodeRemovesNothingWithoutGossip: the attack of a
// local user on a follower — SM_UNMON_ALL and SM_UNMON naming the
// leader's lockd, sent to the follower's own NSM port — removes none of
// the leader's registrations; the follower's own lockd still removes its
// own. Without gossip no member is known to apply owner commands, so the
// leader checks ownership on its state and commits owner-less
// Unregisters (what every release applies), counted by the fallback
// metric.
func TestUnmonFromAnotherNodeRemovesNothingWithoutGossip(t *testing.T) {
	logs := map[string]*unregLog{}
	c := newTestCluster(t, 3, func(cfg *Config) {
		l := &unregLog{}
		logs[cfg.NodeID] = l
		cfg.Subscribers = append(cfg.Subscribers, Subscriber{Applied: l.observe})
	})
	li, leader := c.leader(5 * time.Second)
	f := c.nodes[(li+1)%3].n
	ctx := context.Background()
	ownedRegs(t, leader.n, "lead", 5)
	mine := ownedRegs(t, f, "foll", 2)
	c.converge(5 * time.Second)

	// The attack: the leader's lock manager as my_id, sent on f.
	my := fsm.MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}
	if _, err := f.Registry().UnmonitorAll(ctx, my, lockdOn(f.cfg.NodeID)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Registry().Unmonitor(ctx, fsm.MonID{MonName: "lead-0", My: my}, lockdOn(f.cfg.NodeID)); err != nil {
		t.Fatal(err)
	}
	c.converge(5 * time.Second)
	want := []string{"lead-0", "lead-1", "lead-2", "lead-3", "lead-4"}
	for _, tn := range c.nodes {
		if got := monNames(tn.n); !slices.Equal(got, want) {
			t.Fatalf("%s: registrations %v after the follower's SM_UNMON_ALL, want the leader's %v", tn.id, got, want)
		}
	}
	// f's own removals were owner-less Unregisters of its own MonIDs.
	var got []fsm.Command
	got = logs[leader.id].take()
	for _, cmd := range got {
		u, ok := cmd.(fsm.Unregister)
		if !ok || !u.Owner.IsZero() || !slices.Contains(mine, u.ID) {
			t.Fatalf("leader applied %#v; want only owner-less Unregisters of %v", cmd, mine)
		}
	}
	if len(got) != len(mine) {
		t.Fatalf("leader applied %d removals, want %d", len(got), len(mine))
	}
	// The follower forwarded both; the leader, whose state holds every
	// acknowledged write, lowered them.
	if v := itest.MetricValue(t, leader.n.metrics.ownerLowered); v != 2 {
		t.Fatalf("nsmd_unmon_owner_checked_by_proposer_total on the leader %s = %v, want 2", leader.id, v)
	}
	if v := itest.MetricValue(t, f.metrics.ownerLowered); v != 0 {
		t.Fatalf("nsmd_unmon_owner_checked_by_proposer_total on the follower %s = %v, want 0 (it forwards)", f.cfg.NodeID, v)
	}
	// The leader's own lockd still removes its own.
	if _, err := leader.n.Registry().UnmonitorAll(ctx, my, lockdOn(leader.id)); err != nil {
		t.Fatal(err)
	}
	c.converge(5 * time.Second)
	if got := monNames(f); len(got) != 0 {
		t.Fatalf("left %v after the leader's own SM_UNMON_ALL", got)
	}
}

// TestFollowersUnmonAllIsDecidedOnTheLeadersState: an SM_UNMON_ALL that a
// follower takes while it is cut off from raft (its state lags, no leader
// known) is held until the leader takes it, and the leader chooses what
// it removes on its own state: a registration of the same lock manager
// that the leader acknowledged during the cut goes too, so the command
// is atomic (linearizable). The control shows what choosing on the
// follower's lagging state does: that registration is left behind.
func TestFollowersUnmonAllIsDecidedOnTheLeadersState(t *testing.T) {
	for _, lowerHere := range []bool{false, true} {
		t.Run(fmt.Sprintf("lowered_on_the_follower=%v", lowerHere), func(t *testing.T) {
			c := newTestCluster(t, 3, func(cfg *Config) { cfg.HoldTimeout = 15 * time.Second })
			li, leader := c.leader(5 * time.Second)
			fi := (li + 1) % 3
			f := c.nodes[fi].n
			ctx := context.Background()
			my := fsm.MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}
			ownedRegs(t, leader.n, "lead", 1)
			ownedRegs(t, f, "before", 1)
			c.converge(5 * time.Second)

			c.partition(fi)
			itest.WaitFor(t, 5*time.Second, "the cut-off follower to know no leader", func() bool { return f.Leader() == "" })
			during := fsm.Registration{
				ID:       fsm.MonID{MonName: "during-0", My: my},
				Node:     f.cfg.NodeID,
				Callback: netip.MustParseAddr("127.0.0.1"),
				Added:    time.Unix(1700000000, 0).UTC(),
			}
			if _, err := leader.n.Registry().Monitor(ctx, during); err != nil {
				t.Fatal(err)
			}
			if f.Registry().Has(during.ID) {
				t.Fatal("the cut-off follower applied a write made during the cut: the test needs its state to lag")
			}

			done := make(chan error, 1)
			go func() {
				var err error
				if lowerHere {
					_, err = f.applyLowered(ctx, fsm.UnregisterAll{My: my, Owner: lockdOn(f.cfg.NodeID)})
				} else {
					_, err = f.Registry().UnmonitorAll(ctx, my, lockdOn(f.cfg.NodeID))
				}
				done <- err
			}()
			if !lowerHere {
				itest.HoldsFor(t, 500*time.Millisecond, 50*time.Millisecond, "the cut-off follower to hold the SM_UNMON_ALL", func() (bool, string) {
					select {
					case err := <-done:
						return false, fmt.Sprintf("answered while no leader was reachable: %v", err)
					default:
						return true, ""
					}
				})
			}
			c.heal()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the SM_UNMON_ALL was not answered 15 s after the cut healed")
			}
			c.converge(10 * time.Second)
			want := []string{"lead-0"}
			if lowerHere {
				want = []string{"during-0", "lead-0"} // the control: chosen on the lagging state
			}
			for _, tn := range c.nodes {
				if got := monNames(tn.n); !slices.Equal(got, want) {
					t.Fatalf("%s: registrations %v after the SM_UNMON_ALL, want %v", tn.id, got, want)
				}
			}
		})
	}
}

// TestOwnerCommandsOnlyOnceEveryMemberAppliesThem: in a gossip cluster
// whose members all advertise fsm.CommandLevel 1, an SM_UNMON_ALL is
// committed as one UnregisterAll with its Owner (Apply checks it); with
// one member advertising level 0 (an older release in a rolling upgrade)
// it is committed as owner-less Unregisters, which that member applies,
// and both keep the other node's registrations.
func TestOwnerCommandsOnlyOnceEveryMemberAppliesThem(t *testing.T) {
	for _, older := range []bool{false, true} {
		t.Run(fmt.Sprintf("older_member=%v", older), func(t *testing.T) {
			var mu sync.Mutex
			logs := map[string]*unregLog{}
			_, nodes := formGossipClusterTuned(t, func(id string, cfg *Config) {
				l := &unregLog{}
				mu.Lock()
				logs[id] = l
				mu.Unlock()
				cfg.Subscribers = append(cfg.Subscribers, Subscriber{Applied: l.observe})
				cfg.olderFSM = older && id == "g3"
			}, "g1", "g2", "g3")
			leader := gossipLeader(nodes...)
			if leader == nil {
				t.Fatal("no leader")
			}
			itest.WaitFor(t, 10*time.Second, "the gate to match every member's level", func() bool {
				return leader.ownerCommandsOK() == !older
			})
			ownedRegs(t, leader, "lead", 3)
			var other *Node
			for _, n := range nodes {
				if n != leader {
					other = n
					break
				}
			}
			// other's loopback names the leader's lock manager; other is
			// not the leader, but the leader commits (a gossip test has no
			// forwarding server), so the Owner is what decides.
			my := fsm.MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}
			if _, err := leader.Registry().UnmonitorAll(context.Background(), my, lockdOn(other.cfg.NodeID)); err != nil {
				t.Fatal(err)
			}
			if n := leader.fsm.Len(); n != 3 {
				t.Fatalf("%d registrations left after another node's SM_UNMON_ALL, want 3", n)
			}
			if _, err := leader.Registry().UnmonitorAll(context.Background(), my, lockdOn(leader.cfg.NodeID)); err != nil {
				t.Fatal(err)
			}
			itest.WaitFor(t, 5*time.Second, "every node to apply the removals", func() bool {
				for _, n := range nodes {
					if n.fsm.Len() != 0 {
						return false
					}
				}
				return true
			})
			mu.Lock()
			got := logs[leader.cfg.NodeID].take()
			mu.Unlock()
			if older {
				// Lowered: nothing for the other node's lockd, three
				// owner-less Unregisters for the leader's.
				if len(got) != 3 {
					t.Fatalf("applied %v, want 3 owner-less Unregisters", got)
				}
				for _, c := range got {
					if u, ok := c.(fsm.Unregister); !ok || !u.Owner.IsZero() {
						t.Fatalf("applied %#v with a member at level 0", c)
					}
				}
				return
			}
			want := []fsm.Command{
				fsm.UnregisterAll{My: my, Owner: lockdOn(other.cfg.NodeID)},
				fsm.UnregisterAll{My: my, Owner: lockdOn(leader.cfg.NodeID)},
			}
			if !slices.Equal(got, want) {
				t.Fatalf("applied %#v, want %#v", got, want)
			}
		})
	}
}

// TestTakeoverWrapsAtTheEndOfTheRangeOnlyOnceEveryMemberDoes: with
// sm_state at math.MaxInt32, the next takeover (an SM_SIMU_CRASH) wraps
// it to 1 — a state every peer sees as new — when every member
// advertises fsm.CommandLevel 1; with one member at level 0 it is
// proposed without Wrap and saturates, as that member would apply it.
// Every node ends on the same state either way.
func TestTakeoverWrapsAtTheEndOfTheRangeOnlyOnceEveryMemberDoes(t *testing.T) {
	for _, older := range []bool{false, true} {
		t.Run(fmt.Sprintf("older_member=%v", older), func(t *testing.T) {
			_, nodes := formGossipClusterTuned(t, func(id string, cfg *Config) {
				cfg.olderFSM = older && id == "w3"
			}, "w1", "w2", "w3")
			leader := gossipLeader(nodes...)
			if leader == nil {
				t.Fatal("no leader")
			}
			itest.WaitFor(t, 10*time.Second, "the gate to match every member's level", func() bool {
				return (leader.clusterLevel() >= 1) == !older
			})
			ctx := context.Background()
			// The top of the range, as a forged or very old state would leave it.
			if _, err := leader.apply(ctx, fsm.Takeover{Node: leader.cfg.NodeID, MinState: math.MaxInt32}); err != nil {
				t.Fatal(err)
			}
			if err := leader.Registry().SimuCrash(ctx); err != nil {
				t.Fatal(err)
			}
			want := int32(1)
			if older {
				want = math.MaxInt32
			}
			itest.WaitFor(t, 5*time.Second, fmt.Sprintf("every node at sm_state %d", want), func() bool {
				for _, n := range nodes {
					if n.View().State() != want {
						return false
					}
				}
				return true
			})
			if _, err := leader.Registry().Import(ctx, nil, math.MaxInt32-1); !errors.Is(err, ErrBadImport) {
				t.Fatalf("import of a state at the end of the range: %v, want ErrBadImport", err)
			}
			if st := leader.View().State(); st != want {
				t.Fatalf("a refused import changed sm_state to %d", st)
			}
		})
	}
}
