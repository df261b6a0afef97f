// Package fencetest holds fakes for tests of code that uses package
// fence: a watchdog device that computes the reset deadline as the
// kernel's watchdog core does, and a clock to drive it.
package fencetest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/nsmd/nsmd/fence"
)

// Clock is a manual clock, safe for concurrent use. Its zero value starts
// at a fixed instant (not at time zero, which reads as "never").
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// epoch is where a zero Clock starts.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		c.now = epoch
	}
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		c.now = epoch
	}
	c.now = c.now.Add(d)
}

// Op names an operation on a FakeDevice.
type Op string

// The operations a FakeDevice records.
const (
	OpOpen       Op = "open"
	OpKeepalive  Op = "keepalive"
	OpSetTimeout Op = "settimeout"
	OpMagicClose Op = "magicclose"
	OpClose      Op = "close" // without the magic character: a process death too
)

// Event is one operation on a FakeDevice.
type Event struct {
	Op Op
	At time.Time
	// Value is the timeout asked for (OpSetTimeout).
	Value int
	// Err is what the operation returned.
	Err error
	// Ping: the operation pinged the watchdog.
	Ping bool
	// Deadline is the reset deadline after the operation (zero: stopped).
	Deadline time.Time
}

// ErrMachineReset is returned by every operation on a FakeDevice after
// its deadline passed while it was running: the machine would have been
// reset, and nothing would be running to call it.
var ErrMachineReset = errors.New("fencetest: the watchdog has reset the machine")

// FakeDevice is a watchdog in a fake kernel. Its Open stands in for
// fence.OpenDevice (set it as WatchdogConfig.Open); the state outlives the
// handles it opens, as the kernel's does, so a test can make the process
// die (ProcessDied) and open it again. It keeps the deadline as the
// kernel's watchdog core does:
//
//   - opening a stopped watchdog starts it with its current timeout (a
//     ping);
//   - WDIOC_KEEPALIVE pings; WDIOC_SETTIMEOUT, when it takes the timeout,
//     pings with the new one, and rejects one out of [MinTimeout,
//     MaxTimeout] with EINVAL, without a ping;
//   - a magic close (write "V", then close) pings (the write), then stops
//     it, unless NoWayOut;
//   - a close without "V" pings and leaves it running.
//
// A second open while one is open fails with EBUSY. Opening a watchdog that
// is running while nobody holds it fails as fence.OpenDevice does, with
// fence.ErrLeftRunning, unless AllowOpenRunning (the kernel's own
// behaviour: it opens without a ping).
//
// Set the fields before the first Open; the methods are safe for
// concurrent use.
type FakeDevice struct {
	// Now is the clock (required).
	Now func() time.Time
	// DefaultTimeout is the driver's timeout before any SETTIMEOUT
	// (0: 60s, as softdog's).
	DefaultTimeout int
	// MinTimeout and MaxTimeout bound what SETTIMEOUT takes (0: 1 and
	// 65535).
	MinTimeout, MaxTimeout int
	// NoWayOut: the magic close does not stop it. Unless NoSysfs, the
	// kernel says so in sysfs, and Open and OpenLeftRunning refuse it as
	// fence.OpenDevice does (fence.ErrNoWayOut), without opening it.
	NoWayOut bool
	// NoSysfs: a kernel without watchdog sysfs, so nothing is known before
	// an open: OpenLeftRunning opens (and so starts) a watchdog that is not
	// running, and nowayout is not seen. Otherwise OpenLeftRunning refuses
	// one that is not running (fence.ErrNotRunning), as
	// fence.OpenDeviceLeftRunning does.
	NoSysfs bool
	// AllowOpenRunning: open a running watchdog, as the kernel does,
	// instead of refusing it as fence.OpenDevice does.
	AllowOpenRunning bool
	// Fail, when set, is asked before each operation; an error it returns
	// fails the operation, which then changes nothing (for OpMagicClose: the
	// write fails, and the device is closed without "V").
	Fail func(op Op) error
	// Delay, when set, is called at the start of each operation on an
	// open handle, before the device lock is taken and before the
	// operation takes effect: a slow ioctl (ipmi_watchdog asks the board's
	// BMC) whose effect lands when it returns, the worst case for the
	// caller. A test advances its Clock there.
	Delay func(op Op)

	mu       sync.Mutex
	inited   bool
	active   bool
	open     int // the generation of the open handle; 0: none
	gen      int
	timeout  int
	lastPing time.Time
	resetAt  time.Time // when it reset the machine; zero: not yet
	events   []Event
}

