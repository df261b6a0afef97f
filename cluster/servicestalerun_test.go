package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

// A write of a service's run never lands in a later run, over real raft:
// the owner of a service at epoch E (a follower, so its writes are
// forwarded) builds an NFSv4 client remove, a client create and an
// SM_UNMON while it serves; they are held until the service's move to
// another server (epoch E+1) has committed, then sent as the owner sends
// them. Each is committed after the move, refused on every node
// (fsm.ErrStaleRun, surfaced to the sender through the forward), and
// changes nothing: the record the new server's clients reclaim by
// stays, the client the new server never saw does not appear, the
// registration stays. The same writes proposed by the leader itself are
// refused alike (the check is at apply, not at send). The negative
// control: the same writes sent by the service's current run land.
func TestAWriteOfAServicesEndedRunIsRefusedAfterItMoved(t *testing.T) {
	fc, svc, from, to, ld := followerOwnedService(t)
	old, next := nodeByID(fc, from).Services(), nodeByID(fc, to).Services()
	tracking, registry := old.Tracking(svc), old.Registry(svc)
	testutil.WaitFor(t, 10*time.Second, svc+"'s owner ready", tracking.Ready)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	lockd := fsm.MyID{MyName: "server", Prog: 100021, Vers: 4, Proc: 16}
	lo := netip.MustParseAddr("127.0.0.1")
	reg := fsm.Registration{ID: fsm.MonID{MonName: "client1", My: lockd}, Node: from, Callback: lo,
		Addrs: []netip.Addr{netip.MustParseAddr("10.77.9.1")}, Added: time.Now()}
	if err := tracking.TrackCreate(ctx, "keep", "p"); err != nil {
		t.Fatalf("Create on the owner: %v", err)
	}
	if _, err := registry.Monitor(ctx, reg); err != nil {
		t.Fatalf("SM_MON on the owner: %v", err)
	}

	// Built by the owner's run while it serves at epoch E, held.
	p, _ := ld.n.fsm.PlacementOf(svc)
	remove, err1 := tracking.scoped(fsm.ClientRemove{Name: "keep"})
	create, err2 := tracking.scoped(fsm.ClientCreate{Name: "ghost"})
	unmon, err3 := registry.scoped(fsm.Unregister{ID: reg.ID, Owner: fsm.Owner{Node: from, Callback: lo}})
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatal(err)
	}
	if remove.Node != from || remove.Epoch != p.Epoch || unmon.Epoch != p.Epoch {
		t.Fatalf("the owner's writes name run %s@%d and %s@%d, want %s@%d", remove.Node, remove.Epoch, unmon.Node, unmon.Epoch, from, p.Epoch)
	}

	if err := ld.n.Services().Move(ctx, svc, to); err != nil {
		t.Fatalf("move %s to %s: %v", svc, to, err)
	}
	if q, _ := ld.n.fsm.PlacementOf(svc); q.Node != to || q.Epoch != p.Epoch+1 {
		t.Fatalf("after the move the leader has %s@%d", q.Node, q.Epoch)
	}
	testutil.WaitFor(t, 10*time.Second, "the old owner applied the move", func() bool {
		q, _ := nodeByID(fc, from).fsm.PlacementOf(svc)
		return q.Epoch == p.Epoch+1
	})

	// Sent now, as the old owner sends them: forwarded, committed after
	// the move, refused.
	if _, err := tracking.send(ctx, remove); !errors.Is(err, fsm.ErrStaleRun) {
		t.Fatalf("the old run's client remove: %v, want ErrStaleRun", err)
	}
	if _, err := tracking.send(ctx, create); !errors.Is(err, fsm.ErrStaleRun) {
		t.Fatalf("the old run's client create: %v, want ErrStaleRun", err)
	}
	if _, err := registry.send(ctx, unmon); !errors.Is(err, fsm.ErrStaleRun) {
		t.Fatalf("the old run's SM_UNMON: %v, want ErrStaleRun", err)
	}
	// Proposed by the leader itself: refused at apply alike.
	for _, sc := range []fsm.Scoped{remove, create, unmon} {
		res, err := ld.n.apply(ctx, sc)
		if err != nil || !res.Refused || !errors.Is(res.Refusal, fsm.ErrStaleRun) {
			t.Fatalf("the old run's %T proposed by the leader: %+v, %v; want ErrStaleRun", sc.Cmd, res, err)
		}
	}
	// The new owner's state at E+1 is as the old run left it, on every node.
	idx := ld.n.fsm.AppliedIndex()
	for _, tn := range fc.nodes {
		testutil.WaitForSeen(t, 10*time.Second, tn.id+" applied the refused writes", func() (bool, string) {
			return tn.n.fsm.AppliedIndex() >= idx, fmt.Sprintf("applied %d of %d", tn.n.fsm.AppliedIndex(), idx)
		})
		sc := tn.n.fsm.Scope(svc)
		keep, _ := sc.HasV4Client("keep")
		ghost, _ := sc.HasV4Client("ghost")
		if !keep || ghost || sc.Len() != 1 {
			t.Fatalf("%s: a refused write landed: keep %v, ghost %v, %d registrations", tn.id, keep, ghost, sc.Len())
		}
	}

	// Negative control: the same writes, sent by the current run, land.
	testutil.WaitFor(t, 20*time.Second, svc+"'s new owner ready", next.Tracking(svc).Ready)
	for _, sc := range []*fsm.Scoped{&remove, &create, &unmon} {
		sc.Node, sc.Epoch = to, p.Epoch+1
	}
	if _, err := next.Tracking(svc).send(ctx, remove); err != nil {
		t.Fatalf("control: the current run's client remove: %v", err)
	}
	if _, err := next.Tracking(svc).send(ctx, create); err != nil {
		t.Fatalf("control: the current run's client create: %v", err)
	}
	if _, err := next.Registry(svc).send(ctx, unmon); err != nil {
		t.Fatalf("control: the current run's SM_UNMON: %v", err)
	}
	testutil.WaitForSeen(t, 10*time.Second, "control: the current run's writes land", func() (bool, string) {
		sc := nodeByID(fc, to).fsm.Scope(svc) // the SM_UNMON's answer came from the leader
		keep, _ := sc.HasV4Client("keep")
		ghost, _ := sc.HasV4Client("ghost")
		return !keep && ghost && sc.Len() == 0, fmt.Sprintf("keep %v, ghost %v, %d registrations", keep, ghost, sc.Len())
	})
}

// A forward's answer carries at most fwdMaxErr bytes of reason, which its
// reader takes: a refusal's reason naming long node ids (up to 1024
// bytes each) is cut, not made unreadable. The control: the reader
// refuses a longer one written past the cut.
func TestForwardAnswerReasonIsCutToWhatItsReaderTakes(t *testing.T) {
	in := fwdRes{Status: fwdStaleRun, State: 5, Err: strings.Repeat("n", 3*fwdMaxErr)}
	var w oncrpc.Writer
	in.MarshalXDR(&w)
	var out fwdRes
	if err := out.UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err != nil {
		t.Fatalf("a long reason made the answer unreadable: %v", err)
	}
	if out.Status != fwdStaleRun || out.State != 5 || out.Err != in.Err[:fwdMaxErr] {
		t.Fatalf("read %d %d %d bytes of reason", out.Status, out.State, len(out.Err))
	}
	var long oncrpc.Writer
	long.Uint32(fwdStaleRun)
	long.Int32(5)
	long.String(in.Err)
	if err := out.UnmarshalXDR(oncrpc.NewReader(long.Bytes())); err == nil {
		t.Fatal("control: the reader took a reason longer than fwdMaxErr")
	}
}
