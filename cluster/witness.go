package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// A witness is a raft voter that gives a two-server cluster its quorum and
// serves nothing: no VIP, no hooks, no takeover, no SM_NOTIFY. Raft has no
// node priority, so a witness can still win an election (with pre-vote, a
// surviving server cannot win before every other voter's heartbeat timer
// has run out, and the witness's own may run out first). When it does, it
// hands leadership to a serving voter at once (handOff) and commits
// nothing itself, so the serving node's Takeover is the only state bump.
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

// TransferLeadership hands leadership to voter to, or to a serving voter
// of raft's choosing among the serving ones when to is "". A witness is
// never a target.
func (n *Node) TransferLeadership(to string) error {
	if to == "" {
		targets := n.servingVoters()
		if len(targets) == 0 {
			return fmt.Errorf("%w: no other serving voter", ErrWitnessTarget)
		}
		var errs []error
		for _, s := range targets {
			err := n.raft.LeadershipTransferToServer(s.ID, s.Address).Error()
			if err == nil {
				return nil
			}
			errs = append(errs, fmt.Errorf("to %s: %w", s.ID, err))
		}
		return fmt.Errorf("cluster: leadership transfer: %w", errors.Join(errs...))
	}
	if n.IsWitness(to) {
		return fmt.Errorf("%w: %s is a witness", ErrWitnessTarget, to)
	}
	if to == n.cfg.NodeID {
		return fmt.Errorf("%w: %s is this node", ErrUnknownTarget, to)
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("cluster: read configuration: %w", err)
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == to && s.Suffrage == raft.Voter {
			if err := n.raft.LeadershipTransferToServer(s.ID, s.Address).Error(); err != nil {
				return fmt.Errorf("cluster: leadership transfer to %s: %w", to, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: %q", ErrUnknownTarget, to)
}

// handOff is a witness's whole leadership term: pass leadership to a
// serving voter, again and again until it is gone (or the node stops).
//
// The target matters: raft's transfer to a dead node holds every other
// transfer ("in progress") until its own attempt gives up, which over TCP
// to a host that is gone is several seconds. A witness elected just after
// the serving leader's crash is the usual case, and gossip may still call
// that node alive then (a kernel drill lost 8.5 s this way, twice in one
// failover: the rotation below once ran over a list re-sorted between
// rounds and picked the dead node again). So each round asks gossip which
// candidates answer a ping now, and a target whose transfer failed lately
// is tried only when nothing else is left.
func (n *Node) handOff(ctx context.Context) {
	n.log.Warn("witness elected leader; handing leadership to a serving node")
	backoff := 50 * time.Millisecond
	failed := map[raft.ServerID]time.Time{}
	for ctx.Err() == nil && n.raft.State() == raft.Leader {
		targets := n.servingVoters()
		var answering map[string]bool
		if n.member != nil && len(targets) > 1 {
			answering = n.member.answering(ctx, serverIDs(targets))
		}
		if s, ok := handoffTarget(targets, answering, failed, time.Now()); ok {
			if err := n.raft.LeadershipTransferToServer(s.ID, s.Address).Error(); err != nil {
				n.metrics.witnessHandoffs.WithLabelValues("failed").Inc()
				n.log.Warn("witness hand-off failed", "to", s.ID, "err", err)
				if !errors.Is(err, raft.ErrLeadershipTransferInProgress) {
					failed[s.ID] = time.Now()
				}
			} else {
				n.metrics.witnessHandoffs.WithLabelValues("ok").Inc()
				n.handoffs.Add(1)
				n.log.Info("witness handed leadership over", "to", s.ID)
			}
		} else {
			n.log.Warn("witness leads and no serving voter is known; waiting")
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// handoffRetryAfter is how long a target whose transfer failed is passed
// over while another candidate exists.
const handoffRetryAfter = 10 * time.Second

// handoffTarget picks the witness's next transfer target from targets (in
// servingVoters' order): the first one that answered gossip's ping
// (answering nil: no ping was made, every target counts as answering) and
// has not failed within handoffRetryAfter; else the first that has not
// failed lately; else the one that failed longest ago.
func handoffTarget(targets []raft.Server, answering map[string]bool, failed map[raft.ServerID]time.Time, now time.Time) (raft.Server, bool) {
	if len(targets) == 0 {
		return raft.Server{}, false
	}
	fresh := func(s raft.Server) bool {
		at, ok := failed[s.ID]
		return !ok || now.Sub(at) >= handoffRetryAfter
	}
	for _, s := range targets {
		if (answering == nil || answering[string(s.ID)]) && fresh(s) {
			return s, true
		}
	}
	for _, s := range targets {
		if fresh(s) {
			return s, true
		}
	}
	oldest := targets[0]
	for _, s := range targets[1:] {
		if failed[s.ID].Before(failed[oldest.ID]) {
			oldest = s
		}
	}
	return oldest, true
}

func serverIDs(ss []raft.Server) []string {
	ids := make([]string, len(ss))
	for i, s := range ss {
		ids[i] = string(s.ID)
	}
	return ids
}

// Handoffs is how many times this witness handed leadership over.
func (n *Node) Handoffs() uint64 { return n.handoffs.Load() }
