package nsm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nlm"
	"github.com/nsmd/nsmd/oncrpc"
)

// MaxAddrs caps the addresses stored for a monitored host.
const MaxAddrs = 16

// Config configures a Service. Zero values take the documented defaults.
type Config struct {
	// NodeID names this node in registrations: the node that took an
	// SM_MON delivers its callbacks. Required.
	NodeID string
	// Trusted are caller prefixes allowed to use SM_MON, SM_UNMON,
	// SM_UNMON_ALL and SM_SIMU_CRASH besides LoopbackTrusted (remote lock
	// managers, e.g. NFS-Ganesha on another host).
	Trusted []netip.Prefix
	// LoopbackTrusted are the "local host" prefixes, trusted like
	// rpc.statd trusts 127.0.0.1. Default 127.0.0.0/8 and ::1. Tests narrow
	// it (e.g. to 127.0.0.1/32) to play an untrusted caller on 127.0.0.9.
	LoopbackTrusted []netip.Prefix
	// AllowAnyCallback accepts any my_prog/my_proc in SM_MON. By default,
	// as rpc.statd, my_prog must be 100021 (NLM) and my_proc 16 or 24.
	AllowAnyCallback bool
	// Resolve resolves a mon_name that is not an IP literal (a literal is
	// its own address) to its addresses; SM_MON fails unless it returns at
	// least one. Default DefaultResolve.
	Resolve func(ctx context.Context, name string) ([]netip.Addr, error)
	// ResolveTimeout bounds one Resolve call. Default 5 s.
	ResolveTimeout time.Duration
	// Logger receives refusals and errors. Default: discard.
	Logger *slog.Logger
	// Metrics is optional.
	Metrics *Metrics
	// ReadyWait bounds how long a call over TCP that needs the current
	// sm_state waits for the Registry to become Ready before it is
	// dropped: a TCP caller does not retransmit before its own (often long)
	// timeout. Over UDP such a call is dropped at once and the caller
	// retransmits. Default 5 s; negative: drop at once on TCP too.
	ReadyWait time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// ReadyPoll is how often Ready is checked again, once for all the
	// calls held for readiness, besides the events of a Registry that is a
	// ReadyNotifier. Default
	// 2 ms, or 100 ms with a ReadyNotifier (its events carry the changes;
	// the poll only catches what has none, e.g. a lease getting fresh).
	ReadyPoll time.Duration
	// MaxRegistrations caps the registrations: an SM_MON that would add
	// one beyond it (not a repeat, which replaces) is refused stat_fail,
	// counted as nsmd_mon_refused_total{reason="registrations_cap"}. It
	// needs a Registry that is a Counter; 0: no cap.
	MaxRegistrations int
	// UnmonCounts reports whether an SM_UNMON or SM_UNMON_ALL taken now
	// may remove registrations (nil: always). On a node whose NFS server
	// runs only while it serves, its lock manager stops with that server
	// and unmonitors every host it monitored as it goes (Linux lockd does,
	// seen on 6.12): those hosts still hold locks that the next server
	// must tell them to reclaim, so while the node does not serve, the
	// unmonitor is answered as a success and removes nothing (counted in
	// nsmd_unmon_kept_total). A host that did release its locks costs one
	// spurious SM_NOTIFY at the next failover.
	UnmonCounts func() bool
	// NotifyBurst and NotifyEvery limit the SM_NOTIFYs committed per
	// sender address and per mon_name: a bucket of NotifyBurst tokens,
	// one back every NotifyEvery (defaults 4 and 10 s; NotifyBurst < 0:
	// no limit). NotifyTrack buckets of each kind are kept (default
	// 65536; the least recently used go).
	//
	// A notification sent from an address of the host it names, and one
	// sent from anywhere else (rpc.statd accepts both), draw on separate
	// per-name buckets when the Registry is a SenderChecker: notifications
	// forged for a name from other addresses cannot use up the host's own.
	NotifyBurst int
	NotifyEvery time.Duration
	NotifyTrack int
	// NotifyStrictSender accepts an SM_NOTIFY only when it comes from one
	// of the addresses of the host it names (the Registry must be a
	// SenderChecker). rpc.statd's rule, the default, accepts it when
	// mon_name or the sender's address matches a monitored host, so a
	// host that reboots with a new address, or notifies from another
	// interface, is still heard; strict mode does not hear those, and an
	// attacker must then forge the host's own source address.
	NotifyStrictSender bool
	// NotifyOn reports whether an SM_NOTIFY that arrived on local (the
	// address it was sent to; invalid when unknown) is taken at all (nil:
	// every one). The limits above are this node's; in a cluster the
	// agent takes SM_NOTIFY only on the VIP, so the budgets hold for the
	// cluster however many members a sender sprays (DESIGN.md, "SM_NOTIFY
	// is taken on the VIP"). One refused is answered void, as statd
	// answers one it ignores, and counted result="not_vip".
	NotifyOn func(local netip.Addr) bool
	// MonUnprivBurst and MonUnprivEvery bound the new hosts that local
	// callers from an unprivileged source port (≥ 1024: not lockd, not a
	// root process) may have monitored: an SM_MON from loopback naming a
	// mon_name that no registration names yet takes a token from one
	// bucket of MonUnprivBurst, one back every MonUnprivEvery (defaults 32
	// and 10 min; MonUnprivBurst < 0: no bound); without one it is refused
	// stat_fail, counted as nsmd_mon_refused_total{reason=
	// "unprivileged_limit"}. Every loopback address and port is the same
	// caller; trusted remote callers are not bounded. It needs a Registry
	// that is a HostChecker (else no bound).
	MonUnprivBurst int
	MonUnprivEvery time.Duration
}

