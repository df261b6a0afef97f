package vip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// NetlinkConfig configures the VIP of vip_mode netlink: an address the
// leader adds to a real interface with a kernel lifetime, so a holder that
// is killed or frozen loses it by itself (DESIGN invariant 3).
type NetlinkConfig struct {
	// Prefix is the VIP and its prefix length, e.g. 10.0.0.10/24.
	Prefix netip.Prefix
	// Interface is the name of the interface that carries the VIP.
	Interface string
	// Lifetime is the kernel's valid_lft (= preferred_lft) of the address:
	// how long it outlives a holder that stops renewing it. Whole seconds,
	// at least 1 s; default 2 s.
	Lifetime time.Duration
	// Refresh is how often the holder renews the lifetime, re-adds a
	// removed address and re-announces it. Default Lifetime/4; must be
	// shorter than Lifetime.
	Refresh time.Duration
	// Announce is how many gratuitous ARPs (IPv4) or unsolicited neighbour
	// advertisements (IPv6) go out on acquire, ~100 ms apart. Default 3.
	Announce int
	// Bind says where the address lives: BindInterface puts it on
	// Interface; BindProcess (IPv4 only) puts it on a TUN device that
	// this process creates and holds open, so the kernel deletes device
	// and address the moment the process dies, even by SIGKILL (the
	// lifetime still covers a frozen holder). The kernel answers ARP for
	// it on Interface (arp_ignore 0). BindAuto (""): process for IPv4
	// when /dev/net/tun and arp_ignore 0 allow it, else interface.
	Bind string
	// PrefixRoute: the kernel adds the route of the prefix with the
	// address (and drops it with it). Off by default: the interface's own
	// address already routes the prefix. A network namespace whose only
	// address is the VIP needs it: its replies have no route otherwise.
	PrefixRoute bool
	// Within, when set, runs every lookup of the interface: a VIP in a
	// network namespace of its own (made inside it: its sockets are that
	// namespace's) looks its interface up there too, from any goroutine.
	Within func(func() error) error
	// Logger gets the VIP's events; nil discards them.
	Logger *slog.Logger
	// Registerer gets the nsmd_vip_* metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// VIP bindings (NetlinkConfig.Bind).
const (
	BindAuto      = "auto"
	BindProcess   = "process"
	BindInterface = "interface"
)

const (
	defaultLifetime = 2 * time.Second
	defaultAnnounce = 3
	announceGap     = 100 * time.Millisecond
)

// withDefaults fills in zero fields.
func (c NetlinkConfig) withDefaults() NetlinkConfig {
	if c.Lifetime == 0 {
		c.Lifetime = defaultLifetime
	}
	if c.Refresh == 0 {
		c.Refresh = c.Lifetime / 4
	}
	if c.Announce == 0 {
		c.Announce = defaultAnnounce
	}
	return c
}

// Validate reports the first problem of the configuration; zero fields
// count as their defaults.
func (c NetlinkConfig) Validate() error {
	c = c.withDefaults()
	a := c.Prefix.Addr()
	switch {
	case !c.Prefix.IsValid():
		return errors.New("vip: prefix is not set (want an address in CIDR form, like 10.0.0.10/24)")
	case a.Is4In6():
		return fmt.Errorf("vip: %s is an IPv4-mapped IPv6 address; give the IPv4 form", c.Prefix)
	case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback():
		return fmt.Errorf("vip: %s cannot be a floating address (unspecified, multicast or loopback)", c.Prefix)
	case c.Interface == "":
		return errors.New("vip: interface is not set")
	case c.Bind != "" && c.Bind != BindAuto && c.Bind != BindProcess && c.Bind != BindInterface:
		return fmt.Errorf("vip: bind %q is not one of auto, process, interface", c.Bind)
	case c.Bind == BindProcess && !a.Is4():
		return fmt.Errorf("vip: bind process needs an IPv4 VIP (%s): Linux answers neighbour solicitations only for addresses on the receiving interface", c.Prefix)
	case c.Lifetime < time.Second || c.Lifetime%time.Second != 0:
		return fmt.Errorf("vip: lifetime %v must be whole seconds, at least 1s (the kernel counts valid_lft in seconds)", c.Lifetime)
	case c.Lifetime/time.Second > 1<<31:
		return fmt.Errorf("vip: lifetime %v is too long", c.Lifetime)
	case c.Refresh <= 0 || c.Refresh >= c.Lifetime:
		return fmt.Errorf("vip: refresh %v must be positive and shorter than the lifetime %v", c.Refresh, c.Lifetime)
	case c.Announce < 0:
		return fmt.Errorf("vip: announce %d must not be negative", c.Announce)
	}
	return nil
}

// link is the platform side of a Netlink: one address on one
// interface. Methods are safe for concurrent use.
type link interface {
	// resolve looks the interface up again (index, hardware address).
	resolve() error
	// replace adds the address, or renews its lifetime if present.
	replace() error
	// remove deletes every copy of the address on the interface (any
	// prefix length); it reports whether one was there.
	remove() (bool, error)
	// lookup reports the copy of the address on the interface, if any.
	lookup() (addrInfo, bool, error)
	// announce sends one round of gratuitous ARP or unsolicited NA and
	// returns how many packets went out.
	announce() (int, error)
	// diesWithProcess reports whether the address is on a device this
	// process holds (bind process).
	diesWithProcess() bool
	close() error
}

// addrInfo is what the kernel reports about the address.
type addrInfo struct {
	PrefixLen int
	Flags     uint32 // IFA_F_*
	Valid     uint32 // valid_lft left, seconds
	Preferred uint32
	ifindex   int // the interface it is on
}

var (
	// errReleased cancels a refresh loop from Release or Close.
	errReleased = errors.New("vip released")
	// errAbandoned stops a refresh loop without deleting the address,
	// as if the process had died (Abandon).
	errAbandoned = errors.New("vip abandoned")
)

// Netlink is the VIP of vip_mode netlink. It has what cluster.FloatingAddr
// asks for (Acquire, Release, Held, Lifetime) and the two optional methods
// the cluster node looks for: Abandon (an in-process crash) and
// DiesWithProcess (the crash fast path).
type Netlink struct {
	cfg  NetlinkConfig
	log  *slog.Logger
	link link
	m    metrics

	mu     sync.Mutex // serialises Acquire, Release and Close
	run    *hold      // the refresh loop of the current hold, or nil
	closed bool

	annMu  sync.Mutex
	annErr string // the last announcement failure, "" when the last one worked
}

// hold is one acquisition: its refresh loop and how to stop it.
type hold struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
	err    error // the loop's final delete, readable once done is closed
	// quiet: the address is held but not announced (WithQuietStart)
	// until Announce, which wakes the loop through speak.
	quiet atomic.Bool
	speak chan struct{}
}

