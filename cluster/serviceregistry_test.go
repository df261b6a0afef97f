package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// A service's NSM state is its own and follows the service: its owner's
// registry is ready and answers the service's state (2·epoch+1) while it
// serves the service under a lease, and no other node's is; an SM_MON
// taken for the service on its owner — a follower, so it is forwarded —
// lands in the service's scope on every node and nowhere else; a node
// that does not serve the service sends no write of it, its new owner
// after a move takes the registration over (its lockd re-monitors), and
// the service's state rises with the move.
func TestServiceRegistryFollowsTheService(t *testing.T) {
	fc, svc, from, to, ld := followerOwnedService(t)
	node := func(id string) *Node {
		for _, tn := range fc.nodes {
			if tn.id == id {
				return tn.n
			}
		}
		t.Fatalf("no node %s", id)
		return nil
	}
	owner, other := node(from).Services().Registry(svc), node(to).Services().Registry(svc)
	testutil.WaitFor(t, 10*time.Second, svc+"'s owner ready", owner.Ready)
	p, _ := ld.n.fsm.PlacementOf(svc)
	ctx := context.Background()
	if st, err := owner.ReadState(ctx); err != nil || st != fsm.ServiceSMState(p.Epoch) {
		t.Fatalf("owner's ReadState %d, %v; want %d", st, err, fsm.ServiceSMState(p.Epoch))
	}
	if other.Ready() {
		t.Fatal("a node that does not serve the service is ready for it")
	}
	if _, err := other.ReadState(ctx); !errors.Is(err, ErrNotReadyYet) {
		t.Fatalf("a non-owner's ReadState: %v", err)
	}

	lockd := fsm.MyID{MyName: "server", Prog: 100021, Vers: 4, Proc: 16}
	lo := netip.MustParseAddr("127.0.0.1")
	reg := func(node string) fsm.Registration {
		return fsm.Registration{ID: fsm.MonID{MonName: "client1", My: lockd}, Node: node, Callback: lo,
			Addrs: []netip.Addr{netip.MustParseAddr("10.77.9.1")}, Added: time.Now()}
	}
	st, err := owner.Monitor(ctx, reg(from))
	if err != nil || st != fsm.ServiceSMState(p.Epoch) {
		t.Fatalf("SM_MON on the owner: state %d, %v", st, err)
	}
	for _, tn := range fc.nodes {
		testutil.WaitForSeen(t, 10*time.Second, tn.id+" holds the service's registration", func() (bool, string) {
			sc := tn.n.fsm.Scope(svc)
			return sc.Len() == 1 && tn.n.fsm.Len() == 0, fmt.Sprintf("service %d, node-level %d", sc.Len(), tn.n.fsm.Len())
		})
	}
	if _, err := other.Monitor(ctx, reg(to)); !errors.Is(err, ErrServiceNotServed) {
		t.Fatalf("a node that does not serve the service wrote its registration: %v", err)
	}
	if err := other.SimuCrash(ctx); !errors.Is(err, ErrNoServiceCrash) {
		t.Fatalf("SM_SIMU_CRASH for a service: %v", err)
	}

	if err := ld.n.Services().Move(ctx, svc, to); err != nil {
		t.Fatalf("move %s to %s: %v", svc, to, err)
	}
	testutil.WaitFor(t, 20*time.Second, svc+"'s new owner ready", other.Ready)
	if owner.Ready() {
		t.Fatal("the old owner is still ready for the service it released")
	}
	st, err = other.ReadState(ctx)
	if err != nil || st != fsm.ServiceSMState(p.Epoch+1) {
		t.Fatalf("new owner's ReadState %d, %v; want %d", st, err, fsm.ServiceSMState(p.Epoch+1))
	}
	if st, err := other.Monitor(ctx, reg(to)); err != nil || st != fsm.ServiceSMState(p.Epoch+1) {
		t.Fatalf("the new owner's lockd re-monitors: state %d, %v", st, err)
	}
	if err := other.PeerRebooted(ctx, fsm.PeerRebooted{MonName: "client1", State: 3, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForSeen(t, 10*time.Second, "the reboot recorded in the service's scope", func() (bool, string) {
		s, ok := node(to).fsm.Scope(svc).LastSeen("client1")
		g, _ := node(to).fsm.Scope(svc).Get(reg(to).ID)
		return ok && s == 3 && g.Node == to, fmt.Sprintf("seen %d %v, registration of %q", s, ok, g.Node)
	})
}

// followerOwnedService starts a three-server services cluster, one
// service per server, and names a service a follower owns (from), the
// other follower (to) and the leader.
func followerOwnedService(t *testing.T) (fc *fencedCluster, svc, from, to string, ld *tnode) {
	t.Helper()
	fc, h, _ := newServicesCluster(t, 3, 30*time.Second, nil)
	owners := waitOnePerServer(t, h)
	_, ld = fc.leader(10 * time.Second)
	for s, node := range owners {
		if node != ld.id {
			svc, from = s, node
			break
		}
	}
	for _, tn := range fc.nodes {
		if tn.id != from && tn.id != ld.id {
			to = tn.id
		}
	}
	return fc, svc, from, to, ld
}
