package nsm

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// NotifierConfig configures a Notifier. Zero values take the defaults.
type NotifierConfig struct {
	// Name is sent as stat_chge.mon_name: the name clients mounted
	// (--notify-name). Required.
	Name string
	// Source is the address SM_NOTIFY leaves from (the VIP); peers match
	// the sender's address against their monitor list. Zero: any address.
	Source netip.Addr
	// Window is how long a host is retried before it is given up, counted
	// from the start of Run. Default 15 min (sm-notify's -m default).
	Window time.Duration
	// Parallel bounds the hosts in their first round trip. A host leaves
	// this budget when it answers, or when it is overtaken: calls sent
	// after its own have been answered (Parallel/32 of them, 1..32), so a
	// dead host among live ones gives its place up after a few answers,
	// however slow the round trips are; or, when no call at all has been
	// answered for 100 ms (at most InitialRTO: every host in the budget
	// may be dead), after that long. Its call stays outstanding and it
	// continues on its own backoff schedule outside the budget, so dead
	// hosts never hold up live ones, while a stall of the sender or of the
	// network (no answers, nobody overtaken) shorter than 100 ms frees no
	// place, and a longer one the budget once per 100 ms: the calls in
	// flight stay bounded instead of piling up behind it. A host waiting
	// for its name lookup is overtaken in the same way. Default 1024.
	Parallel int
	// InitialRTO is the first retransmit timeout; it doubles up to MaxRTO.
	// Defaults 500 ms and 30 s.
	InitialRTO time.Duration
	MaxRTO     time.Duration
	// PmapRequery re-queries the host's portmapper every N unanswered
	// SM_NOTIFY sends (sm-notify: every 4). Default 4; negative: never.
	PmapRequery int
	// PmapPort is the hosts' portmapper port. Default 111.
	PmapPort int
	// StatdPort, if non-zero, skips the portmapper and sends SM_NOTIFY to
	// this port (tests).
	StatdPort int
	// Resolvers bounds concurrent name lookups for targets without
	// addresses. Default 16.
	Resolvers int
	// Resolve resolves a target's MonName when it has no address. Default
	// DefaultResolve.
	Resolve func(ctx context.Context, name string) ([]netip.Addr, error)
	// Listen opens the run's UDP socket (every call leaves from it);
	// default net.ListenUDP. A service served in a network namespace of
	// its own opens it inside that namespace, where its address is.
	Listen  func(network string, laddr *net.UDPAddr) (*net.UDPConn, error)
	Logger  *slog.Logger
	Metrics *Metrics

	// Tests: how many later calls answered overtake a call (default
	// Parallel/32, 1..32), and how long without any answer frees a place
	// in the budget (default 100 ms, at most InitialRTO).
	overtake int
	silence  time.Duration
}

