// Package agent is one nsmd node: raft and gossip (package cluster), the
// NSM server over TCP and UDP (packages oncrpc, nsm), rpcbind registration,
// the floating address (VIP), the hooks, the NFSv4 client-tracking side
// (packages cld, nlm), TLS and the admin API (package admin) with the
// status page. cmd/nsmd parses flags and calls Start; tests, the benches
// and the drill start nodes the same way, one or several per process
// (StartDev: the nsmd dev cluster).
//
//	a, err := agent.Start(cfg, agent.Options{Logger: log})
//	...
//	a.Close() // hands leadership over, runs on_follower, stops
package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"github.com/nsmd/nsmd/fence"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/tickle"
	"github.com/nsmd/nsmd/vip"
)

// Options are the parts of an agent that are not operator settings.
type Options struct {
	Logger *slog.Logger
	// RaftMetrics bridges raft's process-global metrics into this agent's
	// registry: only for a process that runs one node.
	RaftMetrics bool
	// Crash replaces SIGKILL-ing the process for POST /v1/drill/crash
	// (nsmd dev kills one in-process node instead).
	Crash func(*Agent)
	// TuneCluster, when set, adjusts the cluster config before the node
	// starts (measurement tests compare raft and storage settings).
	TuneCluster func(*cluster.Config)
	// TuneTracking, when set, adjusts the NFSv4 client-tracking server of
	// node id (tests put a fake kernel's pipe there: cld/cldtest).
	TuneTracking func(id string, c *cld.Config)
	// TuneServiceTracking, when set, adjusts the NFSv4 client-tracking
	// server of service svc on node id, in the service's namespace (tests
	// put a fake kernel's pipe there).
	TuneServiceTracking func(id, svc string, c *cld.Config)
	// TuneTickle, when set, gives node id's tickler the procfs root it
	// reads connections from and the function it sends tickles with, and
	// lets a loopback VIP tickle too (tests record the sends).
	TuneTickle func(id string) (procRoot string, send func(context.Context, []tickle.Conn, tickle.SendConfig) (int, error))
	// ClientsSeenProc, when set, gives the procfs root from which node id
	// reads nfsd's clients to learn when each was last seen (seen.go).
	ClientsSeenProc func(id string) string
	// HostRoot, when set, is where the node reads what the kernel and the
	// firmware say about the machine (/proc/cpuinfo, /sys/class/dmi/id:
	// whether it runs under a hypervisor; the watchdog's sysfs and who
	// holds it); "" means /.
	HostRoot string
}

// Agent is one running node: raft, the NSM server, rpcbind registration,
// the admin API and (in loopback VIP mode) the VIP listener.
type Agent struct {
	cfg config.Config
	// fences (fence.go): nil when not configured
	watchdog    *fence.Watchdog
	fenceAgent  *fence.Agent
	hypervisor  string // what says this serving node is a virtual machine ("": nothing)
	hostRoot    string // Options.HostRoot: where /proc and /sys are read ("": the machine's)
	log         *slog.Logger
	node        *cluster.Node
	notifier    *nsm.Notifier  // SM_NOTIFY after each takeover this node serves
	deliver     *nsm.Deliverer // callbacks to the lock managers of this node's registrations
	stopDeliver context.CancelFunc
	server      *oncrpc.Server
	progs       oncrpc.Programs
	reg         *prometheus.Registry
	nsmm        *nsm.Metrics
	nsmPort     int
	nsmTCP      net.Listener
	nsmUDP      net.PacketConn // both closed by server.Shutdown once serving
	admin       *http.Server
	adminLn     net.Listener
	pmap        *oncrpc.PmapClient
	pmapSrv     *oncrpc.Server

	crashFn    func(*Agent)
	started    time.Time // this agent's start (GET /v1/status, process)
	bootID     string    // the kernel's boot id, read at start
	hooks      *hookRunner
	v4         *nfsv4
	v4cancel   context.CancelFunc
	netlinkVIP *vip.Netlink // closed (address dropped) on shutdown
	tickle     *tickler     // nil without tickling (tickle.go)
	svcNSM     *serviceNSMs // the NSM of the services this node serves (servicensm.go)
	svcV4      *serviceV4s  // their NFSv4 tracking and grace, in their namespaces (servicev4.go)
	sec        security
	connEvents *prometheus.CounterVec
	readsHeld  *prometheus.CounterVec

	// rooms serves the services placed on this node (serviceroom.go),
	// each with its NSM (servicensm.go): nil without services:.
	rooms *serviceRoom

	wg sync.WaitGroup
}

