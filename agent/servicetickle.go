package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/tickle"
)

// unsupportedRetry is how long a server that answered SVCCONNS with
// PROC_UNAVAIL (an older release) is not asked again, unless gossip says
// it runs another version since (it was upgraded and restarted).
const unsupportedRetry = 5 * time.Minute

// unsupported is a server's PROC_UNAVAIL to SVCCONNS: when, and the
// version gossip said it ran then.
type unsupported struct {
	at      time.Time
	version string
}

// serviceTickler is the tickler with services: (DESIGN.md, "Tickle
// ACKs"): the clients' connections of a service are on its address, on
// the server that serves it, so each service is tickled on its own. Every
// tickleInterval this node samples the connections of the services it
// serves (on each one's address, nfsd's port and lockd's when fixed,
// bounded by tickle_max_conns each) and hands them to its cluster node,
// which answers SVCCONNS with them (cluster/svcconns.go); and it asks every
// other server that serves one of its services (the placements say which)
// for that server's samples, keeping the last sample of each service and
// which server it came from. Right after a service's start hook succeeded
// here, it tickles, from the service's address, the connections of the
// last sample it holds of that service from the server that served it
// before (the placement's Prev, else From), and only those.
type serviceTickler struct {
	log      *slog.Logger
	node     atomic.Pointer[cluster.Node] // set by start (a service may start before: nothing is tickled then)
	self     string
	procRoot string
	max      int
	send     tickle.SendConfig
	sendFn   sendFunc
	addrs    map[string]netip.Addr // this node's services' addresses, by id

	tickleMetrics // the sums over the services (the series without services:)
	svcKnown      *prometheus.GaugeVec
	svcSent       *prometheus.CounterVec

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the loop and the takeovers' sends

	mu   sync.Mutex
	last map[string]svcSample // by service: the last sample held
	// inNS runs a function inside the network namespace of each service
	// that has one (service_namespaces): its connections are in that
	// namespace's tables and its tickle ACKs leave from there.
	inNS        map[string]func(func() error) error
	unsupported map[string]unsupported // server → its PROC_UNAVAIL
	overLogged  map[string]bool        // "over tickle_max_conns" logged for the service, not cleared since
	stopped     bool                   // stop ran: no new sends
	sampleErr   errOnce
}

// svcSample is the last sample held of one service's connections.
type svcSample struct {
	from string // the server that sampled it (this node: its own)
	v    cluster.VIPConns
}

// newServiceTickler is the services' tickler of cfg (newTickler decided
// that there is one).
func newServiceTickler(cfg config.Config, log *slog.Logger, reg prometheus.Registerer, procRoot string, send sendFunc) (*serviceTickler, error) {
	t := &serviceTickler{
		log: log.With("component", "tickle"), self: cfg.NodeID, procRoot: procRoot, sendFn: send,
		max: cfg.TickleMaxConns, addrs: map[string]netip.Addr{},
		last: map[string]svcSample{}, inNS: map[string]func(func() error) error{}, unsupported: map[string]unsupported{}, overLogged: map[string]bool{},
		svcKnown: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nsmd_tickle_service_connections",
			Help: "Client connections on the service's address this node knows: its own last sample while it serves the service, else the last one fetched from the server that serves it (what it tickles if it takes the service over from that server).",
		}, []string{"service"}),
		svcSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_tickle_service_acks_sent_total",
			Help: "Tickle ACKs sent, after starting the service here, to the clients of the connections the server that served it before had on its address.",
		}, []string{"service"}),
	}
	for _, sp := range cfg.Services {
		t.addrs[sp.ID] = sp.Address.Addr().Unmap()
	}
	var err error
	if t.tickleMetrics, err = newTickleMetrics(reg); err != nil {
		return nil, err
	}
	for _, c := range []prometheus.Collector{t.svcKnown, t.svcSent} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t, nil
}