func (f *FakeDevice) initLocked() {
	if f.inited {
		return
	}
	f.inited = true
	if f.Now == nil {
		panic("fencetest: FakeDevice.Now is not set")
	}
	f.timeout = f.DefaultTimeout
	if f.timeout == 0 {
		f.timeout = 60
	}
	if f.MinTimeout == 0 {
		f.MinTimeout = 1
	}
	if f.MaxTimeout == 0 {
		f.MaxTimeout = 65535
	}
}

// deadlineLocked is the reset deadline; zero when stopped.
func (f *FakeDevice) deadlineLocked() time.Time {
	if !f.active {
		return time.Time{}
	}
	return f.lastPing.Add(time.Duration(f.timeout) * time.Second)
}

// checkResetLocked notes a reset once the deadline passed while running.
func (f *FakeDevice) checkResetLocked(now time.Time) error {
	if f.resetAt.IsZero() && f.active && now.After(f.deadlineLocked()) {
		f.resetAt = f.deadlineLocked()
	}
	if !f.resetAt.IsZero() {
		return fmt.Errorf("%w at %s", ErrMachineReset, f.resetAt.Format(time.RFC3339Nano))
	}
	return nil
}

func (f *FakeDevice) pingLocked(now time.Time) {
	f.lastPing = now
}

func (f *FakeDevice) recordLocked(op Op, now time.Time, value int, ping bool, err error) {
	f.events = append(f.events, Event{Op: op, At: now, Value: value, Err: err, Ping: ping, Deadline: f.deadlineLocked()})
}

// Open opens the device, as fence.OpenDevice would.
func (f *FakeDevice) Open(path string) (fence.Device, error) {
	return f.openWith(path, f.AllowOpenRunning)
}

// OpenLeftRunning opens the device also when it was left running, as
// fence.OpenDeviceLeftRunning would.
func (f *FakeDevice) OpenLeftRunning(path string) (fence.Device, error) {
	return f.openWith(path, true)
}

func (f *FakeDevice) openWith(path string, allowRunning bool) (fence.Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	now := f.Now()
	if err := f.checkResetLocked(now); err != nil {
		return nil, err
	}
	if f.Fail != nil {
		if err := f.Fail(OpOpen); err != nil {
			f.recordLocked(OpOpen, now, 0, false, err)
			return nil, err
		}
	}
	if allowRunning && !f.active && !f.NoSysfs && !f.AllowOpenRunning {
		err := fmt.Errorf("%s: %w", path, fence.ErrNotRunning)
		f.recordLocked(OpOpen, now, 0, false, err)
		return nil, err
	}
	if f.NoWayOut && !f.NoSysfs {
		err := fmt.Errorf("%s: %w", path, fence.ErrNoWayOut)
		f.recordLocked(OpOpen, now, 0, false, err)
		return nil, err
	}
	if f.open != 0 {
		err := fmt.Errorf("%s is held by another process: %w (%w)", path, fence.ErrHeldByOther, &fs.PathError{Op: "open", Path: path, Err: syscall.EBUSY})
		f.recordLocked(OpOpen, now, 0, false, err)
		return nil, err
	}
	ping := false
	if f.active {
		if !allowRunning {
			err := fmt.Errorf("%s: %w", path, fence.ErrLeftRunning)
			f.recordLocked(OpOpen, now, 0, false, err)
			return nil, err
		}
	} else {
		f.active = true
		f.pingLocked(now)
		ping = true
	}
	f.gen++
	f.open = f.gen
	f.recordLocked(OpOpen, now, 0, ping, nil)
	return &handle{f: f, gen: f.gen}, nil
}

// HeldByOther plays another process (systemd's RuntimeWatchdogSec, a
// watchdog daemon) opening the device: it runs, and every open fails with
// EBUSY (fence.ErrHeldByOther) until Dropped.
func (f *FakeDevice) HeldByOther() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	now := f.Now()
	if !f.active {
		f.active = true
		f.pingLocked(now)
	}
	f.gen++
	f.open = f.gen
	f.recordLocked(OpOpen, now, 0, true, nil)
}

