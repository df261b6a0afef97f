package cluster

import (
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// Raft's parts as New opens them: the transport, the configuration and
// the log store.

// openTransport is cfg.Transport, or raft's TCP transport on RaftBind
// (over mutual TLS with RaftTLS).
func openTransport(cfg Config, hl hclog.Logger) (raft.Transport, error) {
	if cfg.Transport != nil {
		return cfg.Transport, nil
	}
	addr, err := net.ResolveTCPAddr("tcp", cfg.RaftBind)
	if err != nil {
		return nil, fmt.Errorf("cluster: raft address: %w", err)
	}
	var trans raft.Transport
	if cfg.RaftTLS != nil {
		trans, err = newTLSTransport(cfg.RaftBind, addr, cfg.RaftTLS, cfg.TLSRefusals, cfg.RaftHandshakesPerHost, hl.Named("transport"))
	} else {
		trans, err = raft.NewTCPTransportWithConfig(cfg.RaftBind, addr, &raft.NetworkTransportConfig{
			MaxPool: 4, Timeout: 5 * time.Second, Logger: hl.Named("transport"), MaxRPCsInFlight: raftMaxRPCsInFlight,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: raft transport on %s: %w", cfg.RaftBind, err)
	}
	return trans, nil
}

// raftConfig is raft's configuration for cfg; leadership changes go to
// notify.
func raftConfig(cfg Config, notify chan bool, hl hclog.Logger) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = 5 * time.Millisecond
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.MaxAppendEntries = 256
	rc.NotifyCh = notify
	rc.Logger = hl
	rc.NoLegacyTelemetry = true
	return rc
}

// openLogs opens the raft log in the store the data directory has
// (resolveLogStore: the bolt store, or the WAL), behind the disk guard
// and a cache, and notes the last index it holds at start (bootIndex).
func (n *Node) openLogs(store *raftboltdb.BoltStore, hl hclog.Logger) (raft.LogStore, error) {
	var logStore raft.LogStore = store
	kind, why, err := resolveLogStore(n.cfg.DataDir, n.cfg.LogStore, store)
	if err != nil {
		return nil, err
	}
	n.cfg.LogStore = kind
	n.log.Info("raft log store", "store", kind, "why", why)
	if kind == LogStoreWAL {
		if n.wal, err = openWAL(n.cfg.DataDir, hl.Named("wal")); err != nil {
			return nil, err
		}
		logStore = n.wal
	}
	logs, err := raft.NewLogCache(1024, guardedLogs{LogStore: logStore, d: n.disk})
	if err != nil {
		return nil, fmt.Errorf("cluster: log cache: %w", err)
	}
	if n.bootIndex, err = logStore.LastIndex(); err != nil {
		return nil, fmt.Errorf("cluster: read last index: %w", err)
	}
	return logs, nil
}
