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
// raft-boltdb/v2 by default, or hashicorp/raft-wal, whose segment files
// take an append with one fsync where bolt's B+tree commit takes two. The
// stable store (term, vote) stays in bolt either way. A directory keeps the
// store it was created with: a node that came up with the other one would
// find an empty log, and a cluster restarted that way would have lost its
// committed entries. Switching means a fresh data directory (remove the
// node, wipe, join again: it is sent a snapshot).

const walDir = "wal"

// walStore is raft-wal with the meta database it was opened with:
// WAL.Close (v0.4.0) leaves that bolt file open and locked, so a node
// restarted in the same process would wait on its flock for ever.
type walStore struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
}

func (w *walStore) Close() error {
	return errors.Join(w.WAL.Close(), w.meta.Close())
}

// openWAL opens DataDir/wal as the log store, refusing a directory whose
// log lives in bolt.
func openWAL(dataDir string, bolt *raftboltdb.BoltStore, logger hclog.Logger) (*walStore, error) {
	last, err := bolt.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("cluster: read the bolt log: %w", err)
	}
	if last > 0 {
		return nil, fmt.Errorf("cluster: raft_log_store wal, but %s holds a raft log in bolt (up to index %d): this data directory uses raft_log_store bolt; to switch, give the node an empty data directory and let it rejoin", filepath.Join(dataDir, "raft.db"), last)
	}
	dir := filepath.Join(dataDir, walDir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("cluster: create %s: %w", dir, err)
	}
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(dir, wal.WithLogger(logger), wal.WithMetaStore(meta))
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("cluster: open raft-wal in %s: %w", dir, err)
	}
	return &walStore{WAL: w, meta: meta}, nil
}

// noWAL refuses to use bolt for the log in a directory whose log is in
// raft-wal.
func noWAL(dataDir string) error {
	dir := filepath.Join(dataDir, walDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cluster: read %s: %w", dir, err)
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".wal" {
			return fmt.Errorf("cluster: raft_log_store bolt, but %s holds a raft-wal log: this data directory uses raft_log_store wal; to switch, give the node an empty data directory and let it rejoin", dir)
		}
	}
	return nil
}
