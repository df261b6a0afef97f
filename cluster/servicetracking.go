package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nsmd/nsmd/fsm"
)

// ServiceTracking is one service's NFSv4 client tracking: what the
// client-tracking upcalls (cld) of the nfsd in that service's namespace
// read and write, and what the service's grace reads. Every write is an
// fsm.Scoped command of the service (its scope's NFSv4 records and
// epochs, nothing else), committed like any write (an owner that does
// not lead forwards it); every read is of the service's scope. The
// writes are made only while this node serves the service under a lease
// (as ServiceRegistry is ready): the lease proves that no other server
// serves the service, so no other nfsd writes its records. Each write
// returns once it is applied here too, so a read after it sees it (the
// recovery records a GraceStart hands to nfsd, the answer of a Check).
// It holds no state of its own.
type ServiceTracking struct {
	n  *Node
	id string
}

// Tracking is service id's NFSv4 client tracking on this node.
func (s Services) Tracking(id string) ServiceTracking { return ServiceTracking{n: s.p.n, id: id} }

// ErrServiceNotServed means this node may not answer a service's NFSv4
// client-tracking upcalls: it does not serve the service under a lease
// now (another server may, or none yet).
var ErrServiceNotServed = errors.New("cluster: the service is not served here under a lease")

func (t ServiceTracking) scope() fsm.Scope { return t.n.fsm.Scope(t.id) }

// Ready reports whether this node serves the service under a lease.
func (t ServiceTracking) Ready() bool {
	_, ok := t.n.runs.leasedEpoch(t.id)
	return ok
}

// State is the service's sm_state in this node's state (2·epoch+1).
func (t ServiceTracking) State() int32 { return t.scope().State() }

// AppliedIndex is the index of the last entry applied here.
func (t ServiceTracking) AppliedIndex() uint64 { return t.n.fsm.AppliedIndex() }

// MonitoredHosts are the distinct hosts the service's registrations name.
func (t ServiceTracking) MonitoredHosts() []string {
	targets := t.scope().Targets()
	hosts := make([]string, len(targets))
	for i, tg := range targets {
		hosts[i] = tg.MonName
	}
	return hosts
}

// Epochs, V4Clients, V4Counts and HasV4Client read the service's records.
func (t ServiceTracking) Epochs() (current, recovery uint64) { return t.scope().Epochs() }
func (t ServiceTracking) V4Clients(recovery bool) []fsm.V4Client {
	return t.scope().V4Clients(recovery)
}
func (t ServiceTracking) V4Counts() (current, recovery, reclaimed int) {
	return t.scope().V4Counts()
}
func (t ServiceTracking) HasV4Client(name string) (inCurrent, inRecovery bool) {
	return t.scope().HasV4Client(name)
}

// TrackCreate records client name (and its principal's hash) in the
// service's current epoch (cld Create).
func (t ServiceTracking) TrackCreate(ctx context.Context, name, princHash string) error {
	_, err := t.write(ctx, fsm.ClientCreate{Name: name, PrincHash: princHash})
	return err
}

// TrackRemove drops client name from the service's current epoch (cld
// Remove).
func (t ServiceTracking) TrackRemove(ctx context.Context, name string) error {
	_, err := t.write(ctx, fsm.ClientRemove{Name: name})
	return err
}

// TrackCheck says whether client name may reclaim from the service (it is
// in its recovery epoch) and, if so, records it in the current one (cld
// Check, old kernels).
func (t ServiceTracking) TrackCheck(ctx context.Context, name string) (bool, error) {
	res, err := t.write(ctx, fsm.ClientCheck{Name: name})
	return res.Accepted, err
}

// TrackGraceStart starts a new recovery epoch of the service's scope
// (cld GraceStart; unless one is open) and returns its records: the
// clients that may reclaim from the service. No other scope changes.
func (t ServiceTracking) TrackGraceStart(ctx context.Context) ([]fsm.V4Client, error) {
	if _, err := t.write(ctx, fsm.GraceStart{}); err != nil {
		return nil, err
	}
	// Applied here (write waits for it); only GraceDone changes the
	// recovery set, and nfsd sends it after this GraceStart's answer.
	return t.scope().V4Clients(true), nil
}

// TrackGraceDone closes the service's grace period in its records (cld
// GraceDone).
func (t ServiceTracking) TrackGraceDone(ctx context.Context) error {
	_, err := t.write(ctx, fsm.GraceDone{})
	return err
}

// write commits cmd in the service's scope while this node serves the
// service under a lease, and returns its result as applied here, once it
// is.
func (t ServiceTracking) write(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	want, err := t.scoped(cmd)
	if err != nil {
		return fsm.Result{}, err
	}
	return t.send(ctx, want)
}

