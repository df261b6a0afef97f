package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	itest "github.com/nsmd/nsmd/internal/testutil"
)

// regLog records the applied Registers and their results.
type regLog struct {
	mu      sync.Mutex
	guarded int
	plain   int
	refused int
}

func (l *regLog) observe(ev Applied) {
	r, ok := ev.Cmd.(fsm.Register)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Guarded {
		l.guarded++
	} else {
		l.plain++
	}
	if ev.Result.Refused {
		l.refused++
	}
}

// TestGuardedMonitorOnlyOnceEveryMemberAppliesIt: an SM_MON taken on
// another member naming the serving node's lockd (the leader's, whose
// takeover is the last) is refused — in a cluster whose members all
// advertise fsm.CommandLevel 2 by Apply (kind 14, refused in the log), and
// with one member at level 0 (an older release in a rolling upgrade) by
// the leader on its own state, committing nothing (and kind 1 for the
// accepted ones, which that member applies). Either way that member's
// SM_UNMON_ALL afterwards removes nothing, and every node ends with the
// leader's registrations and cookies.
func TestGuardedMonitorOnlyOnceEveryMemberAppliesIt(t *testing.T) {
	for _, older := range []bool{false, true} {
		t.Run(fmt.Sprintf("older_member=%v", older), func(t *testing.T) {
			var mu sync.Mutex
			logs := map[string]*regLog{}
			_, nodes := formGossipClusterTuned(t, func(id string, cfg *Config) {
				l := &regLog{}
				mu.Lock()
				logs[id] = l
				mu.Unlock()
				cfg.Subscribers = append(cfg.Subscribers, Subscriber{Applied: l.observe})
				cfg.olderFSM = older && id == "r3"
			}, "r1", "r2", "r3")
			leader := gossipLeader(nodes...)
			if leader == nil {
				t.Fatal("no leader")
			}
			itest.WaitFor(t, 10*time.Second, "the gate to match every member's level", func() bool {
				return leader.guardedOK() == !older
			})
			itest.WaitFor(t, 10*time.Second, "the leader's takeover", func() bool {
				return leader.View().LastTakeover().Node == leader.cfg.NodeID
			})
			ids := ownedRegs(t, leader, "srv", 3)
			ctx := context.Background()
			for _, other := range nodes {
				if other == leader {
					continue
				}
				for _, id := range ids {
					// other's loopback names the leader's lock manager; the
					// leader commits (a gossip test has no forwarding
					// server), so the registration's node decides.
					r := fsm.Registration{ID: id, Node: other.cfg.NodeID, Callback: netip.MustParseAddr("127.0.0.1"), Priv: [16]byte{15: 0xee}}
					if _, err := leader.Registry().Monitor(ctx, r); !errors.Is(err, fsm.ErrOwnedElsewhere) {
						t.Fatalf("SM_MON of %s's registration taken on %s: %v, want ErrOwnedElsewhere", leader.cfg.NodeID, other.cfg.NodeID, err)
					}
				}
				if _, err := leader.Registry().UnmonitorAll(ctx, ids[0].My, lockdOn(other.cfg.NodeID)); err != nil {
					t.Fatal(err)
				}
			}
			// The serving node's own lockd still re-monitors (a new cookie).
			again := fsm.Registration{ID: ids[0], Node: leader.cfg.NodeID, Callback: netip.MustParseAddr("127.0.0.1"), Priv: [16]byte{15: 1}}
			if _, err := leader.Registry().Monitor(ctx, again); err != nil {
				t.Fatal(err)
			}
			idx := leader.fsm.AppliedIndex()
			for _, n := range nodes {
				itest.WaitFor(t, 5*time.Second, n.cfg.NodeID+" to apply", func() bool { return n.fsm.AppliedIndex() >= idx })
				regs := n.fsm.Registrations(fsm.MonID{}, 0, "")
				if len(regs) != 3 {
					t.Fatalf("%s: %d registrations, want 3", n.cfg.NodeID, len(regs))
				}
				for _, g := range regs {
					if g.Node != leader.cfg.NodeID || g.Priv[15] == 0xee {
						t.Fatalf("%s: %s owned by %s with cookie %x", n.cfg.NodeID, g.ID.MonName, g.Node, g.Priv)
					}
				}
			}
			mu.Lock()
			l := logs[leader.cfg.NodeID]
			mu.Unlock()
			l.mu.Lock()
			defer l.mu.Unlock()
			if older {
				if l.guarded != 0 || l.refused != 0 || l.plain != 4 {
					t.Fatalf("with a member at level 0: %d guarded, %d refused, %d plain Registers applied; want 0, 0, 4", l.guarded, l.refused, l.plain)
				}
				if v := itest.MetricValue(t, leader.metrics.monLowered); v != 10 {
					t.Fatalf("nsmd_mon_owner_checked_by_proposer_total = %v, want 10", v)
				}
				return
			}
			if l.guarded != 10 || l.refused != 6 || l.plain != 0 {
				t.Fatalf("%d guarded, %d refused, %d plain Registers applied; want 10, 6, 0", l.guarded, l.refused, l.plain)
			}
		})
	}
}