// metrics are the nsmd_vip_* counters. Whether the VIP is held
// (nsmd_vip_held) is exported by the cluster node for every VIP mode,
// from Held.
type metrics struct {
	acquired      prometheus.Counter
	readded       prometheus.Counter
	announcements prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		acquired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_vip_acquired_total", Help: "Times this node acquired the VIP.",
		}),
		readded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_vip_readded_total", Help: "Times the held VIP was missing from the interface (removed by someone else, or expired after a stall) and was added again.",
		}),
		announcements: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_vip_announcements_total", Help: "Gratuitous ARP / unsolicited neighbour advertisement packets sent for the VIP.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	// A second Netlink of the same address (a service's, made anew in each
	// of its network namespaces) counts on in the first one's counters.
	for _, c := range []*prometheus.Counter{&m.acquired, &m.readded, &m.announcements} {
		err := reg.Register(*c)
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(prometheus.Counter); ok {
				*c, err = old, nil
			}
		}
		if err != nil {
			return m, fmt.Errorf("vip: register metrics: %w", err)
		}
	}
	return m, nil
}

// NewNetlink checks the configuration, opens the netlink and packet
// sockets (CAP_NET_ADMIN and CAP_NET_RAW), resolves the interface and
// removes a copy of the address that a crashed earlier run left behind.
func NewNetlink(cfg NetlinkConfig) (*Netlink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("vip", cfg.Prefix.String(), "interface", cfg.Interface)
	link, err := newLink(cfg, log)
	if err != nil {
		return nil, err
	}
	stale, err := link.remove()
	if err != nil {
		link.close()
		return nil, fmt.Errorf("vip: remove a stale %s from %s: %w", cfg.Prefix, cfg.Interface, err)
	}
	if stale {
		log.Warn("removed a stale copy of the VIP left on the interface by an earlier run")
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		link.close()
		return nil, err
	}
	return &Netlink{cfg: cfg, log: log, link: link, m: m}, nil
}

// Lifetime is the kernel valid_lft of the address.
func (v *Netlink) Lifetime() time.Duration { return v.cfg.Lifetime }

// DiesWithProcess reports whether the address goes with this process (bind
// process): then a previous holder whose process is gone no longer has it.
func (v *Netlink) DiesWithProcess() bool { return v.link.diesWithProcess() }

