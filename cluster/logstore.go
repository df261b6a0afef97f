package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

// The raft log store is chosen per data directory (Config.LogStore):
// hashicorp/raft-wal, whose segment files take an append with one fsync,
// or raft-boltdb/v2, whose B+tree commit takes two. The stable store (term,
// vote) is bolt's raft.db either way. A directory keeps the store it was
// created with: a node that came up with the other one would find an empty
// log, and a cluster restarted that way would have lost its committed
// entries. "auto" (the default) takes the store the directory has and wal
// in a directory with no log yet; naming one refuses a directory that has
// the other. Switching means a fresh data directory (remove the node,
// wipe, join again: it is sent a snapshot).
//
// raft-wal v0.4.0 could not reopen a log whose tail raft had truncated
// (hashicorp/raft-wal#31, fixed in v0.4.1): TestRaftWALReopensAfterTailTruncation.

// Log stores (Config.LogStore).
const (
	LogStoreAuto = "auto"
	LogStoreWAL  = "wal"
	LogStoreBolt = "bolt"
)

const walDir = "wal"

// resolveLogStore says which store this directory's log is in: the one it
// has, else want, else (auto) wal. It refuses want naming the store the
// directory does not have.
func resolveLogStore(dataDir, want string, bolt *raftboltdb.BoltStore) (store, why string, err error) {
	if want == "" {
		want = LogStoreAuto
	}
	if want != LogStoreAuto && want != LogStoreWAL && want != LogStoreBolt {
		return "", "", fmt.Errorf("cluster: log store %q is not one of auto, wal, bolt", want)
	}
	last, err := bolt.LastIndex()
	if err != nil {
		return "", "", fmt.Errorf("cluster: read the bolt log: %w", err)
	}
	segs, err := walSegments(dataDir)
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(dataDir, walDir)
	switch {
	case last > 0 && segs:
		return "", "", fmt.Errorf("cluster: %s holds a raft log in bolt (up to index %d) and %s one in raft-wal: one of them was put there by hand; move the data directory aside and let the node rejoin", filepath.Join(dataDir, "raft.db"), last, dir)
	case last > 0:
		if want == LogStoreWAL {
			return "", "", fmt.Errorf("cluster: raft_log_store wal, but %s holds a raft log in bolt (up to index %d): this data directory's log store is bolt; set raft_log_store auto or bolt, or give the node an empty data directory and let it rejoin to move to wal", filepath.Join(dataDir, "raft.db"), last)
		}
		return LogStoreBolt, "the data directory's log is in bolt", nil
	case segs:
		if want == LogStoreBolt {
			return "", "", fmt.Errorf("cluster: raft_log_store bolt, but %s holds a raft-wal log: this data directory's log store is wal; set raft_log_store auto or wal, or give the node an empty data directory and let it rejoin to move to bolt", dir)
		}
		return LogStoreWAL, "the data directory's log is in raft-wal", nil
	case want == LogStoreBolt:
		return LogStoreBolt, "raft_log_store bolt, no log yet", nil
	case want == LogStoreWAL:
		return LogStoreWAL, "raft_log_store wal, no log yet", nil
	default:
		return LogStoreWAL, "raft_log_store auto, no log yet", nil
	}
}

// walSegments says whether DataDir/wal holds raft-wal segment files.
func walSegments(dataDir string) (bool, error) {
	dir := filepath.Join(dataDir, walDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cluster: read %s: %w", dir, err)
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".wal" {
			return true, nil
		}
	}
	return false, nil
}

// openWAL opens DataDir/wal as the log store.
func openWAL(dataDir string, logger hclog.Logger) (*wal.WAL, error) {
	dir := filepath.Join(dataDir, walDir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("cluster: create %s: %w", dir, err)
	}
	// WAL.Close closes the meta database too (since v0.4.1).
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(dir, wal.WithLogger(logger), wal.WithMetaStore(meta))
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("cluster: open raft-wal in %s: %w", dir, err)
	}
	return w, nil
}

// LogStore is where this node's raft log is: LogStoreWAL or LogStoreBolt.
func (n *Node) LogStore() string { return n.cfg.LogStore }
