package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// A node whose data directory cannot be written must stay out of
// elections: measured before this, a single node on a full disk went
// through 115 elections in 50 s (each won, its takeover failing to store,
// raft stepping down), and in a cluster a full node that wins an election
// costs a takeover (sm_state bump, grace, notify storm) each time.
//
// diskHealth watches the raft log and stable stores' writes (guardedLogs,
// guardedStable) and, every probeEvery, writes and fsyncs a probe file in
// the data directory. On the first failure it stretches raft's heartbeat
// and election timeouts to outOfElections — synchronously, inside the
// failing write, so that when raft steps a leader down right after, the
// follower it becomes never times out into a candidacy — and hands
// leadership away if it still leads. It keeps voting (votes and terms
// are small in-place writes the stable store usually still manages) and
// keeps following. Once probes succeed again it restores the timeouts,
// which wakes raft's follower timer at once.
type diskHealth struct {
	n    *Node
	dir  string
	wake chan struct{}
	// raft is n's raft once raft.NewRaft returned: the store writes that
	// report here start inside NewRaft, before Node.raft is set.
	raft atomic.Pointer[raft.Raft]

	mu       sync.Mutex
	ok       bool
	since    time.Time // of the current condition
	lastErr  error
	failures uint64
	lastLog  time.Time

	slowState slowState // write latency (diskslow.go)
}

const (
	outOfElections = 24 * time.Hour
	probeSize      = 64 << 10 // head room the probe insists on
)

// DiskStatus is what Status and the metrics say about the data directory.
type DiskStatus struct {
	Writable bool
	Since    time.Time
	Error    string
	Failures uint64
	// Slow: the median write over the last 2 s is above the threshold
	// (diskslow.go); the node stays out of leadership while it is.
	Slow      bool
	SlowSince time.Time
	WriteP50  time.Duration
}

func newDiskHealth(n *Node, dir string) *diskHealth {
	d := &diskHealth{n: n, dir: dir, wake: make(chan struct{}, 1), ok: true, since: time.Now()}
	d.slowState.threshold = n.cfg.DiskSlowThreshold
	return d
}

// failed records a failed write; the first one takes the node out of
// elections.
func (d *diskHealth) failed(what string, err error) {
	d.mu.Lock()
	d.failures++
	d.lastErr = fmt.Errorf("%s: %w", what, err)
	was := d.ok
	d.ok = false
	if was {
		d.since = time.Now()
		d.lastLog = d.since
	}
	d.mu.Unlock()
	d.n.metrics.diskWriteErrors.Inc()
	if !was {
		d.n.log.Error("data directory not writable: staying out of elections until it is", "dir", d.dir, "err", d.lastErr)
		d.setTimeouts(outOfElections, outOfElections)
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
}

func (d *diskHealth) setTimeouts(hb, el time.Duration) {
	r := d.raft.Load()
	if r == nil {
		return
	}
	rc := r.ReloadableConfig()
	rc.HeartbeatTimeout, rc.ElectionTimeout = hb, el
	if err := r.ReloadConfig(rc); err != nil {
		d.n.log.Error("cannot change raft timeouts", "err", err)
	}
}

// Status reports the current condition.
func (d *diskHealth) Status() DiskStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := DiskStatus{Writable: d.ok, Since: d.since, Failures: d.failures, Slow: d.slowState.slow, WriteP50: d.slowState.p50}
	if s.Slow {
		s.SlowSince = d.slowState.since
	}
	if !d.ok && d.lastErr != nil {
		s.Error = d.lastErr.Error()
	}
	return s
}

func (d *diskHealth) writable() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ok
}

// probe writes, fsyncs and removes a file of probeSize in the data dir.
func (d *diskHealth) probe() error {
	p := filepath.Join(d.dir, ".nsmd-disk-probe")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	start := time.Now()
	_, werr := f.Write(make([]byte, probeSize))
	serr := f.Sync()
	if werr == nil && serr == nil {
		took := time.Since(start)
		d.n.metrics.diskWrite.WithLabelValues("probe").Observe(took.Seconds())
		d.sample(took)
	}
	cerr := f.Close()
	os.Remove(p)
	return errors.Join(werr, serr, cerr)
}

