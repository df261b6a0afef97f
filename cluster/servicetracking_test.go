package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// A service's NFSv4 client tracking is its own: the upcalls of its
// owner's nfsd — the owner a follower, so every write is forwarded —
// land in the service's scope on every node, and the owner reads its own
// writes (the recovery records of its GraceStart, the answer of a
// Check); another service's scope and the node-level table stay as they
// were. A node that does not serve the service (the leader here, which
// could commit at once) is refused and changes nothing: the control that
// the lease, not the placement alone, gates the writes.
func TestServiceTrackingLandsInTheServicesScope(t *testing.T) {
	fc, h, _ := newServicesCluster(t, 3, 30*time.Second, nil)
	owners := waitOnePerServer(t, h)
	_, ld := fc.leader(10 * time.Second)
	var svc, from, otherSvc string
	for s, node := range owners {
		if node != ld.id && svc == "" {
			svc, from = s, node
		}
	}
	for s := range owners {
		if s != svc {
			otherSvc = s
			break
		}
	}
	var owner ServiceTracking
	for _, tn := range fc.nodes {
		if tn.id == from {
			owner = tn.n.Services().Tracking(svc)
		}
	}
	stranger := ld.n.Services().Tracking(svc)
	testutil.WaitFor(t, 10*time.Second, svc+"'s owner ready", owner.Ready)
	if stranger.Ready() {
		t.Fatal("the leader, which does not serve the service, is ready for its tracking")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// The owner's nfsd: a client mounts, then nfsd restarts (GraceStart)
	// and the client reclaims (Check, as an old kernel would).
	if err := owner.TrackCreate(ctx, "client-a", "p1"); err != nil {
		t.Fatalf("Create on the owner: %v", err)
	}
	if err := stranger.TrackCreate(ctx, "intruder", ""); !errors.Is(err, ErrServiceNotServed) {
		t.Fatalf("Create on a node that does not serve the service: %v, want ErrServiceNotServed", err)
	}
	if _, err := stranger.TrackGraceStart(ctx); !errors.Is(err, ErrServiceNotServed) {
		t.Fatalf("GraceStart on a node that does not serve the service: %v, want ErrServiceNotServed", err)
	}
	recs, err := owner.TrackGraceStart(ctx)
	if err != nil {
		t.Fatalf("GraceStart on the owner: %v", err)
	}
	if len(recs) != 1 || recs[0] != (fsm.V4Client{Name: "client-a", PrincHash: "p1"}) {
		t.Fatalf("GraceStart handed nfsd %+v, want client-a's record", recs)
	}
	if ok, err := owner.TrackCheck(ctx, "client-a"); err != nil || !ok {
		t.Fatalf("Check of a client of the recovery epoch: %v, %v", ok, err)
	}
	if ok, err := owner.TrackCheck(ctx, "stranger"); err != nil || ok {
		t.Fatalf("Check of an unknown client: %v, %v", ok, err)
	}
	if c, r := owner.Epochs(); c != 2 || r != 1 {
		t.Fatalf("the owner reads epochs %d/%d after its GraceStart, want 2/1", c, r)
	}

	for _, tn := range fc.nodes {
		testutil.WaitForSeen(t, 10*time.Second, tn.id+" holds the service's records", func() (bool, string) {
			sc := tn.n.fsm.Scope(svc)
			cur, rec := sc.Epochs()
			names := []string{}
			for _, c := range sc.V4Clients(false) {
				names = append(names, c.Name)
			}
			return cur == 2 && rec == 1 && slices.Equal(names, []string{"client-a"}),
				fmt.Sprintf("epochs %d/%d, current %q", cur, rec, names)
		})
		if in, _ := tn.n.fsm.Scope(svc).HasV4Client("intruder"); in {
			t.Errorf("%s: the refused write landed", tn.id)
		}
		oc, or := tn.n.fsm.Scope(otherSvc).Epochs()
		n1, n2, n3 := tn.n.fsm.Scope(otherSvc).V4Counts()
		if oc != 1 || or != 0 || n1+n2+n3 != 0 {
			t.Errorf("%s: service %s's scope changed: epochs %d/%d, records %d %d %d", tn.id, otherSvc, oc, or, n1, n2, n3)
		}
		nc, nr := tn.n.fsm.Epochs()
		m1, m2, m3 := tn.n.fsm.V4Counts()
		if nc != 1 || nr != 0 || m1+m2+m3 != 0 {
			t.Errorf("%s: the node-level table changed: epochs %d/%d, records %d %d %d", tn.id, nc, nr, m1, m2, m3)
		}
	}

	if err := owner.TrackGraceDone(ctx); err != nil {
		t.Fatalf("GraceDone on the owner: %v", err)
	}
	if c, r := owner.Epochs(); c != 2 || r != 0 {
		t.Fatalf("the owner reads epochs %d/%d after its GraceDone, want 2/0", c, r)
	}
}
