package fence

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"
)

// Device is an open watchdog device (the kernel's /dev/watchdog API).
//
// Opening a watchdog starts it (with the driver's current timeout); from
// then on the machine resets unless the device is pinged within its
// timeout. The kernel pings it on WDIOC_KEEPALIVE, on every write, on
// WDIOC_SETTIMEOUT, and on a close without the magic character, which is
// what a dying process does: that close leaves the watchdog running.
type Device interface {
	// Keepalive pings the watchdog (WDIOC_KEEPALIVE): the reset deadline
	// becomes now plus the device's timeout.
	Keepalive() error
	// SetTimeout sets the device's timeout in seconds (WDIOC_SETTIMEOUT)
	// and returns the timeout the driver took, which may differ from the
	// one asked for. The kernel pings the watchdog when it takes one. A
	// driver rejects a timeout out of its range with EINVAL, and then does
	// not ping.
	SetTimeout(seconds int) (int, error)
	// MagicClose writes the magic character "V", then closes: a driver
	// with WDIOF_MAGICCLOSE stops (unless the kernel was told nowayout).
	// The write pings. The device is closed even when an error is
	// returned.
	MagicClose() error
	// Close closes without the magic character: an armed watchdog keeps
	// running (the kernel pings it once) and resets the machine at the end
	// of its timeout.
	Close() error
}

// ErrNotArmed is returned by [Watchdog.Feed] when the watchdog is not
// armed: nothing would reset the machine, so a feed cannot protect it.
var ErrNotArmed = errors.New("watchdog not armed")

// ErrResetPending is returned by [Watchdog.Feed] and [Watchdog.Arm] after
// [Watchdog.ResetSoon]: the machine is about to be reset and must not be
// kept alive.
var ErrResetPending = errors.New("watchdog reset pending (ResetSoon was called)")

// ErrLeftRunning is wrapped by [OpenDevice] (and by fakes that stand in
// for it) when the watchdog is already running with nobody holding it: a
// process that held it died without disarming it. Opening it would let
// this process feed a deadline that belongs to the dead one, so it is not
// opened, and the machine resets when it expires.
var ErrLeftRunning = errors.New("watchdog left running by a process that died without disarming it")

// ErrNoProof is returned by [Watchdog.FeedWithin] when the proof it was
// given had already ended: nothing was pinged (the caller starves).
var ErrNoProof = errors.New("no proof that this node may serve")

// ErrLateFeed is returned by [Watchdog.FeedWithin] when the ping returned
// after the proof it was given had ended: it may have landed after it, so
// the watchdog was starved at once towards the end of that proof plus the
// timeout.
var ErrLateFeed = errors.New("the watchdog's ping returned after its proof ended")

// ErrNoWayOut is wrapped by [OpenDevice], [Probe] (and fakes) when sysfs
// says the watchdog was built or loaded with nowayout
// (CONFIG_WATCHDOG_NOWAYOUT, softdog nowayout=1): once opened it can never
// be stopped, so every open — the release at each start, each takeover —
// would reset the machine a timeout after the next stop.
var ErrNoWayOut = errors.New("the watchdog has nowayout set: once opened it can never be stopped, and it would reset this machine after every stop of nsmd; load its driver with nowayout=0 (e.g. softdog.nowayout=0 on the kernel command line, or options softdog nowayout=0 in /etc/modprobe.d; a kernel built with CONFIG_WATCHDOG_NOWAYOUT needs the parameter too), or set fence_watchdog: off and use a fence_agent")

// ErrHeldByOther is wrapped by [OpenDevice], [Probe] (and fakes) when
// another process holds the watchdog open (a watchdog daemon, systemd's
// RuntimeWatchdogSec, sbd): this node cannot arm it, so it cannot serve.
var ErrHeldByOther = errors.New("the watchdog is held by another process")

// ErrNotRunning is wrapped by [OpenDeviceLeftRunning] (and fakes) when
// sysfs says the watchdog is not running: there is nothing to release, and
// opening it would start it. [Watchdog.Release] then does nothing.
var ErrNotRunning = errors.New("the watchdog is not running")

