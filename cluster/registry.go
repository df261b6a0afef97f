package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"

	"github.com/nsmd/nsmd/fsm"
)

// Registry is the node as the NSM service's Registry (and its optional
// SenderChecker, HostChecker, Counter and ReadyNotifier): the NSM writes,
// each through the gate that keeps it applicable by every member during a
// rolling upgrade (fsm.CommandLevel), and the reads and readiness SM_STAT,
// SM_MON and SM_NOTIFY need. It holds no state of its own.
type Registry struct{ n *Node }

// Registry is this node as the NSM service's Registry.
func (n *Node) Registry() Registry { return Registry{n} }

// ReadyChanged is closed at the next event that may make Ready true: a
// takeover applied here, or leadership moving (the NSM service's
// ReadyNotifier).
func (n *Node) ReadyChanged() <-chan struct{} { return n.leaderChanged() }

// ReadyChanged is Node.ReadyChanged (the NSM service's ReadyNotifier).
func (r Registry) ReadyChanged() <-chan struct{} { return r.n.leaderChanged() }

// Ready is Node.Ready: whether this node knows the current incarnation's
// sm_state.
func (r Registry) Ready() bool { return r.n.Ready() }

// Count is the number of registrations (the NSM service's Counter).
func (r Registry) Count() int { return r.n.fsm.Len() }

// Has reports whether the registration id exists (the NSM service's
// Counter).
func (r Registry) Has(id fsm.MonID) bool {
	_, ok := r.n.fsm.Get(id)
	return ok
}

// Monitor commits a registration (SM_MON) and returns sm_state. It is a
// guarded Register (fsm.Register.Guarded): it replaces an existing
// registration only for the lock manager that made it or for the serving
// node's lockd; otherwise nothing changes and the error wraps
// fsm.ErrOwnedElsewhere. Until every member applies guarded registrations
// (guardedOK), the leader decides on its own state (applyLocal,
// lowerRegister), or this node does while the leader is an older release.
func (r Registry) Monitor(ctx context.Context, reg fsm.Registration) (int32, error) {
	n := r.n
	cmd := fsm.Register{Reg: reg, Guarded: !n.cfg.unguardedMonitor}
	res, err := n.commit(ctx, cmd, n.olderThan(2))
	if errors.Is(err, errLowerHere) {
		n.log.Debug("the leader runs an older release; checking an SM_MON's owner here")
		res, err = n.lowerRegister(ctx, cmd, n.apply)
	}
	if err != nil {
		return res.State, err
	}
	if res.Refused {
		return res.State, fmt.Errorf("cluster: SM_MON of %q for %q taken on %s: %w", reg.ID.MonName, reg.ID.My.MyName, reg.Node, fsm.ErrOwnedElsewhere)
	}
	return res.State, nil
}

// guardedOK reports whether a guarded Register (log entry kind 14) may be
// proposed: every server of the raft configuration is alive in gossip
// and advertises fsm.CommandLevel ≥ 2 (as ownerCommandsOK for level 1).
func (n *Node) guardedOK() bool { return n.clusterLevel() >= 2 }

// lowerRegister commits a guarded Register in the form every release
// applies: it checks the guard on this node's state (fsm.MayRegister) and
// then commits the registration unguarded (kind 1) through commit, or
// answers Refused without committing anything. On the leader this node's
// state holds every acknowledged SM_MON and Takeover; what it has not
// applied yet is in flight at the same moment as this SM_MON, so the
// check decides as if this SM_MON had come first (during a rolling
// upgrade only).
func (n *Node) lowerRegister(ctx context.Context, r fsm.Register, commit func(context.Context, fsm.Command) (fsm.Result, error)) (fsm.Result, error) {
	n.metrics.monLowered.Inc()
	if !n.fsm.MayRegister(r.Reg) {
		return fsm.Result{State: n.fsm.State(), Refused: true}, nil
	}
	return commit(ctx, fsm.Register{Reg: r.Reg})
}

// lowerOnLeader is applyLocal's gate for a guarded Register: while not
// every member applies kind 14 it is checked here and committed as kind 1.
func (n *Node) lowerOnLeader(ctx context.Context, cmd fsm.Command) (fsm.Result, bool, error) {
	r, ok := cmd.(fsm.Register)
	if !ok || !r.Guarded || n.guardedOK() {
		return fsm.Result{}, false, nil
	}
	res, err := n.lowerRegister(ctx, r, n.applyLocal)
	return res, true, err
}

// Unmonitor commits an SM_UNMON of owner's registration (applyOwned).
func (r Registry) Unmonitor(ctx context.Context, id fsm.MonID, owner fsm.Owner) (int32, error) {
	res, err := r.n.applyOwned(ctx, fsm.Unregister{ID: id, Owner: owner})
	return res.State, err
}

