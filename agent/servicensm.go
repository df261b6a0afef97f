package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/service"
)

// serviceNSMs is the NSM side of the services this node serves (with
// services:): for each, an NSM service over that service's own scope
// (cluster.ServiceRegistry: its registrations, its last-seen states, its
// sm_state 2·epoch+1), reached on the service's address, and the SM_NOTIFY
// fan-out to its monitored hosts, from that address with that state,
// after each start. Calls are routed by the address they arrived on
// (nsmRouter): a call to a service's address is that service's, anything
// else the node's own. The room that serves a service (its address, its
// hooks) opens its NSM once the address is held and closes it after the
// stop.
type serviceNSMs struct {
	a *Agent

	mu     sync.Mutex
	byID   map[string]*serviceNSM
	byAddr map[netip.Addr]*serviceNSM
}

// serviceNSM is one served service's NSM.
type serviceNSM struct {
	id       string
	addr     netip.Addr
	svc      *nsm.Service
	notifier *nsm.Notifier
	// serving: the service runs here and its lock manager's unmonitors
	// count; false once its stop began (lockd unmonitors every host as
	// nfsd stops, and those hosts' locks move with the service).
	serving atomic.Bool
	// stopState is the state of the epoch whose stop began (0: none).
	stopState atomic.Int32
	srv       *oncrpc.Server // its own listener when the node's does not cover the address; nil otherwise
	// ns is the service's namespace (nil: none); registered is closed
	// once its NSM is registered with the namespace's rpcbind (closed at
	// once without a namespace).
	ns         svcNamespace
	registered chan struct{}
	regErr     error // the last registration failure, for ready's error

	mu        sync.Mutex
	cancel    context.CancelFunc // the running fan-out's
	cancelReg context.CancelFunc // the registration's (with a namespace)
	wg        sync.WaitGroup     // the fan-out goroutine
}

func newServiceNSMs(a *Agent) *serviceNSMs {
	return &serviceNSMs{a: a, byID: map[string]*serviceNSM{}, byAddr: map[netip.Addr]*serviceNSM{}}
}

// open starts service sp's NSM on its address, which this node holds
// now. Opening one that is open returns it as it is.
func (s *serviceNSMs) open(sp service.Spec, ns svcNamespace) (*serviceNSM, error) {
	a := s.a
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.byID[sp.ID]; m != nil {
		m.serving.Store(true)
		return m, nil
	}
	addr := sp.Address.Addr().Unmap()
	m := &serviceNSM{id: sp.ID, addr: addr, ns: ns, registered: make(chan struct{})}
	m.serving.Store(true)
	local := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.PrefixFrom(addr, addr.BitLen())}
	var err error
	m.svc, err = nsm.NewService(stoppingRegistry{a.node.Services().Registry(sp.ID), m}, nsm.Config{
		NodeID:  a.cfg.NodeID,
		Trusted: a.cfg.TrustedPrefixes(),
		// A lock manager on this server reaches its service's NSM from the
		// service's own address: a packet from a remote host with a source
		// address local here is dropped by the kernel as a martian.
		LoopbackTrusted:    local,
		Logger:             a.log.With("service", sp.ID),
		Metrics:            a.nsmm,
		MaxRegistrations:   a.cfg.MaxRegistrations,
		NotifyBurst:        a.cfg.NotifyBurst,
		NotifyEvery:        a.cfg.NotifyEvery,
		MonUnprivBurst:     a.cfg.MonUnprivBurst,
		MonUnprivEvery:     a.cfg.MonUnprivEvery,
		NotifyStrictSender: a.cfg.NotifyStrictSender,
		NotifyOn:           func(local netip.Addr) bool { return local.Unmap() == addr },
		UnmonCounts:        m.serving.Load,
	})
	if err != nil {
		return nil, fmt.Errorf("service %s: NSM: %w", sp.ID, err)
	}
	if m.notifier, err = nsm.NewNotifier(nsm.NotifierConfig{
		Name: addr.String(), Source: addr, Window: a.cfg.NotifyWindow, PmapPort: a.cfg.PmapPort,
		Metrics: a.nsmm, Logger: a.log.With("service", sp.ID),
		Listen: func(network string, laddr *net.UDPAddr) (c *net.UDPConn, err error) {
			err = within(ns, func() (err error) {
				c, err = net.ListenUDP(network, laddr)
				return err
			})
			return c, err
		},
	}); err != nil {
		return nil, fmt.Errorf("service %s: notifier: %w", sp.ID, err)
	}
	switch {
	case ns != nil:
		// Everything that reaches NSM in the service's namespace is the
		// service's: its lockd (from 127.0.0.1) and its clients.
		var ln net.Listener
		var pc net.PacketConn
		if err := ns.Do(func() (err error) {
			ln, pc, err = listenBoth(":" + strconv.Itoa(a.nsmPort))
			return err
		}); err != nil {
			return nil, fmt.Errorf("service %s: listen for NSM in its namespace %s: %w", sp.ID, sp.EffectiveNamespace(), err)
		}
		m.srv = oncrpc.NewServer(oncrpc.Programs{nsm.Program: m.svc}, a.serverConfig())
		a.serve(m.srv, ln, pc)
		if a.cfg.Rpcbind == config.RpcbindOff {
			close(m.registered) // rpcbind off: registered nowhere, as the node's own
			break
		}
		ctx, cancel := context.WithCancel(context.Background())
		m.cancelReg = cancel
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.register(ctx, a.nsmPort, a.log.With("service", sp.ID))
		}()
	case !a.nsmCovers(addr):
		ln, pc, err := listenBoth(net.JoinHostPort(addr.String(), strconv.Itoa(a.nsmPort)))
		if err != nil {
			return nil, fmt.Errorf("service %s: listen for NSM on its address: %w", sp.ID, err)
		}
		m.srv = oncrpc.NewServer(a.progs, a.serverConfig())
		a.serve(m.srv, ln, pc)
		close(m.registered)
	default:
		close(m.registered)
	}
	s.byID[sp.ID], s.byAddr[addr] = m, m
	return m, nil
}

