package cluster

// Ready reports whether this node knows the current incarnation's
// sm_state, so that NSM may answer SM_STAT, SM_MON, SM_UNMON, SM_UNMON_ALL
// and SM_SIMU_CRASH (nsm.Registry). It is true iff
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
func (n *Node) Ready() bool {
	if _, id := n.raft.LeaderWithID(); id == "" {
		return false
	}
	term := n.raft.CurrentTerm()
	state, takeoverTerm := n.fsm.Incarnation()
	return takeoverTerm == term && state%2 == 1
}
