package cluster

import (
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

// TestRaftWALCannotReopenAfterTailTruncation is a canary for a bug in
// hashicorp/raft-wal v0.4.0 (hashicorp/raft-wal#31): DeleteRange on the
// tail — what raft does on a follower whose uncommitted suffix conflicts
// with a new leader's log, routine after a failover — marks the tail
// segment sealed without writing its index, and after a restart every read
// from that segment fails ("sealed segment has no index block"), so
// raft.NewRaft panics and the node cannot start. Found by
// TestRandomFaultsLoseNoAcknowledgedRegistration with
// NSMD_CHAOS_LOGSTORE=wal (2 s in). It is why config refuses
// raft_log_store wal. When this test fails, raft-wal has fixed the bug:
// lift the refusal (config.Validate) and run the chaos test on wal.
func TestRaftWALCannotReopenAfterTailTruncation(t *testing.T) {
	dir := t.TempDir()
	open := func() (*wal.WAL, *metadb.BoltMetaDB) {
		meta := &metadb.BoltMetaDB{}
		w, err := wal.Open(dir, wal.WithMetaStore(meta), wal.WithLogger(hclog.NewNullLogger()))
		if err != nil {
			t.Fatal(err)
		}
		return w, meta
	}
	logs := func(from, to, term uint64) []*raft.Log {
		var ls []*raft.Log
		for i := from; i <= to; i++ {
			ls = append(ls, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: []byte("x")})
		}
		return ls
	}
	w, meta := open()
	if err := w.StoreLogs(logs(1, 10, 1)); err != nil {
		t.Fatal(err)
	}
	// A new leader's log conflicts from index 8: raft drops 8..10 and
	// appends the leader's entries.
	if err := w.DeleteRange(8, 10); err != nil {
		t.Fatal(err)
	}
	if err := w.StoreLogs(logs(8, 9, 2)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	meta.Close()

	w, meta = open()
	defer func() { w.Close(); meta.Close() }()
	var l raft.Log
	err := w.GetLog(1, &l)
	if err == nil {
		t.Fatal("raft-wal reopened a log after a tail truncation and read index 1: the bug (raft-wal#31) is fixed — allow raft_log_store wal in config.Validate and run TestRandomFaultsLoseNoAcknowledgedRegistration with NSMD_CHAOS_LOGSTORE=wal")
	}
	t.Logf("raft-wal v0.4.0 after a tail truncation and a restart: GetLog(1): %v", err)
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
