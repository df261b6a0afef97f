package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/types"
)

// TestRaftWALReopensAfterTailTruncation is the regression test of
// hashicorp/raft-wal#31, which v0.4.0 had and v0.4.1 fixed (PR #33):
// DeleteRange on the tail — what raft does on a follower whose uncommitted
// suffix conflicts with a new leader's log, routine after a failover —
// marked the tail segment sealed without writing its index, and after a
// restart every read from that segment failed ("sealed segment has no index
// block"), so raft.NewRaft panicked and the node could not start. The chaos
// test found it in 2 s on v0.4.0.
//
// Each case truncates a tail, appends the new leader's entries, closes,
// reopens twice and reads back every entry with its term. The negative
// control puts the reopened directory into v0.4.0's state (the truncated
// segment sealed with no index, as v0.4.0 left it in the meta database) and
// shows the same check refuses it: the check sees the old behaviour.
func TestRaftWALReopensAfterTailTruncation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		segSize int    // raft-wal segment size; small ones rotate
		data    int    // bytes per entry
		n, cut  uint64 // entries written at term 1; the new leader's log conflicts from cut
	}{
		{"within the only segment", wal.DefaultSegmentSize, 1, 10, 8},
		{"within the tail after rotations", 8 << 10, 1 << 10, 40, 39},
		{"back into a sealed segment", 8 << 10, 1 << 10, 40, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			truncateTail(t, dir, tc.segSize, tc.data, tc.n, tc.cut)
			if err := checkWALLog(dir, tc.segSize, tc.data, tc.cut, tc.cut+1); err != nil {
				t.Fatalf("first reopen after a tail truncation: %v", err)
			}
			// The reopened log takes appends and reopens again.
			w, err := openTestWAL(dir, tc.segSize)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.StoreLogs(walEntries(tc.cut+2, tc.cut+2, 2, tc.data)); err != nil {
				t.Fatal(err)
			}
			w.Close()
			if err := checkWALLog(dir, tc.segSize, tc.data, tc.cut, tc.cut+2); err != nil {
				t.Fatalf("second reopen: %v", err)
			}
		})
		t.Run(tc.name+"/negative control: v0.4.0's sealed segment without an index", func(t *testing.T) {
			dir := t.TempDir()
			truncateTail(t, dir, tc.segSize, tc.data, tc.n, tc.cut)
			meta := &metadb.BoltMetaDB{}
			st, err := meta.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			unindexed := 0
			for i := range st.Segments {
				if s := &st.Segments[i]; !s.SealTime.IsZero() && s.MaxIndex >= tc.cut-1 {
					s.IndexStart = 0 // v0.4.0 sealed the truncated tail without one
					unindexed++
				}
			}
			if unindexed == 0 {
				t.Fatalf("no sealed segment ends at the truncation point in %+v", st.Segments)
			}
			if err := meta.CommitState(st); err != nil {
				t.Fatal(err)
			}
			meta.Close()
			err = checkWALLog(dir, tc.segSize, tc.data, tc.cut, tc.cut+1)
			if err == nil {
				t.Fatal("the check passed a log whose truncated segment has no index: it cannot see raft-wal#31")
			}
			t.Logf("v0.4.0's state refused as it should be: %v", err)
		})
	}
}

// testWAL closes its meta database itself too, as v0.4.0's Close did not
// (a no-op since v0.4.1): the test then runs against v0.4.0 and fails.
type testWAL struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
}

func (w testWAL) Close() { w.WAL.Close(); w.meta.Close() }

func openTestWAL(dir string, segSize int) (testWAL, error) {
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(dir, wal.WithMetaStore(meta), wal.WithLogger(hclog.NewNullLogger()), wal.WithSegmentSize(segSize))
	if err != nil {
		meta.Close()
	}
	return testWAL{w, meta}, err
}

// walEntries are raft log entries from..to at term, data bytes each; the
// payload names the index and term so a read-back can tell them apart.
func walEntries(from, to, term uint64, data int) []*raft.Log {
	var ls []*raft.Log
	for i := from; i <= to; i++ {
		ls = append(ls, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: walPayload(i, term, data)})
	}
	return ls
}

