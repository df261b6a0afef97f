package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

// TestForgedLeaseAnswersAreNotBelieved: an owner keeps serving while the
// leader's yes holds, so a yes must come from the leader, now, for these
// pairs and with this rest. Without a MAC, with another key's, for another
// nonce (a replay), from another node, or with the rest or an answer
// changed, it is not believed; the control, the leader's own, is.
func TestForgedLeaseAnswersAreNotBelieved(t *testing.T) {
	key := []byte("test-cluster-key")
	args := &leaseArgs{Node: "n2", Nonce: []byte("0123456789abcdef"), Items: []leaseItem{{"a", 3}, {"b", 1}}}
	good := func() *leaseRes {
		r := &leaseRes{Status: fwdOK, RestNS: int64(time.Second), OK: []bool{true, false}}
		r.MAC = leaseMAC(key, "n1", args.Nonce, r.Status, r.RestNS, r.OK)
		return r
	}
	for name, forge := range map[string]func(r *leaseRes){
		"no MAC":          func(r *leaseRes) { r.MAC = nil },
		"another key":     func(r *leaseRes) { r.MAC = leaseMAC([]byte("k2"), "n1", args.Nonce, r.Status, r.RestNS, r.OK) },
		"replayed":        func(r *leaseRes) { r.MAC = leaseMAC(key, "n1", []byte("fedcba9876543210"), r.Status, r.RestNS, r.OK) },
		"another node's":  func(r *leaseRes) { r.MAC = leaseMAC(key, "n3", args.Nonce, r.Status, r.RestNS, r.OK) },
		"a longer rest":   func(r *leaseRes) { r.RestNS *= 10 },
		"a no made a yes": func(r *leaseRes) { r.OK[1] = true },
	} {
		r := good()
		forge(r)
		if err := verifyLease(key, "n1", args, r); !errors.Is(err, errLeaseUnproven) {
			t.Errorf("%s: %v, want errLeaseUnproven", name, err)
		}
	}
	if err := verifyLease(key, "n1", args, good()); err != nil {
		t.Fatalf("control: the leader's own answer: %v", err)
	}
}

// serviceForger answers SERVICE "not serving" with mac's MAC.
type serviceForger struct {
	mac func(a *serviceArgs) []byte
}

func (f serviceForger) ServeRPC(_ context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	var args serviceArgs
	if err := args.UnmarshalXDR(c.Args); err != nil {
		return err
	}
	out := servingRes{}
	if f.mac != nil {
		out.MAC = f.mac(&args)
	}
	out.MarshalXDR(res)
	return nil
}

// TestForgedServiceAnswersAreNotBelieved: a new owner starts a service
// once its last holder answers that it does not serve it at that epoch;
// the answer must be that node's, now, about that service and epoch.
func TestForgedServiceAnswersAreNotBelieved(t *testing.T) {
	key := []byte("test-cluster-key")
	with := func(f func(a serviceArgs) serviceArgs, node string, k []byte) func(a *serviceArgs) []byte {
		return func(a *serviceArgs) []byte { b := f(*a); return serviceMAC(k, node, &b, false) }
	}
	same := func(a serviceArgs) serviceArgs { return a }
	for _, tc := range []struct {
		name    string
		mac     func(a *serviceArgs) []byte
		believe bool
	}{
		{"no MAC", nil, false},
		{"another key", with(same, "n1", []byte("k2")), false},
		{"replayed", with(func(a serviceArgs) serviceArgs { a.Nonce = make([]byte, 16); return a }, "n1", key), false},
		{"another node's", with(same, "n2", key), false},
		{"another service", with(func(a serviceArgs) serviceArgs { a.Service = "b"; return a }, "n1", key), false},
		{"an older epoch", with(func(a serviceArgs) serviceArgs { a.Epoch--; return a }, "n1", key), false},
		{"control: n1's own", with(same, "n1", key), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asker := &Node{cfg: Config{NodeID: "n3", PeerNSMAddrs: map[string]string{"n1": startPeer(t, serviceForger{tc.mac})}, ClusterKey: key}}
			serving, err := asker.askService(context.Background(), "n1", "a", 5)
			switch {
			case tc.believe && (err != nil || serving):
				t.Fatalf("n1's own answer: serving %v, err %v; want believed: not serving", serving, err)
			case !tc.believe && !errors.Is(err, errServingUnproven):
				t.Fatalf("a forged answer gave serving %v, err %v; want errServingUnproven", serving, err)
			}
		})
	}
}

