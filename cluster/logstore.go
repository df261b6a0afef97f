package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/types"
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

// walLog is raft-wal (DataDir/wal) with one repair. raft-wal (v0.4.2)
// changes its segments — a rotation when one fills, a new tail after raft
// truncates the log's tail — by committing the new state to its meta
// database and then creating the new segment file, preallocated (64 MiB).
// When creating it fails (ENOSPC), its in-memory state is left behind the
// meta database: after a failed rotation every append is refused
// (ErrSealed), after a failed tail truncation every retry fails on the
// half-created file ("file exists"), even once there is room again, until
// the WAL is reopened — a follower so stuck never catches up (the checked
// schedules' disk-full-follower fault found it). So after such a failure
// walLog reopens the WAL: Open loads the state the meta database has. It drops any entries of a
// failed append the reopened log holds (raft was told they were not
// stored) and does the write again, so that raft's view of the log and the
// store's agree. TestRaftWALRepairedAfterAFullDisk.
type walLog struct {
	dir     string
	segSize int // 0: raft-wal's default
	logger  hclog.Logger

	mu sync.RWMutex
	w  *wal.WAL // nil after a reopen that failed
}

var errWALClosed = errors.New("cluster: raft-wal log not open (a reopen failed)")

// openWAL opens DataDir/wal as the log store.
func openWAL(dataDir string, logger hclog.Logger) (*walLog, error) {
	return openWALSized(dataDir, 0, logger)
}

func openWALSized(dataDir string, segSize int, logger hclog.Logger) (*walLog, error) {
	l := &walLog{dir: filepath.Join(dataDir, walDir), segSize: segSize, logger: logger}
	if err := os.MkdirAll(l.dir, 0o750); err != nil {
		return nil, fmt.Errorf("cluster: create %s: %w", l.dir, err)
	}
	w, err := l.open()
	if err != nil {
		return nil, err
	}
	l.w = w
	return l, nil
}

func (l *walLog) open() (*wal.WAL, error) {
	size := l.segSize
	if size <= 0 {
		size = wal.DefaultSegmentSize
	}
	// WAL.Close closes the meta database too (since v0.4.1).
	w, err := wal.Open(l.dir, wal.WithLogger(l.logger), wal.WithMetaStore(&metadb.BoltMetaDB{}), wal.WithSegmentSize(size))
	if errors.Is(err, syscall.ENOSPC) {
		return nil, fmt.Errorf("cluster: open raft-wal in %s: %w (raft-wal preallocates each %d MiB segment: free that much on the data directory's file system, or give a new node raft_log_store: bolt)", l.dir, err, size>>20)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: open raft-wal in %s: %w", l.dir, err)
	}
	return w, nil
}

// write runs f, a write, on the open WAL, and repairs the WAL after it
// failed in a way that left raft-wal's memory behind its meta database.
func (l *walLog) write(f func(*wal.WAL) error) error {
	l.mu.RLock()
	w := l.w
	var before uint64
	err := errWALClosed
	if w != nil {
		if before, err = w.LastIndex(); err == nil {
			err = f(w)
		}
	}
	l.mu.RUnlock()
	if err == nil {
		return nil
	}
	// ErrSealed: a rotation failed; "file exists": a new segment's file was
	// left half-created by a failed rotation or truncation, and raft-wal
	// retries the same name. Other errors (ENOSPC on an append) raft-wal
	// rolls back itself.
	if w != nil && !errors.Is(err, types.ErrSealed) && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if rerr := l.reopen(w, before); rerr != nil {
		return errors.Join(err, rerr)
	}
	// The reopened log is at most where raft believes it is: do the write
	// again. (Raft's view must match the store's: a truncation the meta
	// database took but raft was told failed left raft reading an entry
	// that is gone, for good — the retry tells it the truncation is done.)
	return l.read(f)
}

// reopen closes and reopens the WAL if it still is was (another caller may
// have done it), then drops entries after before that the failed write
// left. Open needs no new segment for the states above (the half-created
// file is opened as the tail), so it works on a disk still full.
func (l *walLog) reopen(was *wal.WAL, before uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w != was {
		return nil
	}
	if l.w != nil {
		l.w.Close()
		l.w = nil
	}
	w, err := l.open()
	if err != nil {
		return err
	}
	l.w = w
	last, err := w.LastIndex()
	if err != nil {
		return fmt.Errorf("cluster: raft-wal reopened: last index: %w", err)
	}
	if was != nil && last > before {
		if err := w.DeleteRange(before+1, last); err != nil {
			return fmt.Errorf("cluster: raft-wal reopened: drop %d..%d of the failed append: %w", before+1, last, err)
		}
	}
	l.logger.Warn("raft-wal reopened after a failed write", "dir", l.dir)
	return nil
}

func (l *walLog) read(f func(*wal.WAL) error) error {
	l.mu.RLock()
	w := l.w
	l.mu.RUnlock()
	if w == nil { // a reopen failed: try again
		if err := l.reopen(nil, 0); err != nil {
			return errors.Join(errWALClosed, err)
		}
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.w == nil {
		return errWALClosed
	}
	return f(l.w)
}

func (l *walLog) FirstIndex() (i uint64, err error) {
	err = l.read(func(w *wal.WAL) (err error) { i, err = w.FirstIndex(); return })
	return
}

func (l *walLog) LastIndex() (i uint64, err error) {
	err = l.read(func(w *wal.WAL) (err error) { i, err = w.LastIndex(); return })
	return
}

func (l *walLog) GetLog(index uint64, log *raft.Log) error {
	return l.read(func(w *wal.WAL) error { return w.GetLog(index, log) })
}

func (l *walLog) StoreLog(log *raft.Log) error {
	return l.write(func(w *wal.WAL) error { return w.StoreLog(log) })
}

func (l *walLog) StoreLogs(logs []*raft.Log) error {
	return l.write(func(w *wal.WAL) error { return w.StoreLogs(logs) })
}

func (l *walLog) DeleteRange(min, max uint64) error {
	return l.write(func(w *wal.WAL) error { return w.DeleteRange(min, max) })
}

// IsMonotonic: raft-wal refuses appends that do not follow its last index.
func (l *walLog) IsMonotonic() bool { return true }

func (l *walLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w == nil {
		return nil
	}
	err := l.w.Close()
	l.w = nil
	return err
}

// LogStore is where this node's raft log is: LogStoreWAL or LogStoreBolt.
func (n *Node) LogStore() string { return n.cfg.LogStore }