func walPayload(i, term uint64, data int) []byte {
	p := []byte(fmt.Sprintf("%d@%d;", i, term))
	for len(p) < data {
		p = append(p, 'x')
	}
	return p
}

// truncateTail writes 1..n at term 1, then does what a follower does when
// a new leader's log conflicts from cut: drops cut..n and appends cut and
// cut+1 at term 2.
func truncateTail(t *testing.T, dir string, segSize, data int, n, cut uint64) {
	t.Helper()
	w, err := openTestWAL(dir, segSize)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := uint64(1); i <= n; i++ { // one append per entry, as rotation needs
		if err := w.StoreLogs(walEntries(i, i, 1, data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.DeleteRange(cut, n); err != nil {
		t.Fatal(err)
	}
	if err := w.StoreLogs(walEntries(cut, cut+1, 2, data)); err != nil {
		t.Fatal(err)
	}
}

// checkWALLog reopens dir and reads the whole log back: 1..cut-1 at term
// 1 and cut..last at term 2, each with its own payload.
func checkWALLog(dir string, segSize, data int, cut, last uint64) error {
	w, err := openTestWAL(dir, segSize)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer w.Close()
	first, err := w.FirstIndex()
	if err != nil {
		return fmt.Errorf("first index: %w", err)
	}
	end, err := w.LastIndex()
	if err != nil {
		return fmt.Errorf("last index: %w", err)
	}
	if first != 1 || end != last {
		return fmt.Errorf("log holds %d..%d, want 1..%d", first, end, last)
	}
	for i := uint64(1); i <= last; i++ {
		term := uint64(1)
		if i >= cut {
			term = 2
		}
		var l raft.Log
		if err := w.GetLog(i, &l); err != nil {
			return fmt.Errorf("GetLog(%d): %w", i, err)
		}
		if l.Index != i || l.Term != term || !bytes.Equal(l.Data, walPayload(i, term, data)) {
			return fmt.Errorf("GetLog(%d): index %d term %d data %.12q, want term %d", i, l.Index, l.Term, l.Data, term)
		}
	}
	return nil
}

// TestMeasureLogStores compares raft's log in bolt and in raft-wal: three
// nodes in this process, raft over loopback TCP, fsync on, 64 writers each
// waiting for its commit (NSMD_MEASURE=1; BENCHMARKS.md).
func TestMeasureLogStores(t *testing.T) {
	if os.Getenv("NSMD_MEASURE") == "" {
		t.Skip("measurement; set NSMD_MEASURE=1 to run")
	}
	const writers, perWriter = 64, 400
	stores := []string{"bolt", "wal"}
	if s := os.Getenv("NSMD_MEASURE_STORE"); s != "" {
		stores = []string{s}
	}
	for round := range 2 {
		for _, store := range stores {
			nodes, took := tcpCluster(t, []string{t.TempDir(), t.TempDir(), t.TempDir()}, func(c *Config) {
				c.LogStore = store
				c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 500*time.Millisecond, 500*time.Millisecond, 250*time.Millisecond
			})
			ev := nextTakeover(t, took, 10*time.Second)
			var leader *Node
			for _, tn := range nodes {
				if tn.id == ev.node {
					leader = tn.n
				}
			}
			idx0 := leader.raft.LastIndex()
			lat := make([]time.Duration, writers*perWriter)
			var wg sync.WaitGroup
			start := time.Now()
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perWriter {
						k := w*perWriter + i
						t0 := time.Now()
						if err := mon(leader, k); err != nil {
							t.Errorf("SM_MON %d: %v", k, err)
							return
						}
						lat[k] = time.Since(t0)
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			entries := leader.raft.LastIndex() - idx0
			slices.Sort(lat)
			t.Logf("round %d, %s: %d writes by %d writers in %v: %.0f/s, p50 %v, p99 %v; %d raft entries (%.1f writes each, %v per entry)",
				round+1, store, len(lat), writers, el.Round(time.Millisecond), float64(len(lat))/el.Seconds(),
				lat[len(lat)/2].Round(10*time.Microsecond), lat[len(lat)*99/100].Round(10*time.Microsecond),
				entries, float64(len(lat))/float64(entries), (el / time.Duration(max(entries, 1))).Round(time.Microsecond))
			for _, tn := range nodes {
				killWithin(t, tn, 10*time.Second)
			}
		}
	}
}

// TestRaftSeesRaftWALAsMonotonic: raft-wal refuses an append that does not
// follow its last index, so after installing a snapshot raft must clear
// its whole log rather than compact it by trailing_logs — which raft does
// only for a store that says so (raft.MonotonicLogStore), and the log
// cache asks the store it wraps: nsmd's guardedLogs must pass the answer
// on. raft's in-memory store is the control: not monotonic, through the
// same wrappers.
func TestRaftSeesRaftWALAsMonotonic(t *testing.T) {
	w, err := openWAL(t.TempDir(), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	n := &Node{}
	for _, tc := range []struct {
		store raft.LogStore
		want  bool
	}{{w, true}, {&raft.InmemStore{}, false}} {
		cache, err := raft.NewLogCache(16, guardedLogs{LogStore: tc.store, d: newDiskHealth(n, t.TempDir())})
		if err != nil {
			t.Fatal(err)
		}
		if got := cache.IsMonotonic(); got != tc.want {
			t.Errorf("%T through guardedLogs and the log cache: monotonic %v, want %v", tc.store, got, tc.want)
		}
	}
}

// TestRaftWALRepairedAfterAFullDisk: raft-wal (v0.4.2) that cannot create
// a segment file — the disk filled up just as a segment did, or as raft
// truncated the log's tail — stays stuck once there is room again, until
// it is reopened: appends refused with ErrSealed after a failed rotation,
// every retried truncation failing on the half-created file ("file
// exists": the checked schedules' disk-full-follower fault found a
// follower that never caught up). walLog reopens it at once, which opens
// the half-created file as the tail: appends go on into it until the disk
// has no room for them (ENOSPC, like bolt), the truncation succeeds at
// raft's next retry on the still-full disk, and once space returns every
// entry reads back after a restart.
// The negative controls are raft-wal alone, still stuck after the space
// came back. 1 MiB segments on an 8 MiB tmpfs (needs root).
func TestRaftWALRepairedAfterAFullDisk(t *testing.T) {
	const seg, data = 1 << 20, 4 << 10
	// fillUpTo fills dir, leaving room for a sealing append but not for a
	// new segment.
	fillUpTo := func(dir string) func() {
		free := fill(t, dir)
		p := filepath.Join(dir, "filler")
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, fi.Size()-256<<10); err != nil {
			t.Fatal(err)
		}
		return free
	}
	// appendUntilRefused appends one entry at a time from 1 and returns
	// the first index refused and its error.
	appendUntilRefused := func(s raft.LogStore) (uint64, error) {
		for i := uint64(1); i < 10_000; i++ {
			if err := s.StoreLogs(walEntries(i, i, 1, data)); err != nil {
				return i, err
			}
		}
		t.Fatal("no append refused on a full disk")
		return 0, nil
	}
	type store interface {
		raft.LogStore
		Close() error
	}
	open := map[bool]func(t *testing.T, dir string) store{
		true: func(t *testing.T, dir string) store {
			l, err := openWALSized(dir, seg, hclog.NewNullLogger())
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		false: func(t *testing.T, dir string) store {
			w, err := openTestWAL(dir, seg)
			if err != nil {
				t.Fatal(err)
			}
			return closer{w}
		},
	}
	name := map[bool]string{true: "walLog", false: "negative control: raft-wal alone"}
	walDirOf := map[bool]func(string) string{
		true:  func(d string) string { return filepath.Join(d, walDir) },
		false: func(d string) string { return d },
	}
	for _, repaired := range []bool{true, false} {
		t.Run("rotation/"+name[repaired], func(t *testing.T) {
			dir := smallDisk(t, 8)
			s := open[repaired](t, dir)
			free := fillUpTo(dir)
			i, err := appendUntilRefused(s)
			if repaired {
				// The reopened WAL writes on into the half-created
				// segment until the disk has no room for the entries.
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("append %d on a full disk: %v, want ENOSPC (not ErrSealed: the failed rotation repaired)", i, err)
				}
			} else if !errors.Is(err, types.ErrSealed) {
				t.Fatalf("append %d on a full disk: %v, want raft-wal's ErrSealed (a failed rotation)", i, err)
			}
			free()
			err = s.StoreLogs(walEntries(i, i, 1, data))
			if !repaired {
				s.Close()
				if !errors.Is(err, types.ErrSealed) {
					t.Fatalf("append %d once there is room: %v, want ErrSealed still (the state walLog repairs)", i, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("append %d once there is room: %v", i, err)
			}
			if err := s.StoreLogs(walEntries(i+1, i+2, 1, data)); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if err := checkWALLog(walDirOf[repaired](dir), seg, data, 1<<62, i+2); err != nil {
				t.Fatalf("after a restart: %v", err)
			}
		})
		t.Run("tail truncation/"+name[repaired], func(t *testing.T) {
			dir := smallDisk(t, 8)
			s := open[repaired](t, dir)
			if err := s.StoreLogs(walEntries(1, 20, 1, data)); err != nil {
				t.Fatal(err)
			}
			free := fillUpTo(dir)
			// A new leader's log conflicts from 18: raft drops 18..20.
			if err := s.DeleteRange(18, 20); err == nil {
				t.Fatal("tail truncation on a full disk succeeded: nothing to repair")
			}
			// raft retries at every AppendEntries. raft-wal alone fails on
			// the half-created segment even once there is room; walLog
			// succeeds at once, disk still full (the segment file exists),
			// and then holds what raft believes: 1..17.
			if !repaired {
				free()
				var err error
				for range 3 {
					if err = s.DeleteRange(18, 20); err == nil {
						break
					}
				}
				s.Close()
				if err == nil || !strings.Contains(err.Error(), "file exists") {
					t.Fatalf("truncation once there is room: %v, want it still failing on the half-created segment", err)
				}
				return
			}
			defer free()
			if err := s.DeleteRange(18, 20); err != nil {
				t.Fatalf("truncation retried, disk still full: %v", err)
			}
			if last, err := s.LastIndex(); err != nil || last != 17 {
				t.Fatalf("after the truncation: last index %d (%v), want 17", last, err)
			}
			if err := s.StoreLogs(walEntries(18, 19, 2, data)); err != nil {
				t.Fatalf("the new leader's entries: %v", err)
			}
			s.Close()
			if err := checkWALLog(walDirOf[repaired](dir), seg, data, 18, 19); err != nil {
				t.Fatalf("after a restart: %v", err)
			}
		})
	}
}

// closer gives testWAL an error-returning Close.
type closer struct{ testWAL }

func (c closer) Close() error { c.testWAL.Close(); return nil }

// A new raft-wal log on a file system with less room than one segment is
// refused at open with what to do (raft-wal preallocates the segment);
// the same directory on a roomy disk opens (the control).
func TestRaftWALOnASmallDiskSaysWhatToDo(t *testing.T) {
	small := smallDisk(t, 8)
	_, err := openWAL(small, hclog.NewNullLogger())
	if err == nil || !strings.Contains(err.Error(), "raft_log_store: bolt") || !strings.Contains(err.Error(), "64 MiB") {
		t.Fatalf("raft-wal on an 8 MiB disk: %v, want a refusal naming the 64 MiB segment and raft_log_store: bolt", err)
	}
	l, err := openWAL(t.TempDir(), hclog.NewNullLogger())
	if err != nil {
		t.Fatalf("control: raft-wal on the test's temp dir: %v", err)
	}
	l.Close()
}
