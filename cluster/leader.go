package cluster

import (
	"context"
	"time"

	"github.com/nsmd/nsmd/fsm"
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
// number, grace opened), take the VIP, prove every other serving node
// stopped, run OnLeader, then tell the subscribers the term serves (they
// notify every monitored host). An SM_SIMU_CRASH or an import while
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
	n.setTimeline(Timeline{PrevLeaderContact: lastContact, Elected: start, Committed: time.Now(), State: res.State})
	n.log.Info("takeover committed", "sm_state", res.State, "grace_until", t.GraceUntil)
	n.metrics.takeovers.Inc()
	// Taking the VIP and proving every other serving node stopped wait on
	// the same kind of bound: they overlap.
	fenced := make(chan bool, 1)
	go func() { fenced <- n.awaitFenced(ctx, start) }()
	if n.cfg.VIP != nil && !n.acquireVIP(ctx, lastContact, start) {
		<-fenced // ends with ctx
		return
	}
	vipTaken = true
	n.MarkTimeline(res.State, func(tl *Timeline) { tl.VIP = time.Now() })
	if !<-fenced {
		return
	}
	if !n.serve(ctx, t, res.State) {
		// Leadership ended while the hook ran (the VIP is gone, and the
		// next leader notifies with its own state), or the takeover failed:
		// nobody is told to reclaim at a server that does not serve.
		n.log.Info("not serving in this term; not notifying")
		return
	}
	hookDone := time.Now()
	n.MarkTimeline(res.State, func(tl *Timeline) { tl.OnLeaderDone = hookDone })
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

// stopLeading drops leader-only side effects at once — the VIP first, then
// OnFollower — before the subscribers' Serving is waited for.
//
// keepWrites (a shutdown that ends the term while raft still leads) keeps
// the node taking writes until OnFollower returned; otherwise writes go to
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
		// Until OnFollower returned (the on_follower hook unmounted the
		// shared disk), this node still answers "held" to a new leader
		// asking whether it may take the VIP at once, and "serving" to one
		// asking whether it may serve.
		n.standingDown.Store(true)
		n.stoppedServing(n.stopServing())
		n.standingDown.Store(false)
	}
}

// stopServing runs OnFollower (the on_follower hook: stop nfsd, unmount).
func (n *Node) stopServing() error {
	if n.cfg.OnFollower == nil {
		return nil
	}
	return n.cfg.OnFollower()
}

// stopAtStart runs StopAtStart before this node's first term: whatever a
// previous process of it served is stopped before it says it does not
// serve, and a watchdog that process left running is disarmed only then.
func (n *Node) stopAtStart() {
	if n.cfg.StopAtStart == nil {
		return
	}
	n.log.Info("stopping whatever a previous process of this node may still serve")
	// A watchdog left running by a process that died while it served is
	// released only after the stop (it resets the node if the stop takes
	// longer than that process's deadline).
	n.stopped(n.cfg.StopAtStart(), true)
}

