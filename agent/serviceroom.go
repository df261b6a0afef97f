package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/service"
	"github.com/nsmd/nsmd/vip"
)

// The room of each service this node serves (DESIGN.md, "Serving a
// service on any server"): the cluster's serviceRuns decide when a
// service placed here starts and stops (the previous holder proven
// stopped, the lease, the watchdog); serviceRoom is what starting and
// stopping one means on this server: the service's floating address and
// its hooks, told which service and which epoch. One serviceRoom per
// agent, one svcRoom per service inside; calls for one service never
// overlap (the cluster's promise), calls for different ones may, and
// none waits for another: each service has its own hook queue and its
// own address.

// Phases of a service's room (serviceRoomStatus.Phase).
const (
	roomStopped  = "stopped"  // nothing of it runs here (or never started)
	roomStarting = "starting" // ServeService running
	roomServing  = "serving"
	roomStopping = "stopping" // StopService running
	roomFailed   = "failed"   // a start or stop did not complete: it may be partly up until a stop succeeds
)

// What a service's hooks are told (NSMD_ROLE, NSMD_REASON).
const (
	roomRole                 = "service"
	roomReasonStart          = "start"
	roomReasonStop           = "stop"
	roomReasonStartOfProcess = "start-of-process" // epoch 0: whatever a previous process left
)

// serviceState is a service's NSM state at epoch, 2·epoch+1 (odd, new at
// every epoch, clamped at the top of int32): the sm_state of its
// registrations' scope and its SM_NOTIFY (fsm.ServiceSMState, the one
// definition) and its hooks' NSMD_SM_STATE.
func serviceState(epoch uint64) int32 { return fsm.ServiceSMState(epoch) }

// roomConfig is what a serviceRoom needs of the node.
type roomConfig struct {
	nodeID string
	specs  []service.Spec
	// mode is vip_mode: each service's address is a vip.Netlink
	// (netlink: its own instance, announced as the VIP is), a
	// vip.Loopback (loopback: the dev cluster and tests) or none.
	mode     string
	bind     string        // vip_bind (netlink)
	lifetime time.Duration // vip_lifetime (netlink)
	// nsmPort and serve (loopback): holding a loopback address means
	// serving on address:nsmPort what serve starts there.
	nsmPort int
	serve   func(spec service.Spec, addr string) (vip.Server, error)
	// hooks is the node's runner: each service's runner has its scripts,
	// environment and metrics (hookRunner.forService).
	hooks *hookRunner
	// nsm, when set, is the services' NSM side (servicensm.go), told each
	// step; in vip_mode loopback its listener is what answers on a
	// service's address (serve is then unset).
	nsm roomNSM
	// v4, when set, is the NFSv4 side of a service in its own namespace
	// (servicev4.go): its tracking pipe and its grace.
	v4 roomV4
	// tickle, when set, tickles the previous server's connections of a
	// service just started (servicetickle.go).
	tickle func(ctx context.Context, id string, epoch uint64)
	// tickleNS, when set, tells the tickler the namespace a service runs
	// in (nil: none any more).
	tickleNS func(id string, in func(func() error) error)
	// ns, when set, makes each service's network namespace
	// (service_namespaces: servicens.go); runRoot holds the services' run
	// directories (default defaultServiceRunRoot).
	ns      namespaces
	runRoot string
	log     *slog.Logger
	reg     prometheus.Registerer // nsmd_vip_*{service} of netlink addresses; nil: none
}

// roomConfigOf is the room configuration of cfg's services.
func roomConfigOf(cfg config.Config, hooks *hookRunner, log *slog.Logger, reg prometheus.Registerer) roomConfig {
	return roomConfig{nodeID: cfg.NodeID, specs: cfg.Services, mode: cfg.VIPMode, bind: cfg.VIPBind,
		lifetime: cfg.Timing().VIPLifetime, hooks: hooks, log: log.With("component", "services"), reg: reg}
}

// roomNSM is a service's NSM side, told each step of its start and stop.
type roomNSM interface {
	// open serves the service's NSM on its address, just taken; with ns,
	// inside the service's namespace, registered with its rpcbind.
	open(spec service.Spec, ns svcNamespace) error
	// ready waits until the service's NSM can be reached by its lock
	// manager: registered with the rpcbind of its namespace, which the
	// start hook started (nothing to wait for without a namespace).
	ready(ctx context.Context, id string) error
	// announce starts its SM_NOTIFY at epoch once on_leader ran; the
	// fan-out ends with ctx (the run).
	announce(ctx context.Context, id string, epoch uint64)
	// stopping: its stop begins (its lock manager's unmonitors no longer
	// count).
	stopping(id string, epoch uint64)
	// close ends its NSM once the address is dropped.
	close(id string) error
}

