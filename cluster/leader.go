package cluster

import (
	"context"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nsm"
)

// leaderLoop is the one owner of leader-only side effects. It is driven by
// raft's NotifyCh (buffered, so raft never blocks on us); a burst of
// changes collapses to the latest.
func (n *Node) leaderLoop() {
	var cur *term
	stop := func() {
		if cur == nil {
			return
		}
		n.stopLeading()
		cur.cancel()
		<-cur.done
		cur = nil
	}
	defer stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case leader := <-n.leaderCh:
		latest:
			for {
				select {
				case leader = <-n.leaderCh:
				default:
					break latest
				}
			}
			n.metrics.leaderChanges.Inc()
			if !leader {
				n.log.Info("lost leadership")
				stop()
				continue
			}
			if cur != nil {
				continue // still leading: the last change we saw was a gain
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
// number, grace opened), run OnLeader, then notify every monitored host.
// An SM_SIMU_CRASH while leading restarts the fan-out with its new state.
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
	tl := Timeline{Elected: start, Committed: time.Now(), State: res.State}
	n.setTimeline(tl)
	n.log.Info("takeover committed", "sm_state", res.State, "grace_until", t.GraceUntil)
	n.metrics.takeovers.Inc()
	if n.cfg.VIP != nil && !n.acquireVIP(ctx, lastContact, start) {
		return
	}
	vipTaken = true
	tl.VIP = time.Now()
	n.setTimeline(tl)
	if n.cfg.OnLeader != nil {
		n.cfg.OnLeader(ctx, t, res.State) // returns once the on_leader hook ran
	}
	if ctx.Err() != nil {
		// Leadership ended while the hook ran: the VIP is gone, and the
		// next leader notifies with its own state.
		n.log.Info("leadership lost during the on_leader hook; not notifying")
		return
	}
	tl.OnLeaderDone = time.Now()
	n.setTimeline(tl)
	n.metrics.takeoverSeconds.Observe(time.Since(start).Seconds())
	if !lastContact.IsZero() { // a failover: there was a leader before us
		n.metrics.failoverSeconds.Observe(tl.OnLeaderDone.Sub(lastContact).Seconds())
	}

	state := res.State
	for {
		nctx, ncancel := context.WithCancel(ctx)
		finished := make(chan struct{})
		go func(state int32) {
			defer close(finished)
			n.notify(nctx, state)
		}(state)
		select {
		case <-ctx.Done():
			ncancel()
			<-finished
			return
		case state = <-n.crashCh:
			ncancel()
			<-finished
			n.log.Info("SM_SIMU_CRASH: notifying again", "sm_state", state)
		}
	}
}

// notify sends SM_NOTIFY with state to every distinct monitored host.
func (n *Node) notify(ctx context.Context, state int32) {
	cfg := n.cfg.Notifier
	if cfg.Logger == nil {
		cfg.Logger = n.log
	}
	nt, err := nsm.NewNotifier(cfg)
	if err != nil {
		n.log.Error("cannot start notifier", "err", err)
		return
	}
	targets := n.fsm.Targets()
	n.mu.Lock()
	n.notifier, n.notifyState, n.notifyTargets = nt, state, len(targets)
	n.mu.Unlock()
	n.log.Info("notifying monitored hosts", "hosts", len(targets), "sm_state", state)
	sum := nt.Run(ctx, state, targets)
	n.log.Info("notify finished", "summary", sum)
}

// stopLeading drops leader-only side effects at once — the VIP first, then
// OnFollower — before the notifier is waited for.
func (n *Node) stopLeading() {
	n.mu.Lock()
	was := n.leading
	n.leading = false
	n.mu.Unlock()
	if n.cfg.VIP != nil {
		if err := n.cfg.VIP.Release(); err != nil {
			n.log.Error("cannot release the VIP", "err", err)
			n.fault("vip_release", err)
		}
	}
	if was && n.cfg.OnFollower != nil {
		// Until OnFollower returned (the on_follower hook unmounted the
		// shared disk), this node still answers "held" to a new leader
		// asking whether it may take the VIP at once.
		n.standingDown.Store(true)
		n.cfg.OnFollower()
		n.standingDown.Store(false)
	}
}

// Leading reports whether this node has completed a takeover and still leads.
func (n *Node) Leading() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leading
}

// Timeline is when this node's last takeover reached each step (zero: not
// yet). SM_NOTIFY goes out from OnLeaderDone on.
type Timeline struct {
	Elected      time.Time `json:"elected"`
	Committed    time.Time `json:"committed"`      // its Takeover applied
	VIP          time.Time `json:"vip"`            // the VIP acquired (or none to take)
	OnLeaderDone time.Time `json:"on_leader_done"` // OnLeader (the on_leader hook) returned; notify starts
	State        int32     `json:"sm_state"`
}

func (n *Node) setTimeline(tl Timeline) {
	n.mu.Lock()
	n.timeline = tl
	n.mu.Unlock()
}

// LastTimeline is the timeline of this node's last takeover.
func (n *Node) LastTimeline() Timeline {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.timeline
}

// LastTakeover is the last committed takeover.
func (n *Node) LastTakeover() fsm.Takeover { return n.fsm.LastTakeover() }