// run probes every probeEvery (every second while unwritable) until done.
func (d *diskHealth) run(done <-chan struct{}, probeEvery time.Duration) {
	t := time.NewTimer(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-d.wake:
		case <-t.C:
		}
		err := d.probe()
		switch {
		case err != nil && d.writable():
			d.failed("probe", err)
		case err != nil:
			d.mu.Lock()
			logNow := time.Since(d.lastLog) >= time.Minute
			if logNow {
				d.lastLog = time.Now()
			}
			since, last := d.since, d.lastErr
			d.mu.Unlock()
			if logNow {
				d.n.log.Warn("data directory still not writable: staying out of elections", "dir", d.dir, "since", since, "err", last)
			}
		case !d.writable():
			d.mu.Lock()
			d.ok, d.since, d.lastErr = true, time.Now(), nil
			d.mu.Unlock()
			d.restoreTimeoutsIfOK() // unless the disk is slow as well
			d.n.log.Info("data directory writable again: eligible for elections", "dir", d.dir)
		}
		if d.writable() {
			t.Reset(d.checkSlow(probeEvery))
		} else {
			if r := d.raft.Load(); r != nil && r.State() == raft.Leader {
				// Found by the probe while leading: let a node that can
				// write lead (raft steps us down by itself at our next
				// failed write otherwise). Never the witness; the next
				// target only once the last one's election cannot still
				// be under way (successor.go).
				if _, err := d.n.moveLeadership(moveDiskDown); errors.Is(err, ErrNoSuccessor) {
					d.n.log.Debug("data directory not writable and no other serving node may lead: keeping leadership")
				} else if err != nil {
					d.n.log.Warn("cannot hand leadership away from an unwritable node", "err", err)
				}
			}
			t.Reset(min(time.Second, probeEvery))
		}
	}
}

// wrote records one store write that started at start: its time, or its
// failure.
func (d *diskHealth) wrote(op, what string, start time.Time, err error) {
	if err != nil {
		d.failed(what, err)
		return
	}
	took := time.Since(start)
	d.n.metrics.diskWrite.WithLabelValues(op).Observe(took.Seconds())
	d.sample(took)
}

// guardedLogs reports the log store's write times and failures to diskHealth.
type guardedLogs struct {
	raft.LogStore
	d *diskHealth
}

func (g guardedLogs) StoreLog(l *raft.Log) error {
	start := time.Now()
	err := g.LogStore.StoreLog(l)
	g.d.wrote("raft_log", "raft log", start, err)
	return err
}

// IsMonotonic passes on raft.MonotonicLogStore: raft-wal refuses an
// append that does not follow its last index, so raft must clear its log
// after installing a snapshot (logstore_test.go).
func (g guardedLogs) IsMonotonic() bool {
	m, ok := g.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (g guardedLogs) StoreLogs(ls []*raft.Log) error {
	start := time.Now()
	err := g.LogStore.StoreLogs(ls)
	g.d.wrote("raft_log", "raft log", start, err)
	return err
}

// guardedStable reports the stable store's write times and failures to
// diskHealth, and drops the writes that come after the store closed.
//
// Why a write can come that late: raft's transport answers heartbeats on
// its connection goroutines (the heartbeat fast path), which check raft's
// shutdown before they start and are not waited for when the transport
// closes. A heartbeat that passed that check just before shutdown can
// record a newer term after the stores closed, and raft panics when the
// write fails. Dropping it is safe: raft is shut down, so the term was
// learned from a heartbeat, not cast as a vote (votes are written by
// raft's main loop, which has stopped), and a node that restarts with the
// older term has cast no vote in the newer one.
type guardedStable struct {
	raft.StableStore
	d    *diskHealth
	gate *storeGate
}

// storeGate lets closeStores wait for the stable-store writes in flight
// and turn the later ones away.
type storeGate struct {
	mu     sync.RWMutex
	closed bool
}

// enter reports whether the store is still open; the caller calls leave
// when it is.
func (g *storeGate) enter() bool {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return false
	}
	return true
}

func (g *storeGate) leave() { g.mu.RUnlock() }

// close waits for the writes in flight and turns away every later one.
func (g *storeGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

func (g guardedStable) Set(k, v []byte) error {
	if !g.gate.enter() {
		return nil // after shutdown: see guardedStable
	}
	defer g.gate.leave()
	start := time.Now()
	err := g.StableStore.Set(k, v)
	g.d.wrote("raft_stable", "raft stable store", start, err)
	return err
}

func (g guardedStable) SetUint64(k []byte, v uint64) error {
	if !g.gate.enter() {
		return nil // after shutdown: see guardedStable
	}
	defer g.gate.leave()
	start := time.Now()
	err := g.StableStore.SetUint64(k, v)
	g.d.wrote("raft_stable", "raft stable store", start, err)
	return err
}

// Disk reports whether the data directory takes writes (a node that
// cannot write stays out of elections).
func (n *Node) Disk() DiskStatus { return n.disk.Status() }