// start runs the sampling and fetching loop until stop.
func (t *serviceTickler) start(node *cluster.Node) {
	t.node.Store(node)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		tk := time.NewTicker(tickleInterval)
		defer tk.Stop()
		for {
			t.sample()
			t.fetch()
			t.export()
			select {
			case <-t.ctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
}

// stop ends the loop and any sending, and waits for them.
func (t *serviceTickler) stop() {
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
}

// sample reads the connections of the services this node serves (their
// runs in phase serving: not while one starts — its takeover still needs
// the previous server's sample — nor once it stops) and shares them.
func (t *serviceTickler) sample() {
	served := map[netip.Addr]string{}
	for _, r := range t.node.Load().Services().Runs() {
		if a, ok := t.addrs[r.Service]; ok && r.Phase == "serving" {
			served[a] = r.Service
		}
	}
	if len(served) == 0 {
		t.node.Load().Hints().SetServiceConns(nil)
		return
	}
	samples, err := t.readConns(served, t.max)
	if err != nil {
		t.sampleErr.log(t.log, "cannot sample the services' connections; sharing the last samples", err)
		return
	}
	t.sampleErr.log(t.log, "", nil)
	t.node.Load().Hints().SetServiceConns(samples)
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, v := range samples {
		t.last[id] = svcSample{from: t.self, v: v}
		over := v.Total > len(v.Conns)
		if over && !t.overLogged[id] {
			t.log.Warn("more connections on the service's address than tickle_max_conns: those beyond it will reconnect by their own timers after it moves",
				"service", id, "connections", v.Total, "tickle_max_conns", t.max)
		}
		t.overLogged[id] = over
	}
}

// readConns reads the connections of the served services (address →
// service): those in a namespace of their own inside it, the others in
// one pass over procRoot's tables.
func (t *serviceTickler) readConns(served map[netip.Addr]string, max int) (map[string]cluster.VIPConns, error) {
	ports := tickledPorts(t.procRoot) // lockd's port is one setting for the host
	host := map[netip.Addr]string{}
	out := map[string]cluster.VIPConns{}
	var errs []error
	for a, id := range served {
		in := t.namespaceOf(id)
		if in == nil {
			host[a] = id
			continue
		}
		err := in(func() error {
			v, err := readServiceConns("/proc/thread-self", map[netip.Addr]string{a: id}, ports, max)
			maps.Copy(out, v)
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("service %s, in its namespace: %w", id, err))
		}
	}
	if len(host) > 0 {
		v, err := readServiceConns(t.procRoot, host, ports, max)
		if err != nil {
			errs = append(errs, err)
		}
		maps.Copy(out, v)
	}
	return out, errors.Join(errs...)
}

// namespaceOf is what runs a function inside service id's namespace (nil:
// it has none).
func (t *serviceTickler) namespaceOf(id string) func(func() error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inNS[id]
}

// setNamespace says that service id runs in a namespace of its own, which
// in enters (nil: no longer).
func (t *serviceTickler) setNamespace(id string, in func(func() error) error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if in == nil {
		delete(t.inNS, id)
		return
	}
	t.inNS[id] = in
}

// readServiceConns reads the established connections on the services'
// addresses (served: address → service) and ports, in one pass over
// procRoot's tables, at most max of each service.
func readServiceConns(procRoot string, served map[netip.Addr]string, ports []uint16, max int) (map[string]cluster.VIPConns, error) {
	now := time.Now()
	out := make(map[string]cluster.VIPConns, len(served))
	for _, id := range served {
		out[id] = cluster.VIPConns{At: now}
	}
	for _, name := range []string{"tcp", "tcp6"} {
		path := filepath.Join(procRoot, "net", name)
		fh, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // no IPv6
		}
		if err != nil {
			return nil, fmt.Errorf("tickle: %w", err)
		}
		err = tickle.ParseTable(fh, func(c tickle.Conn) {
			id, ok := served[c.Local.Addr()]
			if !ok || !slices.Contains(ports, c.Local.Port()) {
				return
			}
			v := out[id]
			v.Total++
			if max <= 0 || len(v.Conns) < max {
				v.Conns = append(v.Conns, c)
			}
			out[id] = v
		})
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return out, nil
}

// fetch asks every other server that serves one of this node's services
// for its samples, all at once, each bounded by tickleInterval. A failure
// keeps the last sample: a server that just died cannot answer, and its
// last sample is the one to tickle.
func (t *serviceTickler) fetch() {
	owner := map[string]string{} // service → its server, of this node's services
	servers := map[string]bool{}
	now := time.Now()
	versions := t.versions()
	t.mu.Lock()
	for _, p := range t.node.Load().Services().View().State.Placements {
		if _, ours := t.addrs[p.Service]; !ours || p.Node == "" {
			continue
		}
		owner[p.Service] = p.Node
		if u, ok := t.unsupported[p.Node]; ok && now.Sub(u.at) < unsupportedRetry && u.version == versions[p.Node] {
			continue
		}
		if p.Node != t.self {
			servers[p.Node] = true
		}
	}
	t.mu.Unlock()
	var wg sync.WaitGroup
	for srv := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.fetchFrom(srv, owner)
		}()
	}
	wg.Wait()
}