// HostChecker is what a Registry offers for Config.MonUnprivBurst:
// whether any registration names a host (a local read).
type HostChecker interface {
	Monitored(monName string) bool
}

// ReadyNotifier is what a Registry may offer so that calls held for
// readiness wait on one event instead of each polling: ReadyChanged
// returns a channel closed at the next event that may make Ready true
// (a takeover applied, leadership moved).
type ReadyNotifier interface {
	ReadyChanged() <-chan struct{}
}

// Counter is what a Registry offers for Config.MaxRegistrations: how many
// registrations there are, and whether one exists (a repeat SM_MON
// replaces it and adds none).
type Counter interface {
	Count() int
	Has(id fsm.MonID) bool
}

func (c *Config) setDefaults() {
	if c.LoopbackTrusted == nil {
		c.LoopbackTrusted = defaultLoopback()
	}
	if c.Resolve == nil {
		c.Resolve = DefaultResolve
	}
	if c.ResolveTimeout == 0 {
		c.ResolveTimeout = 5 * time.Second
	}
	if c.ReadyWait == 0 {
		c.ReadyWait = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.NotifyBurst == 0 {
		c.NotifyBurst = 4
	}
	if c.NotifyEvery == 0 {
		c.NotifyEvery = 10 * time.Second
	}
	if c.NotifyTrack == 0 {
		c.NotifyTrack = 1 << 16
	}
	if c.MonUnprivBurst == 0 {
		c.MonUnprivBurst = 32
	}
	if c.MonUnprivEvery == 0 {
		c.MonUnprivEvery = 10 * time.Minute
	}
}

// Validate reports a configuration that cannot work.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeID == "" {
		errs = append(errs, errors.New("nsm: NodeID is empty"))
	}
	for _, p := range append(append([]netip.Prefix(nil), c.Trusted...), c.LoopbackTrusted...) {
		if !p.IsValid() {
			errs = append(errs, fmt.Errorf("nsm: invalid trusted prefix %v", p))
		}
	}
	if c.ResolveTimeout < 0 {
		errs = append(errs, errors.New("nsm: ResolveTimeout is negative"))
	}
	return errors.Join(errs...)
}

// DefaultResolve resolves name as an IP literal, else through DNS (the
// system resolver). IPv4-mapped results are unmapped; at most MaxAddrs
// distinct addresses are returned.
func DefaultResolve(ctx context.Context, name string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(name); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil, fmt.Errorf("nsm: resolve %q: %w", name, err)
	}
	return normAddrs(addrs), nil
}

// normAddrs unmaps, drops invalid and duplicate addresses and caps at MaxAddrs.
func normAddrs(in []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, min(len(in), MaxAddrs))
	for _, a := range in {
		a = a.Unmap()
		if !a.IsValid() || len(out) == MaxAddrs {
			continue
		}
		dup := false
		for _, b := range out {
			if a == b {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, a)
		}
	}
	return out
}

// Service serves NSM version 1 (Program) as an oncrpc.Handler. It checks
// callers and arguments, then reads and writes state only through its
// Registry. It is safe for concurrent use.
type Service struct {
	reg   Registry
	cfg   Config
	log   *slog.Logger
	m     *Metrics
	limit *notifyLimiter // nil: SM_NOTIFY not limited
	// monLimit bounds new hosts from unprivileged callers (nil: none).
	monLimit *monLimiter
	// refuseLog spaces the refusal log lines per caller address.
	refuseLog *logLimiter
	gate      *readyGate // where TCP calls held for readiness wait

	// Calls dropped while not ready: when that was last logged (Unix ns)
	// and how many since.
	notReadyLogged  atomic.Int64
	notReadyDropped atomic.Uint64
}

