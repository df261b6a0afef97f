package config

import (
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/fsm"
)

// What a node runs with that no key sets: fixed here, next to the keys,
// so that every value the replication layer gets comes from this package.
const (
	// writeHoldTimeout bounds how long a write waits for a leader while
	// an election runs before it fails (NSM answers stat_fail).
	writeHoldTimeout = 5 * time.Second
	// diskProbeInterval: how often a probe file is written and fsynced in
	// data_dir to find a full or failing disk before raft does.
	diskProbeInterval = 5 * time.Second
	// reconcileEvery: how often the leader brings raft's voters in line
	// with gossip's members (and at every membership event).
	reconcileEvery = 2 * time.Second
	// maxInflightEntries: group-commit entries in raft and not yet
	// applied; one makes the next entry carry everything that arrived
	// meanwhile (cluster/DESIGN.md, "Writes: group commit").
	maxInflightEntries = 1
	// standDownMargin is added to hook_timeout for how long a new leader
	// keeps asking a previous one that still stands down (its on_follower
	// hook runs) before it waits out the VIP's lifetime instead; without
	// an on_follower hook it asks that long.
	standDownMargin = time.Second
)

// ClusterConfig is c as the replication layer takes it (cluster.Config):
// identity, addresses, storage, raft's timings (raft_profile with the keys
// set over it), grace, gossip, the hooks' bounds and the fence timeout,
// each derived here. What only a running agent has — its version, its NSM
// address once it listens, the gossip key read from its file, the VIP,
// the hooks themselves, TLS, the fences, subscribers, logger and metrics
// registry — the agent adds. c is validated.
func (c Config) ClusterConfig() cluster.Config {
	tm := c.Timing()
	cc := cluster.Config{
		NodeID:   c.NodeID,
		Witness:  c.Witness,
		DataDir:  c.DataDir,
		RaftBind: net.JoinHostPort(c.Bind, strconv.Itoa(c.RaftPort)),
		// A lone node (expect 1, nothing to join) forms its own cluster; one
		// given join waits for the leader to add it.
		Bootstrap:          c.BootstrapExpect <= 1 && len(c.Join) == 0,
		GracePeriod:        c.GracePeriod,
		HeartbeatTimeout:   tm.HeartbeatTimeout,
		ElectionTimeout:    tm.ElectionTimeout,
		LeaderLeaseTimeout: tm.LeaderLeaseTimeout,
		SnapshotThreshold:  c.SnapshotThreshold,
		TrailingLogs:       c.TrailingLogs,
		MaxInflightEntries: maxInflightEntries,
		LogStore:           c.RaftLogStore,
		Gossip: cluster.GossipConfig{
			Bind: c.Bind, Port: c.GossipPort, Join: c.Join, BootstrapExpect: c.BootstrapExpect,
			ClusterID: c.ClusterID, ReconcileEvery: reconcileEvery,
		},
		StandDownWait:     c.standDownWait(),
		DiskProbeInterval: diskProbeInterval,
		DiskSlowThreshold: c.DiskSlowThreshold,
		HoldTimeout:       writeHoldTimeout,
		HookTimeout:       c.HookTimeout,
		// Used with raft_tls only (the agent sets RaftTLS).
		RaftHandshakesPerHost: c.RaftHandshakesPerHost,
	}
	for _, sp := range c.Services {
		cc.Services.Declared = append(cc.Services.Declared, fsm.ServiceDecl{ID: sp.ID, Fingerprint: sp.Fingerprint(), Prefer: slices.Clone(sp.Prefer)})
	}
	cc.Services.Failback, cc.Services.Settle = c.ServiceFailback, c.ServiceSettle
	// A node with an on_leader hook serves the storage: it publishes its
	// fencing promise, and as a new leader proves the others stopped.
	cc.ServesStorage = c.Serves()
	if c.Serves() && c.FenceWatchdog != FenceOff {
		// Every serving node of the cluster arms a watchdog with this
		// timeout: a new leader counts on it for nodes it cannot ask.
		cc.FenceTimeout = c.FenceTimeout
	}
	return cc
}

// standDownWait is how long a new leader waits for the previous one to
// finish standing down: its on_follower hook may take up to hook_timeout.
func (c Config) standDownWait() time.Duration {
	if c.OnFollower != "" {
		return c.HookTimeout + standDownMargin
	}
	return standDownMargin
}
