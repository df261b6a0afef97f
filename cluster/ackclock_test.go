package cluster

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/internal/testutil"
)

// delayedAcks is the raft TCP transport (gatedTCP: no pipelining, so every
// append is seen here) whose acknowledgements reach raft late: each
// AppendEntries is delivered at once (the follower handles it when it is
// sent) and its answer is held back ackDelay before raft sees it, as on a
// congested link back. After cut, nothing new reaches the peers (a
// request fails at once) while the answers already on their way still
// arrive. cutNext cuts right after the next request was answered, so
// that its answer reaches raft ackDelay after the cut.
type delayedAcks struct {
	*gatedTCP
	cutNext atomic.Bool
	cut     atomic.Pointer[time.Time]
	didCut  chan time.Time
}

const ackDelay = 300 * time.Millisecond

func (d *delayedAcks) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if c := d.cut.Load(); c != nil {
		return errors.New("test: cut off")
	}
	err := d.gatedTCP.AppendEntries(id, target, args, resp)
	if err == nil && d.cutNext.CompareAndSwap(true, false) {
		now := time.Now()
		d.cut.Store(&now)
		d.didCut <- now
	}
	time.Sleep(ackDelay) // the answer on its way back: what is simulated
	return err
}

// A leader is cut off from both followers while acknowledgements of
// heartbeats it sent before the cut are still on their way to it. raft's
// VerifyLeader, asked after the cut, counts them: no peer acknowledged
// anything after the cut, so no lease may start after it — the fence
// lease a serving node feeds its watchdog by, and the bound its successor
// computes from its own election, count on that. The negative control
// stamps the lease when the question was asked (the lease then claims a
// quorum's confirmation up to ~ackDelay after the cut).
func TestTheLeaseCountsFromWhenTheQuorumsAcknowledgementsWereSent(t *testing.T) {
	for _, control := range []bool{false, true} {
		name := "stamped_at_send"
		if control {
			name = "control_stamped_at_question"
		}
		t.Run(name, func(t *testing.T) {
			trans := map[string]*delayedAcks{}
			c := newReadyCluster(t, 3, func(cfg *Config) {
				d := &delayedAcks{gatedTCP: cfg.Transport.(*gatedTCP), didCut: make(chan time.Time, 1)}
				trans[cfg.NodeID] = d
				cfg.Transport = d
				// Slower than ackDelay, so that delayed answers keep the
				// leader's raft lease.
				cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 1500*time.Millisecond, 1500*time.Millisecond, 800*time.Millisecond
			})
			for i := range c.nodes {
				n := c.start(i)
				if control {
					n.acks = nil // leaseStamp: the question's time, as before
				}
				n.Start()
			}
			ev := c.waitTakeover()
			ln := c.nodes[c.index(ev.node)].n
			testutil.WaitFor(t, 5*time.Second, "a lease", func() bool { return ln.leaseAt.Load() != 0 })
			l0 := ln.leaseAt.Load()
			testutil.WaitFor(t, 10*time.Second, "the lease renewed for a second", func() bool { return ln.leaseAt.Load() > l0+int64(time.Second) })
			trans[ev.node].cutNext.Store(true)
			cut := <-trans[ev.node].didCut
			cutMono := int64(cut.Sub(ln.started))
			var maxLease int64
			testutil.WaitFor(t, 10*time.Second, "the cut-off leader steps down", func() bool {
				maxLease = max(maxLease, ln.leaseAt.Load())
				return ln.raft.State() != raft.Leader
			})
			maxLease = max(maxLease, ln.leaseAt.Load())
			after := time.Duration(maxLease - cutMono)
			t.Logf("latest lease start: %v after the cut", after)
			if (after > 0) != control {
				t.Fatalf("the lease starts %v after the cut (no peer acknowledged anything sent after it); old stamping: %v", after, control)
			}
		})
	}
}
