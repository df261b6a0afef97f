package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/fsm"
)

// Serving the services placed on this node (DESIGN.md, "Serving a service
// on any server"): serviceRuns is the one owner of that, one run per
// service from the placement naming this node until its stop succeeded.
// A run, in order: prove the last server that held the service stopped
// (servicestop.go, fencePeer), hold a lease on it (servicelease.go),
// record that this node serves and arm the watchdog, ServeService; then
// serve until the placement moves on, the lease lapses or the node shuts
// down; then StopService, and only once that succeeded, the release mark
// and the release record. The watchdog is fed while every run that serves
// or stops holds its lease (proofEnd).

// ServiceServer serves the services the cluster places on this node (the
// agent: a service's address, hook, grace and notify). Calls for one
// service never overlap; calls for different services may.
type ServiceServer interface {
	// ServeService starts serving service at epoch and returns once it
	// can take its clients' reclaims (bounded by Config.HookTimeout). An
	// error is a failed start: the node stops it again and retries. ctx
	// ends when the run must stop.
	ServeService(ctx context.Context, service string, epoch uint64) error
	// StopService stops service (epoch 0: whatever a previous process of
	// this node may have left serving, before the first run) and returns
	// once it has. An error means the node may still serve it: its
	// watchdog resets it.
	StopService(service string, epoch uint64) error
}

// The reasons of Server.Fault for a service's failed start or stop.
const (
	FaultServiceStart = "service_start"
	FaultServiceStop  = "service_stop"
)

// runPhase is where a run is.
type runPhase int

const (
	runProving  runPhase = iota // the last holder not proven stopped yet: nothing started
	runStarting                 // ServeService running
	runServing
	runStopping // StopService running
)

func (p runPhase) String() string {
	return [...]string{"proving", "starting", "serving", "stopping"}[p]
}

// svcRun is one service served (or being started or stopped) at one epoch.
type svcRun struct {
	service string
	epoch   uint64
	phase   runPhase
	// leaseEnd (mono ns): the lease holds until then; 0: none yet.
	leaseEnd int64
	// hookUntil (mono ns): ServeService runs and may be fed until then.
	hookUntil int64
	stop      chan struct{} // closed when the run must stop
	why       string        // why it stops
	done      chan struct{} // closed when the run ended
	proof     FencedPeer    // how the last holder was proven stopped
}

// ServiceRun is one service this node serves, starts or stops, as status
// shows it.
type ServiceRun struct {
	Service string
	Epoch   uint64
	Phase   string // proving, starting, serving, stopping
	// LeaseLeft is how long its lease holds still (≤ 0: lapsed).
	LeaseLeft time.Duration
	// Proof is how the server that held the service before was proven
	// stopped (By "" when there was none to prove).
	Proof FencedPeer
}

// Runs lists the services this node serves, starts or stops, by id.
func (s Services) Runs() []ServiceRun {
	r := s.p.n.runs
	now := r.n.mono()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ServiceRun, 0, len(r.runs))
	for _, run := range r.runs {
		out = append(out, ServiceRun{Service: run.service, Epoch: run.epoch, Phase: run.phase.String(), LeaseLeft: time.Duration(run.leaseEnd - now), Proof: run.proof})
	}
	slices.SortFunc(out, func(a, b ServiceRun) int { return strings.Compare(a.Service, b.Service) })
	return out
}

// serviceRuns owns this node's runs.
type serviceRuns struct {
	n     *Node
	srv   ServiceServer
	marks *releaseMarks
	kick  chan struct{}
	// clean: the stop at start of every declared service succeeded (until
	// then the node answers that it serves every service).
	clean atomic.Bool

	mu    sync.Mutex
	runs  map[string]*svcRun
	asked map[string]int64 // what → when it was last written (onceASecondLocked, mono)
}