// Acquire adds the address (lifetime Lifetime, no prefix route, no DAD),
// announces it and starts renewing it every Refresh. It returns once the
// address is on the interface. The hold ends with Release, Close, or when
// ctx ends (then the address is dropped as by Release: a caller that lost
// the right to hold it must never keep renewing it).
func (v *Netlink) Acquire(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return errors.New("vip: acquire after close")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("vip: acquire: %w", err)
	}
	if r := v.run; r != nil {
		select {
		case <-r.done: // the previous hold ended with its context
			v.run = nil
		default:
			return nil // held already; the loop keeps it
		}
	}
	if err := v.link.resolve(); err != nil {
		return fmt.Errorf("vip: acquire %s: %w", v.cfg.Prefix, err)
	}
	if err := v.link.replace(); err != nil {
		return fmt.Errorf("vip: add %s to %s: %w", v.cfg.Prefix, v.cfg.Interface, err)
	}
	renewed := time.Now()
	if err := ctx.Err(); err != nil { // lost the right while adding
		if _, derr := v.link.remove(); derr != nil {
			v.log.Error("cannot drop the VIP after the acquire was cancelled", "err", derr)
		}
		return fmt.Errorf("vip: acquire: %w", err)
	}
	v.m.acquired.Inc()
	quiet := quietStart(ctx)
	v.log.Info("VIP acquired", "lifetime", v.cfg.Lifetime, "refresh", v.cfg.Refresh, "announced", !quiet)
	if !quiet {
		v.announce()
	}
	rctx, cancel := context.WithCancelCause(ctx)
	r := &hold{cancel: cancel, done: make(chan struct{}), speak: make(chan struct{}, 1)}
	r.quiet.Store(quiet)
	v.run = r
	go v.loop(rctx, r, renewed)
	return nil
}

// Announce ends a quiet hold (WithQuietStart): the address is announced
// at once, as by a fresh Acquire, and on every refresh from now on. A
// no-op when not held or already announced.
func (v *Netlink) Announce() {
	v.mu.Lock()
	r := v.run
	v.mu.Unlock()
	if r != nil && r.quiet.CompareAndSwap(true, false) {
		select {
		case r.speak <- struct{}{}:
		default:
		}
	}
}

// Release stops renewing and deletes the address at once. Safe to call
// when not held.
func (v *Netlink) Release() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.releaseLocked()
}

func (v *Netlink) releaseLocked() error {
	r := v.run
	if r == nil {
		return nil
	}
	v.run = nil
	r.cancel(errReleased)
	<-r.done
	if r.err != nil {
		return fmt.Errorf("vip: delete %s from %s: %w", v.cfg.Prefix, v.cfg.Interface, r.err)
	}
	return nil
}

// Drop ends a hold as Release does and also deletes every copy of the
// address on the interface that this Netlink does not hold: one that an
// earlier process left there (bound to the interface, an address outlives
// a killed holder by its lifetime; added by hand, for ever). No copy
// there is no error. After Close it does what Close did: nothing.
func (v *Netlink) Drop() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	err := v.releaseLocked()
	if v.closed {
		return err
	}
	stale, rerr := v.link.remove()
	if rerr != nil {
		return errors.Join(err, fmt.Errorf("vip: delete %s from %s: %w", v.cfg.Prefix, v.cfg.Interface, rerr))
	}
	if stale {
		v.log.Warn("removed a copy of the VIP this process did not hold (left by an earlier run)")
	}
	return err
}

// Abandon stops renewing without deleting the address, as a crashed
// process would: the kernel drops it when its lifetime runs out. For
// simulated crashes (in-process kills, drills); Release after it is a
// no-op.
func (v *Netlink) Abandon() {
	v.mu.Lock()
	r := v.run
	v.run = nil
	v.mu.Unlock()
	if r != nil {
		r.cancel(errAbandoned)
		<-r.done
		v.log.Warn("VIP abandoned: no longer renewed, the kernel drops it when its lifetime ends")
	}
}

// Held reports whether the address is acquired and present on the
// interface now.
func (v *Netlink) Held() bool {
	v.mu.Lock()
	r := v.run
	v.mu.Unlock()
	if r == nil {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
	}
	_, ok, err := v.link.lookup()
	return err == nil && ok
}

// Close releases the address and closes the sockets.
func (v *Netlink) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil
	}
	err := v.releaseLocked()
	v.closed = true
	return errors.Join(err, v.link.close())
}

// announce sends one round of announcements and counts the packets. A
// failure is logged when it first happens (not every refresh).
func (v *Netlink) announce() {
	n, err := v.link.announce()
	v.m.announcements.Add(float64(n))
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	v.annMu.Lock()
	changed := msg != v.annErr
	v.annErr = msg
	v.annMu.Unlock()
	switch {
	case err != nil && changed:
		v.log.Warn("cannot announce the VIP", "err", err)
	case err != nil:
		v.log.Debug("cannot announce the VIP", "err", err)
	case changed:
		v.log.Info("announcing the VIP works again")
	}
}

