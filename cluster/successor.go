package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// Who leads next: the one place that decides it.
//
// Every change of leader costs a takeover — sm_state bump, NLM and NFSv4
// grace, SM_NOTIFY to every client, their reclaims — so leadership moves
// only to a node that is healthier than this one for the reason it moves,
// and when every candidate is in the same trouble nothing moves. Every
// hand-over of this node asks successors (or the operator names a target,
// checked here) and goes through transfer, the only caller of raft's
// leadership transfer.
//
// The rules, by reason (a witness is never a target: it cannot serve):
//
//   - slow disk (diskslow.go): only a serving node whose disk is measured
//     faster: its gossiped report (diskReport) says writable, not slow,
//     not slowing down (suspect), and a median write at most half this
//     node's. A node with no report (no gossip, or an
//     older version) is not measured and not a target. When every other
//     node is as slow (a shared array's hiccup: every fsync slow at once)
//     the slow leader keeps leading; handing over would only add a
//     takeover per hop.
//   - unwritable disk (disk.go): a serving node not known to be
//     unwritable. This node cannot commit at all (raft deposes it at its
//     next failed write), so any node that may write is healthier.
//   - witness hand-off (handOff): any serving node (a witness cannot
//     serve, so every server is healthier), the one that answers a gossip
//     ping first, a target whose transfer failed lately last.
//   - failed takeover (this node's on_leader failed): a serving node that
//     gossip sees alive and whose disk is not known slow or unwritable.
//   - operator (POST /v1/leadership/transfer): a named target is taken as
//     asked unless it is a witness, this node or no voter; unnamed, any
//     serving node.
//   - shutdown: any serving node (this one goes away either way).
//
// The order within the allowed ones: gossip-alive first (without gossip,
// every voter counts as alive; for a slow disk, a silent node only when
// no live one is allowed), then by disk: measured healthy, no report,
// suspect, slow, unwritable; raft's configuration order breaks ties.

// moveReason says why this node hands leadership away; each reason has its
// rule for who may take it.
type moveReason int

const (
	moveSlowDisk       moveReason = iota + 1 // this node's disk is slow (diskslow.go)
	moveDiskDown                             // this node's disk takes no writes (disk.go)
	moveWitness                              // this witness won an election (handOff)
	moveFailedTakeover                       // this node's takeover (on_leader) failed
	moveOperator                             // the admin API asked
	moveShutdown                             // this node stops
)

var moveReasons = []moveReason{moveSlowDisk, moveDiskDown, moveWitness, moveFailedTakeover, moveOperator, moveShutdown}