func newServiceRuns(n *Node, srv ServiceServer, marks *releaseMarks) *serviceRuns {
	r := &serviceRuns{n: n, srv: srv, marks: marks, kick: make(chan struct{}, 1), runs: map[string]*svcRun{}}
	r.clean.Store(srv == nil)
	return r
}

// wake asks the loop to look again (a placement applied); never blocks.
func (r *serviceRuns) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// stopAtStart stops every service this node declares before it serves
// any (a previous process may have died serving them).
func (r *serviceRuns) stopAtStart() error {
	if r.srv == nil {
		return nil
	}
	var errs []error
	for _, d := range r.n.cfg.Services.Declared {
		if err := r.srv.StopService(d.ID, 0); err != nil {
			errs = append(errs, fmt.Errorf("stop %s at start: %w", d.ID, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	r.clean.Store(true)
	return nil
}

// loop reconciles the runs with the applied placements and renews their
// leases every quarter lease, until the node closes.
func (r *serviceRuns) loop(ctx context.Context) {
	t := time.NewTicker(r.n.fenceLease() / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-t.C:
		}
		r.renew(ctx)
		r.reconcile(ctx)
	}
}

// reconcile starts a run for each service placed on this node at an
// epoch above its release mark, and stops each run whose placement moved
// on or whose lease lapsed; it forwards the release of services whose
// record still waits for this node.
func (r *serviceRuns) reconcile(ctx context.Context) {
	n := r.n
	if !r.clean.Load() || n.stopFailed.Load() {
		return
	}
	st := n.fsm.Services()
	mine := map[string]uint64{}
	now := n.mono()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range st.Placements {
		if p.Node == n.cfg.NodeID {
			mine[p.Service] = p.Epoch
		}
		if p.Prev == n.cfg.NodeID {
			r.onceASecondLocked(ctx, "release "+p.Service, func(ctx context.Context) error { return r.forwardRelease(ctx, p) })
		}
	}
	for id, run := range r.runs {
		switch {
		case mine[id] != run.epoch:
			r.stopLocked(run, "placed elsewhere")
		case (run.phase == runStarting || run.phase == runServing) && now-run.leaseEnd > int64(r.lapseGrace()):
			r.stopLocked(run, "lease lapsed")
		}
	}
	for id, epoch := range mine {
		if _, running := r.runs[id]; running {
			continue
		}
		if epoch <= r.marks.mark(id) || epoch <= r.marks.started(id) {
			// This node released that epoch, or a process of it started it
			// (what it served was stopped since): it serves the service
			// again only at a new epoch, which it asks the leader for.
			r.onceASecondLocked(ctx, "restart "+id, func(ctx context.Context) error { return n.placer.restart(ctx, id, epoch) })
			continue
		}
		run := &svcRun{service: id, epoch: epoch, stop: make(chan struct{}), done: make(chan struct{})}
		r.runs[id] = run
		n.wg.Add(1)
		go func() { defer n.wg.Done(); r.run(run, time.Now()) }()
	}
}

// lapseGrace is how long a run keeps serving after its lease lapsed
// (while the watchdog starves) before it stops: a leader election must not
// stop every service of the cluster, and a node cut off for longer stops
// them itself, before its watchdog would reset it. Half the watchdog
// timeout, never less than two fence leases. Without a watchdog there is
// no reset to outrun — a successor serves only once this node answered
// that it stopped, a fence agent powered it off or an operator confirmed
// it (the promise of nothing is no proof) — so the grace covers elections
// with room: noWatchdogLapseElections of them.
func (r *serviceRuns) lapseGrace() time.Duration {
	g := max(r.n.cfg.FenceTimeout/2, 2*r.n.fenceLease())
	if r.n.cfg.Watchdog == nil {
		g = max(g, noWatchdogLapseElections*(r.n.cfg.HeartbeatTimeout+r.n.cfg.ElectionTimeout))
	}
	return g
}

// noWatchdogLapseElections: without a watchdog a run rides out the lapse
// of this many elections (each a heartbeat timeout to notice the leader
// gone and an election timeout to elect) before it stops its service.
const noWatchdogLapseElections = 4

func (r *serviceRuns) stopLocked(run *svcRun, why string) {
	select {
	case <-run.stop:
	default:
		run.why = why
		close(run.stop)
	}
}

// onceASecondLocked runs write (a write to the leader: a new epoch of a
// service placed here, placement.ReasonRestarted, planned again by the
// leader; or the release of one) in its own goroutine, at most once a
// second per what, so that the loop never waits for the leader. mu is held.
func (r *serviceRuns) onceASecondLocked(ctx context.Context, what string, write func(context.Context) error) {
	now := r.n.mono()
	if r.asked == nil {
		r.asked = map[string]int64{}
	}
	if last, ok := r.asked[what]; ok && now-last < int64(time.Second) {
		return
	}
	r.asked[what] = now
	n := r.n
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := write(cctx); err != nil {
			n.log.Debug("a service's write to the leader not done yet; retrying", "what", what, "err", err)
		}
	}()
}

// renew asks the leader for every run's lease and records what holds.
func (r *serviceRuns) renew(ctx context.Context) {
	r.mu.Lock()
	var items []leaseItem
	for _, run := range r.runs {
		items = append(items, leaseItem{Service: run.service, Epoch: run.epoch})
	}
	r.mu.Unlock()
	if len(items) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, r.n.fenceLease()/2)
	defer cancel()
	ok, asked, rest, err := r.n.askLease(cctx, items)
	if err != nil {
		r.n.log.Debug("service lease not renewed", "err", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, it := range items {
		run := r.runs[it.Service]
		if run == nil || run.epoch != it.Epoch {
			continue
		}
		if ok[i] {
			run.leaseEnd = max(run.leaseEnd, asked+int64(rest))
		} else if run.phase != runProving {
			r.stopLocked(run, "lease refused")
		}
	}
}

// run is one run's life (see the file comment). seen is when this node
// saw the placement: the previous holder's watchdog bound starts then.
func (r *serviceRuns) run(run *svcRun, seen time.Time) {
	n := r.n
	defer close(run.done)
	ctx, cancel := context.WithCancel(n.ctx)
	defer cancel()
	go func() {
		select {
		case <-run.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	end := func() {
		r.mu.Lock()
		delete(r.runs, run.service)
		r.mu.Unlock()
		r.wake()
	}
	if !r.proveHolderStopped(ctx, run, seen) || !r.awaitLease(ctx, run) {
		end() // nothing started
		return
	}
	for failed := 1; ; failed++ {
		err := r.start(ctx, run)
		if err == nil {
			break
		}
		if n.ctx.Err() != nil {
			return // the process ends as a crash would: what runs stays
		}
		if ctx.Err() == nil {
			n.log.Error("a service did not start: stopping it again, then retrying", "service", run.service, "epoch", run.epoch, "err", err, "failed", failed)
			n.fault(FaultServiceStart, fmt.Errorf("%s: %w", run.service, err))
			if failed == withdrawAfter {
				n.log.Error("a service failed to start several times here: handing it to another server that declares it", "service", run.service, "failed", failed, "declared_again_in", withdrawFor)
				n.placer.withdraw(run.service, n.cfg.Now().Add(withdrawFor))
			}
		}
		if !r.stopRun(run, false) || ctx.Err() != nil {
			end()
			return
		}
		t := time.NewTimer(failedTakeoverRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			end()
			return
		}
	}
	select {
	case <-run.stop:
	case <-n.ctx.Done():
		return // a crash: what runs stays (a graceful close stops first: stopAll)
	}
	r.stopRun(run, true)
	end()
}

// start records that this node serves, arms the watchdog and runs
// ServeService.
func (r *serviceRuns) start(ctx context.Context, run *svcRun) error {
	n := r.n
	// Under mu, so that an answer "not serving" (serves) either comes
	// after this and says "serving", or before it and stops this run.
	r.mu.Lock()
	select {
	case <-run.stop:
		r.mu.Unlock()
		return fmt.Errorf("stopped before it started: %s", run.why)
	default:
	}
	if run.epoch <= r.marks.mark(run.service) {
		r.mu.Unlock()
		return fmt.Errorf("epoch %d was released", run.epoch)
	}
	run.phase, run.hookUntil = runStarting, n.mono()+int64(n.cfg.HookTimeout+2*time.Second)
	r.mu.Unlock()
	if err := r.marks.raiseStarted(run.service, run.epoch); err != nil {
		return err
	}
	if err := n.armWatchdog(); err != nil {
		return err
	}
	if err := n.recordServingAny(ctx); err != nil {
		return err
	}
	n.log.Info("serving a service", "service", run.service, "epoch", run.epoch)
	err := r.srv.ServeService(ctx, run.service, run.epoch)
	r.setPhase(run, runServing, 0)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return err
}

// stopRun stops run's service; on success it records the release mark
// (final: the epoch is never served again; a failed start's is not) and
// says whether the stop succeeded. A failed stop resets the node.
func (r *serviceRuns) stopRun(run *svcRun, final bool) bool {
	n := r.n
	r.setPhase(run, runStopping, 0)
	n.log.Info("stopping a service", "service", run.service, "epoch", run.epoch, "why", run.why)
	if err := r.srv.StopService(run.service, run.epoch); err != nil {
		n.fault(FaultServiceStop, fmt.Errorf("%s: %w", run.service, err))
		n.stoppedServing(fmt.Errorf("stop service %s: %w", run.service, err))
		return false
	}
	if final {
		if err := r.marks.raise(run.service, run.epoch); err != nil {
			// Stopped, but it cannot promise not to serve it again: it
			// answers "serving" (serves) until it can.
			n.log.Error("a stopped service's release cannot be recorded", "service", run.service, "err", err)
		}
	}
	r.setPhase(run, runProving, 0) // nothing served now
	n.disarmIfIdle()
	return true
}

func (r *serviceRuns) setPhase(run *svcRun, p runPhase, hookUntil int64) {
	r.mu.Lock()
	run.phase, run.hookUntil = p, hookUntil
	r.mu.Unlock()
}

// proveHolderStopped waits until the last server that held run's service
// before this node is proven stopped (fencePeer: its answer, an operator's
// confirmation, the fence agent, or its watchdog bound from seen).
func (r *serviceRuns) proveHolderStopped(ctx context.Context, run *svcRun, seen time.Time) bool {
	n := r.n
	p, _ := n.fsm.PlacementOf(run.service)
	if p.Node != n.cfg.NodeID || p.Epoch != run.epoch {
		return false
	}
	if p.Prev == "" || p.Prev == n.cfg.NodeID || n.cfg.noServiceProof {
		return true
	}
	holder, epoch := p.Prev, p.PrevEpoch
	res := n.fencePeer(ctx, n.peerPromise(holder), fenceFrom{at: seen, what: "placement seen", term: n.raft.CurrentTerm()},
		func(ctx context.Context) (string, bool) {
			return n.askServiceUntilClear(ctx, holder, run.service, epoch)
		})
	if ctx.Err() != nil {
		return false
	}
	n.log.Info("the service's last server is proven stopped", "service", run.service, "epoch", run.epoch, "holder", holder, "by", res.By, "detail", res.Detail)
	r.mu.Lock()
	run.proof = res
	r.mu.Unlock()
	return true
}

// awaitLease waits until run holds a lease.
func (r *serviceRuns) awaitLease(ctx context.Context, run *svcRun) bool {
	for {
		r.mu.Lock()
		ok := run.leaseEnd > r.n.mono()
		r.mu.Unlock()
		if ok {
			return true
		}
		r.wake()
		t := time.NewTimer(r.n.fenceLease() / 8)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// forwardRelease commits that this node released p's service, once its
// mark covers the epoch the record waits for and no run of it at or below
// that epoch remains.
func (r *serviceRuns) forwardRelease(ctx context.Context, p fsm.Placement) error {
	if r.marks.mark(p.Service) < p.PrevEpoch || !r.clean.Load() {
		return nil
	}
	r.mu.Lock()
	run, running := r.runs[p.Service]
	busy := running && run.epoch <= p.PrevEpoch && run.phase != runProving
	r.mu.Unlock()
	if busy {
		return nil
	}
	c := fsm.ServiceReleased{Service: p.Service, Node: r.n.cfg.NodeID, Epoch: p.PrevEpoch}
	var err error
	if r.n.raft.State() == raft.Leader {
		_, err = r.n.applyLocal(ctx, c)
	} else {
		_, err = r.n.apply(ctx, c)
	}
	return err
}

// serves answers SERVICE: true while a run of service at epoch or below
// has started anything, before the stop at start succeeded, after a
// failed stop, or when the promise cannot be recorded; otherwise it
// records the promise (releaseMarks) and says false.
func (r *serviceRuns) serves(service string, epoch uint64) bool {
	if !r.clean.Load() || r.n.stopFailed.Load() {
		return true
	}
	// Under mu throughout: no run starts (start) or is created
	// (reconcile) between the look and the mark.
	r.mu.Lock()
	defer r.mu.Unlock()
	if run, ok := r.runs[service]; ok && run.epoch <= epoch {
		if run.phase != runProving {
			return true
		}
		// Still proving its predecessor stopped: it started nothing, and
		// now it never will.
		r.stopLocked(run, "its epoch released")
	}
	if err := r.marks.raise(service, epoch); err != nil {
		r.n.log.Error("cannot record the promise never to serve a service again", "service", service, "err", err)
		return true
	}
	return false
}

// leasedEpoch is the epoch of service's run on this node while it starts
// or serves under a lease that holds now.
func (r *serviceRuns) leasedEpoch(service string) (uint64, bool) {
	now := r.n.mono()
	r.mu.Lock()
	defer r.mu.Unlock()
	run, ok := r.runs[service]
	if !ok || (run.phase != runStarting && run.phase != runServing) || run.leaseEnd <= now {
		return 0, false
	}
	return run.epoch, true
}

// startedEpoch is the epoch of service's run on this node once it has
// started anything and until its stop returned (starting, serving or
// stopping), lease or not: the run a write of the service's NSM is sent
// by (serviceregistry.go).
func (r *serviceRuns) startedEpoch(service string) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	run, ok := r.runs[service]
	if !ok || run.phase == runProving {
		return 0, false
	}
	return run.epoch, true
}

// active reports whether any run has started its service (the watchdog
// stays armed and the serving record stays).
func (r *serviceRuns) active() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, run := range r.runs {
		if run.phase != runProving {
			return true
		}
	}
	return false
}

// proofEnd is how long the runs let the watchdog be fed: the earliest
// lease end of the runs that serve or stop (and hook end of those that
// start); ok false when none does.
func (r *serviceRuns) proofEnd() (end int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, run := range r.runs {
		if run.phase == runProving {
			continue
		}
		e := run.leaseEnd
		if run.phase == runStarting && run.hookUntil != 0 {
			e = min(e, run.hookUntil)
		}
		if !ok || e < end {
			end, ok = e, true
		}
	}
	return end, ok
}

// stopAll stops every run and waits for the stops (a graceful close).
func (r *serviceRuns) stopAll() {
	r.mu.Lock()
	var dones []chan struct{}
	for _, run := range r.runs {
		r.stopLocked(run, "shutdown")
		dones = append(dones, run.done)
	}
	r.mu.Unlock()
	for _, d := range dones {
		<-d
	}
}