// WatchdogConfig configures a [Watchdog].
type WatchdogConfig struct {
	// Path is the watchdog device, e.g. /dev/watchdog.
	Path string
	// Timeout is the reset timeout while fed: whole seconds, at least 2 s.
	Timeout time.Duration
	// Open opens the device; nil means [OpenDevice]. Tests inject a fake.
	Open func(path string) (Device, error)
	// OpenLeftRunning opens it also when a process that died left it
	// running, for [Watchdog.Release]; nil means [OpenDeviceLeftRunning].
	OpenLeftRunning func(path string) (Device, error)
	// Logger receives state changes (armed, starving, reset soon,
	// disarmed); nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// WatchdogStatus is a [Watchdog]'s state, for the operator surface.
type WatchdogStatus struct {
	Device   string
	Armed    bool
	Timeout  time.Duration // the configured one
	LastFeed time.Time     // zero: never
	// Deadline is when the kernel will reset the machine if nothing else
	// happens (zero when disarmed). It stays set after a failed Disarm,
	// which leaves the watchdog running.
	Deadline time.Time
	Starving bool // not fed for lack of proof
	// ResetPending: ResetSoon was called; feeding is refused until Disarm.
	ResetPending bool
	// DeviceTimeout is the timeout the device has now (shrunk while
	// starving); zero when not open.
	DeviceTimeout time.Duration
}

// Watchdog is the fencing policy over a watchdog [Device]: arm before
// serving, feed only with proof, starve otherwise, disarm after stopping
// (see the package documentation). It has no goroutine of its own: the
// caller decides, at each of its ticks, whether to Feed or Starve, and
// must do so well within the timeout. There is no Close: a process that
// exits without Disarm leaves the watchdog running, as it must. Its
// methods are safe for concurrent use.
type Watchdog struct {
	cfg     WatchdogConfig
	timeout int // cfg.Timeout in seconds
	log     *slog.Logger

	mu  sync.Mutex
	dev Device // nil when not open
	// running: the kernel's timer runs (kernelDeadline is meaningful);
	// true while dev is open, and after a failed Disarm.
	running        bool
	devTimeout     int       // the device's timeout now, in seconds
	kernelDeadline time.Time // last ping + devTimeout, as far as we know
	lastFeed       time.Time // last Arm or Feed
	proofDeadline  time.Time // D: lastFeed + timeout
	starving       bool
	resetPending   bool
	// minTimeout is the shortest timeout the driver takes, learned from
	// EINVAL answers and from timeouts it raised; 1 until then.
	minTimeout int
	// took: how long the last ioctls that ping took (a ring); a shrink
	// asks for that much less, since its own ping lands when it returns.
	took  [8]time.Duration
	tookN int
}

// NewWatchdog checks cfg and returns a Watchdog that is not armed: it
// does not touch the device until Arm (or ResetSoon).
func NewWatchdog(cfg WatchdogConfig) (*Watchdog, error) {
	if cfg.Path == "" {
		return nil, errors.New("watchdog: no device path")
	}
	if cfg.Timeout < 2*time.Second {
		return nil, fmt.Errorf("watchdog %s: timeout %v is too short: it must be at least 2s (the device counts whole seconds, and starving shrinks it towards 1s)", cfg.Path, cfg.Timeout)
	}
	if cfg.Timeout%time.Second != 0 {
		return nil, fmt.Errorf("watchdog %s: timeout %v is not a whole number of seconds (the device counts whole seconds)", cfg.Path, cfg.Timeout)
	}
	if cfg.Timeout > 65535*time.Second {
		return nil, fmt.Errorf("watchdog %s: timeout %v is too long (at most 65535s)", cfg.Path, cfg.Timeout)
	}
	if cfg.Open == nil {
		cfg.Open = OpenDevice
	}
	if cfg.OpenLeftRunning == nil {
		cfg.OpenLeftRunning = OpenDeviceLeftRunning
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Watchdog{
		cfg:        cfg,
		timeout:    int(cfg.Timeout / time.Second),
		log:        cfg.Logger.With("device", cfg.Path),
		minTimeout: 1,
	}, nil
}

// Arm opens the device if it is not open, sets Timeout, and pings: from
// now the machine resets unless Feed is called within Timeout. Idempotent
// while armed (then it only feeds, with the same meaning as Feed: call it
// only with proof). It refuses after ResetSoon ([ErrResetPending]) and
// when the driver does not take Timeout exactly (it then disarms the
// device it opened).
func (w *Watchdog) Arm() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.resetPending {
		return fmt.Errorf("arm watchdog %s: %w", w.cfg.Path, ErrResetPending)
	}
	if w.dev != nil {
		return w.feedLocked("arm")
	}
	dev, err := w.cfg.Open(w.cfg.Path)
	if err != nil {
		return fmt.Errorf("arm watchdog: %w", err)
	}
	// The open started the watchdog with the driver's current timeout.
	got, err := dev.SetTimeout(w.timeout)
	if err == nil && got != w.timeout {
		err = fmt.Errorf("the driver took %ds for the %ds asked: set fence_watchdog's timeout to one it supports", got, w.timeout)
	}
	if err != nil {
		err = fmt.Errorf("arm watchdog %s: set timeout %ds: %w", w.cfg.Path, w.timeout, err)
		if cerr := dev.MagicClose(); cerr != nil {
			// It was opened, so it runs; all we know is its timeout.
			w.running = true
			w.devTimeout = got
			w.kernelDeadline = w.cfg.Now().Add(time.Duration(max(got, w.timeout)) * time.Second)
			return errors.Join(err, fmt.Errorf("and disarming it again failed, so it keeps running and resets the machine: %w", cerr))
		}
		return err
	}
	now := w.cfg.Now()
	w.dev = dev
	w.running = true
	w.setFedLocked(now)
	w.log.Info("watchdog armed", "timeout", w.cfg.Timeout, "deadline", w.kernelDeadline)
	return nil
}

// Feed pings; the kernel's deadline becomes now+Timeout. Only the caller
// knows whether it may: call it only with proof that this node may serve.
// After a Starve it first restores the device's timeout to Timeout (which
// pings too). It fails with [ErrNotArmed] when not armed and with
// [ErrResetPending] after ResetSoon; when the device fails, the deadline
// has not moved.
func (w *Watchdog) Feed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.feedLocked("feed")
}