// nsmCovers reports whether the node's own NSM listener takes calls sent
// to addr (it listens on every address).
func (a *Agent) nsmCovers(addr netip.Addr) bool {
	if a.nsmTCP == nil {
		return false
	}
	l, ok := a.nsmTCP.Addr().(*net.TCPAddr)
	return ok && (l.IP.IsUnspecified() || netip.AddrFrom16([16]byte(l.IP.To16())).Unmap() == addr)
}

// announce starts the SM_NOTIFY fan-out of service id at epoch to every
// host its registrations name, with its state, from its address; it runs
// until ctx ends (the run stops), the window ends or every host answered.
func (s *serviceNSMs) announce(ctx context.Context, id string, epoch uint64) {
	s.mu.Lock()
	m := s.byID[id]
	s.mu.Unlock()
	if m == nil {
		return
	}
	state := fsm.ServiceSMState(epoch)
	targets := s.a.node.Services().Registry(id).Targets()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		m.cancel()
	}
	fctx, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	log := s.a.log.With("service", id)
	log.Info("notifying the service's monitored hosts", "hosts", len(targets), "sm_state", state, "from", m.addr)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		sum := m.notifier.Run(fctx, state, targets)
		log.Info("service notify finished", "summary", sum)
	}()
}

// stopping marks service id's stop at epoch begun: from now on its lock
// manager's unmonitors remove nothing, and they are answered with the
// state of that epoch (stoppingRegistry).
func (s *serviceNSMs) stopping(id string, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.byID[id]; m != nil {
		m.stopState.Store(fsm.ServiceSMState(epoch))
		m.serving.Store(false)
	}
}

// stoppingRegistry is a service's registry as its NSM sees it: ready, and
// answering with the state of the epoch being stopped, also while the
// service's stop runs here, after its lease may have ended. A lock manager
// unmonitors its hosts as its nfsd stops (6.12's lockd does, and waits
// for each answer: unanswered, its nfsd does not stop and the stop hook
// runs into its timeout, which resets the server with every service on
// it); those unmonitors are kept (UnmonCounts), but must be answered.
// Answering with the stopped epoch's state shows no client a state older
// than one it saw: the service's address is still held here only, and no
// other server may serve the service, with a newer state, before this
// stop has returned or this server's watchdog bound passed.
type stoppingRegistry struct {
	cluster.ServiceRegistry
	m *serviceNSM
}

func (r stoppingRegistry) Ready() bool { return r.ServiceRegistry.Ready() || r.m.stopState.Load() != 0 }

func (r stoppingRegistry) ReadState(ctx context.Context) (int32, error) {
	st, err := r.ServiceRegistry.ReadState(ctx)
	if err != nil {
		if s := r.m.stopState.Load(); s != 0 {
			return s, nil
		}
	}
	return st, err
}

// close ends service id's NSM: its fan-out and, if it had one, its own
// listener. Calls to its address then reach the node's NSM, which takes
// no SM_NOTIFY with services: (notifyOn).
func (s *serviceNSMs) close(id string) error {
	s.mu.Lock()
	m := s.byID[id]
	delete(s.byID, id)
	if m != nil {
		delete(s.byAddr, m.addr)
	}
	s.mu.Unlock()
	if m == nil {
		return nil
	}
	m.mu.Lock()
	if m.cancel != nil {
		m.cancel()
	}
	if m.cancelReg != nil {
		m.cancelReg()
	}
	m.mu.Unlock()
	m.wg.Wait()
	if m.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := m.srv.Shutdown(ctx); err != nil && !errors.Is(err, oncrpc.ErrClosed) {
			return fmt.Errorf("service %s: close its NSM listener: %w", id, err)
		}
	}
	return nil
}

// closeAll closes every service's NSM (the agent's shutdown).
func (s *serviceNSMs) closeAll() {
	if s == nil {
		return
	}
	closeEach(&s.mu, s.byID, s.close)
}

