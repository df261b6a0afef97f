package cluster

import (
	"errors"
	"slices"

	"github.com/hashicorp/raft"
)

// A witness is a raft voter that gives a two-server cluster its quorum and
// serves nothing: no VIP, no hooks, no takeover, no SM_NOTIFY. Raft has no
// node priority, so a witness can still win an election (with pre-vote, a
// surviving server cannot win before every other voter's heartbeat timer
// has run out, and the witness's own may run out first). When it does, it
// hands leadership to a serving voter at once (handOff, successor.go) and
// commits nothing itself, so the serving node's Takeover is the only state
// bump.
//
// Measured on the pair topology: a witness with longer timeouts than the
// servers does not win less; it delays every failover to its own timeout
// (its pre-vote refusals hold the survivor back) and then wins. A witness
// therefore uses the same raft timings as the servers.

// ErrWitnessTarget means a leadership transfer named a witness, or no
// serving voter was available.
var ErrWitnessTarget = errors.New("cluster: a witness cannot take leadership")

// ErrUnknownTarget means a leadership transfer named no voter of the cluster.
var ErrUnknownTarget = errors.New("cluster: no such voter")

// IsWitness reports whether node id is a witness: this node's own setting,
// the member's gossip metadata, or Config.Witnesses (static clusters).
func (n *Node) IsWitness(id string) bool {
	if id == n.cfg.NodeID {
		return n.cfg.Witness
	}
	if slices.Contains(n.cfg.Witnesses, id) {
		return true
	}
	return n.member != nil && n.member.isWitness(id)
}

// Witness reports whether this node is a witness.
func (n *Node) Witness() bool { return n.cfg.Witness }

// servingVoters lists the voters other than this node that may lead
// (witnesses excluded), members gossip sees alive first.
func (n *Node) servingVoters() []raft.Server {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var alive, other []raft.Server
	for _, s := range f.Configuration().Servers {
		id := string(s.ID)
		if s.Suffrage != raft.Voter || id == n.cfg.NodeID || n.IsWitness(id) {
			continue
		}
		if n.member == nil || n.member.isAlive(id) {
			alive = append(alive, s)
		} else {
			other = append(other, s)
		}
	}
	return append(alive, other...)
}

// Handoffs is how many times this witness handed leadership over.
func (n *Node) Handoffs() uint64 { return n.handoffs.Load() }