func (w *Watchdog) feedLocked(what string) error {
	if w.resetPending {
		return fmt.Errorf("%s watchdog %s: %w", what, w.cfg.Path, ErrResetPending)
	}
	if w.dev == nil {
		return fmt.Errorf("%s watchdog %s: %w", what, w.cfg.Path, ErrNotArmed)
	}
	if w.devTimeout != w.timeout {
		got, err := w.setTimeoutLocked(w.timeout)
		if err != nil {
			return fmt.Errorf("%s watchdog %s: restore timeout %ds: %w", what, w.cfg.Path, w.timeout, err)
		}
		if got != w.timeout {
			// It pinged with got: that is the deadline now.
			w.devTimeout = got
			w.kernelDeadline = w.cfg.Now().Add(time.Duration(got) * time.Second)
			return fmt.Errorf("%s watchdog %s: restore timeout: the driver took %ds for the %ds asked", what, w.cfg.Path, got, w.timeout)
		}
		if w.starving {
			w.log.Info("watchdog fed again after starving")
		}
	} else if err := w.keepaliveLocked(); err != nil {
		return fmt.Errorf("%s watchdog %s: keepalive: %w", what, w.cfg.Path, err)
	} else if w.starving {
		w.log.Info("watchdog fed again after starving")
	}
	w.setFedLocked(w.cfg.Now())
	return nil
}

// setFedLocked records a ping with the full timeout at now.
func (w *Watchdog) setFedLocked(now time.Time) {
	w.devTimeout = w.timeout
	w.lastFeed = now
	w.proofDeadline = now.Add(w.cfg.Timeout)
	w.kernelDeadline = w.proofDeadline
	w.starving = false
}

// Starve is called instead of Feed while the caller cannot prove it may
// serve. It keeps the kernel's reset deadline from moving past D, the
// deadline of the last Feed or Arm: since the kernel pings on SETTIMEOUT
// and on an unclean close (a process death pings once), each call shrinks
// the device timeout to floor(D - now) seconds (at least 1), so that a
// process death resets the machine no later than D + 1 s + one call
// interval. Once the timeout cannot shrink any more (it is 1 s, or the
// shortest the driver takes), it leaves the device alone, since a
// SETTIMEOUT would ping. It never lengthens the timeout. It is a no-op when
// not armed and after ResetSoon.
func (w *Watchdog) Starve() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dev == nil || w.resetPending {
		return nil
	}
	now := w.cfg.Now()
	if !w.starving {
		w.starving = true
		w.log.Warn("watchdog starving: no proof that this node may serve", "reset_by", w.proofDeadline)
	}
	if err := w.shrinkLocked(w.wantLocked(now)); err != nil {
		return fmt.Errorf("starve watchdog %s: %w", w.cfg.Path, err)
	}
	return nil
}

