package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/placement"
)

// placedOwners is "svc=owner@epoch …" of a node's replicated placements.
func placedOwners(n *Node) string {
	var parts []string
	for _, p := range n.Services().View().State.Placements {
		parts = append(parts, fmt.Sprintf("%s=%s@%d", p.Service, p.Node, p.Epoch))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// downSet is the members a test says are down (placement's health).
type downSet struct {
	mu   sync.Mutex
	down map[string]bool
}

func (d *downSet) healthy(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.down[id]
}

func (d *downSet) set(id string, down bool) {
	d.mu.Lock()
	d.down[id] = down
	d.mu.Unlock()
}

// Three servers declaring the same three services: the leader spreads
// them one per server, every node's replicated state says so, a lost
// server's service alone moves (to the server with the fewest), an
// operator's move through a follower is decided and committed by the
// leader with the next epoch, and a move to a server that is down is
// refused and changes nothing.
func TestServicesArePlacedOnePerServerAndMoveOneAtATime(t *testing.T) {
	decl := []fsm.ServiceDecl{{ID: "a", Fingerprint: "fa"}, {ID: "b", Fingerprint: "fb"}, {ID: "c", Fingerprint: "fc"}}
	ds := &downSet{down: map[string]bool{}}
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.Services = ServiceConfig{Declared: decl, Settle: 10 * time.Second}
		cfg.memberHealthy = ds.healthy
	})
	_, leader := c.leader(10 * time.Second)
	owners := func() map[string]string {
		out := map[string]string{}
		for _, p := range leader.n.Services().View().State.Placements {
			out[p.Service] = p.Node
		}
		return out
	}
	testutil.WaitForSeen(t, 15*time.Second, "every service placed, one per server", func() (bool, string) {
		o := owners()
		seen := map[string]bool{}
		for _, n := range o {
			seen[n] = true
		}
		return len(o) == 3 && len(seen) == 3, placedOwners(leader.n)
	})
	testutil.WaitForSeen(t, 10*time.Second, "every node's state to agree", func() (bool, string) {
		want := placedOwners(leader.n)
		for _, tn := range c.nodes {
			if got := placedOwners(tn.n); got != want {
				return false, tn.id + ": " + got + " vs " + want
			}
		}
		return true, ""
	})
	before := owners()

	// A server other than the leader is lost: its service alone moves.
	var lost string
	for _, tn := range c.nodes {
		if tn != leader {
			lost = tn.id
			break
		}
	}
	var lostSvc string
	for s, n := range before {
		if n == lost {
			lostSvc = s
		}
	}
	ds.set(lost, true)
	testutil.WaitForSeen(t, 10*time.Second, lostSvc+" to leave "+lost, func() (bool, string) {
		return owners()[lostSvc] != lost, placedOwners(leader.n)
	})
	after := owners()
	for s, n := range before {
		if s != lostSvc && after[s] != n {
			t.Errorf("%s moved from %s to %s though its owner is healthy", s, n, after[s])
		}
	}
	p, _ := leader.n.fsm.PlacementOf(lostSvc)
	if p.Epoch != 2 || p.From != lost || p.Reason != placement.ReasonOwnerLost {
		t.Errorf("the lost server's service: %+v, want epoch 2 from %s, reason %s", p, lost, placement.ReasonOwnerLost)
	}

	// A move to a server that is down is refused and changes nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := leader.n.Services().Move(ctx, lostSvc, lost); !errors.Is(err, placement.ErrUnhealthy) {
		t.Errorf("a move to the lost server: %v, want ErrUnhealthy", err)
	}
	if got := owners(); got[lostSvc] != after[lostSvc] {
		t.Errorf("a refused move changed the owner: %v", got)
	}

	// It comes back: nothing moves back by itself (no failback), and an
	// operator's move through a follower takes the service there.
	ds.set(lost, false)
	var follower *tnode
	for _, tn := range c.nodes {
		if tn != leader && tn.id != lost {
			follower = tn
		}
	}
	testutil.HoldsFor(t, 2*time.Second, 200*time.Millisecond, "nothing moves back to "+lost+" by itself", func() (bool, string) {
		return owners()[lostSvc] != lost, placedOwners(leader.n)
	})
	if err := follower.n.Services().Move(ctx, lostSvc, lost); err != nil {
		t.Fatalf("an operator's move through follower %s: %v", follower.id, err)
	}
	testutil.WaitForSeen(t, 5*time.Second, lostSvc+" back on "+lost, func() (bool, string) {
		return owners()[lostSvc] == lost, placedOwners(leader.n)
	})
	p, _ = leader.n.fsm.PlacementOf(lostSvc)
	if p.Epoch != 3 || p.Reason != placement.ReasonOperator {
		t.Errorf("after the operator's move: %+v, want epoch 3, reason %s", p, placement.ReasonOperator)
	}
}

