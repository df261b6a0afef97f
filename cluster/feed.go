package cluster

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/fence"
)

// Feeding the watchdog: a serving node pings it only while it holds proof
// that it may serve, and a ping may not outlive that proof
// (cluster/DESIGN.md, "A ping never outlives its proof"): the proof's end
// is asked before the ping and again when it returns, and a ping that
// returned late leaves the watchdog starved towards proof + fence timeout.
// The proof is the fence lease: leaseAt (no later than when the quorum's
// acknowledgements that confirmed this leader were sent, ackclock.go)
// plus fenceLease.

// feedInterval is how often the watchdog is fed or starved: a quarter of
// the fence timeout, at most every half second.
func (n *Node) feedInterval() time.Duration {
	return min(max(n.cfg.FenceTimeout/4, 50*time.Millisecond), 500*time.Millisecond)
}

// fenceLoop feeds the armed watchdog while proofEnd is ahead, and starves it
// otherwise. A stopped or stuck process does neither, and the kernel resets
// the machine.
func (n *Node) fenceLoop() {
	t := time.NewTicker(n.feedInterval())
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		n.tickWatchdog()
	}
}

func (n *Node) tickWatchdog() {
	n.fence.mu.Lock()
	defer n.fence.mu.Unlock()
	if !n.fence.armed {
		return
	}
	hookUntil := n.fence.hookUntil
	proofEnd := func() time.Time { return n.proofEnd(hookUntil) }
	if time.Now().Before(proofEnd()) {
		err := n.cfg.Watchdog.FeedWithin(proofEnd)
		switch {
		case err == nil:
			if n.fence.starving {
				n.log.Info("watchdog fed again")
			}
			n.fence.starving, n.fence.lastFeed = false, time.Now()
			n.metrics.watchdogFeeds.Inc()
			return
		case errors.Is(err, fence.ErrLateFeed):
			// Pinged, but it may have landed after the proof ended: the
			// watchdog is starved towards that proof's end already.
			if !n.fence.starving {
				n.log.Error("the watchdog's ping returned after this node's proof ended: starving it", "err", err)
			}
			n.metrics.watchdogLateFeeds.Inc()
			n.fence.starving = true
			return
		case !errors.Is(err, fence.ErrNoProof):
			n.log.Error("cannot feed the watchdog", "err", err)
			return
		}
		// The proof ended between the two looks: starve.
	}
	if !n.fence.starving {
		n.log.Warn("no proof this node may serve: the watchdog is no longer fed", "serving", n.serving.Load(), "stop_failed", n.stopFailed.Load(), "fence_lease_fresh", n.fenceLeaseFresh())
	}
	n.fence.starving = true
	if err := n.cfg.Watchdog.Starve(); err != nil {
		n.log.Error("cannot shorten the watchdog's timeout", "err", err)
	}
}

// proofEnd is until when this node may ping its watchdog (zero: it may
// not): it serves, its stop did not fail, raft says it leads; then the
// fence lease's end (leaseAt + fenceLease) or, while an on_leader hook
// runs, the hook's end (hookUntil, mono ns; 0: none), whichever is first.
// It is asked before a ping and again when the ping returns
// (fence.Watchdog.FeedWithin), so it reads only atomics.
//
// With services served here (servicerun.go), the earliest end of their
// leases bounds it too: one watchdog covers everything the node serves.
func (n *Node) proofEnd(hookUntil int64) time.Time {
	if n.stopFailed.Load() {
		return time.Time{}
	}
	svcEnd, services := n.runs.proofEnd()
	serving := n.serving.Load()
	if !serving && !services {
		return time.Time{}
	}
	end := svcEnd
	if serving {
		v := n.leaseAt.Load()
		if v == 0 || n.raft.State() != raft.Leader {
			return time.Time{}
		}
		end = v + int64(n.fenceLease())
		if hookUntil != 0 {
			end = min(end, hookUntil)
		}
		if services {
			end = min(end, svcEnd)
		}
	}
	if end <= 0 {
		return time.Time{}
	}
	return n.started.Add(time.Duration(end))
}