// wantLocked is the timeout, in whole seconds (at least 1), that a
// SETTIMEOUT asked at now may set without moving the reset past the proof
// deadline: what is left of it, less the slowest recent ping (a
// SETTIMEOUT's ping lands when the ioctl returns, at worst).
func (w *Watchdog) wantLocked(now time.Time) int {
	left := w.proofDeadline.Sub(now) - w.slowestLocked()
	if left < 2*time.Second {
		return 1
	}
	return int(left / time.Second)
}

// FeedWithin is Feed bound to a proof: proofEnd says until when this node
// may serve (zero or past: no proof); the caller passes a function so that
// it is asked again when the ping returns. A ping lands somewhere between
// the ioctl's call and its return, and a slow driver (ipmi_watchdog asks
// the board's BMC; a stalled process) may return seconds later: then the
// reset would move past proof + timeout, the bound a successor waits for.
// So it pings only while the proof holds ([ErrNoProof] otherwise, nothing
// pinged), and if the ping returned after the proof ended — asked again
// then, so a proof renewed meanwhile counts — it starves at once towards
// the end of that proof + Timeout, less the slowest recent ping, and
// returns [ErrLateFeed]. The kernel's deadline then stays within the
// proof's end + Timeout (+ the whole-second rounding), as long as the
// shrinking SETTIMEOUT is no slower than the slowest of the last pings.
func (w *Watchdog) FeedWithin(proofEnd func() time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	end := proofEnd()
	if !w.cfg.Now().Before(end) {
		return fmt.Errorf("feed watchdog %s: %w", w.cfg.Path, ErrNoProof)
	}
	if err := w.feedLocked("feed"); err != nil {
		return err
	}
	returned := w.lastFeed
	if e := proofEnd(); e.After(end) {
		end = e
	}
	if !returned.After(end) {
		return nil
	}
	// The ping may have landed after the proof ended: the promise is
	// end + Timeout, not returned + Timeout.
	w.proofDeadline = end.Add(w.cfg.Timeout)
	w.starving = true
	w.log.Warn("watchdog ping returned after its proof ended: starving it at once", "proof_end", end, "returned", returned, "reset_by", w.proofDeadline)
	err := fmt.Errorf("feed watchdog %s: %w (%v after the proof ended at %s)", w.cfg.Path, ErrLateFeed, returned.Sub(end).Round(time.Millisecond), end.Format(time.RFC3339Nano))
	if serr := w.shrinkLocked(w.wantLocked(w.cfg.Now())); serr != nil {
		return errors.Join(err, fmt.Errorf("starve watchdog %s: %w", w.cfg.Path, serr))
	}
	return err
}

// keepaliveLocked pings and notes how long the ioctl took.
func (w *Watchdog) keepaliveLocked() error {
	start := w.cfg.Now()
	err := w.dev.Keepalive()
	w.tookLocked(w.cfg.Now().Sub(start))
	return err
}

// setTimeoutLocked sets the device's timeout and notes how long it took.
func (w *Watchdog) setTimeoutLocked(seconds int) (int, error) {
	start := w.cfg.Now()
	got, err := w.dev.SetTimeout(seconds)
	w.tookLocked(w.cfg.Now().Sub(start))
	return got, err
}

func (w *Watchdog) tookLocked(d time.Duration) {
	w.took[w.tookN%len(w.took)] = d
	w.tookN++
}

// slowestLocked is the longest of the last ioctls that pinged.
func (w *Watchdog) slowestLocked() time.Duration {
	var m time.Duration
	for _, d := range w.took {
		m = max(m, d)
	}
	return m
}

// shrinkLocked sets the device's timeout to want seconds, or to the
// shortest above it that the driver takes, if that is shorter than the
// timeout it has: a timeout the driver rejects (EINVAL) does not ping, so
// it tries the next one up. It does nothing when the device's timeout is
// already that short.
func (w *Watchdog) shrinkLocked(want int) error {
	for req := max(want, w.minTimeout); req < w.devTimeout; req++ {
		got, err := w.setTimeoutLocked(req)
		if errors.Is(err, syscall.EINVAL) {
			w.minTimeout = req + 1
			continue
		}
		if err != nil {
			return fmt.Errorf("set timeout %ds: %w", req, err)
		}
		w.devTimeout = got
		w.kernelDeadline = w.cfg.Now().Add(time.Duration(got) * time.Second)
		if got > req {
			w.minTimeout = got
			w.log.Error("watchdog driver took a longer timeout than asked", "asked", req, "took", got, "deadline", w.kernelDeadline)
		}
		return nil
	}
	return nil
}

