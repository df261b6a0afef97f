package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/timeline"
)

// leaderLoop is the one owner of leader-only side effects. It is driven by
// this node's gains and losses of leadership (raft's NotifyCh), which
// observeLeadership hands over as the latest value only: a burst of
// changes collapses to the latest.
func (n *Node) leaderLoop() {
	n.stopAtStart()
	var cur *term
	stop := func() {
		if cur == nil {
			return
		}
		n.stopLeading(false)
		cur.cancel()
		<-cur.done
		cur = nil
	}
	defer stop()
	quitting := false
	for {
		select {
		case <-n.ctx.Done():
			return
		case ack := <-n.quitTerms:
			if cur != nil {
				// Still raft's leader with its takeover committed: writes
				// (lockd's SM_UNMON as nfsd stops) commit until the hook
				// returned.
				n.log.Info("shutting down: ending this node's term")
				cur.cancel()
				<-cur.done
				n.stopLeading(true)
				cur = nil
			}
			quitting = true
			close(ack)
		case leader := <-n.termCh:
			n.metrics.leaderChanges.Inc()
			if !leader {
				n.log.Info("lost leadership")
				stop()
				continue
			}
			if cur != nil || quitting {
				continue // still leading, or shutting down
			}
			n.log.Info("gained leadership")
			cur = n.startTerm()
		}
	}
}

// term is one leadership term's goroutine.
type term struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (n *Node) startTerm() *term {
	ctx, cancel := context.WithCancel(n.ctx)
	t := &term{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		if n.cfg.Witness {
			n.handOff(ctx)
			return
		}
		n.lead(ctx)
	}()
	return t
}

// lead runs one term of leadership: Barrier (apply everything the old
// leader committed), commit a Takeover (sm_state up to the next odd
// number, grace opened), prove every other serving node stopped while the
// VIP's hand-over wait runs, take the VIP, run Server.Serve, announce the
// VIP, then tell the subscribers the term serves (they notify every
// monitored host). An SM_SIMU_CRASH or an import while
// leading tells them again with its new state.
func (n *Node) lead(ctx context.Context) {
	start := time.Now()
	lastContact := n.raft.LastContact() // the previous leader, as a follower last heard it
	vipTaken := false
	defer func() {
		if !vipTaken { // this term ends without the VIP: see vipUnsure
			n.vipUnsure(start)
		}
	}()
	// A barrier enqueued while raft is handing leadership over (or being
	// shut down) may not resolve until raft shuts down: wait for it only
	// as long as this term lasts, so shutdown is never stuck behind it.
	// The waiter ends when raft resolves the future (at the latest at
	// raft's shutdown).
	bf := n.raft.Barrier(10 * time.Second)
	berr := make(chan error, 1)
	go func() { berr <- bf.Error() }()
	select {
	case err := <-berr:
		if err != nil {
			n.log.Warn("barrier after election failed; not taking over", "err", err)
			return
		}
	case <-ctx.Done():
		return
	}
	select {
	case <-n.crashCh: // stale: from before this term
	default:
	}
	t := n.takeover("leader_elected")
	asked := n.mono()
	res, err := n.applyLocal(ctx, t) // never forwarded: a deposed leader's takeover is void
	if err == nil {
		n.leaseAt.Store(asked) // committed: a quorum heard from us since asked (Ready's lease)
	}
	if err != nil {
		n.log.Warn("takeover not committed", "err", err)
		n.fault("takeover", err)
		return
	}
	n.mu.Lock()
	n.leading = true
	n.mu.Unlock()
	n.wakeWriters()
	tl := timeline.Timeline{State: res.State}
	tl.Mark(timeline.PrevLeaderContact, lastContact)
	tl.Mark(timeline.Elected, start)
	tl.Mark(timeline.Committed, time.Now())
	n.setTimeline(tl)
	n.log.Info("takeover committed", "sm_state", res.State, "grace_until", t.GraceUntil)
	n.metrics.takeovers.Inc()
	// The VIP's wait (a previous holder's copy must have expired) and the
	// proof that every other serving node stopped overlap. The address is
	// added only once both hold, right before on_leader (which checks that
	// this node holds it), and announced only once the hook returned
	// (announcer): clients keep sending to the old holder's hardware
	// address until nfsd listens here. Reaching this node before, they
	// would be refused, and each refused reconnect doubles the kernel RPC
	// client's pause before its next (3, 6, 12 s).
	fenced := make(chan fenceOutcome, 1)
	go func() {
		ok, at := n.awaitFenced(ctx, start)
		fenced <- fenceOutcome{ok, at}
	}()
	if n.cfg.VIP != nil && !n.awaitVIPFree(ctx, lastContact, start) {
		<-fenced // ends with ctx
		return
	}
	f := <-fenced
	if !f.ok {
		return
	}
	if !f.at.IsZero() {
		n.MarkTimeline(res.State, func(tl *timeline.Timeline) { tl.Mark(timeline.Fenced, f.at) })
	}
	quiet := n.cfg.VIP != nil && n.quietVIP()
	if n.cfg.VIP != nil && !n.takeVIP(ctx, quiet) {
		return
	}
	vipTaken = true
	n.MarkTimeline(res.State, func(tl *timeline.Timeline) { tl.Mark(timeline.VIP, time.Now()) })
	if !n.serve(ctx, t, res.State) {
		// Leadership ended while the hook ran (the VIP is gone, and the
		// next leader notifies with its own state), or the takeover failed:
		// nobody is told to reclaim at a server that does not serve.
		n.log.Info("not serving in this term; not notifying")
		return
	}
	hookDone := time.Now()
	if quiet {
		n.announceVIP() // nfsd listens now: clients may find this node
	}
	n.MarkTimeline(res.State, func(tl *timeline.Timeline) { tl.Mark(timeline.OnLeaderDone, hookDone) })
	n.metrics.takeoverSeconds.Observe(hookDone.Sub(start).Seconds())
	if !lastContact.IsZero() { // a failover: there was a leader before us
		n.metrics.failoverSeconds.Observe(hookDone.Sub(lastContact).Seconds())
	}

	state := res.State
	for {
		nctx, ncancel := context.WithCancel(ctx)
		finished := make(chan struct{})
		go func(state int32) {
			defer close(finished)
			n.servingTerm(nctx, state)
		}(state)
		select {
		case <-ctx.Done():
			ncancel()
			<-finished
			return
		case state = <-n.crashCh:
			ncancel()
			<-finished
			n.log.Info("a takeover within this term: serving with its new sm_state", "sm_state", state)
		}
	}
}