// UnmonitorAll commits an SM_UNMON_ALL of owner's registrations (applyOwned).
func (r Registry) UnmonitorAll(ctx context.Context, my fsm.MyID, owner fsm.Owner) (int32, error) {
	res, err := r.n.applyOwned(ctx, fsm.UnregisterAll{My: my, Owner: owner})
	return res.State, err
}

// commandLevel is the fsm.CommandLevel this node advertises.
func (c *Config) commandLevel() int {
	if c.olderFSM {
		return 0
	}
	return fsm.CommandLevel
}

// clusterLevel is the fsm.CommandLevel every server of the raft
// configuration applies: the lowest that gossip shows them advertising,
// 0 while one is down or unknown, or without gossip.
func (n *Node) clusterLevel() int { return n.serversLevel(false) }

// serversLevel is clusterLevel; with lastKnown a server that is down
// counts by the level it last advertised (membership.commandLevel).
func (n *Node) serversLevel(lastKnown bool) int {
	if n.member == nil {
		return 0
	}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	servers := f.Configuration().Servers
	if len(servers) == 0 {
		return 0
	}
	ids := make([]string, len(servers))
	for i, s := range servers {
		ids[i] = string(s.ID)
	}
	return n.member.commandLevel(ids, lastKnown)
}

// ownerCommandsOK reports whether an Unregister or UnregisterAll with an
// Owner (log entry kinds 11 and 12) may be proposed: every server of the
// raft configuration is alive in gossip and advertises fsm.CommandLevel
// ≥ 1, so none would refuse the entry (an older release) and diverge.
// Without gossip, or while a server is down or unknown, it is false.
func (n *Node) ownerCommandsOK() bool { return n.clusterLevel() >= 1 }

// lowerTakeover clears a Takeover's Wrap (kind 13) while not every member
// applies it: an older member would saturate where the others wrap.
func (n *Node) lowerTakeover(t fsm.Takeover) fsm.Takeover {
	if t.Wrap && n.clusterLevel() < 1 {
		t.Wrap = false
	}
	return t
}

// isOwned reports whether cmd is an Unregister or UnregisterAll with an
// Owner (kinds 11 and 12).
func isOwned(cmd fsm.Command) bool {
	switch c := cmd.(type) {
	case fsm.Unregister:
		return !c.Owner.IsZero()
	case fsm.UnregisterAll:
		return !c.Owner.IsZero()
	}
	return false
}

// applyOwned commits an Unregister or UnregisterAll with an Owner: as
// such once every member applies it (ownerCommandsOK), else — a rolling
// upgrade, a member down — lowered (applyLowered) on the leader's state.
//
// A follower forwards it and lets the leader decide, retrying like any
// write while the leader is unreachable (a cut): its own state may lag
// writes the leader acknowledged (an SM_MON its own lockd sent a moment
// ago, forwarded and answered before this node applied it), and a
// removal chosen on that state would leave out a registration that an
// earlier, acknowledged SM_MON made — the SM_UNMON_ALL would not be
// atomic. Only a leader of an older release, which refuses the new kinds
// — gossip shows it (olderLeader), or it answers so — has the command
// lowered here.
func (n *Node) applyOwned(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	if n.ownerCommandsOK() {
		return n.apply(ctx, cmd)
	}
	if n.Leading() {
		return n.applyLowered(ctx, cmd)
	}
	res, err := n.commit(ctx, cmd, n.olderLeader)
	if errors.Is(err, errLowerHere) {
		n.log.Debug("the leader runs an older release; lowering an owner command here")
		return n.applyLowered(ctx, cmd)
	}
	return res, err
}

// olderLeader reports whether gossip shows leader id advertising a
// command level below 1 (a release without owner commands). A leader
// gossip cannot see now is judged by what it last advertised; one it
// never saw is not judged older: the forward then finds out.
func (n *Node) olderLeader(id string) bool { return n.olderThan(1)(id) }

// olderThan is olderLeader for a command of the given level.
func (n *Node) olderThan(level int) func(id string) bool {
	return func(id string) bool {
		if n.member == nil {
			return false // no gossip: the forward's answer tells
		}
		l, known := n.member.lastLevel(id)
		return known && l < level
	}
}

// applyLowered commits cmd, an Unregister or UnregisterAll with an Owner,
// in the form every release applies: one owner-less Unregister for each
// registration that this node's state says the owner made (fsm.Owned).
// The check runs on this node's state rather than in Apply, so a
// registration committed but not yet applied here is not removed (lockd
// is answered as if it had been; the registration costs one spurious
// callback at most), and nothing is removed that the owner did not make.
// The Result's State is the last committed one, Removed the count.
func (n *Node) applyLowered(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	ids := n.fsm.Owned(cmd)
	n.metrics.ownerLowered.Inc()
	if len(ids) == 0 {
		return fsm.Result{State: n.fsm.State()}, nil
	}
	type done struct {
		res fsm.Result
		err error
	}
	sem := make(chan struct{}, 64) // let group commit batch them
	out := make(chan done, len(ids))
	for _, id := range ids {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			res, err := n.apply(ctx, fsm.Unregister{ID: id})
			out <- done{res, err}
		}()
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	close(out)
	res := fsm.Result{State: n.fsm.State()}
	var errs []error
	for d := range out {
		if d.err != nil {
			errs = append(errs, d.err)
			continue
		}
		res.State = max(res.State, d.res.State)
		res.Removed += d.res.Removed
	}
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("cluster: unregister %d of %d registrations: %w", len(errs), len(ids), err)
	}
	return res, nil
}