// ResetSoon sets the shortest timeout (1 s, or the shortest the driver
// takes) and stops feeding: used after a failed stop, when the node must
// not keep serving. If the watchdog is not armed it opens the device to
// do so. The machine resets about a second later; until Disarm, Feed and
// Arm are refused with [ErrResetPending] and Starve does nothing. It does
// not lengthen a timeout already that short. An error means the watchdog
// may not reset the machine: the caller must reset it another way.
func (w *Watchdog) ResetSoon() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dev == nil {
		dev, err := w.cfg.Open(w.cfg.Path)
		if err != nil {
			return fmt.Errorf("reset soon: %w", err)
		}
		w.dev = dev
		w.running = true
		// The driver's own timeout is unknown: try any up to ours.
		w.devTimeout = w.timeout + 1
		w.kernelDeadline = time.Time{}
	}
	w.resetPending = true
	w.starving = false
	if err := w.shrinkLocked(1); err != nil {
		return fmt.Errorf("reset soon: watchdog %s: %w", w.cfg.Path, err)
	}
	if w.devTimeout > w.timeout {
		return fmt.Errorf("reset soon: watchdog %s: the driver took no timeout from %ds to %ds; it resets the machine at the end of its own", w.cfg.Path, w.minTimeout, w.timeout)
	}
	w.log.Warn("watchdog set to reset the machine", "deadline", w.kernelDeadline)
	return nil
}

// Disarm writes the magic character and closes the device: a driver that
// supports the magic close stops, and the machine is not reset. Call it
// only after the node has stopped serving. It also cancels a ResetSoon.
// Idempotent when not armed. A kernel booted with nowayout (or a driver
// built so) ignores the magic character: the watchdog then keeps running
// and resets the machine at the end of its timeout; nothing in the device
// API tells a process so.
func (w *Watchdog) Disarm() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dev == nil {
		return nil
	}
	err := w.dev.MagicClose()
	w.dev = nil
	w.starving = false
	w.resetPending = false
	if err != nil {
		// The close without "V" pinged: the watchdog runs on.
		w.kernelDeadline = w.cfg.Now().Add(time.Duration(w.devTimeout) * time.Second)
		w.log.Error("watchdog disarm failed: it keeps running", "deadline", w.kernelDeadline, "err", err)
		return fmt.Errorf("disarm watchdog %s: %w (it keeps running and resets the machine at %s)", w.cfg.Path, err, w.kernelDeadline.Format(time.RFC3339))
	}
	w.running = false
	w.devTimeout = 0
	w.kernelDeadline = time.Time{}
	w.log.Info("watchdog disarmed")
	return nil
}

// Release stops the watchdog once the node no longer serves: Disarm when
// this process armed it; otherwise it opens the device, also when a
// previous process of this node died and left it running (the open does
// not ping a running one), and magic-closes it at once. Where sysfs says
// the watchdog is not running it does not open it at all (a standby's
// start touches nothing: an open would start it). A process that
// restarts after a crash calls it only after it stopped what the dead one
// served; until then the left-running watchdog keeps counting down to the
// dead process's deadline, and resets the machine if the stop takes too
// long.
func (w *Watchdog) Release() error {
	w.mu.Lock()
	armed := w.dev != nil
	w.mu.Unlock()
	if armed {
		return w.Disarm()
	}
	dev, err := w.cfg.OpenLeftRunning(w.cfg.Path)
	if errors.Is(err, ErrNotRunning) {
		return nil // not opened: an open would start it
	}
	if err != nil {
		return fmt.Errorf("release watchdog: %w", err)
	}
	w.mu.Lock()
	w.dev, w.running = dev, true
	w.mu.Unlock()
	return w.Disarm()
}

// Status reports the state for the operator surface.
func (w *Watchdog) Status() WatchdogStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := WatchdogStatus{
		Device:       w.cfg.Path,
		Armed:        w.dev != nil,
		Timeout:      w.cfg.Timeout,
		LastFeed:     w.lastFeed,
		Starving:     w.starving,
		ResetPending: w.resetPending,
	}
	if w.running {
		s.Deadline = w.kernelDeadline
	}
	if w.dev != nil {
		s.DeviceTimeout = time.Duration(w.devTimeout) * time.Second
	}
	return s
}