func (r moveReason) String() string {
	switch r {
	case moveSlowDisk:
		return "slow_disk"
	case moveDiskDown:
		return "disk_unwritable"
	case moveWitness:
		return "witness"
	case moveFailedTakeover:
		return "failed_takeover"
	case moveOperator:
		return "operator"
	case moveShutdown:
		return "shutdown"
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// ErrNoSuccessor means no other node may take leadership for the reason
// given: leadership stays where it is.
var ErrNoSuccessor = errors.New("cluster: no healthier node to take leadership")

// candidate is another serving voter as this node sees it.
type candidate struct {
	srv   raft.Server
	alive bool       // gossip sees it alive (always true without gossip)
	disk  diskReport // its gossiped disk report, when known
	known bool
}

// diskRank orders candidates by disk health, healthiest first.
func (c candidate) diskRank() int {
	switch {
	case !c.known:
		return 1
	case c.disk.Down:
		return 4
	case c.disk.Slow:
		return 3
	case c.disk.Suspect:
		return 2
	}
	return 0
}

// measuredFaster: c's disk is measured healthy and at most half as slow
// as a disk whose median write is self.
func (c candidate) measuredFaster(self time.Duration) bool {
	return c.known && c.diskRank() == 0 && c.disk.P50us > 0 && self > 0 && 2*c.disk.p50() <= self
}

// allowed is the policy: may c take leadership from this node for why?
// self is this node's own disk report.
func (c candidate) allowed(why moveReason, self diskReport) bool {
	switch why {
	case moveSlowDisk:
		return c.measuredFaster(self.p50())
	case moveDiskDown:
		return !c.known || !c.disk.Down
	case moveFailedTakeover:
		return c.alive && (!c.known || (!c.disk.Slow && !c.disk.Down))
	case moveWitness, moveOperator, moveShutdown:
		return true
	}
	return false
}

// successorsFor picks from cs (another serving voter each, in raft's
// configuration order) those allowed for why, best first.
func successorsFor(why moveReason, self diskReport, cs []candidate) []raft.Server {
	var ok []candidate
	for _, c := range cs {
		if c.allowed(why, self) {
			ok = append(ok, c)
		}
	}
	if why == moveSlowDisk && slices.ContainsFunc(ok, func(c candidate) bool { return c.alive }) {
		// A silent node only when no live one is faster: gossip lags
		// raft (a voter back from a cut replicates for seconds before
		// gossip calls it alive), but a dead one holds writes for an
		// election timeout.
		ok = slices.DeleteFunc(ok, func(c candidate) bool { return !c.alive })
	}
	slices.SortStableFunc(ok, func(a, b candidate) int {
		if a.alive != b.alive {
			if a.alive {
				return -1
			}
			return 1
		}
		return a.diskRank() - b.diskRank()
	})
	out := make([]raft.Server, len(ok))
	for i, c := range ok {
		out[i] = c.srv
	}
	return out
}

// candidates lists the voters other than this node that may serve
// (witnesses excluded), with what gossip says of each.
func (n *Node) candidates() []candidate {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var out []candidate
	for _, s := range f.Configuration().Servers {
		id := string(s.ID)
		if s.Suffrage != raft.Voter || id == n.cfg.NodeID || n.IsWitness(id) {
			continue
		}
		c := candidate{srv: s, alive: true}
		if n.member != nil {
			c.alive = n.member.isAlive(id)
			c.disk, c.known = n.member.diskOf(id)
		}
		out = append(out, c)
	}
	return out
}

// describeCandidates says what this node knows of each candidate (for
// the log line of a leader that keeps leadership for want of a better
// node): "n2=slow/62ms n3=suspect/3ms n4=?" ("?": no report).
func describeCandidates(cs []candidate) string {
	var b strings.Builder
	for i, c := range cs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(string(c.srv.ID))
		b.WriteByte('=')
		if !c.alive {
			b.WriteString("silent,")
		}
		switch {
		case !c.known:
			b.WriteString("?")
			continue
		case c.disk.Down:
			b.WriteString("unwritable")
		case c.disk.Slow:
			b.WriteString("slow")
		case c.disk.Suspect:
			b.WriteString("suspect")
		default:
			b.WriteString("ok")
		}
		fmt.Fprintf(&b, "/%v", c.disk.p50().Round(100*time.Microsecond))
	}
	return b.String()
}

// successors lists, best first, the nodes that may take leadership from
// this one for why (empty: none may).
func (n *Node) successors(why moveReason) []raft.Server {
	return successorsFor(why, n.disk.report(time.Now()), n.candidates())
}

// pickSuccessor is the best node to take leadership from this one for
// why, or ErrNoSuccessor.
func (n *Node) pickSuccessor(why moveReason) (raft.ServerID, raft.ServerAddress, error) {
	to := n.successors(why)
	if len(to) == 0 {
		return "", "", fmt.Errorf("%w (%s)", ErrNoSuccessor, why)
	}
	return to[0].ID, to[0].Address, nil
}

// moveLeadership hands leadership to the best successor for why, the next
// one when a transfer fails, and says who took it ("" when leadership left
// this node but no leader is known yet). Every transfer blocks until
// raft's own attempt ends (about an election timeout when the target does
// not answer).
//
// Raft answers "timeout" when the target's election outlasts its wait, and
// that target may still win: so after a failed transfer it waits up to an
// election timeout for a leader change, and stops if this node no longer
// leads — two targets asked at once can make two takeovers. (The wait
// follows the last failure too: a caller that retries at once must not
// overlap with it either.)
func (n *Node) moveLeadership(why moveReason) (raft.ServerID, error) {
	to := n.successors(why)
	if len(to) == 0 {
		n.metrics.transferDeclined.WithLabelValues(why.String()).Inc()
		return "", fmt.Errorf("%w (%s)", ErrNoSuccessor, why)
	}
	var errs []error
	for _, s := range to {
		changed := n.leaderChanged()
		err := n.transfer(why, s)
		if err == nil {
			return s.ID, nil
		}
		errs = append(errs, err)
		t := time.NewTimer(n.cfg.ElectionTimeout)
		select {
		case <-changed:
		case <-t.C:
		case <-n.ctx.Done():
		}
		t.Stop()
		if n.raft.State() != raft.Leader {
			_, id := n.raft.LeaderWithID()
			return id, nil
		}
		if n.ctx.Err() != nil {
			break
		}
	}
	return "", errors.Join(errs...)
}

// transfer is the one call of raft's leadership transfer: to one target,
// logged and counted by reason.
func (n *Node) transfer(why moveReason, to raft.Server) error {
	start := time.Now()
	err := n.raft.LeadershipTransferToServer(to.ID, to.Address).Error()
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		n.metrics.transfers.WithLabelValues(why.String(), "failed").Inc()
		msg := "leadership transfer failed"
		if why == moveWitness {
			msg = "witness hand-off failed"
		}
		n.log.Warn(msg, "reason", why.String(), "to", to.ID, "took", took, "err", err)
		return fmt.Errorf("cluster: leadership transfer to %s (%s): %w", to.ID, why, err)
	}
	n.metrics.transfers.WithLabelValues(why.String(), "ok").Inc()
	switch why {
	case moveWitness:
		n.log.Info("witness handed leadership over", "to", to.ID, "took", took)
	case moveSlowDisk:
		n.log.Warn("data directory slow: handed leadership over", "to", to.ID, "took", took)
	default:
		n.log.Info("leadership handed over", "reason", why.String(), "to", to.ID, "took", took)
	}
	return nil
}

