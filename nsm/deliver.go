package nsm

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nlm"
	"github.com/nsmd/nsmd/oncrpc"
)

// ErrRunning is returned by a second concurrent call to Run.
var ErrRunning = errors.New("nsm: already running")

// Callback is one lock-manager callback to deliver: registration Reg's
// monitored host MonName now has state State.
type Callback struct {
	Reg     fsm.Registration
	MonName string // the monitored host's name as the lock manager registered it
	State   int32
	// From is the address the SM_NOTIFY came from. A callback for a
	// notification that did not come from one of the host's own addresses
	// (Reg.Addrs) may fill only half of the queue (DelivererConfig.QueueSize).
	From netip.Addr
}

// fromHost reports whether the notification came from one of the
// monitored host's own addresses.
func (cb Callback) fromHost() bool {
	return cb.From.IsValid() && slices.Contains(cb.Reg.Addrs, cb.From.Unmap())
}

// DelivererConfig configures a Deliverer. Zero values take the defaults.
type DelivererConfig struct {
	// PmapPort is the lock manager host's portmapper port. Default 111.
	PmapPort int
	// Attempts is how many times a callback is tried before it is given up.
	// Default 5 (rpc.statd: 5 tries about 5 s apart).
	Attempts int
	// Interval separates the starts of two tries. Default 5 s.
	Interval time.Duration
	// Timeout bounds each RPC of a try (GETPORT, then the callback).
	// Default 2 s.
	Timeout time.Duration
	// Workers is how many callbacks are in flight at once. Default 8.
	Workers int
	// QueueSize bounds callbacks waiting for a worker. Default 4096. Those
	// for notifications not sent from the host's own addresses (anyone may
	// send one naming a monitored host) take at most half of it, so a
	// flood of them never drops the callbacks of hosts that notified
	// themselves.
	QueueSize int
	// Unprivileged sends from an ordinary source port. Linux lockd drops a
	// callback that does not come from a port below 1024, so this is only
	// for tests and development without root.
	Unprivileged bool
	// Done, if set, is called from a worker after each callback was
	// delivered (err nil) or given up (err the last failure), with the
	// number of tries made. It must not block.
	Done    func(cb Callback, tries int, err error)
	Logger  *slog.Logger
	Metrics *Metrics
}

func (c *DelivererConfig) setDefaults() {
	if c.PmapPort == 0 {
		c.PmapPort = oncrpc.PmapPort
	}
	if c.Attempts <= 0 {
		c.Attempts = 5
	}
	if c.Interval <= 0 {
		c.Interval = 5 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Deliverer calls lock managers back (the NSM callback: my_prog, my_vers,
// my_proc with nlm.Status{mon_name, state, priv}) as rpc.statd does: over
// UDP to the registration's callback address, port found through the
// portmapper there, from a privileged source port, retried Attempts times
// Interval apart. Callbacks are queued with Enqueue and delivered by Run.
type Deliverer struct {
	cfg     DelivererConfig
	log     *slog.Logger
	m       *Metrics
	queue   chan delivery
	others  atomic.Int64 // queued deliveries whose notification did not come from the host
	wake    chan struct{}
	running atomic.Bool

	mu      sync.Mutex
	retries retryHeap
}

type delivery struct {
	cb      Callback
	attempt int       // tries made so far
	due     time.Time // retries: when the next try may start
}

// NewDeliverer creates a Deliverer; call Run to start delivering.
func NewDeliverer(cfg DelivererConfig) *Deliverer {
	cfg.setDefaults()
	return &Deliverer{
		cfg:   cfg,
		log:   cfg.Logger,
		m:     cfg.Metrics,
		queue: make(chan delivery, cfg.QueueSize),
		wake:  make(chan struct{}, 1),
	}
}

// Enqueue queues a callback without blocking. It returns false (and counts
// a dropped callback) when the queue is full.
// Callbacks for notifications not sent from the host's own addresses
// are dropped once they fill half of the queue.
func (d *Deliverer) Enqueue(cb Callback) bool {
	other := !cb.fromHost()
	if other && d.others.Add(1) > int64((d.cfg.QueueSize+1)/2) {
		d.others.Add(-1)
		d.m.callback("dropped")
		return false
	}
	select {
	case d.queue <- delivery{cb: cb}:
		return true
	default:
		if other {
			d.others.Add(-1)
		}
		d.m.callback("dropped")
		return false
	}
}

// Applied enqueues the callbacks that a command applied on node self
// calls for: for an accepted PeerRebooted (a monitored host rebooted),
// one per matched registration that self owns — the node that took an
// SM_MON calls its lock manager back, whichever node took the
// SM_NOTIFY. A replayed command (already in the log when the node
// started) calls for none: its callbacks went out before the restart, and
// a second one could make lockd drop locks that clients have reclaimed
// since. It never blocks: a full queue drops the callback (counted and
// logged).
func (d *Deliverer) Applied(self string, cmd fsm.Command, res fsm.Result, replay bool) {
	ev, ok := cmd.(fsm.PeerRebooted)
	if !ok || !res.Accepted || replay {
		return
	}
	for _, reg := range res.Matched {
		if reg.Node != self {
			continue
		}
		if !d.Enqueue(Callback{Reg: reg, MonName: reg.ID.MonName, State: ev.State, From: ev.From}) {
			d.log.Warn("callback queue full; callback dropped", "mon_name", reg.ID.MonName)
		}
	}
}

// Run delivers queued callbacks until ctx ends; it owns the worker
// goroutines and the retry schedule, waits for the workers to stop, and
// returns ctx's error. Retries not yet due when ctx ends are abandoned.
func (d *Deliverer) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer d.running.Store(false)
	var wg sync.WaitGroup
	defer wg.Wait()
	for range d.cfg.Workers {
		wg.Go(func() { d.work(ctx) })
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, next := d.popDue(time.Now())
		for _, j := range due {
			if !j.cb.fromHost() {
				d.others.Add(1)
			}
			select {
			case d.queue <- j:
			case <-ctx.Done():
				if !j.cb.fromHost() {
					d.others.Add(-1)
				}
				return ctx.Err()
			}
		}
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.wake:
		case <-timer.C:
		}
	}
}

func (d *Deliverer) popDue(now time.Time) (due []delivery, next time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.retries.Len() > 0 && !d.retries[0].due.After(now) {
		due = append(due, heap.Pop(&d.retries).(delivery))
	}
	if d.retries.Len() > 0 {
		next = d.retries[0].due
	}
	return due, next
}

func (d *Deliverer) retryLater(j delivery) {
	d.mu.Lock()
	heap.Push(&d.retries, j)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *Deliverer) work(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-d.queue:
			if !j.cb.fromHost() {
				d.others.Add(-1)
			}
			d.try(ctx, j)
		}
	}
}