// Kill stops an agent as SIGKILL would: no leadership transfer, no gossip
// leave; its sockets (and so its loopback VIP) close. Close still releases
// what Kill left (the hook runner).
func (a *Agent) Kill() {
	a.tickle.stop()
	a.node.Kill() // releases the loopback VIP: its sockets die with a real process too
	a.rooms.kill()
	a.svcNSM.closeAll()
	a.svcV4.closeAll()
	if a.stopDeliver != nil {
		a.stopDeliver()
	}
	if a.v4cancel != nil {
		a.v4cancel()
		a.v4.wait()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	a.server.Shutdown(ctx)
	if a.pmapSrv != nil {
		a.pmapSrv.Shutdown(ctx)
	}
	if a.admin != nil {
		a.admin.Shutdown(ctx)
	}
	a.wg.Wait()
}

// witnessConfig drops what a witness never uses, so that one configuration
// file can serve the servers and the witness: the VIP and the hooks. It
// says so once.
func witnessConfig(cfg config.Config, log *slog.Logger) config.Config {
	var ignored []string
	if cfg.VIP != "" || cfg.VIPMode != config.VIPNone {
		ignored = append(ignored, "vip", "vip_mode", "vip_interface")
	}
	for _, h := range []struct {
		key string
		v   *string
	}{{"on_leader", &cfg.OnLeader}, {"on_follower", &cfg.OnFollower}, {"on_fault", &cfg.OnFault}} {
		if *h.v != "" {
			ignored = append(ignored, h.key)
			*h.v = ""
		}
	}
	cfg.VIP, cfg.VIPMode, cfg.VIPInterface = "", config.VIPNone, ""
	if len(ignored) > 0 {
		log.Warn("witness: ignoring settings a witness never uses", "keys", ignored)
	}
	return cfg
}

// crash ends this node abruptly: the process gets SIGKILL, or in nsmd dev
// the in-process node is killed.
func (a *Agent) crash() {
	if a.crashFn != nil {
		a.crashFn(a)
		return
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
}

// Start starts a node of cfg (validated) and returns once it serves NSM,
// rpcbind and the admin API; raft elects a leader after.
func Start(cfg config.Config, opts Options) (a *Agent, err error) {
	log := opts.Logger.With("node", cfg.NodeID)
	if cfg.Witness {
		cfg = witnessConfig(cfg, log)
	}
	a = &Agent{cfg: cfg, log: log, reg: prometheus.NewRegistry(), crashFn: opts.Crash, started: time.Now(), bootID: readBootID()}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	build := Build()
	if err := a.registerMetrics(build, opts.HostRoot); err != nil {
		return a, err
	}
	a.hooks = newHookRunner(cfg, log, a.reg)
	if err := a.buildNFSv4(opts); err != nil {
		return a, err
	}
	if a.tickle, err = newTickler(cfg, log, a.reg, opts.TuneTickle); err != nil {
		return a, err
	}
	a.hooks.onStart = a.hookStarted
	a.hooks.start(context.Background())
	if opts.RaftMetrics {
		if err := cluster.BridgeRaftMetrics(a.reg); err != nil {
			return a, err
		}
	}

	tcpLn, udpConn, err := listenBoth(cfg.NSMAddr)
	if err != nil {
		return a, fmt.Errorf("listen for NSM on %s: %w", cfg.NSMAddr, err)
	}
	a.nsmTCP, a.nsmUDP = tcpLn, udpConn
	a.nsmPort = tcpLn.Addr().(*net.TCPAddr).Port

	vip := cfg.VIPAddr()
	if a.notifier, err = nsm.NewNotifier(nsm.NotifierConfig{
		Name:     cfg.EffectiveNotifyName(),
		Source:   vip,
		Window:   cfg.NotifyWindow,
		PmapPort: cfg.PmapPort,
		Metrics:  a.nsmm,
		Logger:   log,
	}); err != nil {
		return a, fmt.Errorf("notifier: %w", err)
	}
	a.deliver = nsm.NewDeliverer(nsm.DelivererConfig{PmapPort: cfg.PmapPort, Metrics: a.nsmm, Logger: log})
	ccfg := cfg.ClusterConfig()
	ccfg.Version = build.Gossip()
	ccfg.NSMAddr = a.NSMAddr().String()
	ccfg.Subscribers = []cluster.Subscriber{{Applied: a.applied, Serving: a.announce}}
	ccfg.Server = takeover{a}
	ccfg.RaftTLS, ccfg.TLSRefusals = a.sec.tls, a.sec.refusals
	ccfg.Logger, ccfg.Registerer = opts.Logger, a.reg
	key, err := readGossipKey(cfg.GossipKeyFile)
	if err != nil {
		return a, err
	}
	ccfg.ClusterKey, ccfg.Gossip.Key = key, key
	if ccfg.VIP, err = a.floatingAddr(); err != nil {
		return a, err
	}
	if len(cfg.Services) > 0 && !cfg.Witness {
		if a.rooms, err = a.buildServiceRoom(); err != nil {
			return a, err
		}
		ccfg.ServiceServer = a.rooms
	}
	if err := a.fencing(&ccfg); err != nil {
		return a, err
	}
	if opts.TuneCluster != nil {
		opts.TuneCluster(&ccfg)
	}
	a.node, err = cluster.New(ccfg)
	if err != nil {
		return a, err
	}
	svc, err := a.nodeNSM()
	if err != nil {
		return a, err
	}
	a.svcNSM = newServiceNSMs(a)
	a.progs = oncrpc.Programs{nsm.Program: nsmRouter{node: svc, services: a.svcNSM}, cluster.ForwardProgram: a.node}
	a.server = oncrpc.NewServer(a.progs, a.serverConfig())
	a.serve(a.server, tcpLn, udpConn)

	if err := a.startRpcbind(); err != nil {
		return a, err
	}
	if cfg.AdminAddr != "" {
		if err := a.startAdmin(); err != nil {
			return a, err
		}
	}
	dctx, dcancel := context.WithCancel(context.Background())
	a.stopDeliver = dcancel
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.deliver.Run(dctx); err != nil && !errors.Is(err, context.Canceled) {
			a.log.Error("deliverer stopped", "err", err)
		}
	}()
	a.node.Start()
	a.tickle.start(a.node)
	v4ctx, cancel := context.WithCancel(context.Background())
	a.v4cancel = cancel
	a.v4.start(v4ctx)
	log.Info("nsmd node started", "cluster_id", cfg.ClusterID, "version", build.Gossip(), "nsm_port", a.nsmPort, "raft", ccfg.RaftBind, "admin", a.AdminURL(), "vip", cfg.VIP, "vip_mode", cfg.VIPMode,
		"tls", a.sec.tls != nil, "insecure", len(a.sec.exposures) > 0)
	return a, nil
}

// registerMetrics registers the process's, NSM's, build's, connections'
// and fencing's metrics, and sets up security (its refusal counters); the
// host's root (HostRoot) is where fencing reads the watchdog's.
func (a *Agent) registerMetrics(build admin.BuildInfo, hostRoot string) error {
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.nsmm = nsm.NewMetrics(a.reg)
	if err := registerBuildInfo(a.reg, build); err != nil {
		return err
	}
	if err := a.setupSecurity(); err != nil {
		return err
	}
	if err := a.registerConnMetrics(); err != nil {
		return err
	}
	a.hostRoot = hostRoot
	return a.registerFenceMetrics(hostRoot)
}

// buildNFSv4 builds the node's NFSv4 side (its environment goes to every
// hook) and its services' (before the node: it hears applied commands).
func (a *Agent) buildNFSv4(opts Options) error {
	var err error
	if a.v4, err = newNFSv4(a, opts.TuneTracking, opts.ClientsSeenProc); err != nil {
		return err
	}
	a.hooks.fixedEnv = append(a.hooks.fixedEnv, a.v4.hookEnv()...)
	var tuneSvc func(string, *cld.Config)
	if opts.TuneServiceTracking != nil {
		id := a.cfg.NodeID
		tuneSvc = func(svc string, c *cld.Config) { opts.TuneServiceTracking(id, svc, c) }
	}
	a.svcV4 = newServiceV4s(a, a.v4, tuneSvc)
	return a.reg.Register(serviceV4Collector{a.svcV4})
}

// nodeNSM is the node's own NSM service: the node-level registrations
// (the cluster without services:, and what is sent to no service's
// address).
func (a *Agent) nodeNSM() (*nsm.Service, error) {
	cfg := a.cfg
	return nsm.NewService(a.node.Registry(), nsm.Config{
		NodeID:             cfg.NodeID,
		Trusted:            cfg.TrustedPrefixes(),
		Logger:             a.log,
		Metrics:            a.nsmm,
		MaxRegistrations:   cfg.MaxRegistrations,
		NotifyBurst:        cfg.NotifyBurst,
		NotifyEvery:        cfg.NotifyEvery,
		MonUnprivBurst:     cfg.MonUnprivBurst,
		MonUnprivEvery:     cfg.MonUnprivEvery,
		NotifyStrictSender: cfg.NotifyStrictSender,
		NotifyOn:           notifyOn(cfg),
		UnmonCounts:        a.unmonCounts,
	})
}

// applied sees every command applied here (a cluster.Subscriber: it must
// not block): the lock-manager callbacks it calls for, and the grace
// keeper's view of clients coming back.
func (a *Agent) applied(ev cluster.Applied) {
	if sc, ok := ev.Cmd.(fsm.Scoped); ok {
		if ev.Result.Refusal != nil {
			return // changed nothing (a run that ended, an unplaced service): no client came back
		}
		a.svcNSM.applied(sc, ev)
		a.svcV4.applied(sc, ev)
		return
	}
	a.deliver.Applied(a.cfg.NodeID, ev.Cmd, ev.Result, ev.Replay)
	a.v4.grace.Observe(ev.Index, ev.Cmd, ev.Result)
}

// NotifyRun says which sm_state the current (or last) SM_NOTIFY fan-out
// of this node sends and to how many hosts (0, 0 before the first).
func (a *Agent) NotifyRun() (state int32, targets int) { return a.notifier.Current() }

// floatingAddr builds the VIP of the configured mode (nil: none).
func (a *Agent) floatingAddr() (cluster.FloatingAddr, error) {
	if len(a.cfg.Services) > 0 {
		// The services carry their own addresses (vip is refused with
		// services:); the node's leadership holds none.
		a.log.Info("services: each service is served by the server it is placed on, on its own address; raft leadership serves none", "services", len(a.cfg.Services))
		return nil, nil
	}
	switch a.cfg.VIPMode {
	case config.VIPLoopback:
		return vip.NewLoopback(vip.LoopbackConfig{
			Addr: net.JoinHostPort(a.cfg.VIPAddr().String(), strconv.Itoa(a.nsmPort)), Serve: a.serveVIP, Logger: a.log,
		}), nil
	case config.VIPNetlink:
		p, _ := netip.ParsePrefix(a.cfg.VIP) // validated
		v, err := vip.NewNetlink(vip.NetlinkConfig{
			Prefix: p, Interface: a.cfg.VIPInterface, Lifetime: a.cfg.Timing().VIPLifetime, Bind: a.cfg.VIPBind,
			Logger: a.log.With("component", "vip"), Registerer: a.reg,
		})
		if err != nil {
			return nil, fmt.Errorf("netlink VIP: %w", err)
		}
		a.netlinkVIP = v
		return v, nil
	}
	return nil, nil
}

func (a *Agent) serverConfig() oncrpc.ServerConfig {
	return oncrpc.ServerConfig{Logger: a.log, Observe: a.nsmm.ObserveRPC,
		MaxConns: a.cfg.NSMMaxConns, MaxConnsPerHost: a.cfg.NSMMaxConnsHost, ReservedLocal: a.cfg.NSMReservedLocal,
		MaxConnBuffered: a.cfg.NSMMaxConnBuffer, MaxHostBuffered: a.cfg.NSMMaxHostBuffer, MaxBuffered: a.cfg.NSMMaxBuffer,
		OnConn: func(ev string) { a.connEvents.WithLabelValues(ev).Inc() },
		OnHold: func(cap string) { a.readsHeld.WithLabelValues(cap).Inc() }}
}

// registerConnMetrics counts NSM TCP connection events (accepted,
// refused_per_host, refused_total, evicted_idle, accepted_reserved) and exports the open
// connections of the node's own NSM server.
func (a *Agent) registerConnMetrics() error {
	a.connEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nsmd_nsm_tcp_connections_total",
		Help: "NSM TCP connections by event: accepted, refused_per_host, refused_total (all busy at nsm_max_conns), evicted_idle (closed to make room), evicted_stalled (a connection that does not read its replies, closed to make room), accepted_reserved (a privileged loopback port, i.e. lockd, admitted beyond the caps others hold: nsm_reserved_local_conns).",
	}, []string{"event"})
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nsmd_nsm_tcp_connections", Help: "Open NSM TCP connections on the node's own address.",
	}, func() float64 {
		if a.server == nil {
			return 0
		}
		return float64(a.server.Conns())
	})
	a.readsHeld = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nsmd_nsm_tcp_reads_held_total",
		Help: "Times an NSM TCP connection was not read until its buffered calls and replies were served, by cap: conn (nsm_max_conn_buffer), host (nsm_max_host_buffer), total (nsm_max_buffer).",
	}, []string{"cap"})
	for _, c := range []string{oncrpc.HoldConn, oncrpc.HoldHost, oncrpc.HoldTotal} {
		a.readsHeld.WithLabelValues(c)
	}
	buffered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nsmd_nsm_tcp_buffered_bytes", Help: "Bytes of NSM calls being served and replies not yet written that the node's own TCP connections hold.",
	}, func() float64 {
		if a.server == nil {
			return 0
		}
		return float64(a.server.Buffered())
	})
	regMax := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nsmd_registrations_max", Help: "max_registrations: SM_MONs that would add a registration beyond it are refused (0: no cap); alert on nsmd_registrations approaching it.",
	}, func() float64 { return float64(a.cfg.MaxRegistrations) })
	for _, c := range []prometheus.Collector{a.connEvents, a.readsHeld, buffered, open, regMax, servicesCollector{a}} {
		if err := a.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// serve runs srv on both sockets; the goroutines end when srv shuts down.
func (a *Agent) serve(srv *oncrpc.Server, ln net.Listener, pc net.PacketConn) {
	a.wg.Add(2)
	go func() {
		defer a.wg.Done()
		if err := srv.ServeTCP(ln); err != nil && !errors.Is(err, oncrpc.ErrClosed) {
			a.log.Error("NSM TCP server stopped", "err", err)
		}
	}()
	go func() {
		defer a.wg.Done()
		if err := srv.ServeUDP(pc); err != nil && !errors.Is(err, oncrpc.ErrClosed) {
			a.log.Error("NSM UDP server stopped", "err", err)
		}
	}()
}

// serveVIP serves NSM on the loopback VIP while this node holds it
// (vip.Loopback).
func (a *Agent) serveVIP(addr string) (vip.Server, error) {
	ln, pc, err := listenBoth(addr)
	if err != nil {
		return nil, err
	}
	srv := oncrpc.NewServer(a.progs, a.serverConfig())
	a.serve(srv, ln, pc)
	return srv, nil
}

// listenBoth opens TCP and UDP on the same address and port; with port 0
// it finds a port free for both.
func listenBoth(addr string) (net.Listener, net.PacketConn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, err
	}
	var lastErr error
	for range 32 {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
		if err != nil {
			return nil, nil, err
		}
		p := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		pc, err := net.ListenPacket("udp", net.JoinHostPort(host, p))
		if err == nil {
			return ln, pc, nil
		}
		ln.Close()
		lastErr = err
		if port != "0" {
			break
		}
	}
	return nil, nil, lastErr
}