// reasonSimuCrash marks the Takeover of an SM_SIMU_CRASH; the leader that
// commits it restarts the SM_NOTIFY fan-out with the new state.
const reasonSimuCrash = "simu_crash"

// SimuCrash acts as a failover: a takeover that raises sm_state and
// opens grace, then SM_NOTIFY to every monitored host with the new state.
// On a follower it is forwarded to the leader, which notifies.
func (r Registry) SimuCrash(ctx context.Context) error {
	n := r.n
	_, err := n.apply(ctx, n.takeover(reasonSimuCrash))
	return err
}

// signalCrash hands the leader loop the newest SM_SIMU_CRASH state.
func (n *Node) signalCrash(state int32) {
	for {
		select {
		case n.crashCh <- state:
			return
		default:
		}
		select { // replace an older, unconsumed state
		case <-n.crashCh:
		default:
		}
	}
}

// PeerRebooted commits an accepted SM_NOTIFY from a monitored host.
func (r Registry) PeerRebooted(ctx context.Context, ev fsm.PeerRebooted) error {
	_, err := r.n.apply(ctx, ev)
	return err
}

// State is the local sm_state.
func (r Registry) State() int32 { return r.n.fsm.State() }

// SenderIsHost reports whether from is an address of the monitored host
// monName (the NSM service's SenderChecker).
func (r Registry) SenderIsHost(monName string, from netip.Addr) bool {
	return r.n.fsm.SenderIsHost(monName, from)
}

// WouldAccept pre-checks an SM_NOTIFY against local state.
func (r Registry) WouldAccept(monName string, from netip.Addr, state int32) bool {
	return r.n.fsm.WouldAccept(monName, from, state)
}

// wrapZone is how close to the end of the int32 range sm_state must be
// for a takeover to carry Wrap (entry kind 13). Below it no takeover can
// reach the end (each adds 2; a MinState a follower may forward or an
// import may ask for is at most fsm.MaxImportedState+1), so takeovers keep
// the kind every release applies, and a member can still be downgraded.
const wrapZone = 1 << 20

// takeover is a Takeover by this node; near the end of the sm_state range
// it wraps there, once every member applies that (lowerTakeover).
func (n *Node) takeover(reason string) fsm.Takeover {
	now := n.cfg.Now().UTC()
	t := fsm.Takeover{Node: n.cfg.NodeID, GraceUntil: now.Add(n.cfg.GracePeriod), Reason: reason, At: now}
	t.Wrap = n.fsm.State() >= math.MaxInt32-wrapZone
	return n.lowerTakeover(t)
}

// ErrBadImport means an import was refused before anything was committed.
var ErrBadImport = errors.New("cluster: import refused")

// reasonImport marks the Takeover that follows an import of another
// server's monitor list (nsmd import-statd).
const reasonImport = "import"

// Import commits registrations taken over from another NSM server (rpc.statd)
// and then a Takeover that lifts sm_state above minAbove, the state that
// server had, so its clients accept our SM_NOTIFY; the leader then notifies
// every monitored host with the new state. It returns the new sm_state.
func (r Registry) Import(ctx context.Context, regs []fsm.Registration, minAbove int32) (int32, error) {
	n := r.n
	if minAbove < 0 || minAbove > fsm.MaxImportedState {
		return 0, fmt.Errorf("%w: imported sm_state %d is outside 0…%d", ErrBadImport, minAbove, fsm.MaxImportedState)
	}
	sem := make(chan struct{}, 64) // let group commit batch them
	errs := make(chan error, len(regs))
	for _, r := range regs {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			_, err := n.apply(ctx, fsm.Register{Reg: r})
			errs <- err
		}()
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, fmt.Errorf("cluster: import registration: %w", err)
		}
	}
	t := n.takeover(reasonImport)
	t.MinState = minAbove + 1
	res, err := n.apply(ctx, t)
	if err != nil {
		return 0, fmt.Errorf("cluster: import takeover: %w", err)
	}
	return res.State, nil
}

// Monitored reports whether any registration names host monName (the NSM
// service's HostChecker).
func (r Registry) Monitored(monName string) bool {
	return len(r.n.fsm.Registrations(fsm.MonID{}, 1, monName)) > 0
}
