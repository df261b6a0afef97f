package cluster

import (
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// A slow data directory on the leader makes every commit slow: an SM_MON
// is answered after the leader's own fsync, whatever its followers do. A
// slow follower costs nothing while the others make the quorum. So a node
// whose writes are persistently slow stays out of leadership: a slow
// leader hands leadership to a serving voter (never a witness), and while
// slow it does not campaign (the same stretched timeouts as a full disk);
// it keeps voting and following.
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
// to every client), so the hand-off happens at most once per slow episode:
// if leadership comes back while still slow (every other serving node is
// slow too, or gone), this node keeps it. And a slow node must not leave
// the cluster leaderless: when it has heard from no leader for
// slowLastResort election timeouts it becomes eligible again (a slow
// leader beats none).

const (
	defaultDiskSlowThreshold = 50 * time.Millisecond
	slowWindow               = 2 * time.Second
	slowMinSamples           = 5
	slowProbeEvery           = 250 * time.Millisecond
	slowTransferRetry        = 5 * time.Second
	slowLastResort           = 3 // election timeouts with no leader heard
	slowMaxSamples           = 4096
	slowMaxAge               = 10 * time.Second
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
	episodes     uint64
}

// diskSlowThreshold resolves Config.DiskSlowThreshold: 0 is the default,
// negative turns the check off.
func diskSlowThreshold(c time.Duration) time.Duration {
	switch {
	case c == 0:
		return defaultDiskSlowThreshold
	case c < 0:
		return 0
	}
	return c
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
	if win >= slowMinSamples {
		ds := make([]time.Duration, win)
		for i, w := range s.samples[len(s.samples)-win:] {
			ds[i] = w.d
		}
		slices.Sort(ds)
		s.p50 = ds[len(ds)/2]
		switch {
		case !s.slow && s.p50 > s.threshold:
			s.slow, s.since, s.handedOff, s.lastResort = true, now, false, false
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
	r := d.n.raft
	if r == nil {
		return
	}
	d.mu.Lock()
	s := &d.slowState
	handedOff, lastTry, lastResort, next := s.handedOff, s.lastTry, s.lastResort, s.nextTarget
	d.mu.Unlock()
	switch r.State() {
	case raft.Leader:
		// Not after a last-resort election either: no healthy node took
		// leadership when it could, so the others are slow or gone.
		if handedOff || lastResort || d.n.cfg.Witness || now.Sub(lastTry) < slowTransferRetry {
			return // a witness hands off by itself (handOff)
		}
		d.mu.Lock()
		s.lastTry = now
		d.mu.Unlock()
		var to []raft.Server
		all := d.n.servingVoters()
		for _, t := range all {
			if d.n.member == nil || d.n.member.isAlive(string(t.ID)) {
				to = append(to, t)
			}
		}
		if len(to) == 0 {
			// Gossip lags raft (a voter back from a cut replicates for
			// seconds before gossip says it is alive): try the others
			// too, one per slowTransferRetry.
			to = all
		}
		if len(to) == 0 {
			d.n.log.Warn("data directory slow, but there is no other serving voter: keeping leadership")
			return
		}
		// One target per attempt, the next one next time: a transfer to
		// a node that is down (no gossip to say so in a static cluster)
		// holds writes for an election timeout, so it is not retried at
		// once.
		t := to[next%len(to)]
		d.mu.Lock()
		s.nextTarget = next + 1
		d.mu.Unlock()
		if err := r.LeadershipTransferToServer(t.ID, t.Address).Error(); err != nil {
			d.n.log.Warn("data directory slow: leadership transfer failed; next attempt in a while", "to", t.ID, "err", err, "retry", slowTransferRetry)
			return
		}
		d.mu.Lock()
		s.handedOff = true
		d.mu.Unlock()
		d.n.metrics.diskSlowHandoffs.Inc()
		d.n.log.Warn("data directory slow: handed leadership over", "to", t.ID)
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