func (d *Deliverer) try(ctx context.Context, j delivery) {
	start := time.Now()
	err := d.deliver(ctx, j.cb)
	j.attempt++
	attrs := []any{"mon_name", j.cb.MonName, "state", j.cb.State, "callback", j.cb.Reg.Callback,
		"my_name", j.cb.Reg.ID.My.MyName, "prog", j.cb.Reg.ID.My.Prog, "vers", j.cb.Reg.ID.My.Vers,
		"proc", j.cb.Reg.ID.My.Proc, "attempt", j.attempt}
	switch {
	case err == nil:
		d.m.callback("delivered")
		d.log.Info("lock manager notified", attrs...)
		d.done(j, nil)
	case ctx.Err() != nil:
		// Shutting down: the callback is abandoned with the rest.
	case j.attempt >= d.cfg.Attempts:
		d.m.callback("failed")
		d.log.Error("lock manager callback failed; giving up", append(attrs, "err", err)...)
		d.done(j, err)
	default:
		d.m.callback("retried")
		d.log.Warn("lock manager callback failed; will retry", append(attrs, "err", err, "in", d.cfg.Interval)...)
		j.due = start.Add(d.cfg.Interval)
		d.retryLater(j)
	}
}

func (d *Deliverer) done(j delivery, err error) {
	if d.cfg.Done != nil {
		d.cfg.Done(j.cb, j.attempt, err)
	}
}

// deliver makes one try: GETPORT at the callback host, then the call.
func (d *Deliverer) deliver(ctx context.Context, cb Callback) error {
	host := cb.Reg.Callback.Unmap()
	if !host.IsValid() || host.IsUnspecified() {
		host = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	my := cb.Reg.ID.My
	pctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	pmAddr := netip.AddrPortFrom(host, uint16(d.cfg.PmapPort)).String()
	pm := oncrpc.NewPmapClient(pmAddr, oncrpc.ClientConfig{Net: "udp", Addr: pmAddr, Timeout: d.cfg.Timeout})
	port, err := pm.GetPort(pctx, my.Prog, my.Vers, oncrpc.IPProtoUDP)
	if err != nil {
		return fmt.Errorf("nsm: portmapper GETPORT %d/%d at %s: %w", my.Prog, my.Vers, host, err)
	}
	addr := netip.AddrPortFrom(host, port).String()
	cctx, ccancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer ccancel()
	ccfg := oncrpc.ClientConfig{Net: "udp", Addr: addr, Timeout: d.cfg.Timeout, Privileged: !d.cfg.Unprivileged}
	cl, err := oncrpc.Dial(cctx, ccfg)
	if err != nil && ccfg.Privileged && (errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)) {
		// Not root: send anyway (a lock manager other than Linux lockd may
		// accept it), and say why Linux lockd will not.
		d.log.Warn("cannot bind a privileged source port; Linux lockd drops unprivileged callbacks", "err", err)
		ccfg.Privileged = false
		cl, err = oncrpc.Dial(cctx, ccfg)
	}
	if err != nil {
		return fmt.Errorf("nsm: dial lock manager at %s: %w", addr, err)
	}
	defer cl.Close()
	st := nlm.Status{MonName: cb.MonName, State: cb.State, Priv: cb.Reg.Priv}
	if err := cl.Call(cctx, my.Prog, my.Vers, my.Proc, &st, nil); err != nil {
		return fmt.Errorf("nsm: callback %d/%d/%d at %s: %w", my.Prog, my.Vers, my.Proc,
			addr+" (from port "+strconv.Itoa(int(cl.LocalAddr().Port()))+")", err)
	}
	return nil
}

// retryHeap orders pending retries by due time.
type retryHeap []delivery

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h retryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *retryHeap) Push(x any)        { *h = append(*h, x.(delivery)) }
func (h *retryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