// serve runs OnLeader as the serving node: it says it serves first, makes
// sure raft still confirms its leadership (so a node that asked it before
// it said so cannot have been elected: see servingAnswer), arms the
// watchdog, then runs the hook. A failed OnLeader is a failed takeover:
// the node stops again, hands leadership to another serving node and, if
// none takes it, tries again. It returns true once the node serves.
func (n *Node) serve(ctx context.Context, t fsm.Takeover, state int32) bool {
	if n.cfg.OnLeader == nil {
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
		} else {
			n.fence.mu.Lock()
			n.fence.hookUntil = n.mono() + int64(n.cfg.HookTimeout+2*time.Second)
			n.fence.mu.Unlock()
			err = n.cfg.OnLeader(ctx, t, state)
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

// fault reports a fault the node cannot fix by itself (OnFault hook).
func (n *Node) fault(reason string, err error) {
	if n.cfg.OnFault != nil {
		n.cfg.OnFault(reason, err)
	}
}

// Leading reports whether this node has completed a takeover and still leads.
func (n *Node) Leading() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leading
}

// Timeline is when this node's last takeover reached each step (zero: not
// yet, or not here), all on this node's clock. SM_NOTIFY goes out from
// OnLeaderDone on. The leader loop sets the steps up to the notify; the
// steps after it (the hook's start, the clients' reclaims, the kernel
// graces' end) happen in the node's owner, which records them with
// MarkTimeline.
type Timeline struct {
	Elected      time.Time `json:"elected"`
	Committed    time.Time `json:"committed"`      // its Takeover applied
	VIP          time.Time `json:"vip"`            // the VIP acquired (or none to take)
	OnLeaderDone time.Time `json:"on_leader_done"` // OnLeader (the on_leader hook) returned; notify starts
	State        int32     `json:"sm_state"`
	// PrevLeaderContact is when this node, as a follower, last heard from
	// the leader before it (zero: none known). After a crash it is within
	// a heartbeat before the fault: Elected − PrevLeaderContact is the
	// failure detection and election, on this node's clock.
	PrevLeaderContact time.Time `json:"prev_leader_contact,omitzero"`
	// HookStarted: the on_leader script started (it may wait behind an
	// on_follower still running); zero without a script.
	HookStarted time.Time `json:"hook_started,omitzero"`
	// NotifyStarted: the SM_NOTIFY fan-out started (again after an
	// SM_SIMU_CRASH); NotifyDone: every host it started with answered or
	// was given up.
	NotifyStarted time.Time `json:"notify_started,omitzero"`
	NotifyDone    time.Time `json:"notify_done,omitzero"`
	// NFSdGraceStart: nfsd, started by the hook, sent its GraceStart
	// upcall and nsmd answered it (the NFSv4 clients that may reclaim
	// were handed to the kernel).
	NFSdGraceStart time.Time `json:"nfsd_grace_start,omitzero"`
	// NLMFirstBack: the first SM_MON committed after the takeover (this
	// node's lockd monitors a client when it takes its first lock — a
	// reclaim during grace); NLMAllBack: every host monitored at the
	// takeover did so.
	NLMFirstBack time.Time `json:"nlm_first_back,omitzero"`
	NLMAllBack   time.Time `json:"nlm_all_back,omitzero"`
	// NFSv4FirstBack: the first NFSv4 client back (a cld Create committed
	// — an NFSv4.1+ client's RECLAIM_COMPLETE, a new NFSv4.0 client's
	// OPEN_CONFIRM — or an NFSv4.0 client of the recovery epoch confirmed
	// by nfsd); NFSv4AllBack: every client of the recovery epoch.
	NFSv4FirstBack time.Time `json:"nfsv4_first_back,omitzero"`
	NFSv4AllBack   time.Time `json:"nfsv4_all_back,omitzero"`
	// NLMGraceEnd, NFSv4GraceEnd: lockd's and nfsd's grace seen over (by
	// nsmd's grace keeper, which ended it or saw the kernel end it).
	NLMGraceEnd   time.Time `json:"nlm_grace_end,omitzero"`
	NFSv4GraceEnd time.Time `json:"nfsv4_grace_end,omitzero"`
}

func (n *Node) setTimeline(tl Timeline) {
	n.mu.Lock()
	n.timeline = tl
	n.mu.Unlock()
}

// MarkTimeline records steps of the takeover whose sm_state is state:
// mark changes the timeline in place. A mark for another takeover (an
// older term's late event) is dropped.
func (n *Node) MarkTimeline(state int32, mark func(*Timeline)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.timeline.State == state && !n.timeline.Elected.IsZero() {
		mark(&n.timeline)
	}
}

// LastTimeline is the timeline of this node's last takeover.
func (n *Node) LastTimeline() Timeline {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.timeline
}

// LastTakeover is the last committed takeover.
func (n *Node) LastTakeover() fsm.Takeover { return n.fsm.LastTakeover() }