// fenceOutcome is awaitFenced's answer: ok, and when the last other
// serving node was proven stopped (zero: there was none to prove).
type fenceOutcome struct {
	ok bool
	at time.Time
}

// stopLeading drops leader-only side effects at once — the VIP first, then
// Server.Stop — before the subscribers' Serving is waited for.
//
// keepWrites (a shutdown that ends the term while raft still leads) keeps
// the node taking writes until Server.Stop returned; otherwise writes go to
// the next leader at once.
func (n *Node) stopLeading(keepWrites bool) {
	n.mu.Lock()
	was := n.leading
	if !keepWrites {
		n.leading = false
	}
	n.mu.Unlock()
	if keepWrites {
		defer func() {
			n.mu.Lock()
			n.leading = false
			n.mu.Unlock()
		}()
	}
	if n.cfg.VIP != nil {
		if err := n.cfg.VIP.Release(); err != nil {
			n.log.Error("cannot release the VIP", "err", err)
			n.fault("vip_release", err)
		}
	}
	if was && n.serving.Load() {
		// Until Server.Stop returned (the on_follower hook unmounted the
		// shared disk), this node still answers "held" to a new leader
		// asking whether it may take the VIP at once, and "serving" to one
		// asking whether it may serve.
		n.standingDown.Store(true)
		n.stoppedServing(n.stopServing())
		n.standingDown.Store(false)
	}
}

// stopServing runs Server.Stop (the on_follower hook: stop nfsd, unmount).
func (n *Node) stopServing() error {
	if n.cfg.Server == nil {
		return nil
	}
	return n.cfg.Server.Stop(StopLeadershipLost)
}

// stopAtStart runs Server.Stop before this node's first term (with
// Config.StopAtStart): whatever a previous process of it served is stopped
// before it says it does not serve, and a watchdog that process left
// running is disarmed only then.
func (n *Node) stopAtStart() {
	node := n.cfg.StopAtStart && n.cfg.Server != nil
	if !node && n.runs.srv == nil {
		return
	}
	n.log.Info("stopping whatever a previous process of this node may still serve")
	// A watchdog left running by a process that died while it served is
	// released only after the stop (it resets the node if the stop takes
	// longer than that process's deadline).
	var err error
	if node {
		err = n.cfg.Server.Stop(StopStart)
	}
	n.stopped(errors.Join(err, n.runs.stopAtStart()), true)
}

