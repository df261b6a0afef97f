package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/timeline"
)

// takeover is this node's side of one takeover, the cluster.Server the
// replication layer calls in a takeover's order (cluster/DESIGN.md,
// "Leadership"): once the Takeover committed, the VIP is held and every
// other serving node is proven stopped, the leader loop calls Serve (the
// grace keeper of the term, the on_leader hook, the tickle ACKs, the
// grace's end watched), then announce (the Serving subscriber: SM_NOTIFY
// with the new state); when leadership ends, Stop (the on_follower hook)
// before a successor may serve, and before the first term too when a
// previous process may have served (fence.go sets StopAtStart); Fault for
// what the node cannot fix by itself (the on_fault hook). The hooks'
// runner is hooks.go; the fence agent the node calls is fence.go's.
type takeover struct{ a *Agent }

var _ cluster.Server = takeover{}

// Serve runs the on_leader hook and returns when it has run (bounded by
// hook_timeout), so that the notifier, which starts after this returns,
// sends SM_NOTIFY only once the service it announces (kernel nfsd and
// lockd, started by the hook) can take the clients' reclaims. A failed hook
// is reported (status, metric, on_fault) and the clients are still
// notified: one never notified loses its locks for sure, one notified
// while nfsd is down retries its reclaim (hard mounts retry forever).
func (tk takeover) Serve(ctx context.Context, t fsm.Takeover, state int32) error {
	a := tk.a
	if len(a.cfg.Services) > 0 {
		// With services: each service is served by its own server
		// (serviceroom.go); raft leadership serves nothing by itself.
		a.log.Info("leading (raft only: with services:, leadership serves no service)", "sm_state", state)
		return nil
	}
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

// Stop runs the on_follower hook (its reason why) and returns when it has
// run (bounded by hook_timeout). When leadership ended, until then this
// node tells a new leader that asks that it has not stood down yet, so
// that leader does not start its on_leader hook (mount the shared disk)
// while this one still unmounts it; at start, a previous process that died
// while it served left the storage mounted and nfsd running.
func (tk takeover) Stop(why cluster.StopReason) error {
	a := tk.a
	if len(a.cfg.Services) > 0 {
		return nil // leadership served nothing (Serve); each service stops in its room
	}
	if why == cluster.StopLeadershipLost {
		a.log.Info("following")
	}
	if err := <-a.hooks.follower(a.node.View().State(), string(why)); err != nil {
		return fmt.Errorf("on_follower hook (%s): %w", why, err)
	}
	return nil
}

// Fault logs a fault the node cannot fix by itself and runs the on_fault
// hook.
func (tk takeover) Fault(reason string, err error) {
	a := tk.a
	a.log.Error("fault", "reason", reason, "err", err)
	if reason == cluster.FaultServiceStart || reason == cluster.FaultServiceStop {
		return // the service's room ran on_fault, with the service's environment
	}
	a.hooks.fault(a.node.RaftStatus().Role, a.node.View().State(), reason, err)
}
