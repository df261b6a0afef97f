package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/nsmd/nsmd/fsm"
)

// ServiceRegistry is one service's NSM state as the NSM service of that
// service sees it (an nsm.Registry, SenderChecker, HostChecker, Counter
// and ReadyNotifier): every write is an fsm.Scoped command of the service
// (its own registrations, last-seen states and NFSv4 records, its own
// sm_state), committed like any write (a follower forwards it), sent by
// this node's run of the service (its node and epoch: the state applies
// it only while that run is the service's current one, so an SM_UNMON
// or SM_MON that commits after the service moved changes nothing and
// fails, fsm.ErrStaleRun); every read is of the service's scope. It is ready, and answers with the
// service's sm_state, only while this node serves the service under a
// lease (servicerun.go): the lease is the proof that the epoch this node
// serves is the service's current one, so no client can see the state go
// back after another saw it rise. It holds no state of its own.
type ServiceRegistry struct {
	n  *Node
	id string
}

// Registry is service id's registry on this node.
func (s Services) Registry(id string) ServiceRegistry { return ServiceRegistry{n: s.p.n, id: id} }

// ErrNoServiceCrash: SM_SIMU_CRASH is not taken for one service; a
// service gets a new state only from a new placement (a move or a
// restart of the service).
var ErrNoServiceCrash = errors.New("cluster: SM_SIMU_CRASH is not taken for a service; move or restart the service instead")

func (r ServiceRegistry) scope() fsm.Scope { return r.n.fsm.Scope(r.id) }

// servingEpoch is the epoch this node serves the service at under a
// lease that holds now, if it does.
func (r ServiceRegistry) servingEpoch() (uint64, bool) { return r.n.runs.leasedEpoch(r.id) }

// Ready reports whether this node serves the service under a lease.
func (r ServiceRegistry) Ready() bool {
	_, ok := r.servingEpoch()
	return ok
}

// ReadyChanged is Node.ReadyChanged (the NSM service's ReadyNotifier);
// the NSM service also polls, which catches a lease granted.
func (r ServiceRegistry) ReadyChanged() <-chan struct{} { return r.n.leaderChanged() }

// State is the service's sm_state in this node's state.
func (r ServiceRegistry) State() int32 { return r.scope().State() }

// ReadState is the service's sm_state at the epoch this node serves
// under a lease (no question to the leader: the lease is the proof).
func (r ServiceRegistry) ReadState(context.Context) (int32, error) {
	e, ok := r.servingEpoch()
	if !ok {
		return 0, fmt.Errorf("%w: service %q is not served here under a lease", ErrNotReadyYet, r.id)
	}
	return fsm.ServiceSMState(e), nil
}

// Count is the number of the service's registrations.
func (r ServiceRegistry) Count() int { return r.scope().Len() }

// Has reports whether the service's registration id exists.
func (r ServiceRegistry) Has(id fsm.MonID) bool {
	_, ok := r.scope().Get(id)
	return ok
}

// Monitored reports whether any of the service's registrations names
// host monName.
func (r ServiceRegistry) Monitored(monName string) bool {
	return len(r.scope().Registrations(fsm.MonID{}, 1, monName)) > 0
}

// Registrations is View.Registrations of the service's own registrations.
func (r ServiceRegistry) Registrations(after fsm.MonID, limit int, monName string) []fsm.Registration {
	return r.scope().Registrations(after, limit, monName)
}

// Targets is every distinct host the service's registrations name, with
// their addresses: whom its SM_NOTIFY goes to.
func (r ServiceRegistry) Targets() []fsm.Target { return r.scope().Targets() }

// SenderIsHost is Registry.SenderIsHost on the service's registrations.
func (r ServiceRegistry) SenderIsHost(monName string, from netip.Addr) bool {
	return r.scope().SenderIsHost(monName, from)
}

// WouldAccept is Registry.WouldAccept on the service's registrations.
func (r ServiceRegistry) WouldAccept(monName string, from netip.Addr, state int32) bool {
	return r.scope().WouldAccept(monName, from, state)
}

// scoped is cmd as this node's run of the service sends it: with the
// run's node and epoch (servicerun.go: once the run started anything and
// until its stop returned — its lock manager's last writes come during
// the stop). The state applies it only while that run is the service's
// current one.
func (r ServiceRegistry) scoped(cmd fsm.Command) (fsm.Scoped, error) {
	epoch, ok := r.n.runs.startedEpoch(r.id)
	if !ok {
		return fsm.Scoped{}, fmt.Errorf("service %s: %w", r.id, ErrServiceNotServed)
	}
	return fsm.Scoped{Service: r.id, Node: r.n.cfg.NodeID, Epoch: epoch, Cmd: cmd}, nil
}

// apply commits cmd in the service's scope, as this node's run sends it.
func (r ServiceRegistry) apply(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	sc, err := r.scoped(cmd)
	if err != nil {
		return fsm.Result{}, err
	}
	return r.send(ctx, sc)
}

// send commits sc; a refusal with a reason (the run that sent it ended
// before it was applied: fsm.ErrStaleRun) is an error. A guarded
// Register's refusal (another lock manager's registration) is left to
// Monitor.
func (r ServiceRegistry) send(ctx context.Context, sc fsm.Scoped) (fsm.Result, error) {
	res, err := r.n.apply(ctx, sc)
	if err == nil && res.Refused && res.Refusal != nil {
		err = res.Refusal
	}
	if err != nil {
		err = fmt.Errorf("service %s: %T: %w", r.id, sc.Cmd, err)
		r.n.staleRun(sc, err)
	}
	return res, err
}

// Monitor commits a guarded registration (SM_MON) in the service's
// scope: it replaces an existing one only for the lock manager that made
// it or for the lockd of the service's owner (fsm.Scoped); otherwise the
// error wraps fsm.ErrOwnedElsewhere.
func (r ServiceRegistry) Monitor(ctx context.Context, reg fsm.Registration) (int32, error) {
	res, err := r.apply(ctx, fsm.Register{Reg: reg, Guarded: true})
	if err != nil {
		return res.State, err
	}
	if res.Refused {
		return res.State, fmt.Errorf("cluster: SM_MON of %q for %q of service %s taken on %s: %w",
			reg.ID.MonName, reg.ID.My.MyName, r.id, reg.Node, fsm.ErrOwnedElsewhere)
	}
	return res.State, nil
}

// Unmonitor commits an SM_UNMON of owner's registration in the service's
// scope.
func (r ServiceRegistry) Unmonitor(ctx context.Context, id fsm.MonID, owner fsm.Owner) (int32, error) {
	res, err := r.apply(ctx, fsm.Unregister{ID: id, Owner: owner})
	return res.State, err
}

// UnmonitorAll commits an SM_UNMON_ALL of owner's registrations in the
// service's scope.
func (r ServiceRegistry) UnmonitorAll(ctx context.Context, my fsm.MyID, owner fsm.Owner) (int32, error) {
	res, err := r.apply(ctx, fsm.UnregisterAll{My: my, Owner: owner})
	return res.State, err
}

// PeerRebooted commits an accepted SM_NOTIFY in the service's scope.
func (r ServiceRegistry) PeerRebooted(ctx context.Context, ev fsm.PeerRebooted) error {
	_, err := r.apply(ctx, ev)
	return err
}

// SimuCrash is refused for a service (ErrNoServiceCrash).
func (r ServiceRegistry) SimuCrash(context.Context) error { return ErrNoServiceCrash }
