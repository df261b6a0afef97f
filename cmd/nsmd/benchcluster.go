package main

import (
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/bench"
)

// startBenchCluster is bench.StartCluster for nsmd's benches: a dev
// cluster (startDev) in this process. A node it kills stays down.
func startBenchCluster(spec bench.ClusterSpec) (bench.Cluster, error) {
	level, log := spec.LogLevel, newLogger(spec.LogTo, spec.LogLevel, "text")
	if level == "" {
		level, log = "error", newLogger(io.Discard, "error", "text")
	}
	d, err := startDev(devOptions{
		Nodes: spec.Nodes, DataDir: spec.DataDir, VIP: spec.VIP, LogLevel: level,
		NSMPort: spec.NSMPort, RaftPort: spec.RaftPort, AdminPort: spec.AdminPort, GossipPort: spec.GossipPort,
	}, agentOptions{Logger: log})
	if err != nil {
		return nil, err
	}
	return benchCluster{d}, nil
}

// benchCluster is a devCluster as package bench sees it.
type benchCluster struct{ d *devCluster }

func (c benchCluster) Nodes() []bench.Node {
	var out []bench.Node
	for i := range c.d.cfgs {
		out = append(out, benchNode{c.d.agent(i)})
	}
	return out
}

func (c benchCluster) Close() error { return c.d.Close() }

// benchNode is one agent as package bench sees it.
type benchNode struct{ a *agent }

func (n benchNode) ID() string                   { return n.a.cfg.NodeID }
func (n benchNode) AdminURL() string             { return n.a.AdminURL() }
func (n benchNode) Leading() bool                { return n.a.node.Leading() }
func (n benchNode) VIPHeld() bool                { return n.a.VIPHeld() }
func (n benchNode) State() int32                 { return n.a.node.FSM().State() }
func (n benchNode) Registrations() int           { return n.a.node.FSM().Len() }
func (n benchNode) LastTakeover() time.Time      { return n.a.node.LastTakeover().At }
func (n benchNode) NotifyName() string           { return n.a.cfg.EffectiveNotifyName() }
func (n benchNode) Metrics() prometheus.Gatherer { return n.a.reg }
func (n benchNode) Kill()                        { n.a.kill() }
func (n benchNode) TransferLeadership() error    { return n.a.node.Raft().LeadershipTransfer().Error() }
