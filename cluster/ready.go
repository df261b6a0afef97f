package cluster

import (
	"time"

	"github.com/hashicorp/raft"
)

// Ready reports whether this node knows the current incarnation's
// sm_state, so that NSM may answer SM_STAT, SM_MON, SM_UNMON, SM_UNMON_ALL
// and SM_SIMU_CRASH (the NSM service's Registry). It is true iff
//
//   - raft knows a leader,
//   - the last Takeover applied here was carried by an entry of raft's
//     current term (fsm.FSM.TakeoverTerm), and
//   - sm_state is odd.
//
// Every serving leader's term commits one Takeover before it serves, so a
// term without one applied here means that this node's sm_state may
// belong to a previous incarnation. That covers a fresh node (no takeover
// yet: state 0), a restarted one (the leader is unknown until its first
// heartbeat, then the new term's takeover is not applied yet), a leader
// whose takeover is still in flight, an election in progress (the term
// moved on), and a term led by a witness, which hands off and commits no
// takeover.
//
// It is called for every such NSM call: three reads under short locks or
// atomics, no allocation. The leader is read before the term: raft
// raises the term before it records a new term's leader, so a leader seen
// here never belongs to a term newer than the one read after it.
//
// And the node must have heard from the cluster lately (fresh): a
// follower from its leader within the heartbeat timeout, a leader from a
// quorum within its lease (leaseLoop). A process that was paused
// (SIGSTOP, a VM stall) resumes with its old view — leader of a term
// that has ended, or follower of a dead leader — and until raft notices,
// the three checks above still pass: found by the checked fault schedules
// (3 of 200 had an SM_STAT answered with the previous state by a node just
// resumed, after a client had seen the new one).
func (n *Node) Ready() bool {
	if _, id := n.raft.LeaderWithID(); id == "" {
		return false
	}
	term := n.raft.CurrentTerm()
	state, takeoverTerm := n.fsm.Incarnation()
	return takeoverTerm == term && state%2 == 1 && n.fresh()
}

// fresh: see Ready.
func (n *Node) fresh() bool {
	switch n.raft.State() {
	case raft.Leader:
		v := n.leaseAt.Load()
		return v != 0 && n.mono()-v < int64(n.cfg.LeaderLeaseTimeout)
	case raft.Follower:
		return time.Since(n.raft.LastContact()) < n.cfg.HeartbeatTimeout
	}
	return false
}

// leaderLeaseFresh: raft says leader and a quorum confirmed it within the
// lease. The VIP's renew gate (vip.WithRenewGate); not fresh() alone: a
// deposed leader becomes a follower with a fresh contact inside raft
// before the leader loop hears of it.
func (n *Node) leaderLeaseFresh() bool {
	return n.raft.State() == raft.Leader && n.fresh()
}

// mono is the monotonic time since the node started, in nanoseconds: it
// keeps running while the process is stopped, so a lease taken before a
// pause has expired after it.
func (n *Node) mono() int64 { return int64(time.Since(n.started)) }

// leaseLoop keeps a leader's read lease: every quarter lease it asks raft
// to confirm leadership with a quorum (VerifyLeader: one heartbeat round)
// and, on success, records when the acknowledgements of the quorum were
// sent, no later than when it asked (leaseStamp: raft may count an answer
// to a request sent before the question). A leader cut off, deposed or
// resumed from a pause fails to confirm and stops being Ready within one
// lease, before a new leader can have been elected (the lease is shorter
// than the heartbeat timeout followers wait before an election).
func (n *Node) leaseLoop() {
	every := max(n.cfg.LeaderLeaseTimeout/4, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		if n.raft.State() != raft.Leader {
			continue
		}
		asked := n.mono()
		f := n.raft.VerifyLeader()
		done := make(chan error, 1)
		// The future resolves once a quorum answered or leadership is
		// lost; but one queued just as raft shuts down is never answered
		// (raft does not drain verifyCh), so the loop must not wait on it
		// past ctx: in that one race this waiter stays blocked, holding
		// nothing, in a process that is shutting the node down.
		go func() { done <- f.Error() }()
		select {
		case <-n.ctx.Done():
			return
		case err := <-done:
			if err == nil {
				if at, ok := n.leaseStamp(asked); ok && at > n.leaseAt.Load() {
					n.leaseAt.Store(at)
				}
			}
		}
	}
}
