package cluster

import (
	"github.com/hashicorp/raft"
)

// observeLeadership is the one place that watches raft's leadership, and
// it feeds everything that depends on it:
//   - the leader loop, with the latest of this node's gains and losses
//     (termCh);
//   - writes held for a leader (leaderChanged), woken at every leader
//     change anywhere in the cluster;
//   - the VIP hand-over, with the last serving node seen leading
//     (previousLeader);
//   - membership, whose reconcile runs at once on a leader change.
//
// It reads two raft signals, because neither carries both answers: raft's
// NotifyCh says "this node leads / no longer leads" and is never dropped
// (raft blocks until it is taken, so it is buffered and read here at
// once), and a LeaderObservation says who leads, on every node, but an
// observer's channel drops what does not fit. A lost "no longer leads"
// would keep the VIP up, so the leader loop is driven by NotifyCh only.
// Nothing here blocks: the leader loop may spend seconds stepping down
// (the on_follower hook) while writers still need their wake-ups.
func (n *Node) observeLeadership() {
	ch := make(chan raft.Observation, 16)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.raft.RegisterObserver(obs)
	defer n.raft.DeregisterObserver(obs)
	// Raft ran before the observer was registered: a leader it heard from
	// in between (a restarted node hears one within a heartbeat) was not
	// observed. Without it, this node, elected next, could not ask the
	// killed leader about the VIP and would wait out its lifetime.
	_, id := n.raft.LeaderWithID()
	n.notePrevLeader(string(id))
	for {
		select {
		case leader := <-n.leaderCh:
			offerLatest(n.termCh, leader)
		case o := <-ch:
			if lo, ok := o.Data.(raft.LeaderObservation); ok {
				n.notePrevLeader(string(lo.LeaderID))
			}
			n.wakeWriters()
			if n.member != nil {
				n.member.nudge()
			}
		case <-n.ctx.Done():
			return
		}
	}
}

// notePrevLeader records id as the last other node seen leading. A
// witness never holds the VIP: the previous holder to ask about it is the
// last *serving* leader.
func (n *Node) notePrevLeader(id string) {
	if id == "" || id == n.cfg.NodeID || n.IsWitness(id) {
		return
	}
	n.lcMu.Lock()
	n.prevLeader = id
	n.lcMu.Unlock()
}

// offerLatest leaves v in the one-slot channel ch, replacing a value its
// reader has not taken yet: the reader only ever needs the latest. The
// caller must be ch's only sender.
func offerLatest(ch chan bool, v bool) {
	for {
		select {
		case ch <- v:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

// leaderChanged returns a channel closed at the next leader change.
func (n *Node) leaderChanged() <-chan struct{} {
	n.lcMu.Lock()
	defer n.lcMu.Unlock()
	return n.lcCh
}

// wakeWriters wakes writes held for a leader: leadership moved, or this
// node's takeover committed.
func (n *Node) wakeWriters() {
	n.lcMu.Lock()
	close(n.lcCh)
	n.lcCh = make(chan struct{})
	n.lcMu.Unlock()
}

// previousLeader is the last other serving node seen leading ("" if none):
// the node a new leader asks whether it still holds the VIP.
func (n *Node) previousLeader() string {
	n.lcMu.Lock()
	defer n.lcMu.Unlock()
	return n.prevLeader
}