func (c *NotifierConfig) setDefaults() {
	if c.Window == 0 {
		c.Window = 15 * time.Minute
	}
	if c.Parallel == 0 {
		c.Parallel = 1024
	}
	if c.InitialRTO == 0 {
		c.InitialRTO = 500 * time.Millisecond
	}
	if c.MaxRTO == 0 {
		c.MaxRTO = 30 * time.Second
	}
	if c.PmapRequery == 0 {
		c.PmapRequery = 4
	}
	if c.PmapPort == 0 {
		c.PmapPort = oncrpc.PmapPort
	}
	if c.Resolvers == 0 {
		c.Resolvers = 16
	}
	if c.Resolve == nil {
		c.Resolve = DefaultResolve
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.overtake == 0 {
		c.overtake = min(max(c.Parallel/32, 1), 32)
	}
	if c.silence == 0 {
		c.silence = min(silenceFree, c.InitialRTO)
	}
}

// Validate reports a configuration that cannot work.
func (c *NotifierConfig) Validate() error {
	var errs []error
	if c.Name == "" || len(c.Name) > MaxStrLen {
		errs = append(errs, fmt.Errorf("nsm: notify name %q: must be 1..%d bytes", c.Name, MaxStrLen))
	}
	if c.Window < 0 || c.InitialRTO < 0 || c.MaxRTO < 0 {
		errs = append(errs, errors.New("nsm: negative notifier duration"))
	}
	if c.MaxRTO < c.InitialRTO {
		errs = append(errs, fmt.Errorf("nsm: MaxRTO %v below InitialRTO %v", c.MaxRTO, c.InitialRTO))
	}
	if c.Parallel < 0 || c.Resolvers < 0 {
		errs = append(errs, errors.New("nsm: negative notifier parallelism"))
	}
	if c.PmapPort < 0 || c.PmapPort > 65535 || c.StatdPort < 0 || c.StatdPort > 65535 {
		errs = append(errs, errors.New("nsm: notifier port out of range"))
	}
	return errors.Join(errs...)
}

// Summary is what a Notifier run did.
type Summary struct {
	State    int32
	Targets  int
	Done     int           // hosts that acknowledged SM_NOTIFY
	Failed   int           // hosts given up (window over, no address)
	Pending  int           // hosts neither done nor failed (run cancelled)
	Elapsed  time.Duration // from start to return
	Canceled bool          // ctx ended before every host finished
	RTT      time.Duration // smoothed round trip of the answers (0: none)
	Err      error         // the run could not start (e.g. the source address is not local)
}

// LogValue renders a Summary for slog.
func (s Summary) LogValue() slog.Value {
	attrs := []slog.Attr{slog.Int("state", int(s.State)), slog.Int("targets", s.Targets),
		slog.Int("done", s.Done), slog.Int("failed", s.Failed), slog.Int("pending", s.Pending),
		slog.Duration("elapsed", s.Elapsed), slog.Bool("canceled", s.Canceled), slog.Duration("rtt", s.RTT)}
	if s.Err != nil {
		attrs = append(attrs, slog.String("err", s.Err.Error()))
	}
	return slog.GroupValue(attrs...)
}

// Notifier sends SM_NOTIFY (XNFS NSM procedure 6, stat_chge{Name, state})
// to every monitored host after a takeover, as sm-notify does, at scale:
// one UDP socket bound to Source carries every portmapper GETPORT and
// SM_NOTIFY call, replies are matched to hosts by XID, and one scheduler
// goroutine (Run's) drives every retransmission from a timer heap. A
// Notifier is used for one Run at a time; Progress may be called
// concurrently.
type Notifier struct {
	cfg     NotifierConfig
	log     *slog.Logger
	m       *Metrics
	running atomic.Bool

	pending, done, failed atomic.Int64
	state, targets        atomic.Int64 // of the current (or last) run
}

// NewNotifier checks cfg and creates a Notifier.
func NewNotifier(cfg NotifierConfig) (*Notifier, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Notifier{cfg: cfg, log: cfg.Logger, m: cfg.Metrics}, nil
}

// Progress reports the current (or last) run's hosts still pending, done
// and failed.
func (n *Notifier) Progress() (pending, done, failed int) {
	return int(n.pending.Load()), int(n.done.Load()), int(n.failed.Load())
}

// Current reports which sm_state the current (or last) run sends and to
// how many hosts (0, 0 before the first).
func (n *Notifier) Current() (state int32, targets int) {
	return int32(n.state.Load()), int(n.targets.Load())
}

// Run notifies every target of state and returns when each has
// acknowledged or been given up, or promptly after ctx ends.
func (n *Notifier) Run(ctx context.Context, state int32, targets []fsm.Target) Summary {
	start := time.Now()
	if !n.running.CompareAndSwap(false, true) {
		return Summary{State: state, Targets: len(targets), Pending: len(targets), Err: ErrRunning}
	}
	defer n.running.Store(false)
	n.state.Store(int64(state))
	n.targets.Store(int64(len(targets)))
	n.pending.Store(int64(len(targets)))
	n.done.Store(0)
	n.failed.Store(0)
	n.publish()

	r := &run{n: n, cfg: &n.cfg, state: state, start: start, deadline: start.Add(n.cfg.Window), lastAnswer: start}
	sum := r.run(ctx, targets)
	sum.RTT = r.srtt
	sum.State = state
	sum.Targets = len(targets)
	sum.Pending, sum.Done, sum.Failed = n.Progress()
	sum.Elapsed = time.Since(start)
	return sum
}

func (n *Notifier) publish() {
	p, d, f := n.Progress()
	n.m.notifyProgress(p, d, f)
}

// ---- one run ---------------------------------------------------------------

type phase uint8

const (
	phWaiting phase = iota // not started (Parallel budget)
	phResolve              // name lookup in flight
	phPmap                 // GETPORT 100024/1/UDP at the host's portmapper
	phNotify               // SM_NOTIFY to the host's statd
	phDone
	phFailed
)

type host struct {
	name  string
	addrs []netip.Addr
	addr  netip.Addr
	port  uint16 // statd port once known
	phase phase
	xid   uint32 // outstanding call's XID (0: none)
	sends int    // SM_NOTIFY sends since the last GETPORT
	// pmapSent, notifySent: calls of each kind sent to the host so far.
	pmapSent, notifySent int
	rto                  time.Duration
	rtoAt                time.Time // the current call's retransmit timeout
	sentAt               time.Time // the current call's last send
	callSends            uint8     // sends of the current call (XID), saturating
	seq                  uint64    // the run's send sequence number of the last send
	gen                  uint32    // timer generation; older heap entries are stale
	first                bool      // in its first round trip (counts toward Parallel)
	// resolving: a lookup is in flight (at most one per host, so the
	// resolver queues never fill).
	resolving bool
}

type reply struct {
	xid    uint32
	from   netip.Addr
	ok     bool // MSG_ACCEPTED + SUCCESS
	val    uint32
	hasVal bool
}

type resolved struct {
	idx   int
	addrs []netip.Addr
	err   error
}

// firstSend is one send of a host in its first round trip.
type firstSend struct {
	idx int32
	seq uint64
}

type run struct {
	n        *Notifier
	cfg      *NotifierConfig
	state    int32
	start    time.Time
	deadline time.Time

	conn    *net.UDPConn
	hosts   []host
	next    int // next host to start
	inFirst int
	left    int // hosts not finished
	xids    map[uint32]int
	xid     uint32
	timers  timerHeap
	buf     []byte
	// Round-trip estimate from answers to calls sent once (Karn), RFC
	// 6298 §2 (reported in the Summary).
	srtt, rttvar time.Duration
	rttSamples   int
	// The first-round budget: sends numbered in order, the highest number
	// answered (calls sent once only), when the last answer came, and the
	// first-round sends not yet overtaken, oldest first.
	sendSeq    uint64
	ackedSeq   uint64
	lastAnswer time.Time
	firstQ     []firstSend
	firstHead  int
	resolve    chan int
	results    chan resolved
}

func (r *run) run(ctx context.Context, targets []fsm.Target) Summary {
	if len(targets) == 0 {
		return Summary{}
	}
	r.hosts = make([]host, len(targets))
	needDNS := false
	for i, t := range targets {
		r.hosts[i] = host{name: t.MonName, addrs: t.Addrs}
		if len(t.Addrs) == 0 {
			needDNS = true
		}
	}
	r.left = len(r.hosts)
	r.xids = make(map[uint32]int, min(len(r.hosts), r.cfg.Parallel)*2)
	r.xid = rand.Uint32()
	r.buf = make([]byte, 0, 1500)

	conn, err := r.listen()
	if err != nil {
		r.n.log.Error("SM_NOTIFY fan-out cannot start", "source", r.cfg.Source, "err", err)
		for i := range r.hosts {
			r.finish(i, false, err)
		}
		return Summary{Err: err}
	}
	r.conn = conn

	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		conn.Close()
		wg.Wait()
	}()
	replies := make(chan reply, 1024)
	wg.Go(func() { r.receive(rctx, replies) })
	if needDNS {
		r.resolve = make(chan int, len(r.hosts))
		r.results = make(chan resolved, len(r.hosts))
		for range max(r.cfg.Resolvers, 1) {
			wg.Go(func() { r.resolver(rctx) })
		}
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	r.fill()
	for r.left > 0 {
		now := time.Now()
		r.fire(now)
		if r.left == 0 {
			break
		}
		if r.timers.Len() > 0 {
			timer.Reset(r.timers[0].at.Sub(now))
		}
		select {
		case <-ctx.Done():
			return Summary{Canceled: true}
		case rep := <-replies:
			r.onReply(rep)
			// Drain what is already queued before touching the timer again.
			for more := true; more && r.left > 0; {
				select {
				case rep := <-replies:
					r.onReply(rep)
				default:
					more = false
				}
			}
		case res := <-r.results:
			r.onResolved(res)
		case <-timer.C:
		}
	}
	return Summary{}
}

func (r *run) listen() (*net.UDPConn, error) {
	network, laddr := "udp", &net.UDPAddr{}
	if src := r.cfg.Source; src.IsValid() {
		network = "udp6"
		if src.Unmap().Is4() {
			network = "udp4"
		}
		laddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(src.Unmap(), 0))
	}
	listen := r.cfg.Listen
	if listen == nil {
		listen = net.ListenUDP
	}
	conn, err := listen(network, laddr)
	if err != nil {
		return nil, fmt.Errorf("nsm: notifier socket on %v: %w", laddr, err)
	}
	// Best effort: room for a burst of replies (sm-notify loses them here).
	_ = conn.SetReadBuffer(4 << 20)
	_ = conn.SetWriteBuffer(4 << 20)
	return conn, nil
}

