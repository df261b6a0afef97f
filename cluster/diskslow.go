package cluster

import (
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// A slow data directory on the leader makes every commit slow: an SM_MON
// is answered after the leader's own fsync, whatever its followers do. A
// slow follower costs nothing while the others make the quorum. So a node
// whose writes are persistently slow stays out of leadership: a slow
// leader hands leadership to a serving voter whose disk is measured faster
// (successor.go: never a witness, never an equally slow node), and while
// slow it does not campaign (the same stretched timeouts as a full disk);
// it keeps voting and following. Each node tells the others what it
// measures (diskReport, in its gossip metadata): judged slow, slowing down
// ("suspect": a quarter of its writes over slowWindow over the threshold,
// so that a disk that just slowed down is no target before its own
// verdict is in), unwritable, and its median write.
//
// "Slow" is the median of the data directory's writes (raft log and stable
// store commits, and the probe's 64 KiB write + fsync) over the last
// slowWindow above DiskSlowThreshold (default 50 ms), with at least
// slowMinSamples writes: when the window holds fewer (a disk so slow that
// a follower's probes take half a second each), the last slowMinSamples
// writes of the last slowMaxAge. The median, not a high percentile:
// one stalled fsync (a journal commit, a pause) is not a slow disk, and a
// disk whose every other fsync takes 50 ms is. 50 ms is ten times the
// SM_MON p99 goal (10 ms) and two hundred times this project's VM disk
// (fsync p50 0.25 ms, p99 1.1 ms under load); a disk that slow turns each
// commit into its fsync. It is healthy again when the median falls to
// half the threshold (hysteresis, so a disk near the line does not flap
// leadership). While a write is over the threshold or the disk is slow,
// the probe runs every slowProbeEvery to decide quickly.
//
// Every change of leader costs a takeover (sm_state bump, grace, SM_NOTIFY
// to every client), so the hand-off happens at most once per slow episode,
// and only when it gains something: when every other serving node is as
// slow (a shared array's hiccup slows every fsync at once) the slow leader
// keeps leading and says so once; handing over would have moved
// leadership round the equally slow nodes, one takeover per hop. If
// leadership comes back while still slow, this node keeps it. And a slow
// node must not leave the cluster leaderless: when it has heard from no
// leader for slowLastResort election timeouts it becomes eligible again
// (a slow leader beats none).

const (
	slowWindow        = 2 * time.Second
	slowMinSamples    = 5
	slowProbeEvery    = 250 * time.Millisecond
	slowTransferRetry = 5 * time.Second
	slowLastResort    = 3 // election timeouts with no leader heard
	slowMaxSamples    = 4096
	slowMaxAge        = 10 * time.Second
	// A disk that slowed down is "suspect" (told in its gossiped report,
	// so that it is no hand-off target) while at least 1/suspectShare of
	// its writes over slowWindow, and at least suspectMinWrites, were over
	// the threshold: when every disk slows at once, the others cross that
	// line well before the leader's median does. One stalled fsync in a
	// busy window is not enough: a fast node under load is still a target.
	suspectShare     = 4
	suspectMinWrites = 2
	// slowHandoffSettle: a slow leader hands over no sooner than this
	// after its verdict, so that the others' reports of a common slowdown
	// have reached it.
	slowHandoffSettle = time.Second
)

type writeSample struct {
	at time.Time
	d  time.Duration
}

// slowState is diskHealth's view of write latency; guarded by diskHealth.mu.
type slowState struct {
	threshold    time.Duration // ≤ 0: off
	samples      []writeSample // the last slowWindow, oldest first
	slow         bool
	since        time.Time // of the current slow episode
	p50          time.Duration
	suspectUntil time.Time
	handedOff    bool // leadership handed away in this episode
	lastTry      time.Time
	lastResort   bool // eligible for elections despite the slow disk
	nextTarget   int  // rotates hand-off targets (one per attempt)
	declined     bool // "no faster node" said in this episode
	// anySuccessor (tests only, the negative control): the rule before
	// successor.go, any serving voter, gossip-alive first.
	anySuccessor bool
	episodes     uint64
	// recent is the median of the writes the verdict looked at, however
	// few (the gossiped report's; p50 needs slowMinSamples).
	recent time.Duration
}

// sample records one successful write's duration; a write over the
// threshold wakes the probe loop to look closer.
func (d *diskHealth) sample(dur time.Duration) {
	now := time.Now()
	d.mu.Lock()
	s := &d.slowState
	if s.threshold <= 0 {
		d.mu.Unlock()
		return
	}
	s.samples = append(s.samples, writeSample{now, dur})
	if len(s.samples) > slowMaxSamples {
		s.samples = slices.Delete(s.samples, 0, len(s.samples)-slowMaxSamples)
	}
	wake := dur > s.threshold && !s.slow && now.After(s.suspectUntil)
	if dur > s.threshold {
		s.suspectUntil = now.Add(slowWindow)
	}
	d.mu.Unlock()
	if wake {
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
}

// slowVerdict trims the window and decides slow or not; it returns what
// changed and whether the probe should run at the fast pace.
func (d *diskHealth) slowVerdict(now time.Time) (became, cleared, fast bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := &d.slowState
	if s.threshold <= 0 {
		return false, false, false
	}
	cut := 0
	for cut < len(s.samples) && now.Sub(s.samples[cut].at) > slowMaxAge {
		cut++
	}
	s.samples = slices.Delete(s.samples, 0, cut)
	win := len(s.samples) // the samples of the last slowWindow, at least slowMinSamples
	for win > 0 && now.Sub(s.samples[len(s.samples)-win].at) > slowWindow {
		win--
	}
	win = min(max(win, slowMinSamples), len(s.samples))
	s.recent = 0
	if win > 0 {
		ds := make([]time.Duration, win)
		for i, w := range s.samples[len(s.samples)-win:] {
			ds[i] = w.d
		}
		slices.Sort(ds)
		s.recent = ds[len(ds)/2]
	}
	if win >= slowMinSamples {
		s.p50 = s.recent
		switch {
		case !s.slow && s.p50 > s.threshold:
			s.slow, s.since, s.handedOff, s.lastResort, s.declined = true, now, false, false, false
			s.episodes++
			became = true
		case s.slow && s.p50 <= s.threshold/2:
			s.slow, s.since, s.lastResort = false, now, false
			cleared = true
		}
	}
	return became, cleared, s.slow || now.Before(s.suspectUntil)
}

// electionsOK says whether this node may campaign: its disk takes writes
// and is not slow (or no leader is heard from: the last resort).
func (d *diskHealth) electionsOK() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ok && (!d.slowState.slow || d.slowState.lastResort)
}

// restoreTimeoutsIfOK puts raft's own timeouts back when nothing keeps the
// node out of elections any more.
func (d *diskHealth) restoreTimeoutsIfOK() {
	if d.electionsOK() {
		d.setTimeouts(d.n.cfg.HeartbeatTimeout, d.n.cfg.ElectionTimeout)
	}
}

// checkSlow runs after each probe while the disk is writable: it updates
// the verdict, acts on it, and returns how long until the next probe.
func (d *diskHealth) checkSlow(probeEvery time.Duration) time.Duration {
	now := time.Now()
	became, cleared, fast := d.slowVerdict(now)
	st := d.Status()
	switch {
	case became:
		d.n.log.Warn("data directory slow: handing leadership away and staying out of elections while it is",
			"dir", d.dir, "write_p50", st.WriteP50, "threshold", d.slowState.threshold)
		d.setTimeouts(outOfElections, outOfElections)
	case cleared:
		d.n.log.Info("data directory fast again: eligible for elections", "dir", d.dir, "write_p50", st.WriteP50)
		d.restoreTimeoutsIfOK()
	}
	if st.Slow {
		d.slowLeadership(now)
	}
	if fast {
		return min(probeEvery, slowProbeEvery)
	}
	return probeEvery
}

// slowLeadership acts for a node whose disk is slow: hand leadership away
// once per episode, and become eligible again when the cluster has no
// leader.
func (d *diskHealth) slowLeadership(now time.Time) {
	r := d.raft.Load()
	if r == nil {
		return
	}
	d.mu.Lock()
	s := &d.slowState
	handedOff, lastTry, lastResort, next, anySuccessor, since := s.handedOff, s.lastTry, s.lastResort, s.nextTarget, s.anySuccessor, s.since
	d.mu.Unlock()
	switch r.State() {
	case raft.Leader:
		// Not after a last-resort election either: no healthy node took
		// leadership when it could, so the others are slow or gone.
		if handedOff || lastResort || d.n.cfg.Witness || now.Sub(lastTry) < slowTransferRetry || now.Sub(since) < slowHandoffSettle {
			return // a witness hands off by itself (handOff)
		}
		// Only to a node whose disk is measured faster (successor.go):
		// when every other one is as slow (a shared array's hiccup), a
		// move costs a takeover and gains nothing.
		to := d.n.successors(moveSlowDisk)
		if anySuccessor {
			to = d.n.successors(moveShutdown)
		}
		if len(to) == 0 {
			d.mu.Lock()
			said := s.declined
			s.declined = true
			p50 := s.p50
			d.mu.Unlock()
			if !said {
				d.n.metrics.transferDeclined.WithLabelValues(moveSlowDisk.String()).Inc()
				d.n.log.Warn("data directory slow, but no other serving node's disk is measured faster: keeping leadership",
					"write_p50", p50, "threshold", s.threshold, "others", describeCandidates(d.n.candidates()))
			}
			return
		}
		// One target per attempt, the next one next time: a transfer to
		// a node that is down (gossip lags) holds writes for an election
		// timeout, so it is not retried at once.
		t := to[next%len(to)]
		d.mu.Lock()
		s.lastTry = now
		s.nextTarget = next + 1
		d.mu.Unlock()
		if err := d.n.transfer(moveSlowDisk, t); err != nil {
			return // logged; the next attempt comes after slowTransferRetry
		}
		d.mu.Lock()
		s.handedOff = true
		d.mu.Unlock()
		d.n.metrics.diskSlowHandoffs.Inc()
	case raft.Follower:
		if lastResort || d.n.cfg.noSlowLastResort {
			return
		}
		last := r.LastContact()
		if last.IsZero() {
			last = d.n.started // never heard from a leader: count from the start
		}
		if wait := slowLastResort * d.n.cfg.ElectionTimeout; now.Sub(last) > wait {
			d.mu.Lock()
			s.lastResort = true
			d.mu.Unlock()
			d.n.log.Warn("data directory slow and no leader heard from: eligible for elections again (a slow leader beats none)",
				"last_contact", last, "waited", wait)
			d.restoreTimeoutsIfOK()
		}
	}
}

// diskReport is what a node tells the others about its data directory,
// in its gossip metadata ("dk"); the successor policy (successor.go)
// compares them. A member without one (no gossip, or an older version)
// has no measured disk.
type diskReport struct {
	Slow    bool   `json:"s,omitempty"` // judged slow (the median over slowWindow)
	Suspect bool   `json:"q,omitempty"` // slowing down: suspectShare of its writes over slowWindow over the threshold
	Down    bool   `json:"x,omitempty"` // not writable
	P50us   uint32 `json:"p,omitempty"` // median of its recent writes in µs; 0: none measured
}

// p50 is the report's median write time.
func (r diskReport) p50() time.Duration { return time.Duration(r.P50us) * time.Microsecond }

// sameForGossip says whether r and o tell the others the same thing:
// every flag equal and the median in the same power-of-two bucket (a
// median that wanders within its bucket is not worth a broadcast).
func (r diskReport) sameForGossip(o diskReport) bool {
	return r.Slow == o.Slow && r.Suspect == o.Suspect && r.Down == o.Down && bits.Len32(r.P50us) == bits.Len32(o.P50us)
}

// report is this node's diskReport now.
func (d *diskHealth) report(now time.Time) diskReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := &d.slowState
	us := s.recent.Microseconds()
	us = min(max(us, 0), math.MaxUint32)
	if us == 0 && s.recent > 0 {
		us = 1 // measured, under a microsecond
	}
	over, all := 0, 0
	for i := len(s.samples) - 1; i >= 0 && now.Sub(s.samples[i].at) <= slowWindow; i-- {
		all++
		if s.samples[i].d > s.threshold {
			over++
		}
	}
	return diskReport{
		Slow:    s.slow,
		Suspect: s.threshold > 0 && over >= suspectMinWrites && over*suspectShare >= all,
		Down:    !d.ok,
		P50us:   uint32(us),
	}
}
