package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/fsm"
)

// RaftStatus is this node's view of raft at one moment.
type RaftStatus struct {
	// Role is "leader", "follower", "candidate" or "shutdown".
	Role string
	// Leader is the id of the leader this node knows ("" when none).
	Leader string
	Term   uint64
	// CommitIndex is the last log index known committed; AppliedIndex the
	// last one applied to the state machine here; LastIndex the last one
	// in this node's log.
	CommitIndex  uint64
	AppliedIndex uint64
	LastIndex    uint64
	// HeartbeatTimeout and ElectionTimeout are what raft runs with now
	// (a node that cannot write, or whose disk is slow, runs with 24 h:
	// disk.go).
	HeartbeatTimeout time.Duration
	ElectionTimeout  time.Duration
}

// RaftStatus reports this node's view of raft.
func (n *Node) RaftStatus() RaftStatus {
	_, leader := n.raft.LeaderWithID()
	rc := n.raft.ReloadableConfig()
	return RaftStatus{
		Role:             roleName(n.raft.State()),
		Leader:           string(leader),
		Term:             n.raft.CurrentTerm(),
		CommitIndex:      n.raft.CommitIndex(),
		AppliedIndex:     n.fsm.AppliedIndex(),
		LastIndex:        n.raft.LastIndex(),
		HeartbeatTimeout: rc.HeartbeatTimeout,
		ElectionTimeout:  rc.ElectionTimeout,
	}
}

func roleName(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Candidate:
		return "candidate"
	case raft.Follower:
		return "follower"
	}
	return "shutdown"
}

// Leader is the id of the leader this node knows ("" when none).
func (n *Node) Leader() string {
	_, id := n.raft.LeaderWithID()
	return string(id)
}

// Voters lists the ids of the servers in raft's configuration as this
// node has it (none before it joined a cluster).
func (n *Node) Voters() ([]string, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("cluster: raft configuration: %w", err)
	}
	var ids []string
	for _, s := range f.Configuration().Servers {
		ids = append(ids, string(s.ID))
	}
	return ids, nil
}

// Snapshot makes raft snapshot the state machine now (a restart then
// restores it rather than replaying the log).
func (n *Node) Snapshot() error {
	if err := n.raft.Snapshot().Error(); err != nil {
		return fmt.Errorf("cluster: snapshot: %w", err)
	}
	return nil
}

// appliedPoll is how often WaitApplied looks again: applying an entry
// wakes nobody (Apply must not block), so the wait polls.
const appliedPoll = 10 * time.Millisecond

// WaitApplied waits until this node has applied index and is Ready (it
// knows the current incarnation's sm_state), or ctx ends: then it says
// which of the two it still lacks.
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	t := time.NewTicker(appliedPoll)
	defer t.Stop()
	for {
		ready := n.Ready()
		applied := n.fsm.AppliedIndex()
		if ready && applied >= index {
			return nil
		}
		select {
		case <-ctx.Done():
			if !ready {
				return fmt.Errorf("%w (this term's takeover not applied here)", ErrNotReadyYet)
			}
			return fmt.Errorf("cluster: applied %d < %d: %w", applied, index, ctx.Err())
		case <-n.ReadyChanged():
		case <-t.C:
		}
	}
}

// View is a read-only view of this node's state machine: what was applied
// here, which may lag the leader by the entries in flight. AppliedIndex
// says how current it is (compare it with RaftStatus's CommitIndex, or
// wait for an index with WaitApplied); Ready says whether it holds the
// current incarnation's sm_state. A View reads the live state: each call
// sees what is applied at that moment.
type View struct{ f *fsm.FSM }

// View is this node's read view of the replicated state.
func (n *Node) View() View { return View{n.fsm} }

// AppliedIndex is the last log index applied here.
func (v View) AppliedIndex() uint64 { return v.f.AppliedIndex() }

// State is the local sm_state.
func (v View) State() int32 { return v.f.State() }

// GraceUntil is when the grace opened by the last takeover ends.
func (v View) GraceUntil() time.Time { return v.f.GraceUntil() }

// LastTakeover is the last committed takeover.
func (v View) LastTakeover() fsm.Takeover { return v.f.LastTakeover() }

// Count is the number of registrations.
func (v View) Count() int { return v.f.Len() }

// Registrations pages through the registrations in MonID order after
// after (at most limit; monName, when set, filters).
func (v View) Registrations(after fsm.MonID, limit int, monName string) []fsm.Registration {
	return v.f.Registrations(after, limit, monName)
}

// Targets is every distinct monitored host, as SM_NOTIFY addresses them.
func (v View) Targets() []fsm.Target { return v.f.Targets() }

// Epochs are the NFSv4 client-tracking epochs (nfsdcld's current and
// recovery; recovery 0 outside grace).
func (v View) Epochs() (current, recovery uint64) { return v.f.Epochs() }

// V4Clients lists the NFSv4 client records of the current epoch, or of
// the recovery epoch.
func (v View) V4Clients(recovery bool) []fsm.V4Client { return v.f.V4Clients(recovery) }

// V4Counts counts the NFSv4 client records: current epoch, recovery
// epoch, and those of the recovery epoch reclaimed.
func (v View) V4Counts() (current, recovery, reclaimed int) { return v.f.V4Counts() }

// HasV4Client reports whether a client record name is in the current and
// in the recovery epoch.
func (v View) HasV4Client(name string) (inCurrent, inRecovery bool) {
	return v.f.HasV4Client(name)
}
