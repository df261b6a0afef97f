package agent

import (
	"context"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/timeline"
)

// graceCluster is this node's cluster as package grace needs it
// (grace.Cluster): reads of the replicated state, the client-tracking
// commands and the takeover's timeline. It reaches the node through the
// agent because the grace service is built before the node (the node's
// Applied subscriber hands every applied command to the service).
type graceCluster struct{ a *Agent }

func (g graceCluster) State() int32         { return g.a.node.State() }
func (g graceCluster) AppliedIndex() uint64 { return g.a.node.AppliedIndex() }

func (g graceCluster) MonitoredHosts() []string {
	targets := g.a.node.Targets()
	hosts := make([]string, len(targets))
	for i, t := range targets {
		hosts[i] = t.MonName
	}
	return hosts
}

func (g graceCluster) Epochs() (current, recovery uint64)     { return g.a.node.Epochs() }
func (g graceCluster) V4Clients(recovery bool) []fsm.V4Client { return g.a.node.V4Clients(recovery) }
func (g graceCluster) HasV4Client(name string) (inCurrent, inRecovery bool) {
	return g.a.node.HasV4Client(name)
}

func (g graceCluster) TrackCreate(ctx context.Context, name, princHash string) error {
	return g.a.node.TrackCreate(ctx, name, princHash)
}

func (g graceCluster) TrackRemove(ctx context.Context, name string) error {
	return g.a.node.TrackRemove(ctx, name)
}

func (g graceCluster) TrackCheck(ctx context.Context, name string) (bool, error) {
	return g.a.node.TrackCheck(ctx, name)
}

func (g graceCluster) TrackGraceStart(ctx context.Context) ([]fsm.V4Client, error) {
	return g.a.node.TrackGraceStart(ctx)
}

func (g graceCluster) TrackGraceDone(ctx context.Context) error { return g.a.node.TrackGraceDone(ctx) }

func (g graceCluster) MarkTimeline(state int32, mark func(*timeline.Timeline)) {
	g.a.node.MarkTimeline(state, mark)
}