// A cluster whose nodes declare no service writes no placement entry: its
// log and snapshot stay as the previous release wrote them.
func TestNoServicesWritesNoPlacementEntry(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	_, leader := c.leader(10 * time.Second)
	c.converge(10 * time.Second)
	testutil.HoldsFor(t, 2500*time.Millisecond, 250*time.Millisecond, "no declaration or placement", func() (bool, string) {
		st := leader.n.Services().View().State
		return len(st.Declarations) == 0 && len(st.Placements) == 0, fmt.Sprintf("%+v", st)
	})
}

// While a member cannot apply placement entries (a rolling upgrade from
// a release without them), nothing is declared or placed; the control is
// the first test, where every member can.
func TestServicesWaitForEveryMemberToApplyPlacement(t *testing.T) {
	decl := []fsm.ServiceDecl{{ID: "a", Fingerprint: "fa"}}
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.Services = ServiceConfig{Declared: decl}
		cfg.staticRecords = false // a static cluster then counts as one that has not said its level
	})
	_, leader := c.leader(10 * time.Second)
	testutil.HoldsFor(t, 2500*time.Millisecond, 250*time.Millisecond, "nothing declared or placed", func() (bool, string) {
		st := leader.n.Services().View().State
		return len(st.Declarations) == 0 && len(st.Placements) == 0, fmt.Sprintf("%+v", st)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := leader.n.Services().Move(ctx, "a", leader.id); err == nil {
		t.Errorf("a move while a member cannot apply placements was accepted")
	}
	// Nor is a service's own write (kind 22) proposed: an older member
	// would refuse the whole entry. (Proposed, it would come back
	// applied and refused by the state, without an error: no placement.)
	_, err := leader.n.apply(ctx, fsm.Scoped{Service: "a", Node: leader.id, Epoch: 1, Cmd: fsm.GraceStart{}})
	if err == nil || !strings.Contains(err.Error(), "cannot apply service placements") {
		t.Errorf("a scoped write while a member cannot apply it: %v, want the level gate's refusal", err)
	}
}

// An operator's move asked on a follower is planned again by the leader;
// when the leader's view refuses it (here: the target is unhealthy to the
// leader only), the follower gets ErrRejected with the reason at once,
// not a write retried until the hold timeout.
func TestFollowersMoveRefusedByTheLeaderIsRejectedAtOnce(t *testing.T) {
	views := map[string]*downSet{"n1": {down: map[string]bool{}}, "n2": {down: map[string]bool{}}, "n3": {down: map[string]bool{}}}
	fc, h, _ := newServicesCluster(t, 3, 4*time.Second, func(cfg *Config) { cfg.memberHealthy = views[cfg.NodeID].healthy })
	owners := waitOnePerServer(t, h)
	_, ld := fc.leader(10 * time.Second)
	var asker, target string
	for _, tn := range fc.nodes {
		switch {
		case tn.id == ld.id:
		case asker == "":
			asker = tn.id
		default:
			target = tn.id
		}
	}
	views[ld.id].set(target, true)
	var svc string
	for s, node := range owners {
		if node == asker {
			svc = s
		}
	}
	start := time.Now()
	err := nodeByID(fc, asker).Services().Move(context.Background(), svc, target)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "not healthy") {
		t.Fatalf("move of %s to %s asked on %s: %v, want ErrRejected saying why", svc, target, asker, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the refusal took %v", took)
	}
}

// TestASlowDataDirectoryKeepsItsServices: a leader whose data directory
// is slow stays a healthy server for placement (leadership moves, its
// services do not); one whose data directory fails writes does not.
func TestASlowDataDirectoryKeepsItsServices(t *testing.T) {
	slow := DiskStatus{Writable: true, Slow: true, WriteP50: 2 * time.Second}
	if !placeHealthy(slow) {
		t.Error("a leader with a slow data directory judges itself unfit to serve: its services would be taken away at once")
	}
	if placeHealthy(DiskStatus{Writable: false}) {
		t.Error("a leader whose data directory fails writes judges itself fit to serve")
	}
}