// closeEach calls closeOne for every id byID holds now, holding mu only to
// list them (closeOne takes it itself). The shutdown goes on past an error:
// closeOne's errors are dropped.
func closeEach[V any](mu *sync.Mutex, byID map[string]V, closeOne func(id string) error) {
	mu.Lock()
	ids := slices.Collect(maps.Keys(byID))
	mu.Unlock()
	for _, id := range ids {
		closeOne(id)
	}
}

// route is the NSM service of the service whose address local is, if
// this node serves it.
func (s *serviceNSMs) route(local netip.Addr) *nsm.Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.byAddr[local.Unmap()]; m != nil {
		return m.svc
	}
	return nil
}

// applied delivers the lock-manager callbacks of a service's accepted
// SM_NOTIFY: every matching registration of the service, whichever
// node's lockd made it, is called back by the node that serves the
// service now — its lock manager holds the service's locks.
func (s *serviceNSMs) applied(sc fsm.Scoped, ev cluster.Applied) {
	pr, ok := sc.Cmd.(fsm.PeerRebooted)
	if !ok || !ev.Result.Accepted || ev.Replay {
		return
	}
	s.mu.Lock()
	m := s.byID[sc.Service]
	s.mu.Unlock()
	if m == nil || !m.serving.Load() {
		return
	}
	for _, reg := range ev.Result.Matched {
		if !s.a.deliver.Enqueue(nsm.Callback{Reg: reg, MonName: reg.ID.MonName, State: pr.State, From: pr.From}) {
			s.a.log.Warn("callback queue full; callback dropped", "service", sc.Service, "mon_name", reg.ID.MonName)
		}
	}
}

// nsmRouter is the handler of the NSM program: a call that arrived on a
// served service's address goes to that service's NSM, any other to the
// node's own.
type nsmRouter struct {
	node     *nsm.Service
	services *serviceNSMs
}

func (r nsmRouter) ServeRPC(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	if c.Local.IsValid() {
		if svc := r.services.route(c.Local.Addr()); svc != nil {
			return svc.ServeRPC(ctx, c, res)
		}
	}
	return r.node.ServeRPC(ctx, c, res)
}

// Registration with a service namespace's rpcbind: lockd there finds its
// NSM through the rpcbind at 127.0.0.1:111 of its own namespace, which the
// service's start hook starts. The registration is tried from the moment
// the NSM opens (before the hook) until it succeeds, so it lands as soon
// as that rpcbind answers — before the hook's nfsd takes its first lock
// in the usual order — and the start waits for it (ready) before its
// SM_NOTIFY: a client told to reclaim finds lockd able to monitor it.

// registerEvery is how often the registration is tried until it lands.
const registerEvery = 100 * time.Millisecond

// readyTimeout bounds the wait for the registration after the start hook
// returned (its rpcbind is up by then, or never will be).
const readyTimeout = 10 * time.Second

// register registers the service's NSM (UDP and TCP, port) with the
// rpcbind of its namespace, retrying until it lands or ctx ends.
func (m *serviceNSM) register(ctx context.Context, port int, log *slog.Logger) {
	maps := []oncrpc.Mapping{
		{Prog: nsm.Program.Prog, Vers: nsm.Program.Vers, Prot: oncrpc.IPProtoUDP, Port: uint32(port)},
		{Prog: nsm.Program.Prog, Vers: nsm.Program.Vers, Prot: oncrpc.IPProtoTCP, Port: uint32(port)},
	}
	pm := oncrpc.NewPmapClient("127.0.0.1", oncrpc.ClientConfig{Timeout: time.Second, Within: m.ns.Do})
	try := func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		pm.Unset(cctx, maps[0]) // a stale entry would make SET fail
		for _, mp := range maps {
			ok, err := pm.Set(cctx, mp)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("rpcbind refused to register %d/%d prot %d (is another statd registered there?)", mp.Prog, mp.Vers, mp.Prot)
			}
		}
		return nil
	}
	t := time.NewTicker(registerEvery)
	defer t.Stop()
	for {
		err := try()
		if err == nil {
			log.Info("registered with the rpcbind of the service's namespace", "prog", nsm.Program.Prog, "port", port)
			close(m.registered)
			return
		}
		m.mu.Lock()
		m.regErr = err
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ready waits until service id's NSM is registered with its namespace's
// rpcbind (at once without a namespace), at most readyTimeout or ctx.
func (s *serviceNSMs) ready(ctx context.Context, id string) error {
	s.mu.Lock()
	m := s.byID[id]
	s.mu.Unlock()
	if m == nil {
		return fmt.Errorf("service %s: its NSM is not open", id)
	}
	t := time.NewTimer(readyTimeout)
	defer t.Stop()
	select {
	case <-m.registered:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("service %s: register its NSM with the rpcbind of its namespace: %w", id, ctx.Err())
	case <-t.C:
		m.mu.Lock()
		err := m.regErr
		m.mu.Unlock()
		if err == nil {
			err = errors.New("no answer yet")
		}
		return fmt.Errorf("service %s: its NSM is not registered with the rpcbind of its namespace %s after the start hook (did the hook start rpcbind there?): %w", id, readyTimeout, err)
	}
}