// The leader confirms a lease only for the owner its applied placement
// names, at that epoch, with at most its fence lease left; a placement
// that takes the service away revokes it before it is proposed, and a
// refused one gives it back; a follower confirms nothing.
func TestLeaseOnlyForThePlacedOwnerAndNotOnceRevoked(t *testing.T) {
	decl := []fsm.ServiceDecl{{ID: "a", Fingerprint: "fa"}}
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.Services = ServiceConfig{Declared: decl, Settle: 10 * time.Second}
		cfg.memberHealthy = func(string) bool { return true }
	})
	_, ld := c.leader(10 * time.Second)
	var p fsm.Placement
	testutil.WaitForSeen(t, 15*time.Second, "a placed", func() (bool, string) {
		p, _ = ld.n.fsm.PlacementOf("a")
		return p.Node != "", placedOwners(ld.n)
	})
	yes := func(node string, epoch uint64) bool {
		ok, rest, leading := ld.n.leases.answer(node, []leaseItem{{"a", epoch}})
		if !leading {
			t.Fatal("the leader does not answer as a leader")
		}
		if rest <= 0 || rest > ld.n.fenceLease() {
			t.Fatalf("rest %v, want within the fence lease %v", rest, ld.n.fenceLease())
		}
		return ok[0]
	}
	other := "n1"
	if p.Node == other {
		other = "n2"
	}
	if !yes(p.Node, p.Epoch) || yes(other, p.Epoch) || yes(p.Node, p.Epoch+1) || yes(p.Node, p.Epoch-1) || yes("", p.Epoch) {
		t.Fatal("a lease confirmed for other than the owner at its epoch")
	}
	undo := ld.n.leases.revokeFor(fsm.ServicePlaced{Service: "a", Node: other, Epoch: p.Epoch + 1, From: p.Node})
	if undo == nil || yes(p.Node, p.Epoch) {
		t.Fatal("the owner's lease still confirmed after a placement away from it was about to be proposed")
	}
	undo()
	if !yes(p.Node, p.Epoch) {
		t.Fatal("a refused placement's revocation not given back")
	}
	for _, tn := range c.nodes {
		if tn != ld {
			if _, _, leading := tn.n.leases.answer(p.Node, []leaseItem{{"a", p.Epoch}}); leading {
				t.Fatalf("follower %s confirmed a lease", tn.id)
			}
		}
	}
}

// A release mark survives a restart of the process (it is on disk), and a
// node answers SERVICE "not serving" only after recording it: it never
// starts that epoch or one below afterwards.
func TestReleaseMarksAreDurableAndRaisedOnlyUpwards(t *testing.T) {
	dir := t.TempDir()
	m, err := loadReleaseMarks(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []uint64{3, 2, 5} {
		if err := m.raise("a", e); err != nil {
			t.Fatal(err)
		}
	}
	again, err := loadReleaseMarks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.mark("a"); got != 5 || again.mark("b") != 0 {
		t.Fatalf("after a reload: a at %d, b at %d; want 5 and 0", got, again.mark("b"))
	}
	r := newServiceRuns(&Node{}, nil, again)
	if r.serves("b", 7) || again.mark("b") != 7 {
		t.Fatalf("answering not serving did not record the mark first: b at %d", again.mark("b"))
	}
	if len(again.m.Released) != 2 || len(again.m.Started) != 0 {
		t.Fatalf("marks %+v", again.m)
	}
	if err := again.raiseStarted("a", 6); err != nil {
		t.Fatal(err)
	}
	if third, err := loadReleaseMarks(dir); err != nil || third.started("a") != 6 || third.mark("a") != 5 {
		t.Fatalf("after a reload: %+v, %v", third, err)
	}
}