// versions are the members' versions, as gossip says, by node id.
func (t *serviceTickler) versions() map[string]string {
	out := map[string]string{}
	for _, m := range t.node.Load().Members() {
		out[m.ID] = m.Version
	}
	return out
}

// fetchFrom asks server srv for its samples and keeps those of this
// node's services that srv serves (owner: service → server).
func (t *serviceTickler) fetchFrom(srv string, owner map[string]string) {
	ctx, cancel := context.WithTimeout(t.ctx, tickleInterval)
	defer cancel()
	m, err := t.node.Load().Hints().ServerServiceConns(ctx, srv, t.max)
	switch {
	case errors.Is(err, cluster.ErrServiceConnsUnsupported):
		version := t.versions()[srv]
		t.mu.Lock()
		t.unsupported[srv] = unsupported{at: time.Now(), version: version}
		t.mu.Unlock()
		t.log.Info("a server runs a release that does not share its services' connections: not asking it again for a while", "server", srv, "retry_after", unsupportedRetry)
		return
	case err != nil:
		t.log.Debug("cannot fetch a server's services' connections; keeping the last samples", "server", srv, "err", err)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.unsupported, srv)
	for id, v := range m {
		if owner[id] == srv { // a service of ours that it serves (not one that moved since, here or elsewhere)
			t.last[id] = svcSample{from: srv, v: v}
		}
	}
}

// export sets the gauges: each service's known connections, and their sums.
func (t *serviceTickler) export() {
	t.mu.Lock()
	defer t.mu.Unlock()
	known, over := 0, 0
	for id := range t.addrs {
		s := t.last[id]
		n := len(s.v.Conns)
		t.svcKnown.WithLabelValues(id).Set(float64(n))
		known += n
		over += max(s.v.Total-n, 0)
	}
	t.known.Set(float64(known))
	t.over.Set(float64(over))
}

// takeover tickles, in the background, the connections of the last
// sample held of service id from the server that served it before:
// called once its start hook succeeded here at epoch (nfsd listens, the
// address is held), alongside its SM_NOTIFY. Connections this node has
// itself are left alone; ctx (the run) ends the sending.
func (t *serviceTickler) takeover(ctx context.Context, id string, epoch uint64) {
	addr, ok := t.addrs[id]
	node := t.node.Load()
	if !ok || node == nil {
		return
	}
	p := node.Services().View().State.Current(id)
	if p.Node != t.self || p.Epoch != epoch {
		return // moved on already: this run is stopping
	}
	prev := p.Prev
	if prev == "" {
		prev = p.From // its release recorded (a planned move), or a restart here
	}
	t.mu.Lock()
	s, held := t.last[id]
	if held && s.from == prev {
		delete(t.last, id) // tickled once
	}
	t.mu.Unlock()
	log := t.log.With("service", id, "epoch", epoch, "from", prev)
	if prev == "" || !held || s.from != prev {
		log.Info("service start: no connections of the previous server to tickle", "sample_from", s.from)
		return
	}
	var conns []tickle.Conn
	for _, c := range s.v.Conns {
		if c.Local.Addr().Unmap() == addr && c.Valid() {
			conns = append(conns, c)
		}
	}
	if len(conns) == 0 {
		log.Info("service start: no connections of the previous server to tickle")
		return
	}
	own, err := t.readConns(map[netip.Addr]string{addr: id}, 0)
	if err != nil {
		log.Warn("service start: cannot read this node's own connections on the service's address; tickling every listed one", "err", err)
	}
	log.Info("service start: tickling the previous server's client connections", "connections", len(conns),
		"sample_age", time.Since(s.v.At).Round(time.Millisecond), "already_here", len(own[id].Conns))
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	cfg := t.send
	cfg.Skip = own[id].Conns
	send := t.sendFn
	if in := t.inNS[id]; in != nil { // its ACKs leave from its address, inside
		send = func(ctx context.Context, conns []tickle.Conn, cfg tickle.SendConfig) (n int, err error) {
			err = in(func() (err error) {
				n, err = t.sendFn(ctx, conns, cfg)
				return err
			})
			return n, err
		}
	}
	goSend(ctx, t.ctx, &t.wg, send, cfg, conns, log, "service start", func(sent int) {
		t.sent.Add(float64(sent))
		t.svcSent.WithLabelValues(id).Add(float64(sent))
		t.sends.Inc()
	})
}