// agentRoomNSM is the agent's serviceNSMs as a roomNSM (looked up at each
// call: the room is built before it).
type agentRoomNSM struct{ a *Agent }

func (n agentRoomNSM) open(spec service.Spec, ns svcNamespace) error {
	_, err := n.a.svcNSM.open(spec, ns)
	return err
}
func (n agentRoomNSM) ready(ctx context.Context, id string) error { return n.a.svcNSM.ready(ctx, id) }
func (n agentRoomNSM) announce(ctx context.Context, id string, epoch uint64) {
	n.a.svcNSM.announce(ctx, id, epoch)
}
func (n agentRoomNSM) stopping(id string, epoch uint64) { n.a.svcNSM.stopping(id, epoch) }
func (n agentRoomNSM) close(id string) error            { return n.a.svcNSM.close(id) }

// buildServiceRoom is the room of a's services, with their NSM
// (servicensm.go) and, with service_namespaces, their namespaces
// (servicens.go): the namespaces an earlier process left for services no
// longer configured are removed before anything is served.
func (a *Agent) buildServiceRoom() (*serviceRoom, error) {
	c := roomConfigOf(a.cfg, a.hooks, a.log, a.reg)
	c.nsm = agentRoomNSM{a}
	c.v4 = agentRoomV4{a}
	c.tickle = a.tickle.serviceStarted
	if a.cfg.Namespaced() {
		c.tickleNS = a.tickle.serviceNamespace
		c.ns = svcnsMaker{log: c.log, mounts: kernelHasNFSd()}
	}
	r := newServiceRoom(c)
	if err := r.removeOrphanNamespaces(context.Background()); err != nil {
		return nil, err
	}
	return r, nil
}

// serviceRoom is this node's cluster.ServiceServer.
type serviceRoom struct {
	cfg   roomConfig
	specs map[string]service.Spec

	mu     sync.Mutex
	svcs   map[string]*svcRoom
	closed bool
}

var _ cluster.ServiceServer = (*serviceRoom)(nil)

// svcRoom is one service's room: made at its first start or stop.
type svcRoom struct {
	spec  service.Spec
	hooks *hookRunner

	mu    sync.Mutex
	addr  cluster.FloatingAddr // nil: not made yet (or vip_mode none)
	ns    svcNamespace         // its network namespace while it has one (service_namespaces)
	epoch uint64
	phase string
	last  *roomHookResult
}

// roomHookResult is the last start or stop hook run of a service.
type roomHookResult struct {
	Hook   string // on_leader, on_follower
	Reason string // start, stop, start-of-process
	Epoch  uint64
	Err    string // "" when it succeeded
	At     time.Time
}

// serviceRoomStatus is one service's room as status shows it.
type serviceRoomStatus struct {
	Service     string
	Epoch       uint64 // of the last start or stop (0: the stop at start)
	Phase       string // stopped, starting, serving, stopping, failed
	AddressHeld bool
	Namespace   string             // its network namespace while it has one here
	LastHook    *roomHookResult    // nil: none ran yet
	LastFailure *admin.HookFailure // the last hook of it that failed, on_fault included
}

func newServiceRoom(cfg roomConfig) *serviceRoom {
	r := &serviceRoom{cfg: cfg, specs: map[string]service.Spec{}, svcs: map[string]*svcRoom{}}
	for _, s := range cfg.specs {
		r.specs[s.ID] = s
	}
	return r
}