// serve runs Server.Serve as the serving node: it says it serves first, makes
// sure raft still confirms its leadership (so a node that asked it before
// it said so cannot have been elected: see servingAnswer), arms the
// watchdog, then runs the hook. A failed Serve is a failed takeover:
// the node stops again, hands leadership to another serving node and, if
// none takes it, tries again. It returns true once the node serves.
func (n *Node) serve(ctx context.Context, t fsm.Takeover, state int32) bool {
	if n.cfg.Server == nil {
		return true
	}
	for {
		if n.stopFailed.Load() {
			// Its storage is still held and its watchdog resets it: it
			// neither serves again nor says it does not.
			n.log.Error("this node's last stop failed: not serving again; handing leadership on")
			if _, err := n.stepAsideAfterFailedTakeover(); err != nil {
				n.log.Warn("no other serving node took leadership", "err", err)
			}
			<-ctx.Done()
			return false
		}
		n.serving.Store(true)
		if !n.awaitLease(ctx) {
			n.serving.Store(false) // nothing started
			return false
		}
		if err := n.armWatchdog(); err != nil {
			n.serving.Store(false) // nothing started
			n.log.Error("cannot arm the watchdog: not serving without a fence", "err", err)
			n.fault("watchdog", err)
		} else if err := n.recordServing(ctx); err != nil {
			n.stoppedServing(nil) // nothing started: disarm, not serving
			if ctx.Err() != nil {
				return false
			}
			n.log.Error("cannot record that this node serves: not serving unrecorded", "err", err)
			n.fault("serving_record", err)
		} else {
			n.fence.mu.Lock()
			n.fence.hookUntil = n.mono() + int64(n.cfg.HookTimeout+2*time.Second)
			n.fence.mu.Unlock()
			err = n.cfg.Server.Serve(ctx, t, state)
			n.fence.mu.Lock()
			n.fence.hookUntil = 0
			n.fence.mu.Unlock()
			if ctx.Err() != nil {
				return false // stopLeading stops what the hook started
			}
			if err == nil {
				return true
			}
			n.metrics.failedTakeovers.Inc()
			n.log.Error("on_leader failed: a failed takeover; stopping again and handing leadership on", "err", err)
			n.standingDown.Store(true)
			n.stoppedServing(n.stopServing())
			n.standingDown.Store(false)
			if n.stopFailed.Load() {
				return false // the watchdog resets this node
			}
		}
		if to, err := n.stepAsideAfterFailedTakeover(); err == nil {
			n.log.Info("handed leadership on after a failed takeover", "to", to)
			<-ctx.Done() // the new leader serves
			return false
		} else {
			n.log.Warn("no other serving node took leadership; trying to serve again", "err", err, "in", failedTakeoverRetry)
		}
		tm := time.NewTimer(failedTakeoverRetry)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return false
		}
	}
}

// failedTakeoverRetry is how long a leader whose on_leader failed and that
// found no other serving node waits before it tries again.
const failedTakeoverRetry = 5 * time.Second

// awaitLease waits until a quorum confirmed this node's leadership within
// the fence lease (the lease loop asks every quarter lease), false when
// ctx ends.
func (n *Node) awaitLease(ctx context.Context) bool {
	for !n.fenceLeaseFresh() {
		t := time.NewTimer(n.cfg.LeaderLeaseTimeout / 4)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
	return ctx.Err() == nil
}

// fault reports a fault the node cannot fix by itself (Server.Fault: the
// on_fault hook).
func (n *Node) fault(reason string, err error) {
	if n.cfg.Server != nil {
		n.cfg.Server.Fault(reason, err)
	}
}

// Leading reports whether this node has completed a takeover and still leads.
func (n *Node) Leading() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leading
}

func (n *Node) setTimeline(tl timeline.Timeline) {
	n.mu.Lock()
	n.timeline = tl
	n.mu.Unlock()
}

// MarkTimeline records steps of the takeover whose sm_state is state
// (package timeline): mark changes the timeline in place. The leader loop
// marks the steps up to the SM_NOTIFY fan-out; the later ones (the hook's
// start, the clients' reclaims, the kernel graces' end) happen in the
// node's owner, which marks them here. A mark for another takeover (an
// older term's late event) is dropped.
func (n *Node) MarkTimeline(state int32, mark func(*timeline.Timeline)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.timeline.State == state && !n.timeline.At(timeline.Elected).IsZero() {
		mark(&n.timeline)
	}
}

// LastTimeline is the timeline of this node's last takeover.
func (n *Node) LastTimeline() timeline.Timeline {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.timeline
}