// TransferLeadership hands leadership to voter to, or, when to is "", to
// the best serving voter (successors: gossip-alive and healthy disks
// first), trying the next when a transfer fails. A witness is never a
// target.
func (n *Node) TransferLeadership(to string) error {
	if to == "" {
		_, err := n.moveLeadership(moveOperator)
		if errors.Is(err, ErrNoSuccessor) {
			return fmt.Errorf("%w: no other serving voter", ErrWitnessTarget)
		}
		return err // each transfer's error names its target
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
			return n.transfer(moveOperator, s)
		}
	}
	return fmt.Errorf("%w: %q", ErrUnknownTarget, to)
}

// stepAsideAfterFailedTakeover hands leadership to a serving node that
// gossip sees alive and whose disk is not known slow or unwritable, after
// this node's takeover failed (ErrNoSuccessor: none, it keeps leading).
// The leader loop calls it.
func (n *Node) stepAsideAfterFailedTakeover() (raft.ServerID, error) {
	return n.moveLeadership(moveFailedTakeover)
}

// handOff is a witness's whole leadership term: pass leadership to a
// serving voter, again and again until it is gone (or the node stops).
//
// The target matters: raft's transfer to a dead node holds every other
// transfer ("in progress") until its own attempt gives up, which over TCP
// to a host that is gone is several seconds. A witness elected just after
// the serving leader's crash is the usual case, and gossip may still call
// that node alive then (a kernel drill lost 8.5 s this way, twice in one
// failover: a rotation over a list re-sorted between rounds picked the
// dead node again). So each round asks gossip which candidates answer a
// ping now, and a target whose transfer failed lately is tried only when
// nothing else is left.
func (n *Node) handOff(ctx context.Context) {
	n.log.Warn("witness elected leader; handing leadership to a serving node")
	backoff := 50 * time.Millisecond
	failed := map[raft.ServerID]time.Time{}
	for ctx.Err() == nil && n.raft.State() == raft.Leader {
		targets := n.successors(moveWitness)
		var answering map[string]bool
		if n.member != nil && len(targets) > 1 {
			answering = n.member.answering(ctx, serverIDs(targets))
		}
		if s, ok := handoffTarget(targets, answering, failed, time.Now()); ok {
			if err := n.transfer(moveWitness, s); err != nil {
				n.metrics.witnessHandoffs.WithLabelValues("failed").Inc()
				if !errors.Is(err, raft.ErrLeadershipTransferInProgress) {
					failed[s.ID] = time.Now()
				}
			} else {
				n.metrics.witnessHandoffs.WithLabelValues("ok").Inc()
				n.handoffs.Add(1)
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
// successors' order): the first one that answered gossip's ping
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
