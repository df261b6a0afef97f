package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/tickle"
)

// tickleInterval is how often the VIP holder samples its connections and
// the other serving nodes fetch the sample: a connection opened within it
// before a failover may be missed (its client reconnects by its own
// timers, as without tickles).
const tickleInterval = time.Second

// tickler keeps the list of the clients' TCP connections to the VIP
// where the node that takes the VIP over finds it, and tickles them then
// (package tickle; cluster/conns.go carries the list). While this node
// leads and holds the VIP it samples its own connections on nfsd's port
// (and lockd's, when fixed) every tickleInterval and hands them to its
// cluster node; otherwise it fetches the leader's latest sample. Right
// after an on_leader hook succeeded, it tickles the connections of the
// last sample it fetched. Only a serving node with a netlink VIP has one
// (newTickler): a loopback VIP shares one kernel with every node.
type tickler struct {
	log      *slog.Logger
	node     *cluster.Node // set once the cluster node exists
	self     string
	procRoot string
	vip      netip.Addr
	max      int
	send     tickle.SendConfig
	sendFn   sendFunc
	tickleMetrics
	// svc, with services:, is the services' tickling (servicetickle.go):
	// then this tickler only hands over to it (leadership serves nothing).
	svc *serviceTickler

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the loop and the takeovers' sends

	mu          sync.Mutex
	list        cluster.VIPConns // the leader's last sample, fetched
	from        string           // the leader that answered it
	unsupported string           // a leader that answered PROC_UNAVAIL: not asked again
	sampleErr   errOnce          // the last sampling error, logged once
	overLogged  bool             // "over tickle_max_conns" logged, not cleared since
	stopped     bool             // stop ran: no new sends
}

// sendFunc sends tickles: tickle.Send, or a test's recorder.
type sendFunc func(context.Context, []tickle.Conn, tickle.SendConfig) (int, error)

// newTickler returns the tickler of cfg, nil when there is none (tickle
// off, no netlink VIP, a witness). tune (Options.TuneTickle) gives a
// test's procfs root and sender, and then a loopback VIP tickles too.
// With services: it is the services' tickler (newServiceTickler).
func newTickler(cfg config.Config, log *slog.Logger, reg prometheus.Registerer, tune func(string) (string, func(context.Context, []tickle.Conn, tickle.SendConfig) (int, error))) (*tickler, error) {
	procRoot, send := "/proc", sendFunc(tickle.Send)
	vipOK := cfg.VIPMode == config.VIPNetlink
	if tune != nil {
		var fn func(context.Context, []tickle.Conn, tickle.SendConfig) (int, error)
		procRoot, fn = tune(cfg.NodeID)
		send = fn
		vipOK = vipOK || cfg.VIPMode == config.VIPLoopback
	}
	if cfg.Tickle != config.TickleOn || !vipOK || cfg.Witness {
		return nil, nil
	}
	if len(cfg.Services) > 0 {
		svc, err := newServiceTickler(cfg, log, reg, procRoot, send)
		if err != nil {
			return nil, err
		}
		return &tickler{svc: svc}, nil
	}
	t := &tickler{
		log: log.With("component", "tickle"), self: cfg.NodeID, procRoot: procRoot, sendFn: send,
		vip: cfg.VIPAddr().Unmap(), max: cfg.TickleMaxConns,
	}
	var err error
	if t.tickleMetrics, err = newTickleMetrics(reg); err != nil {
		return nil, err
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t, nil
}

// tickleMetrics are the tickle series of a node, the VIP's or the sum of
// its services'.
type tickleMetrics struct {
	sent, sends prometheus.Counter
	known, over prometheus.Gauge
}

func newTickleMetrics(reg prometheus.Registerer) (tickleMetrics, error) {
	m := tickleMetrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_tickle_acks_sent_total",
			Help: "Tickle ACKs sent, after taking the VIP (or a service's address) over, to the clients of the connections the previous holder had on it (each is reset and reconnects at once).",
		}),
		sends: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_tickle_takeovers_total",
			Help: "Takeovers (of the VIP, or of a service) after which this node tickled the previous holder's connections.",
		}),
		known: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nsmd_tickle_connections",
			Help: "Client connections on the VIP this node knows: its own last sample while it holds the VIP, else the leader's last list (what it tickles if it takes over). With services: the sum over the services.",
		}),
		over: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nsmd_tickle_connections_over_limit",
			Help: "Connections on the VIP beyond tickle_max_conns in the last sample or list: not tickled at a takeover (they reconnect by their own timers). With services: the sum over the services.",
		}),
	}
	for _, c := range []prometheus.Collector{m.sent, m.sends, m.known, m.over} {
		if err := reg.Register(c); err != nil {
			return m, err
		}
	}
	return m, nil
}

