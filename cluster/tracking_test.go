package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	itest "github.com/nsmd/nsmd/internal/testutil"
)

// TestOnlyTheServingLeaderCommitsTrackingWrites: ApplyServing commits an
// NFSv4 client-tracking command on the serving leader only; a follower's
// is ErrNotServing and changes nothing anywhere (it is never forwarded),
// and a command that is not a tracking write is refused on the leader too.
// The control: the leader's write, checked the same way, is found on
// every node, so the check would see a refused write had it committed.
func TestOnlyTheServingLeaderCommitsTrackingWrites(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.waitTakeover(5 * time.Second)
	li, ld := c.leader(5 * time.Second)
	f := c.nodes[(li+1)%3]
	ctx := context.Background()
	itest.WaitFor(t, 5*time.Second, "the follower to know the leader", func() bool { return f.n.Leader() == ld.id })

	if _, err := f.n.ApplyServing(ctx, fsm.ClientCreate{Name: "from-follower"}); !errors.Is(err, ErrNotServing) {
		t.Fatalf("a follower's tracking write: %v, want ErrNotServing", err)
	}
	if _, err := ld.n.ApplyServing(ctx, fsm.ClientCreate{Name: "from-leader"}); err != nil {
		t.Fatalf("the leader's tracking write: %v", err)
	}
	if cur, _ := ld.n.View().HasV4Client("from-leader"); !cur {
		t.Fatal("the leader's answered write is not applied on the leader")
	}
	before := ld.n.View().Count()
	if _, err := ld.n.ApplyServing(ctx, fsm.Register{Reg: testReg("h1", ld.id, 1)}); err == nil || errors.Is(err, ErrNotServing) {
		t.Fatalf("a registration through ApplyServing: %v, want a refusal of the command", err)
	}
	c.converge(5 * time.Second)
	for _, tn := range c.nodes {
		if cur, _ := tn.n.View().HasV4Client("from-follower"); cur {
			t.Errorf("%s: the follower's refused write was committed", tn.id)
		}
		if cur, _ := tn.n.View().HasV4Client("from-leader"); !cur {
			t.Errorf("%s: the leader's write is missing", tn.id)
		}
		if got := tn.n.View().Count(); got != before {
			t.Errorf("%s: %d registrations, want %d: the refused command was committed", tn.id, got, before)
		}
	}

}