// ProcessDied closes the open handle without the magic character, as the
// kernel does when its holder dies; the Watchdog that held it then gets
// os.ErrClosed from it. It reports whether a handle was open.
func (f *FakeDevice) ProcessDied() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	if f.open == 0 {
		return false
	}
	now := f.Now()
	if f.checkResetLocked(now) != nil {
		return true // nothing ran any more
	}
	f.closeLocked(now, false)
	return true
}

// closeLocked releases the open handle: with magic, it stops the watchdog
// (unless NoWayOut); without, it pings and leaves it running.
func (f *FakeDevice) closeLocked(now time.Time, magic bool) {
	f.open = 0
	op := OpClose
	if magic {
		op = OpMagicClose
	}
	if magic && !f.NoWayOut {
		f.active = false
		f.recordLocked(op, now, 0, true, nil) // the write pinged
		return
	}
	f.pingLocked(now)
	f.recordLocked(op, now, 0, true, nil)
}

// Active reports whether the watchdog runs.
func (f *FakeDevice) Active() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.active
}

// IsOpen reports whether a handle is open.
func (f *FakeDevice) IsOpen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open != 0
}

// Timeout is the device's timeout in seconds.
func (f *FakeDevice) Timeout() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	return f.timeout
}

// Deadline is when the watchdog resets the machine if nothing pings it;
// zero when stopped.
func (f *FakeDevice) Deadline() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deadlineLocked()
}

// ResetAt reports when the watchdog reset the machine: true once the
// clock passed the deadline while it was running.
func (f *FakeDevice) ResetAt() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	_ = f.checkResetLocked(f.Now())
	return f.resetAt, !f.resetAt.IsZero()
}

// Events are the operations so far, in order.
func (f *FakeDevice) Events() []Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Event(nil), f.events...)
}

// Count is how many operations op have succeeded.
func (f *FakeDevice) Count(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, e := range f.events {
		if e.Op == op && e.Err == nil {
			n++
		}
	}
	return n
}

// handle is one open of a FakeDevice.
type handle struct {
	f   *FakeDevice
	gen int
}

// begin checks that the handle may act at now.
func (h *handle) beginLocked(op Op, now time.Time) error {
	f := h.f
	if f.open != h.gen {
		err := fmt.Errorf("fake watchdog %s: %w", op, os.ErrClosed)
		f.recordLocked(op, now, 0, false, err)
		return err
	}
	if err := f.checkResetLocked(now); err != nil {
		return err
	}
	if f.Fail != nil {
		if err := f.Fail(op); err != nil {
			f.recordLocked(op, now, 0, false, err)
			return err
		}
	}
	return nil
}

func (h *handle) Keepalive() error {
	f := h.f
	if f.Delay != nil {
		f.Delay(OpKeepalive)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.Now()
	if err := h.beginLocked(OpKeepalive, now); err != nil {
		return err
	}
	f.pingLocked(now)
	f.recordLocked(OpKeepalive, now, 0, true, nil)
	return nil
}

func (h *handle) SetTimeout(seconds int) (int, error) {
	f := h.f
	if f.Delay != nil {
		f.Delay(OpSetTimeout)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.Now()
	if err := h.beginLocked(OpSetTimeout, now); err != nil {
		return 0, err
	}
	if seconds < f.MinTimeout || seconds > f.MaxTimeout {
		err := fmt.Errorf("fake watchdog set timeout %ds: %w", seconds, syscall.EINVAL)
		f.recordLocked(OpSetTimeout, now, seconds, false, err)
		return 0, err
	}
	f.timeout = seconds
	f.pingLocked(now)
	f.recordLocked(OpSetTimeout, now, seconds, true, nil)
	return seconds, nil
}

func (h *handle) MagicClose() error {
	f := h.f
	if f.Delay != nil {
		f.Delay(OpMagicClose)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.Now()
	if err := h.beginLocked(OpMagicClose, now); err != nil {
		if f.open == h.gen && f.resetAt.IsZero() {
			// The write failed; the close still happens, without "V".
			f.closeLocked(now, false)
		}
		return err
	}
	f.closeLocked(now, true)
	return nil
}

func (h *handle) Close() error {
	f := h.f
	if f.Delay != nil {
		f.Delay(OpClose)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.Now()
	if err := h.beginLocked(OpClose, now); err != nil {
		if f.open == h.gen && f.resetAt.IsZero() {
			f.closeLocked(now, false) // a close always releases
		}
		return err
	}
	f.closeLocked(now, false)
	return nil
}