// start runs the sampling and fetching loop until stop.
func (t *tickler) start(node *cluster.Node) {
	if t == nil {
		return
	}
	if t.svc != nil {
		t.svc.start(node)
		return
	}
	t.node = node
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		tk := time.NewTicker(tickleInterval)
		defer tk.Stop()
		for {
			t.tick()
			select {
			case <-t.ctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
}

// stop ends the loop and any sending, and waits for them.
func (t *tickler) stop() {
	if t == nil {
		return
	}
	if t.svc != nil {
		t.svc.stop()
		return
	}
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
}

// ports are the local ports whose connections are sampled: nfsd's, and
// lockd's when the kernel's nlm_tcpport fixes it.
func (t *tickler) ports() []uint16 { return tickledPorts(t.procRoot) }

func tickledPorts(procRoot string) []uint16 {
	ports := []uint16{tickle.NFSPort}
	if p, err := tickle.LockdPort(procRoot); err == nil && p != 0 && p != tickle.NFSPort {
		ports = append(ports, p)
	}
	return ports
}

func (t *tickler) tick() {
	if t.node.Leading() {
		if t.node.VIPHeld() {
			t.sample()
		}
		return
	}
	t.node.Hints().SetVIPConns(cluster.VIPConns{}) // a former leader shares nothing
	t.fetch()
}

// sample reads this node's connections on the VIP and shares them.
func (t *tickler) sample() {
	conns, total, err := tickle.Read(t.procRoot, tickle.Filter{VIP: t.vip, Ports: t.ports(), Max: t.max})
	if err != nil {
		t.sampleErr.log(t.log, "cannot sample the VIP's connections; sharing the last sample", err)
		return
	}
	t.sampleErr.log(t.log, "", nil)
	t.node.Hints().SetVIPConns(cluster.VIPConns{Conns: conns, Total: total, At: time.Now()})
	t.setKnown(len(conns), total)
}

func (t *tickler) setKnown(n, total int) {
	t.known.Set(float64(n))
	t.over.Set(float64(total - n))
	t.mu.Lock()
	over, logged := total > n, t.overLogged
	t.overLogged = over
	t.mu.Unlock()
	if over && !logged {
		t.log.Warn("more connections on the VIP than tickle_max_conns: those beyond it will reconnect by their own timers after a failover",
			"connections", total, "tickle_max_conns", t.max)
	}
}

// errOnce logs an error once until it changes or clears: a loop that
// fails every second says so once.
type errOnce struct {
	mu   sync.Mutex
	last string
}

// log logs msg with err on l when it differs from the last one logged
// (nil: things are fine again).
func (e *errOnce) log(l *slog.Logger, msg string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := ""
	if err != nil {
		s = msg + ": " + err.Error()
	}
	if s == e.last {
		return
	}
	e.last = s
	if err != nil {
		l.Warn(msg, "err", err)
	}
}

// fetch asks the leader for its latest sample. A failure keeps the last
// list: a leader that just died cannot answer, and its last list is the
// one to tickle.
func (t *tickler) fetch() {
	leader := t.node.Leader()
	t.mu.Lock()
	skip := leader == "" || leader == t.self || leader == t.unsupported
	t.mu.Unlock()
	if skip {
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, tickleInterval)
	defer cancel()
	from, v, err := t.node.Hints().LeaderVIPConns(ctx, t.max)
	switch {
	case errors.Is(err, cluster.ErrVIPConnsUnsupported):
		t.mu.Lock()
		t.unsupported = from
		t.mu.Unlock()
		t.log.Info("the leader runs a release that does not share its VIP connections: not asking it again", "leader", from)
		return
	case err != nil:
		t.log.Debug("cannot fetch the leader's VIP connections; keeping the last list", "leader", leader, "err", err)
		return
	}
	t.mu.Lock()
	t.list, t.from, t.unsupported = v, from, ""
	t.mu.Unlock()
	t.setKnown(len(v.Conns), v.Total)
}

// takeover tickles, in the background, the connections of the last list
// fetched from the previous leader: called once on_leader succeeded (nfsd
// listens, the VIP is held), alongside SM_NOTIFY. Connections this node
// has itself are left alone; ctx (the term) ends the sending.
func (t *tickler) takeover(ctx context.Context, state int32) {
	if t == nil || t.svc != nil {
		return
	}
	t.mu.Lock()
	v, from := t.list, t.from
	t.list, t.from = cluster.VIPConns{}, ""
	t.mu.Unlock()
	var conns []tickle.Conn
	var ports []uint16
	for _, c := range v.Conns {
		if c.Local.Addr().Unmap() != t.vip || !c.Valid() {
			continue // not on this VIP: nothing of ours to tickle
		}
		conns = append(conns, c)
		if !slices.Contains(ports, c.Local.Port()) {
			ports = append(ports, c.Local.Port())
		}
	}
	if len(conns) == 0 {
		t.log.Info("takeover: no connections of the previous VIP holder to tickle", "sm_state", state, "from", from)
		return
	}
	own, _, err := tickle.Read(t.procRoot, tickle.Filter{VIP: t.vip, Ports: ports})
	if err != nil {
		t.log.Warn("takeover: cannot read this node's own connections on the VIP; tickling every listed one", "err", err)
	}
	age := time.Since(v.At).Round(time.Millisecond)
	t.log.Info("takeover: tickling the previous VIP holder's client connections", "sm_state", state,
		"connections", len(conns), "from", from, "sample_age", age, "already_here", len(own))
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	cfg := t.send
	cfg.Skip = own
	goSend(ctx, t.ctx, &t.wg, t.sendFn, cfg, conns, t.log.With("sm_state", state), "takeover", func(sent int) {
		t.sent.Add(float64(sent))
		t.sends.Inc()
	})
}

// goSend sends conns' tickle ACKs in a goroutine that wg owns, until ctx
// or owner ends, then counts them (counted) and logs how it went (what:
// the occasion). The caller holds its lock and has checked it is not
// stopped, so wg is not waited on before this Add.
func goSend(ctx, owner context.Context, wg *sync.WaitGroup, send sendFunc, cfg tickle.SendConfig, conns []tickle.Conn, log *slog.Logger, what string, counted func(int)) {
	sctx, cancel := context.WithCancel(ctx)
	unlink := context.AfterFunc(owner, cancel)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cancel()
		defer unlink()
		sent, err := send(sctx, conns, cfg)
		counted(sent)
		if err != nil {
			log.Warn(what+": tickle ACKs sent with errors", "sent", sent, "err", err)
			return
		}
		log.Info(what+": tickle ACKs sent", "sent", sent, "connections", len(conns))
	}()
}

// serviceStarted tickles, after service id's start hook succeeded at
// epoch here, the connections of the server that served it before
// (serviceTickler.takeover); nothing without services' tickling.
// serviceNamespace says that service id runs in a namespace of its own,
// which in enters (nil: no longer): its connections are sampled and
// tickled there.
func (t *tickler) serviceNamespace(id string, in func(func() error) error) {
	if t == nil || t.svc == nil {
		return
	}
	t.svc.setNamespace(id, in)
}

func (t *tickler) serviceStarted(ctx context.Context, id string, epoch uint64) {
	if t == nil || t.svc == nil {
		return
	}
	t.svc.takeover(ctx, id, epoch)
}