// loop keeps one hold: the rest of the acquire burst, then every Refresh a
// renewal (re-adding a removed address) and an announcement. When ctx ends
// it deletes the address.
func (v *Netlink) loop(ctx context.Context, r *hold, renewed time.Time) {
	defer close(r.done)
	defer func() {
		if errors.Is(context.Cause(ctx), errAbandoned) {
			return
		}
		gone, err := v.link.remove()
		r.err = err
		switch {
		case err != nil:
			v.log.Error("cannot delete the VIP", "err", err)
		case !errors.Is(context.Cause(ctx), errReleased):
			v.log.Warn("acquire context ended without a release; VIP dropped", "was_present", gone)
		default:
			v.log.Info("VIP released", "was_present", gone)
		}
	}()
	burst := v.cfg.Announce - 1
	if r.quiet.Load() {
		burst = 0 // Announce starts it
	}
	burstT := time.NewTimer(announceGap)
	defer burstT.Stop()
	if burst <= 0 {
		burstT.Stop()
	}
	tick := time.NewTicker(v.cfg.Refresh)
	defer tick.Stop()
	gated := false // a renewal was skipped by the renew gate
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.speak:
			v.log.Info("announcing the VIP")
			v.announce()
			if burst = v.cfg.Announce - 1; burst > 0 {
				burstT.Reset(announceGap)
			}
		case <-burstT.C:
			v.announce()
			if burst--; burst > 0 {
				burstT.Reset(announceGap)
			}
		case <-tick.C:
			if gap := time.Since(renewed); gap > v.cfg.Lifetime {
				// Frozen (SIGSTOP, a stall) or failing for longer than the
				// lifetime: the kernel has dropped the address and another
				// node may have taken it. Give the leader loop one lifetime
				// to notice a lost leadership and release before re-adding.
				v.log.Warn("VIP renewal stalled past its lifetime; waiting before re-adding",
					"stalled", gap.Round(time.Millisecond), "wait", v.cfg.Lifetime)
				t := time.NewTimer(v.cfg.Lifetime)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			if ctx.Err() != nil {
				return
			}
			if gate := renewGate(ctx); gate != nil && !gate() {
				if !gated {
					v.log.Warn("VIP not renewed: leadership not confirmed by a quorum within the lease (a deposed leader whose raft loop is stuck, e.g. behind a slow disk)",
						"last_renewed", renewed)
				}
				gated = true
				continue
			}
			gated = false
			if ok, readded := v.refresh(!r.quiet.Load()); ok {
				renewed = time.Now()
				if readded && burst <= 0 && v.cfg.Announce > 1 && !r.quiet.Load() {
					// re-added: announce it like a fresh acquire
					burst = v.cfg.Announce - 1
					burstT.Reset(announceGap)
				}
			}
		}
	}
}

// refresh renews the address (re-adding it when missing) and, unless the
// hold is still quiet, announces it; it reports whether the address is on
// the interface again, and whether it had gone.
func (v *Netlink) refresh(announce bool) (ok, readded bool) {
	_, present, err := v.link.lookup()
	if err != nil {
		v.log.Warn("cannot look the VIP up", "err", err)
		present = true // unknown: do not count a re-add
	}
	err = v.link.replace()
	if err != nil && isNoDevice(err) {
		if rerr := v.link.resolve(); rerr == nil {
			err = v.link.replace()
		}
	}
	if err != nil {
		v.log.Error("cannot renew the VIP", "err", err)
		return false, false
	}
	if !present {
		v.m.readded.Inc()
		v.log.Warn("VIP was missing from the interface; added it again")
	}
	if announce {
		v.announce()
	}
	return true, !present
}

type renewGateKey struct{}

// WithRenewGate returns a context for FloatingAddr.Acquire under which the
// VIP is renewed only while ok() holds: the leader's read lease (a quorum
// confirmed its leadership within the lease). A new leader waits until a
// previous holder's address must have expired counting from that holder's
// last quorum contact (vipNotBefore); without the gate a deposed leader
// whose raft loop is stuck (behind fsyncs of a slow disk: it steps down
// only when its loop runs again) kept renewing — found by the checked
// schedules' slow-disk faults, the VIP on two nodes for 340 ms.
func WithRenewGate(ctx context.Context, ok func() bool) context.Context {
	return context.WithValue(ctx, renewGateKey{}, ok)
}

// WithQuietStart returns a context for Acquire under which the address is
// added and renewed but not announced (no gratuitous ARP or unsolicited
// NA) until Announce. Clients keep sending to the previous holder's
// hardware address meanwhile: a new leader takes the address before its
// on_leader hook (which checks that it holds it) and announces it once
// nfsd listens, so that no client reaches it in between and is refused.
func WithQuietStart(ctx context.Context) context.Context {
	return context.WithValue(ctx, quietKey{}, true)
}

type quietKey struct{}

func quietStart(ctx context.Context) bool {
	q, _ := ctx.Value(quietKey{}).(bool)
	return q
}

func renewGate(ctx context.Context) func() bool {
	f, _ := ctx.Value(renewGateKey{}).(func() bool)
	return f
}
