package cluster

import (
	"io"
	"slices"
	"sync"

	"github.com/hashicorp/raft"
)

// ackClock is the raft transport as the leader's lease sees it: it notes,
// for every peer, when the newest AppendEntries that peer acknowledged
// (success, in the sender's term) was SENT.
//
// Why the send time: a peer that acknowledged an AppendEntries of term T
// had not yet voted in a later term when it handled it, and that was
// after the request was sent. raft's VerifyLeader counts, for each peer,
// the first acknowledgement that arrives after it was asked — also one of
// a heartbeat or an append sent before (hashicorp/raft's replication
// goroutines call notifyAll when any response arrives; a heartbeat in
// flight when VerifyLeader asks is counted). Its answer therefore proves
// the quorum followed this leader at some time after the oldest such
// request was sent, not after the question. So the lease (leaseAt,
// leaseLoop) counts from the send time of the quorum's acknowledgements
// noted here, and never from later than the question
// (cluster/DESIGN.md, "A ping never outlives its proof").
//
// Only the requests whose answers it sees count: AppendEntries (the
// heartbeats and the replication that does not pipeline). Pipelined
// appends and snapshots are passed on unseen; leaving answers out only
// makes the lease start earlier, never later.
type ackClock struct {
	raft.Transport
	mono func() int64

	mu    sync.Mutex
	acked map[raft.ServerID]ackAt
}

// ackAt: the newest acknowledged request's term and send time (mono ns).
type ackAt struct {
	term uint64
	sent int64
}

// ackClockPreVote is an ackClock over a transport that takes pre-votes
// (raft asks the transport whether it does; the wrapper must not hide it).
type ackClockPreVote struct {
	*ackClock
	pv raft.WithPreVote
}

func (a ackClockPreVote) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return a.pv.RequestPreVote(id, target, args, resp)
}

// newAckClock wraps t; mono is the node's monotonic clock.
func newAckClock(t raft.Transport, mono func() int64) (*ackClock, raft.Transport) {
	a := &ackClock{Transport: t, mono: mono, acked: map[raft.ServerID]ackAt{}}
	if pv, ok := t.(raft.WithPreVote); ok {
		return a, ackClockPreVote{ackClock: a, pv: pv}
	}
	return a, a
}

// AppendEntries sends, and notes the send time of an acknowledgement.
func (a *ackClock) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	sent := a.mono()
	err := a.Transport.AppendEntries(id, target, args, resp)
	if err == nil && resp.Success && resp.Term == args.Term {
		a.mu.Lock()
		if prev, ok := a.acked[id]; !ok || args.Term > prev.term || (args.Term == prev.term && sent > prev.sent) {
			a.acked[id] = ackAt{term: args.Term, sent: sent}
		}
		a.mu.Unlock()
	}
	return err
}

// Close closes the transport when it can be closed (raft's WithClose;
// the node's closeStores).
func (a *ackClock) Close() error {
	if c, ok := a.Transport.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// confirmedSince is the newest time (mono ns) such that a quorum of
// voters — this node (self, counted as now) and the others by their
// noted acknowledgements in term — acknowledged a request sent no earlier
// than it; ok is false when no quorum did.
func (a *ackClock) confirmedSince(self raft.ServerID, term uint64, voters []raft.ServerID) (int64, bool) {
	now := a.mono()
	times := make([]int64, 0, len(voters))
	a.mu.Lock()
	for _, v := range voters {
		if v == self {
			times = append(times, now)
		} else if at, ok := a.acked[v]; ok && at.term == term {
			times = append(times, at.sent)
		}
	}
	a.mu.Unlock()
	quorum := len(voters)/2 + 1
	if len(times) < quorum {
		return 0, false
	}
	slices.Sort(times)
	slices.Reverse(times)
	return times[quorum-1], true
}

// leaseStamp is when the lease that a VerifyLeader asked at asked (mono
// ns) and answered just now proves starts: the send time of the quorum's
// acknowledgements, and never later than asked. ok is false when no quorum
// of acknowledgements is noted (they came by a path this clock does not
// see): the caller then takes no lease from this round.
func (n *Node) leaseStamp(asked int64) (int64, bool) {
	if n.acks == nil {
		return asked, true
	}
	var voters []raft.ServerID
	for _, s := range n.raft.GetConfiguration().Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, s.ID)
		}
	}
	q, ok := n.acks.confirmedSince(raft.ServerID(n.cfg.NodeID), n.raft.CurrentTerm(), voters)
	if !ok {
		return 0, false
	}
	return min(asked, q), true
}