const (
	// notReadyLogEvery spaces the log lines about calls dropped while not ready.
	notReadyLogEvery = time.Second
	// readyPoll is how often Ready is checked again while TCP calls are
	// held for readiness (Ready is a few loads; one check for all the
	// held calls: readyGate) by default; readyPollNotified with a
	// ReadyNotifier.
	readyPoll         = 2 * time.Millisecond
	readyPollNotified = 100 * time.Millisecond
)

var _ oncrpc.Handler = (*Service)(nil)

// NewService creates a Service over reg.
func NewService(reg Registry, cfg Config) (*Service, error) {
	if reg == nil {
		return nil, errors.New("nsm: nil Registry")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	svc := &Service{reg: reg, cfg: cfg, log: cfg.Logger, m: cfg.Metrics, refuseLog: newLogLimiter(time.Minute, 4096)}
	poll := cfg.ReadyPoll
	if poll <= 0 {
		poll = readyPoll
		if _, ok := reg.(ReadyNotifier); ok {
			poll = readyPollNotified
		}
	}
	svc.gate = newReadyGate(reg, poll)
	if _, ok := reg.(SenderChecker); cfg.NotifyStrictSender && !ok {
		return nil, errors.New("nsm: NotifyStrictSender needs a Registry that is a SenderChecker")
	}
	if cfg.NotifyBurst > 0 {
		svc.limit = newNotifyLimiter(cfg.NotifyBurst, cfg.NotifyEvery, cfg.NotifyTrack)
	}
	if _, ok := reg.(HostChecker); ok && cfg.MonUnprivBurst > 0 {
		svc.monLimit = newMonLimiter(cfg.MonUnprivBurst, cfg.MonUnprivEvery, cfg.Now())
	}
	return svc, nil
}

// ServeRPC implements oncrpc.Handler: it dispatches on the procedure
// number (XNFS NSM: procedures 0–6). Unknown procedures get PROC_UNAVAIL,
// undecodable arguments GARBAGE_ARGS. Until the Registry is Ready, the
// procedures that answer or change sm_state get no reply (awaitReady,
// notReady).
func (s *Service) ServeRPC(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	switch c.Proc {
	case ProcStat, ProcMon, ProcUnmon, ProcUnmonAll, ProcSimuCrash:
		if !s.awaitReady(ctx, c) {
			return s.notReady(c)
		}
	}
	switch c.Proc {
	case ProcNull:
		return s.null(ctx, c, res)
	case ProcStat:
		return s.stat(ctx, c, res)
	case ProcMon:
		return s.mon(ctx, c, res)
	case ProcUnmon:
		return s.unmon(ctx, c, res)
	case ProcUnmonAll:
		return s.unmonAll(ctx, c, res)
	case ProcSimuCrash:
		return s.simuCrash(ctx, c, res)
	case ProcNotify:
		return s.notify(ctx, c, res)
	}
	return fmt.Errorf("nsm: procedure %d: %w", c.Proc, oncrpc.ErrProcUnavail)
}

// awaitReady reports whether the Registry is Ready; a call that did not
// come over UDP waits up to ReadyWait for it.
func (s *Service) awaitReady(ctx context.Context, c *oncrpc.Call) bool {
	if s.reg.Ready() {
		return true
	}
	if c.Net == "udp" || s.cfg.ReadyWait <= 0 {
		return false
	}
	deadline := time.NewTimer(s.cfg.ReadyWait)
	defer deadline.Stop()
	ready := s.gate.join()
	defer s.gate.leave()
	for {
		select {
		case <-ready:
			if s.reg.Ready() {
				return true
			}
			ready = s.gate.next()
		case <-deadline.C:
			return s.reg.Ready()
		case <-ctx.Done():
			return false
		}
	}
}

// notReady drops a call that would answer with, or act on, an sm_state
// this node does not know yet (a fresh node before its first takeover, a
// restarted one before it applied the current leader's): no reply, so the
// caller retransmits, as for an SM_NOTIFY that cannot be committed. It is
// counted, and logged at most once per notReadyLogEvery with the number
// of calls dropped since the last line.
func (s *Service) notReady(c *oncrpc.Call) error {
	s.m.notReadyInc(c.Proc)
	s.notReadyDropped.Add(1)
	now := s.cfg.Now().UnixNano()
	last := s.notReadyLogged.Load()
	if now-last >= int64(notReadyLogEvery) && s.notReadyLogged.CompareAndSwap(last, now) {
		s.log.Info("NSM calls dropped: this node does not know the current sm_state yet",
			"proc", procLabel(c.Prog, c.Proc), "caller", c.Remote.String(), "dropped", s.notReadyDropped.Swap(0))
	}
	return fmt.Errorf("nsm: procedure %d: %w: %w", c.Proc, ErrNotReady, oncrpc.ErrNoReply)
}

// decodeArgs decodes a procedure's arguments into v (nil for void) and
// insists they use the whole body: anything undecodable, too long or
// trailing is GARBAGE_ARGS (RFC 5531 accept_stat).
func decodeArgs(c *oncrpc.Call, proc string, v oncrpc.Unmarshaler) error {
	if c.Args == nil {
		if v == nil {
			return nil
		}
		return fmt.Errorf("nsm: %s: no arguments: %w", proc, oncrpc.ErrGarbageArgs)
	}
	if v != nil {
		if err := v.UnmarshalXDR(c.Args); err != nil {
			return fmt.Errorf("nsm: %s arguments: %w: %w", proc, oncrpc.ErrGarbageArgs, err)
		}
	}
	if err := c.Args.Done(); err != nil {
		return fmt.Errorf("nsm: %s arguments: %w: %w", proc, oncrpc.ErrGarbageArgs, err)
	}
	return nil
}

// refuse counts a refused request and logs it, at most once a minute per
// caller address (refuseLog), with the number of refusals held back.
func (s *Service) refuse(proc string, c *oncrpc.Call, err error, attrs ...any) {
	reason := refuseReason(err)
	s.m.monRefusedInc(reason)
	ok, held := s.refuseLog.allow(callerAddr(c.Remote), s.cfg.Now())
	if !ok {
		return
	}
	args := []any{"proc", proc, "caller", c.Remote.String(), "net", c.Net, "reason", reason, "err", err}
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	s.log.Warn("NSM request refused", append(args, attrs...)...)
}

func refuseReason(err error) string {
	switch {
	case errors.Is(err, ErrUntrusted):
		return "untrusted"
	case errors.Is(err, ErrNotPrivileged):
		return "not_privileged"
	case errors.Is(err, ErrBadCallback):
		return "bad_callback"
	case errors.Is(err, ErrBadName):
		return "bad_name"
	case errors.Is(err, ErrUnresolved):
		return "unresolved"
	case errors.Is(err, ErrTooMany):
		return "registrations_cap"
	case errors.Is(err, ErrUnprivLimit):
		return "unprivileged_limit"
	case errors.Is(err, fsm.ErrOwnedElsewhere):
		return "owned_elsewhere"
	}
	return "registry"
}

// checkMyID applies rpc.statd's checks to a my_id: a valid my_name and,
// unless AllowAnyCallback, the lock manager's program and callback procedure.
func (s *Service) checkMyID(my MyID) error {
	if !ValidName(my.MyName) {
		return fmt.Errorf("my_name %q: %w", my.MyName, ErrBadName)
	}
	if s.cfg.AllowAnyCallback {
		return nil
	}
	if my.Prog != nlm.Program || (my.Proc != nlm.ProcSMNotify && my.Proc != nlm.ProcSMNotifyAlt) {
		return fmt.Errorf("my_prog %d my_proc %d (want %d and %d or %d): %w",
			my.Prog, my.Proc, nlm.Program, nlm.ProcSMNotify, nlm.ProcSMNotifyAlt, ErrBadCallback)
	}
	return nil
}

// Registration builds the registration an accepted SM_MON commits.
func (s *Service) registration(c *oncrpc.Call, args *Mon, addrs []netip.Addr) fsm.Registration {
	return fsm.Registration{
		ID:       args.ID.FSM(),
		Priv:     args.Priv,
		Node:     s.cfg.NodeID,
		Callback: callbackAddr(c),
		Addrs:    addrs,
		Added:    s.cfg.Now(),
	}
}

// callbackAddr is where the lock manager that made call c is called back:
// over IPv4 loopback, where Linux lockd listens and checks the source,
// for a caller on loopback (whatever address it came from), else the
// caller's address.
func callbackAddr(c *oncrpc.Call) netip.Addr {
	if isLoopback(c.Remote) {
		return netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	return callerAddr(c.Remote)
}

// owner is the lock manager behind an SM_UNMON or SM_UNMON_ALL: this node
// and the caller's address as registration records it (127.0.0.1 for a
// loopback caller), so that it removes only what the same lock manager
// registered: lockd on this node, or the same trusted remote caller.
func (s *Service) owner(c *oncrpc.Call) fsm.Owner {
	return fsm.Owner{Node: s.cfg.NodeID, Callback: callbackAddr(c)}
}

// resolve resolves a mon_name with the configured resolver and timeout.
func (s *Service) resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ResolveTimeout)
	defer cancel()
	addrs, err := s.cfg.Resolve(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("mon_name %q: %w: %w", name, ErrUnresolved, err)
	}
	addrs = normAddrs(addrs)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("mon_name %q: no addresses: %w", name, ErrUnresolved)
	}
	return addrs, nil
}
