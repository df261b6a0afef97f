package agent

import (
	"context"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/timeline"
)

// graceCluster is this node's cluster as package grace needs it
// (grace.Cluster): reads of the replicated state (the node's View), the
// client-tracking commands (each one write of the serving node,
// Node.ApplyServing) and the takeover's timeline. It reaches the node
// through the agent because the grace service is built before the node
// (the node's Applied subscriber hands every applied command to the
// service).
type graceCluster struct{ a *Agent }

func (g graceCluster) State() int32         { return g.a.node.View().State() }
func (g graceCluster) AppliedIndex() uint64 { return g.a.node.View().AppliedIndex() }

func (g graceCluster) MonitoredHosts() []string {
	targets := g.a.node.View().Targets()
	hosts := make([]string, len(targets))
	for i, t := range targets {
		hosts[i] = t.MonName
	}
	return hosts
}

func (g graceCluster) Epochs() (current, recovery uint64) { return g.a.node.View().Epochs() }
func (g graceCluster) V4Clients(recovery bool) []fsm.V4Client {
	return g.a.node.View().V4Clients(recovery)
}
func (g graceCluster) HasV4Client(name string) (inCurrent, inRecovery bool) {
	return g.a.node.View().HasV4Client(name)
}

// TrackCreate records NFSv4 client name (and the hash of its Kerberos
// principal, if any) in the current epoch (cld Create).
func (g graceCluster) TrackCreate(ctx context.Context, name, princHash string) error {
	_, err := g.a.node.ApplyServing(ctx, fsm.ClientCreate{Name: name, PrincHash: princHash})
	return err
}

// TrackRemove drops client name from the current epoch (cld Remove).
func (g graceCluster) TrackRemove(ctx context.Context, name string) error {
	_, err := g.a.node.ApplyServing(ctx, fsm.ClientRemove{Name: name})
	return err
}

// TrackCheck says whether client name may reclaim (it is in the recovery
// epoch) and, if so, records it in the current one (cld Check, old
// kernels).
func (g graceCluster) TrackCheck(ctx context.Context, name string) (bool, error) {
	res, err := g.a.node.ApplyServing(ctx, fsm.ClientCheck{Name: name})
	return res.Accepted, err
}

// TrackGraceStart opens a grace period in the tracking table (cld
// GraceStart: a new epoch, unless one is still open) and returns the
// clients that may reclaim: the records of the recovery epoch.
func (g graceCluster) TrackGraceStart(ctx context.Context) ([]fsm.V4Client, error) {
	if _, err := g.a.node.ApplyServing(ctx, fsm.GraceStart{}); err != nil {
		return nil, err
	}
	// Committed and applied here (the leader applies before answering);
	// only GraceDone changes the recovery set, and the kernel sends it
	// after this GraceStart's answer.
	return g.a.node.View().V4Clients(true), nil
}

// TrackGraceDone closes the grace period in the tracking table (cld
// GraceDone): clients that did not reclaim can no longer.
func (g graceCluster) TrackGraceDone(ctx context.Context) error {
	_, err := g.a.node.ApplyServing(ctx, fsm.GraceDone{})
	return err
}

func (g graceCluster) MarkTimeline(state int32, mark func(*timeline.Timeline)) {
	g.a.node.MarkTimeline(state, mark)
}