// receive reads replies until the socket is closed and hands each one to
// the scheduler.
func (r *run) receive(ctx context.Context, out chan<- reply) {
	buf := make([]byte, 4096)
	for {
		nb, from, err := r.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			continue // e.g. an ICMP error surfaced on the socket
		}
		rep, ok := parseReply(buf[:nb])
		if !ok {
			continue
		}
		rep.from = from.Addr().Unmap()
		select {
		case out <- rep:
		case <-ctx.Done():
			return
		}
	}
}

func (r *run) resolver(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case i := <-r.resolve:
			name := r.hosts[i].name // immutable during the run
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			addrs, err := r.cfg.Resolve(lctx, name)
			cancel()
			select {
			case r.results <- resolved{idx: i, addrs: addrs, err: err}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// fill starts waiting hosts while the first-round-trip budget allows.
func (r *run) fill() {
	for r.next < len(r.hosts) && r.inFirst < r.cfg.Parallel {
		i := r.next
		r.next++
		h := &r.hosts[i]
		h.first = true
		r.inFirst++
		h.rto = r.cfg.InitialRTO
		if len(h.addrs) == 0 {
			if a, err := netip.ParseAddr(h.name); err == nil {
				h.addrs = []netip.Addr{a}
			}
		}
		if len(h.addrs) == 0 {
			h.phase = phResolve
			// Calls sent from now on and answered overtake the lookup.
			h.seq = r.sendSeq
			r.firstQ = append(r.firstQ, firstSend{idx: int32(i), seq: h.seq})
			r.lookup(i)
			r.arm(i)
			continue
		}
		r.begin(i)
	}
}

// begin picks the host's address and sends its first call.
func (r *run) begin(i int) {
	h := &r.hosts[i]
	h.addr = r.pickAddr(h.addrs)
	if !h.addr.IsValid() {
		r.finish(i, false, fmt.Errorf("addresses %v: %w", h.addrs, ErrNoAddress))
		return
	}
	if r.cfg.StatdPort != 0 {
		h.port = uint16(r.cfg.StatdPort)
		h.phase = phNotify
	} else {
		h.phase = phPmap
	}
	r.send(i)
}

// pickAddr chooses the first address the socket can reach: of Source's
// family when Source is set.
func (r *run) pickAddr(addrs []netip.Addr) netip.Addr {
	src := r.cfg.Source.Unmap()
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || a.IsUnspecified() {
			continue
		}
		if !src.IsValid() || a.Is4() == src.Is4() {
			return a
		}
	}
	return netip.Addr{}
}

// lookup queues a name lookup for host i unless one is in flight. The
// queue holds len(hosts), so with one lookup per host it never blocks.
func (r *run) lookup(i int) {
	if h := &r.hosts[i]; !h.resolving {
		h.resolving = true
		r.resolve <- i
	}
}

func (r *run) onResolved(res resolved) {
	h := &r.hosts[res.idx]
	h.resolving = false
	if h.phase != phResolve {
		return
	}
	if res.err != nil || len(res.addrs) == 0 {
		// Try again when the host's timer fires.
		r.n.log.Debug("SM_NOTIFY: cannot resolve host yet", "host", h.name, "err", res.err)
		return
	}
	h.addrs = res.addrs
	r.begin(res.idx)
}

// send (re)transmits the host's current call and arms its timer.
func (r *run) send(i int) {
	h := &r.hosts[i]
	if h.xid == 0 {
		r.xid++
		if r.xid == 0 {
			r.xid++
		}
		h.xid = r.xid
		r.xids[h.xid] = i
		h.callSends = 0
	}
	if h.callSends < 255 {
		h.callSends++
	}
	h.sentAt = time.Now()
	r.sendSeq++
	h.seq = r.sendSeq
	if h.first {
		r.firstQ = append(r.firstQ, firstSend{idx: int32(i), seq: h.seq})
	}
	w := oncrpc.NewWriter(r.buf)
	var dst netip.AddrPort
	switch h.phase {
	case phPmap:
		oncrpc.CallHeader{XID: h.xid, Prog: oncrpc.PmapProg, Vers: oncrpc.PmapVers, Proc: oncrpc.PmapProcGetPort}.MarshalXDR(w)
		oncrpc.Mapping{Prog: Program.Prog, Vers: Program.Vers, Prot: oncrpc.IPProtoUDP}.MarshalXDR(w)
		dst = netip.AddrPortFrom(h.addr, uint16(r.cfg.PmapPort))
		r.n.m.notifySent(true, h.pmapSent > 0)
		h.pmapSent++
	case phNotify:
		oncrpc.CallHeader{XID: h.xid, Prog: Program.Prog, Vers: Program.Vers, Proc: ProcNotify}.MarshalXDR(w)
		args := StatChge{MonName: r.cfg.Name, State: r.state}
		args.MarshalXDR(w)
		dst = netip.AddrPortFrom(h.addr, h.port)
		h.sends++
		r.n.m.notifySent(false, h.notifySent > 0)
		h.notifySent++
	}
	r.buf = w.Bytes()
	if _, err := r.conn.WriteToUDPAddrPort(r.buf, dst); err != nil {
		r.n.log.Debug("SM_NOTIFY: send failed", "host", h.name, "to", dst, "err", err)
	}
	r.arm(i)
}

// arm schedules the host's next timeout (never past the window's end): its
// retransmit timeout, or first, while it holds a place in the first-round
// budget, the silence check.
func (r *run) arm(i int) {
	h := &r.hosts[i]
	h.gen++
	now := time.Now()
	h.rtoAt = now.Add(h.rto)
	if h.rtoAt.After(r.deadline) {
		h.rtoAt = r.deadline
	}
	at := h.rtoAt
	if h.first {
		if st := now.Add(r.cfg.silence); st.Before(at) {
			at = st
		}
	}
	heap.Push(&r.timers, timerEntry{at: at, idx: int32(i), gen: h.gen})
}

// silenceFree is how long without any answer frees the places in the
// first-round budget (capped by InitialRTO).
const silenceFree = 100 * time.Millisecond

// leaveFirst takes host i out of the first-round budget.
func (r *run) leaveFirst(i int) {
	if h := &r.hosts[i]; h.first {
		h.first = false
		r.inFirst--
	}
}

// overtaken takes the hosts whose first-round call has been overtaken —
// answered calls sent at least overtake sends after it — out of the
// budget. Their calls stay outstanding until their retransmit timeout.
func (r *run) overtaken() {
	for r.firstHead < len(r.firstQ) {
		e := r.firstQ[r.firstHead]
		if e.seq+uint64(r.cfg.overtake) > r.ackedSeq {
			break
		}
		r.firstHead++
		if h := &r.hosts[e.idx]; h.first && h.seq == e.seq && h.phase < phDone {
			r.leaveFirst(int(e.idx))
		}
	}
	if r.firstHead > 1024 && r.firstHead*2 > len(r.firstQ) {
		r.firstQ = append(r.firstQ[:0], r.firstQ[r.firstHead:]...)
		r.firstHead = 0
	}
}

// sampleRTT folds one round trip into the estimate (RFC 6298 §2.2-2.3).
func (r *run) sampleRTT(d time.Duration) {
	if r.rttSamples == 0 {
		r.srtt, r.rttvar = d, d/2
	} else {
		diff := r.srtt - d
		if diff < 0 {
			diff = -diff
		}
		r.rttvar = (3*r.rttvar + diff) / 4
		r.srtt = (7*r.srtt + d) / 8
	}
	r.rttSamples++
}

// fire handles every timeout due at now.
func (r *run) fire(now time.Time) {
	for r.timers.Len() > 0 && !r.timers[0].at.After(now) {
		e := heap.Pop(&r.timers).(timerEntry)
		i := int(e.idx)
		h := &r.hosts[i]
		if e.gen != h.gen || h.phase >= phDone || h.phase == phWaiting {
			continue
		}
		if !now.Before(r.deadline) {
			r.finish(i, false, fmt.Errorf("no answer within %v", r.cfg.Window))
			continue
		}
		if now.Before(h.rtoAt) {
			// The silence check of a host in its first round trip. If
			// nothing at all has been answered for that long, every host in
			// the budget may be dead: this one gives its place to a host
			// that has not started. Else answers are coming and it stays
			// until they overtake it. Either way its call stays
			// outstanding until its retransmit timeout.
			if h.first {
				if since := now.Sub(r.lastAnswer); since >= r.cfg.silence {
					r.leaveFirst(i)
				} else {
					heap.Push(&r.timers, timerEntry{at: now.Add(r.cfg.silence - since), idx: e.idx, gen: h.gen})
					continue
				}
			}
			heap.Push(&r.timers, timerEntry{at: h.rtoAt, idx: e.idx, gen: h.gen})
			continue
		}
		r.leaveFirst(i)
		h.rto = min(2*h.rto, r.cfg.MaxRTO)
		switch {
		case h.phase == phResolve:
			r.lookup(i)
			r.arm(i)
		case h.phase == phNotify && r.cfg.StatdPort == 0 && r.cfg.PmapRequery > 0 && h.sends >= r.cfg.PmapRequery:
			// sm-notify re-asks the portmapper every few tries: statd may
			// have restarted on another port.
			r.retire(h)
			h.phase = phPmap
			r.send(i)
		default:
			r.send(i)
		}
	}
	r.fill()
}

// retire forgets the host's outstanding XID (late replies are ignored).
func (r *run) retire(h *host) {
	if h.xid != 0 {
		delete(r.xids, h.xid)
		h.xid = 0
	}
}

func (r *run) onReply(rep reply) {
	i, ok := r.xids[rep.xid]
	if !ok {
		return
	}
	h := &r.hosts[i]
	if rep.from != h.addr {
		return // not from the host we asked: ignore (spoofed or stray)
	}
	r.lastAnswer = time.Now()
	if h.callSends == 1 {
		r.sampleRTT(r.lastAnswer.Sub(h.sentAt))
		// Only a call sent once says which send was answered (Karn).
		r.ackedSeq = max(r.ackedSeq, h.seq)
		r.overtaken()
	}
	switch h.phase {
	case phPmap:
		if !rep.ok || !rep.hasVal || rep.val == 0 || rep.val > 65535 {
			// statd not registered (yet): ask again at the next timeout.
			return
		}
		r.retire(h)
		h.port = uint16(rep.val)
		h.phase = phNotify
		h.sends = 0
		r.send(i)
	case phNotify:
		if !rep.ok {
			// statd answered with an error: re-query the portmapper at the
			// next timeout (or, with a fixed StatdPort, just retransmit).
			if r.cfg.StatdPort == 0 {
				r.retire(h)
				h.phase = phPmap
			}
			return
		}
		r.finish(i, true, nil)
		r.fill()
	}
}

// finish ends a host's run as done or failed.
func (r *run) finish(i int, ok bool, err error) {
	h := &r.hosts[i]
	if h.phase >= phDone {
		return
	}
	r.retire(h)
	r.leaveFirst(i)
	h.gen++
	r.left--
	r.n.pending.Add(-1)
	if ok {
		h.phase = phDone
		r.n.done.Add(1)
		d := time.Since(r.start)
		r.n.m.notifyAcked(d)
		r.n.log.Debug("SM_NOTIFY acknowledged", "host", h.name, "addr", h.addr, "after", d)
	} else {
		h.phase = phFailed
		r.n.failed.Add(1)
		r.n.log.Warn("SM_NOTIFY given up", "host", h.name, "addr", h.addr, "err", err)
	}
	r.n.publish()
}

// ---- RPC replies (RFC 5531 §9) -------------------------------------------

// parseReply decodes a reply header and, for a successful reply, the first
// result word (GETPORT's port). ok is false for a malformed message or a
// call; rep.ok is false for a denied or unsuccessful reply (any reply_stat
// but MSG_ACCEPTED, any accept_stat but SUCCESS).
func parseReply(b []byte) (rep reply, ok bool) {
	r := oncrpc.NewReader(b)
	var h oncrpc.ReplyHeader
	err := h.UnmarshalXDR(r)
	rep.xid = h.XID
	if err != nil {
		return rep, false
	}
	if h.Stat != oncrpc.ReplyAccepted || h.AcceptStat != oncrpc.AcceptSuccess {
		return rep, true
	}
	rep.ok = true
	if r.Remaining() >= 4 {
		rep.val = r.Uint32()
		rep.hasVal = true
	}
	return rep, true
}

// ---- timers ----------------------------------------------------------------

type timerEntry struct {
	at  time.Time
	idx int32
	gen uint32
}

type timerHeap []timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