// scoped is cmd as this node's run of the service sends it: with the
// run's node and epoch, which the state checks when it applies it (a run
// that ended by then changes nothing: fsm.ErrStaleRun). Only while this
// node serves the service under a lease.
func (t ServiceTracking) scoped(cmd fsm.Command) (fsm.Scoped, error) {
	epoch, ok := t.n.runs.leasedEpoch(t.id)
	if !ok {
		return fsm.Scoped{}, fmt.Errorf("service %s: %w", t.id, ErrServiceNotServed)
	}
	return fsm.Scoped{Service: t.id, Node: t.n.cfg.NodeID, Epoch: epoch, Cmd: cmd}, nil
}

// send commits want (scoped) and returns its result as applied here.
func (t ServiceTracking) send(ctx context.Context, want fsm.Scoped) (fsm.Result, error) {
	ch, cancel := t.n.scopedWaits.add(want)
	defer cancel()
	if _, err := t.n.apply(ctx, want); err != nil {
		err = fmt.Errorf("service %s: %T: %w", t.id, want.Cmd, err)
		t.n.staleRun(want, err)
		return fsm.Result{}, err
	}
	var res fsm.Result
	select {
	case res = <-ch:
	case <-ctx.Done():
		return fsm.Result{}, fmt.Errorf("service %s: %T committed, not yet applied here: %w", t.id, want.Cmd, ctx.Err())
	case <-t.n.ctx.Done():
		return fsm.Result{}, ErrClosed
	}
	if res.Refused {
		if res.Refusal != nil {
			err := fmt.Errorf("service %s: %T: %w", t.id, want.Cmd, res.Refusal)
			t.n.staleRun(want, err)
			return res, err
		}
		return res, fmt.Errorf("service %s: %T refused", t.id, want.Cmd)
	}
	if !t.Ready() {
		// Committed, but the lease ended meanwhile: nfsd is not told it
		// succeeded (its stop, or a retry, follows).
		return res, fmt.Errorf("service %s: %w (its lease ended during the write)", t.id, ErrServiceNotServed)
	}
	return res, nil
}

// staleRun logs, at warn, a write of this node's run of a service that
// the state refused because that run had ended when it was applied (the
// service moved or restarted first: fsm.ErrStaleRun): it changed nothing,
// and its caller is told it failed.
func (n *Node) staleRun(sent fsm.Scoped, err error) {
	if errors.Is(err, fsm.ErrStaleRun) {
		n.log.Warn("a service's write arrived after its run here ended: refused, nothing changed", "service", sent.Service,
			"epoch", sent.Epoch, "command", fmt.Sprintf("%T", sent.Cmd), "err", err)
	}
}

// scopedWaits hands the result of an applied scoped NFSv4 tracking
// command, as applied on this node, to the write that waits for it
// (ServiceTracking.write): a write forwarded to the leader returns before
// this node applied it, and the leader's answer carries no result. The
// zero value is ready for use.
type scopedWaits struct {
	mu   sync.Mutex
	next uint64
	w    map[uint64]scopedWait
}

type scopedWait struct {
	want fsm.Scoped
	ch   chan fsm.Result // one slot: applied never blocks
}

// add waits for the next applied command equal to want (a scoped NFSv4
// tracking command: comparable); cancel stops waiting.
func (s *scopedWaits) add(want fsm.Scoped) (<-chan fsm.Result, func()) {
	ch := make(chan fsm.Result, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w == nil {
		s.w = map[uint64]scopedWait{}
	}
	s.next++
	id := s.next
	s.w[id] = scopedWait{want: want, ch: ch}
	return ch, func() {
		s.mu.Lock()
		delete(s.w, id)
		s.mu.Unlock()
	}
}

// applied delivers ev to the writes waiting for its command (called for
// every applied command, inside Apply: it does not block).
func (s *scopedWaits) applied(ev Applied) {
	sc, ok := ev.Cmd.(fsm.Scoped)
	if !ok || !isTrackingCmd(sc.Cmd) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, w := range s.w {
		if w.want == sc { // both tracking commands: comparable
			w.ch <- ev.Result
			delete(s.w, id)
		}
	}
}

// isTrackingCmd reports whether c is an NFSv4 client-tracking command.
func isTrackingCmd(c fsm.Command) bool {
	switch c.(type) {
	case fsm.ClientCreate, fsm.ClientRemove, fsm.ClientCheck, fsm.GraceStart, fsm.GraceDone:
		return true
	}
	return false
}