// room is service id's room, made (its hook runner started) on first use.
func (r *serviceRoom) room(id string) (*svcRoom, error) {
	spec, ok := r.specs[id]
	if !ok {
		return nil, fmt.Errorf("service %q is not in this node's configuration", id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("service %s: %w: node is shutting down", id, errHookNotRun)
	}
	if s := r.svcs[id]; s != nil {
		return s, nil
	}
	s := &svcRoom{spec: spec, hooks: r.cfg.hooks.forService(spec), phase: roomStopped}
	if s.hooks != nil {
		s.hooks.onDone = s.hookDone
		s.hooks.start(context.Background())
	}
	r.svcs[id] = s
	return s, nil
}

// ServeService takes the service's address and opens its NSM there, then
// runs its on_leader hook with the service's environment, then starts its
// SM_NOTIFY, and returns once the hook has run (bounded by hook_timeout),
// or when ctx ends first. A failed step is returned (the cluster stops
// the service again and retries; on_fault has run); what it took stays
// until StopService.
//
// The address before the hook, as the node's own takeover holds the VIP
// before on_leader: what the hook starts (nfsd, lockd, exports in the
// service's namespace) may bind to the address, and the clients' first
// retransmissions after the announcement find a server being started
// rather than no one. Taking the address serves nothing by itself: the
// cluster calls this only once the previous holder is proven stopped, so
// no other server holds it.
func (r *serviceRoom) ServeService(ctx context.Context, id string, epoch uint64) error {
	s, err := r.room(id)
	if err != nil {
		return err
	}
	s.setPhase(epoch, roomStarting)
	env := r.env(s, epoch, roomReasonStart)
	if err := ctx.Err(); err != nil {
		s.setPhase(epoch, roomFailed)
		return fmt.Errorf("service %s: %w", id, err)
	}
	if err := r.enterNamespace(ctx, s); err != nil {
		s.setPhase(epoch, roomFailed)
		r.fault(s, env, err)
		return err
	}
	if err := r.acquire(ctx, s); err != nil {
		s.setPhase(epoch, roomFailed)
		r.fault(s, env, err)
		return err
	}
	if r.cfg.nsm != nil {
		if err := r.cfg.nsm.open(s.spec, s.namespaceOf()); err != nil {
			s.setPhase(epoch, roomFailed)
			r.fault(s, env, err)
			return err
		}
	}
	if ns := s.namespaceOf(); r.cfg.v4 != nil && ns != nil {
		// Before on_leader: nfsd looks for the pipe's reader as it starts.
		if err := r.cfg.v4.open(s.spec, ns, r.runDir(id)); err != nil {
			s.setPhase(epoch, roomFailed)
			r.fault(s, env, err)
			return err
		}
	}
	select {
	case err = <-s.hooks.run(ctx, hookEventLeader, env):
	case <-ctx.Done(): // the run must stop: StopService follows, its hook queued behind this one
		s.setPhase(epoch, roomFailed)
		return fmt.Errorf("service %s: on_leader hook not waited for: %w", id, ctx.Err())
	}
	if err != nil {
		s.setPhase(epoch, roomFailed)
		return fmt.Errorf("service %s: on_leader hook: %w", id, err)
	}
	if r.cfg.nsm != nil {
		if err := r.cfg.nsm.ready(ctx, id); err != nil {
			s.setPhase(epoch, roomFailed)
			r.fault(s, env, err)
			return err
		}
		// After on_leader, as the node's own SM_NOTIFY: the clients told
		// to reclaim find nfsd and lockd up.
		r.cfg.nsm.announce(ctx, id, epoch)
	}
	if r.cfg.v4 != nil && s.namespaceOf() != nil {
		r.cfg.v4.serving(ctx, id) // its nfsd and lockd are up: their grace may end early
	}
	if r.cfg.tickle != nil {
		r.cfg.tickle(ctx, id, epoch) // alongside SM_NOTIFY: the previous server's clients reconnect at once
	}
	s.setPhase(epoch, roomServing)
	return nil
}

// StopService tells the service's NSM its stop begins, runs its
// on_follower hook, then drops its address and closes its NSM, and
// returns once all are done (the hook bounded by
// hook_timeout, after a start hook still running). The reverse of the
// start: what the hook stops may be bound to the address. Whether the
// address goes before or after the hook does not matter to the next
// holder, which takes it only once this returned or this node's watchdog
// bound passed. The address is dropped even when the hook failed: less
// is served, never more. Epoch 0 (the stop at start) also deletes a copy
// of the address that a previous process left on the interface. An error
// means this node may still serve the service.
func (r *serviceRoom) StopService(id string, epoch uint64) error {
	s, err := r.room(id)
	if err != nil {
		return err
	}
	s.setPhase(epoch, roomStopping)
	reason := roomReasonStop
	if epoch == 0 {
		reason = roomReasonStartOfProcess
	}
	env := r.env(s, epoch, reason)
	if r.cfg.nsm != nil {
		r.cfg.nsm.stopping(id, epoch)
	}
	var errs []error
	if err := <-s.hooks.run(context.Background(), hookEventFollower, env); err != nil {
		errs = append(errs, fmt.Errorf("service %s: on_follower hook (%s): %w", id, reason, err))
	}
	if err := r.drop(s, epoch == 0); err != nil {
		r.fault(s, env, err)
		errs = append(errs, err)
	}
	if r.cfg.nsm != nil {
		if err := r.cfg.nsm.close(id); err != nil {
			errs = append(errs, err)
		}
	}
	if r.cfg.v4 != nil && r.namespaced() {
		if err := r.cfg.v4.close(id); err != nil { // before the namespace goes: its pipe is open
			errs = append(errs, err)
		}
	}
	if err := r.removeNamespace(context.Background(), s); err != nil {
		r.fault(s, env, err)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		s.setPhase(epoch, roomFailed)
		return err
	}
	s.setPhase(epoch, roomStopped)
	return nil
}

// env is what service s's hooks are told at epoch: the node's hook
// environment, with NSMD_ROLE=service, NSMD_VIP the service's address and
// NSMD_SM_STATE the service's state, then the service's NSMD_SERVICE_*
// and NSMD_SERVICE_EPOCH.
func (r *serviceRoom) env(s *svcRoom, epoch uint64, reason string) hookEnv {
	extra := append(s.spec.Env(), "NSMD_SERVICE_EPOCH="+strconv.FormatUint(epoch, 10))
	if r.namespaced() && r.cfg.v4 != nil {
		extra = append(extra, "NSMD_SERVICE_NFSV4_TRACKING_STATUS="+serviceV4StatusPath(r.runDir(s.spec.ID)))
	}
	return hookEnv{NodeID: r.cfg.nodeID, VIP: s.spec.Address.String(), SMState: serviceState(epoch), Role: roomRole, Reason: reason,
		Extra: append(extra, r.nsEnv(s.spec.ID)...)}
}

// fault runs on_fault with the service's environment for a step of its
// start or stop that is not a hook (a failed hook's on_fault has run
// already) and returns once it has run, as after a failed hook.
func (r *serviceRoom) fault(s *svcRoom, env hookEnv, err error) {
	env.Reason = err.Error()
	<-s.hooks.run(context.Background(), hookEventFault, env)
}

// address is s's floating address, made on first use (nil in vip_mode
// none). Making a netlink one removes a copy a crashed run left.
func (r *serviceRoom) address(s *svcRoom) (cluster.FloatingAddr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.addr != nil {
		return s.addr, nil
	}
	spec := s.spec
	log := r.cfg.log.With("service", spec.ID)
	switch r.cfg.mode {
	case config.VIPNetlink:
		var reg prometheus.Registerer
		if r.cfg.reg != nil {
			reg = prometheus.WrapRegistererWith(prometheus.Labels{"service": spec.ID}, r.cfg.reg)
		}
		// In the service's namespace, when it has one: the address goes on
		// the macvlan named as its interface there, and every socket of
		// the address (netlink, announcements) is the namespace's.
		// There the address goes on the macvlan itself: the namespace has
		// no other address whose route would carry the replies of one on a
		// TUN device (vip_bind process).
		bind := r.cfg.bind
		if s.ns != nil {
			bind = vip.BindInterface
		}
		var in func(func() error) error
		if s.ns != nil {
			in = s.ns.Do
		}
		v, err := vip.NewNetlink(vip.NetlinkConfig{Prefix: spec.Address, Interface: spec.Interface, Lifetime: r.cfg.lifetime,
			Bind: bind, Within: in, PrefixRoute: s.ns != nil, Logger: log.With("component", "vip"), Registerer: reg})
		if err != nil {
			return nil, fmt.Errorf("service %s: address %s on %s: %w", spec.ID, spec.Address, spec.Interface, err)
		}
		s.addr = v
	case config.VIPLoopback:
		if r.cfg.serve == nil {
			return nil, nil // the service's NSM listener is what answers there (roomConfig.nsm)
		}
		s.addr = vip.NewLoopback(vip.LoopbackConfig{
			Addr:   net.JoinHostPort(spec.Address.Addr().String(), strconv.Itoa(r.cfg.nsmPort)),
			Serve:  func(addr string) (vip.Server, error) { return r.cfg.serve(spec, addr) },
			Logger: log,
		})
	}
	return s.addr, nil
}

// acquire takes s's address and keeps it until StopService (or close):
// not with ctx, which ends when the run must stop, before the stop hook.
func (r *serviceRoom) acquire(ctx context.Context, s *svcRoom) error {
	a, err := r.address(s)
	if err != nil || a == nil {
		return err
	}
	if err := a.Acquire(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("service %s: take the address: %w", s.spec.ID, err)
	}
	return nil
}

// dropper is an address that can also delete a copy it does not hold
// (vip.Netlink.Drop).
type dropper interface{ Drop() error }

// drop releases s's address; stale: also a copy it does not hold.
func (r *serviceRoom) drop(s *svcRoom, stale bool) error {
	a, err := r.address(s)
	if err != nil || a == nil {
		return err
	}
	if d, ok := a.(dropper); ok && stale {
		err = d.Drop()
	} else {
		err = a.Release()
	}
	if err != nil {
		return fmt.Errorf("service %s: drop the address: %w", s.spec.ID, err)
	}
	if r.namespaced() {
		// Made in this namespace (or the host's, for the stop at start):
		// the next start makes its own in the next one.
		s.mu.Lock()
		if c, ok := s.addr.(interface{ Close() error }); ok {
			c.Close()
		}
		s.addr = nil
		s.mu.Unlock()
	}
	return nil
}

func (s *svcRoom) setPhase(epoch uint64, phase string) {
	s.mu.Lock()
	s.epoch, s.phase = epoch, phase
	s.mu.Unlock()
}

// hookDone records a start or stop hook's result (hookRunner.onDone).
func (s *svcRoom) hookDone(event string, env hookEnv, err error) {
	if event == hookEventFault {
		return
	}
	res := &roomHookResult{Hook: hookName(event), Reason: env.Reason, At: time.Now().UTC()}
	for _, kv := range env.Extra {
		if v, ok := strings.CutPrefix(kv, "NSMD_SERVICE_EPOCH="); ok {
			res.Epoch, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	if err != nil {
		res.Err = err.Error()
	}
	s.mu.Lock()
	s.last = res
	s.mu.Unlock()
}

// status is every configured service's room, by id.
func (r *serviceRoom) status() []serviceRoomStatus {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	svcs := make(map[string]*svcRoom, len(r.svcs))
	for id, s := range r.svcs {
		svcs[id] = s
	}
	r.mu.Unlock()
	out := make([]serviceRoomStatus, 0, len(r.specs))
	for id := range r.specs {
		st := serviceRoomStatus{Service: id, Phase: roomStopped}
		if s := svcs[id]; s != nil {
			s.mu.Lock()
			st.Epoch, st.Phase = s.epoch, s.phase
			addr := s.addr
			if s.last != nil {
				last := *s.last
				st.LastHook = &last
			}
			s.mu.Unlock()
			st.AddressHeld = addr != nil && addr.Held()
			if s.namespaceOf() != nil {
				st.Namespace = s.spec.EffectiveNamespace()
			}
			st.LastFailure = s.hooks.lastFailure()
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b serviceRoomStatus) int { return strings.Compare(a.Service, b.Service) })
	return out
}

// each is every room made so far.
func (r *serviceRoom) each() []*svcRoom {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*svcRoom, 0, len(r.svcs))
	for _, s := range r.svcs {
		out = append(out, s)
	}
	return out
}

// close ends the rooms after the node's stops (node.Close stops every
// service first): queued hooks run, then every address is dropped.
func (r *serviceRoom) close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	var errs []error
	for _, s := range r.each() {
		s.hooks.stop()
		s.mu.Lock()
		a := s.addr
		s.mu.Unlock()
		switch a := a.(type) {
		case nil:
		case interface{ Close() error }:
			errs = append(errs, a.Close())
		default:
			errs = append(errs, a.Release())
		}
	}
	return errors.Join(errs...)
}

// kill leaves the addresses as a killed process would (Agent.Kill): a
// netlink address is no longer renewed (the kernel drops it after its
// lifetime), a loopback one goes with its sockets. Close still stops the
// hook runners.
func (r *serviceRoom) kill() {
	if r == nil {
		return
	}
	for _, s := range r.each() {
		s.mu.Lock()
		a := s.addr
		s.mu.Unlock()
		switch a := a.(type) {
		case nil:
		case interface{ Abandon() }:
			a.Abandon()
		default:
			a.Release()
		}
	}
}