// VIPHeld reports whether this node currently answers on the VIP.
func (a *Agent) VIPHeld() bool { return a.node != nil && a.node.VIPHeld() }

// startRpcbind registers 100024 v1 with the local rpcbind, or serves PMAP
// v2 ourselves.
func (a *Agent) startRpcbind() error {
	port := uint32(a.nsmPort)
	maps := []oncrpc.Mapping{
		{Prog: nsm.Program.Prog, Vers: nsm.Program.Vers, Prot: oncrpc.IPProtoUDP, Port: port},
		{Prog: nsm.Program.Prog, Vers: nsm.Program.Vers, Prot: oncrpc.IPProtoTCP, Port: port},
	}
	switch a.cfg.Rpcbind {
	case config.RpcbindRegister:
		a.pmap = oncrpc.NewPmapClient("127.0.0.1", oncrpc.ClientConfig{Timeout: 3 * time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// A stale entry from a crashed run would make SET fail. UNSET drops
		// every protocol of prog/vers at once, so it goes before any SET.
		a.pmap.Unset(ctx, maps[0])
		for _, m := range maps {
			ok, err := a.pmap.Set(ctx, m)
			if err != nil {
				return fmt.Errorf("register with rpcbind (is rpcbind running? use --rpcbind embedded or off): %w", err)
			}
			if !ok {
				return fmt.Errorf("rpcbind refused to register %d/%d prot %d (is another statd registered?)", m.Prog, m.Vers, m.Prot)
			}
		}
		a.log.Info("registered with rpcbind", "prog", nsm.Program.Prog, "port", port)
	case config.RpcbindEmbedded:
		pm := oncrpc.NewPortmapper()
		pm.Register(oncrpc.Mapping{Prog: oncrpc.PmapProg, Vers: oncrpc.PmapVers, Prot: oncrpc.IPProtoUDP, Port: oncrpc.PmapPort})
		pm.Register(oncrpc.Mapping{Prog: oncrpc.PmapProg, Vers: oncrpc.PmapVers, Prot: oncrpc.IPProtoTCP, Port: oncrpc.PmapPort})
		for _, m := range maps {
			pm.Register(m)
		}
		ln, pc, err := listenBoth(":" + strconv.Itoa(oncrpc.PmapPort))
		if err != nil {
			return fmt.Errorf("embedded portmapper on port %d: %w", oncrpc.PmapPort, err)
		}
		a.pmapSrv = oncrpc.NewServer(oncrpc.Programs{{Prog: oncrpc.PmapProg, Vers: oncrpc.PmapVers}: pm}, oncrpc.ServerConfig{Logger: a.log})
		a.serve(a.pmapSrv, ln, pc)
	}
	return nil
}

// Close shuts the node down: leadership handed over first (inside
// node.Close), then the servers, then the rpcbind registration.
func (a *Agent) Close() error {
	var errs []error
	a.tickle.stop() // first: nothing of it uses the node after
	if a.node != nil {
		errs = append(errs, a.node.Close())
	}
	a.svcNSM.closeAll() // after the node: its runs' stops ran
	a.svcV4.closeAll()
	if a.stopDeliver != nil {
		a.stopDeliver() // nothing is applied after the node closed
	}
	a.hooks.stop() // after node.Close: the on_follower hook of a shutdown still runs
	// After node.Close too, which stopped every service.
	errs = append(errs, a.rooms.close())
	if a.v4cancel != nil {
		// After the hooks: the on_follower hook stops nfsd, whose last
		// upcalls (refused: no longer leading) still get their answers.
		a.v4cancel()
		a.v4.wait()
	}
	if a.netlinkVIP != nil {
		errs = append(errs, a.netlinkVIP.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if a.server != nil {
		a.server.Shutdown(ctx)
	} else if a.nsmTCP != nil {
		a.nsmTCP.Close()
		a.nsmUDP.Close()
	}
	if a.pmapSrv != nil {
		a.pmapSrv.Shutdown(ctx)
	}
	if a.admin != nil {
		a.admin.Shutdown(ctx)
	}
	if a.pmap != nil { // UNSET removes every protocol of prog/vers
		a.pmap.Unset(ctx, oncrpc.Mapping{Prog: nsm.Program.Prog, Vers: nsm.Program.Vers})
	}
	a.wg.Wait()
	return errors.Join(errs...)
}

// NSMAddr is where this node answers NSM.
func (a *Agent) NSMAddr() netip.AddrPort {
	host, _, _ := net.SplitHostPort(a.cfg.NSMAddr)
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.IsUnspecified() {
		ip = netip.MustParseAddr(a.cfg.Bind)
	}
	return netip.AddrPortFrom(ip, uint16(a.nsmPort))
}

// AdminURL is the admin API's base URL, or "" when disabled.
func (a *Agent) AdminURL() string {
	if a.adminLn == nil {
		return ""
	}
	if a.sec.tls != nil {
		return "https://" + a.adminLn.Addr().String()
	}
	return "http://" + a.adminLn.Addr().String()
}

// readGossipKey reads a base64 16/24/32-byte key; "" means no key.
func readGossipKey(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("gossip key %s: not base64: %w", path, err)
	}
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("gossip key %s: %d bytes, want 16, 24 or 32", path, len(key))
}

// AdminAddr is the admin API's host:port, or "" when disabled.
func (a *Agent) AdminAddr() string {
	if a.adminLn == nil {
		return ""
	}
	return a.adminLn.Addr().String()
}

// Config is the configuration the agent runs with (a witness's without
// the settings it ignores).
func (a *Agent) Config() config.Config { return a.cfg }

// Node is the agent's cluster node: raft, the replicated state, the
// leader loop.
func (a *Agent) Node() *cluster.Node { return a.node }

// Registry holds the agent's metrics (GET /metrics).
func (a *Agent) Registry() *prometheus.Registry { return a.reg }

// startAdmin serves the admin API (package admin) and the status page on
// admin_addr, over TLS when the agent has certificates.
func (a *Agent) startAdmin() error {
	ln, err := net.Listen("tcp", a.cfg.AdminAddr)
	if err != nil {
		return fmt.Errorf("admin API on %s: %w", a.cfg.AdminAddr, err)
	}
	a.adminLn = ln
	conns, err := newAdminConns(a.cfg.AdminMaxConns, a.reg)
	if err != nil {
		ln.Close()
		return err
	}
	// The cap wraps the TLS listener: ConnState sees the connections it admitted.
	ln = conns.listener(a.adminListener(ln))
	mux := admin.NewHandler(adminStore{a}, admin.HandlerConfig{
		NodeID: a.cfg.NodeID, DrillCrash: a.cfg.DrillCrash, Guard: a.sec.guard, Metrics: a.reg, Logger: a.log,
	})
	registerStatusPage(mux)
	a.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: a.cfg.AdminIdleTimeout,
		ConnState: conns.connState, ErrorLog: a.adminErrorLog()}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("admin API stopped", "err", err)
		}
	}()
	return nil
}

// NewLogger is the logger of log_level (debug, info, warn, error) and
// log_format (text, json) writing to w.
func NewLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "debug":
		lv = slog.LevelDebug
	case "warn":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// unmonCounts tells the NSM service whether an SM_UNMON or SM_UNMON_ALL
// may remove registrations now: always on a node without an on_leader
// hook (a plain statd replacement: its lock manager runs all the time);
// on a node that starts the NFS server in on_leader, only while it leads
// — its lock manager unmonitors every host as the server stops in
// on_follower, and those hosts' locks move to the next server, which must
// notify them (nsm.Config.UnmonCounts).
func (a *Agent) unmonCounts() bool {
	return a.cfg.OnLeader == "" || a.node.Leading()
}