// fenceLease is how long after a quorum last confirmed its leadership a
// serving node may still feed its watchdog: the heartbeat timeout, longer
// than the read lease (a busy machine's confirmations come late, and a
// healthy leader must not be reset for it; raft itself steps down after
// LeaderLeaseTimeout without a quorum), and what a successor adds to its
// election time (peerBound, promise.go).
func (n *Node) fenceLease() time.Duration {
	return max(n.cfg.HeartbeatTimeout, n.cfg.LeaderLeaseTimeout)
}

// fenceLeaseFresh: raft says leader, and a quorum confirmed a heartbeat
// round asked within fenceLease.
func (n *Node) fenceLeaseFresh() bool {
	if n.raft.State() != raft.Leader {
		return false
	}
	v := n.leaseAt.Load()
	return v != 0 && n.mono()-v < int64(n.fenceLease())
}

// armWatchdog arms the watchdog before this node serves; a node that
// cannot arm it does not serve.
func (n *Node) armWatchdog() error {
	if n.cfg.Watchdog == nil {
		return nil
	}
	n.fence.mu.Lock()
	defer n.fence.mu.Unlock()
	if err := n.cfg.Watchdog.Arm(); err != nil {
		return fmt.Errorf("arm the watchdog: %w", err)
	}
	if !n.fence.armed {
		n.log.Info("watchdog armed", "timeout", n.cfg.FenceTimeout)
	}
	n.fence.armed, n.fence.starving, n.fence.lastFeed = true, false, time.Now()
	n.metrics.watchdogArmed.Set(1)
	return nil
}

// stoppedServing records the outcome of a stop (the on_follower hook, or
// the stop at start): on success the node no longer serves and disarms
// its watchdog; on failure it still holds the storage, and its watchdog
// resets it within a second (armed now if it was not).
func (n *Node) stoppedServing(err error) { n.stopped(err, false) }

// stopped is stoppedServing; atStart releases a watchdog that a previous
// process of this node may have left running.
func (n *Node) stopped(err error, atStart bool) {
	n.fence.mu.Lock()
	defer n.fence.mu.Unlock()
	if err == nil {
		n.serving.Store(false)
		n.stopFailed.Store(false)
		n.disarmIdleLocked(atStart)
		return
	}
	n.stopFailed.Store(true) // the failed hook already ran on_fault
	if n.cfg.Watchdog == nil {
		n.log.Error("stop failed and no watchdog fences this node: it may still hold the storage; another node must not serve it until it is stopped", "err", err)
		return
	}
	n.log.Error("stop failed: resetting this node through its watchdog", "err", err)
	if !n.fence.armed {
		if aerr := n.cfg.Watchdog.Arm(); aerr != nil {
			n.log.Error("cannot arm the watchdog to reset this node", "err", aerr)
			return
		}
		n.fence.armed = true
		n.metrics.watchdogArmed.Set(1)
	}
	n.fence.starving = true
	if rerr := n.cfg.Watchdog.ResetSoon(); rerr != nil {
		n.log.Error("cannot shorten the watchdog's timeout", "err", rerr)
	}
}

// disarmIfIdle disarms the watchdog and clears the serving record once
// nothing is served here any more: no term serves (serving), no service
// runs (servicerun.go) and no stop failed.
func (n *Node) disarmIfIdle() {
	n.fence.mu.Lock()
	defer n.fence.mu.Unlock()
	n.disarmIdleLocked(false)
}

// disarmIdleLocked is disarmIfIdle with fence.mu held; atStart releases a
// watchdog that a previous process of this node may have left running.
func (n *Node) disarmIdleLocked(atStart bool) {
	if n.serving.Load() || n.stopFailed.Load() || n.runs.active() {
		return
	}
	n.stoppedRecording() // clear the serving record (promise.go)
	if n.cfg.Watchdog == nil {
		return
	}
	disarm := n.cfg.Watchdog.Disarm
	if atStart {
		disarm = n.cfg.Watchdog.Release
	}
	if derr := disarm(); derr != nil {
		n.log.Error("cannot disarm the watchdog", "err", derr)
	} else if n.fence.armed {
		n.log.Info("stopped serving: watchdog disarmed")
	}
	n.fence.armed, n.fence.starving = false, false
	n.metrics.watchdogArmed.Set(0)
}
