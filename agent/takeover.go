package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/timeline"
)

// This node's side of one takeover, in the order the replication layer
// calls it (cluster/DESIGN.md, "Leadership"): once the Takeover committed,
// the VIP is held and every other serving node is proven stopped, the
// leader loop calls onLeader (cluster.Config.OnLeader: the grace keeper
// of the term, the on_leader hook, the tickle ACKs, the grace's end
// watched), then announce (the Serving subscriber: SM_NOTIFY with the new
// state); when leadership ends, onFollower (OnFollower: the on_follower
// hook) before a successor may serve; before the first term, stopAtStart
// (StopAtStart, set with fencing: fence.go); and onFault for what the node
// cannot fix by itself (OnFault: the on_fault hook). The hooks' runner is
// hooks.go; the fence agent the node calls is fence.go's.

// onLeader runs the on_leader hook and returns when it has run (bounded by
// hook_timeout), so that the notifier, which starts after this returns,
// sends SM_NOTIFY only once the service it announces (kernel nfsd and
// lockd, started by the hook) can take the clients' reclaims. A failed hook
// is reported (status, metric, on_fault) and the clients are still
// notified: one never notified loses its locks for sure, one notified
// while nfsd is down retries its reclaim (hard mounts retry forever).
func (a *Agent) onLeader(ctx context.Context, t fsm.Takeover, state int32) error {
	a.log.Info("leading", "sm_state", state, "grace_until", t.GraceUntil, "vip_held", a.node.VIPHeld())
	start := time.Now()
	a.v4.grace.Takeover(state)
	var err error
	select {
	case err = <-a.hooks.leader(ctx, t, state):
	case <-ctx.Done(): // leadership lost meanwhile: no notify follows anyway
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("on_leader hook: %w", err)
	}
	if a.cfg.OnLeader != "" {
		a.log.Info("on_leader hook done; notifying", "took", time.Since(start).Round(time.Millisecond))
	}
	a.tickle.takeover(ctx, state) // alongside SM_NOTIFY, which starts when this returns
	a.v4.grace.Serving(ctx)
	return nil
}

// hookStarted records the on_leader script's start in the takeover's
// timeline.
func (a *Agent) hookStarted(event string, state int32, at time.Time) {
	if event == hookEventLeader && a.node != nil {
		a.node.MarkTimeline(state, func(tl *timeline.Timeline) { tl.Mark(timeline.HookStarted, at) })
	}
}

// announce sends SM_NOTIFY with state to every distinct monitored host
// (a cluster.Subscriber's Serving: the node calls it once its takeover
// committed, the VIP is held and on_leader succeeded, and again after an
// SM_SIMU_CRASH or an import; ctx ends with the term or that next call).
func (a *Agent) announce(ctx context.Context, state int32) {
	targets := a.node.View().Targets()
	a.log.Info("notifying monitored hosts", "hosts", len(targets), "sm_state", state)
	started := time.Now()
	a.node.MarkTimeline(state, func(tl *timeline.Timeline) {
		tl.Mark(timeline.NotifyStarted, started)
		tl.Mark(timeline.NotifyDone, time.Time{})
	})
	sum := a.notifier.Run(ctx, state, targets)
	if ctx.Err() == nil && sum.Pending == 0 {
		done := time.Now()
		a.node.MarkTimeline(state, func(tl *timeline.Timeline) { tl.Mark(timeline.NotifyDone, done) })
	}
	a.log.Info("notify finished", "summary", sum)
}

// onFollower runs the on_follower hook and returns when it has run
// (bounded by hook_timeout): until then this node tells a new leader that
// asks that it has not stood down yet, so that leader does not start its
// on_leader hook (mount the shared disk) while this one still unmounts it.
func (a *Agent) onFollower() error {
	a.log.Info("following")
	if err := <-a.hooks.follower(a.node.View().State(), "leadership_lost"); err != nil {
		return fmt.Errorf("on_follower hook: %w", err)
	}
	return nil
}

// stopAtStart runs the on_follower hook (reason "start") before this node
// may serve: a previous process that died while it served left the storage
// mounted and nfsd running.
func (a *Agent) stopAtStart() error {
	if err := <-a.hooks.follower(a.node.View().State(), "start"); err != nil {
		return fmt.Errorf("on_follower hook at start: %w", err)
	}
	return nil
}

func (a *Agent) onFault(reason string, err error) {
	a.log.Error("fault", "reason", reason, "err", err)
	a.hooks.fault(a.node.RaftStatus().Role, a.node.View().State(), reason, err)
}
