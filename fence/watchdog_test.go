package fence_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fence"
	"github.com/nsmd/nsmd/fence/fencetest"
)

// rig is a Watchdog over a FakeDevice on a manual clock.
type rig struct {
	clock *fencetest.Clock
	dev   *fencetest.FakeDevice
	w     *fence.Watchdog
}

func newRig(t *testing.T, timeout time.Duration, tune func(*fencetest.FakeDevice)) *rig {
	t.Helper()
	clock := &fencetest.Clock{}
	dev := &fencetest.FakeDevice{Now: clock.Now}
	if tune != nil {
		tune(dev)
	}
	w, err := fence.NewWatchdog(fence.WatchdogConfig{
		Path:    "/dev/watchdog",
		Timeout: timeout,
		Open:    dev.Open,
		Now:     clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{clock: clock, dev: dev, w: w}
}

func TestNewWatchdogValidates(t *testing.T) {
	for _, c := range []struct {
		path    string
		timeout time.Duration
		want    string
	}{
		{"", 10 * time.Second, "no device path"},
		{"/dev/watchdog", 0, "at least 2s"},
		{"/dev/watchdog", time.Second, "at least 2s"},
		{"/dev/watchdog", 2500 * time.Millisecond, "whole number of seconds"},
		{"/dev/watchdog", 70000 * time.Second, "too long"},
	} {
		_, err := fence.NewWatchdog(fence.WatchdogConfig{Path: c.path, Timeout: c.timeout})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewWatchdog(%q, %v) = %v, want an error with %q", c.path, c.timeout, err, c.want)
		}
	}
	if _, err := fence.NewWatchdog(fence.WatchdogConfig{Path: "/dev/watchdog", Timeout: 2 * time.Second}); err != nil {
		t.Errorf("2s: %v", err)
	}
}

func TestNewWatchdogDoesNotOpen(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if n := len(r.dev.Events()); n != 0 || r.dev.Active() {
		t.Fatalf("NewWatchdog touched the device: %v", r.dev.Events())
	}
	if s := r.w.Status(); s.Armed || !s.Deadline.IsZero() || !s.LastFeed.IsZero() {
		t.Fatalf("status before Arm: %+v", s)
	}
}

func TestArmThenFeed(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	t0 := r.clock.Now()
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	if got, want := r.dev.Deadline(), t0.Add(10*time.Second); !got.Equal(want) {
		t.Fatalf("kernel deadline after Arm = %v, want %v", got, want)
	}
	if r.dev.Timeout() != 10 {
		t.Fatalf("device timeout %d, want 10", r.dev.Timeout())
	}
	s := r.w.Status()
	if !s.Armed || s.Starving || !s.LastFeed.Equal(t0) || !s.Deadline.Equal(r.dev.Deadline()) || s.Timeout != 10*time.Second || s.Device != "/dev/watchdog" {
		t.Fatalf("status after Arm: %+v", s)
	}

	r.clock.Advance(4 * time.Second)
	if err := r.w.Feed(); err != nil {
		t.Fatal(err)
	}
	if got, want := r.dev.Deadline(), t0.Add(14*time.Second); !got.Equal(want) {
		t.Fatalf("kernel deadline after Feed = %v, want %v", got, want)
	}

	// Arm while armed only feeds.
	r.clock.Advance(time.Second)
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	if n := r.dev.Count(fencetest.OpOpen); n != 1 {
		t.Fatalf("%d opens, want 1", n)
	}
	if n := r.dev.Count(fencetest.OpKeepalive); n != 2 {
		t.Fatalf("%d keepalives, want 2 (Feed and the second Arm)", n)
	}
	if got, want := r.w.Status().Deadline, t0.Add(15*time.Second); !got.Equal(want) || !r.dev.Deadline().Equal(want) {
		t.Fatalf("deadline after the second Arm: status %v, kernel %v, want %v", got, r.dev.Deadline(), want)
	}
}

func TestFeedNotArmed(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if err := r.w.Feed(); !errors.Is(err, fence.ErrNotArmed) {
		t.Fatalf("Feed before Arm = %v, want ErrNotArmed", err)
	}
	if err := r.w.Starve(); err != nil {
		t.Fatalf("Starve before Arm = %v, want nil", err)
	}
	if err := r.w.Disarm(); err != nil {
		t.Fatalf("Disarm before Arm = %v, want nil", err)
	}
	if n := len(r.dev.Events()); n != 0 {
		t.Fatalf("the device was touched: %v", r.dev.Events())
	}
}

// A death while fed: the kernel pings on the unclean close, so the
// deadline moves to the death plus the timeout. This is what Starve must
// guard against, and the reason the fake's deadline is worth checking.
func TestDeathWhileFedPingsOnce(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	t0 := r.clock.Now()
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(4 * time.Second)
	r.dev.ProcessDied()
	if got, want := r.dev.Deadline(), t0.Add(14*time.Second); !got.Equal(want) {
		t.Fatalf("deadline after a death 4s after the feed = %v, want %v", got, want)
	}
	if err := r.w.Feed(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Feed on a dead handle = %v, want os.ErrClosed", err)
	}
}

// TestStarveBound is the contract: while starving, the kernel's deadline
// never passes D+1s (D: the last feed plus the timeout), and a process
// death at any point resets the machine by D + 1s + one call interval.
func TestStarveBound(t *testing.T) {
	const timeout = 10 * time.Second
	for _, interval := range []time.Duration{
		300 * time.Millisecond, 500 * time.Millisecond, time.Second,
		1700 * time.Millisecond, 3 * time.Second, 7 * time.Second,
	} {
		// The last step that can run: the machine resets by D+1s.
		steps := int((timeout+time.Second)/interval) + 1
		for die := -1; die <= steps; die++ { // -1: no death
			t.Run(fmt.Sprintf("every%v/die%d", interval, die), func(t *testing.T) {
				r := newRig(t, timeout, nil)
				r.clock.Advance(3 * time.Second)
				if err := r.w.Arm(); err != nil {
					t.Fatal(err)
				}
				r.clock.Advance(1500 * time.Millisecond)
				if err := r.w.Feed(); err != nil {
					t.Fatal(err)
				}
				D := r.clock.Now().Add(timeout)
				bound := D.Add(time.Second)
				for step := 0; ; step++ {
					if step == die {
						r.dev.ProcessDied()
						bound = D.Add(time.Second + interval)
						if dl := r.dev.Deadline(); dl.After(bound) {
							t.Fatalf("death at step %d: deadline %v is %v past D", step, dl, dl.Sub(D))
						}
						break
					}
					r.clock.Advance(interval)
					if _, reset := r.dev.ResetAt(); reset {
						break
					}
					if err := r.w.Starve(); err != nil {
						t.Fatalf("Starve at step %d: %v", step, err)
					}
					if dl := r.dev.Deadline(); dl.After(D.Add(time.Second)) {
						t.Fatalf("step %d: kernel deadline %v is %v past D", step, dl, dl.Sub(D))
					}
					if st := r.w.Status(); !st.Starving || !st.Deadline.Equal(r.dev.Deadline()) {
						t.Fatalf("step %d: status %+v, kernel deadline %v", step, st, r.dev.Deadline())
					}
				}
				r.clock.Advance(time.Minute)
				at, reset := r.dev.ResetAt()
				if !reset {
					t.Fatal("the machine was never reset")
				}
				if at.After(bound) {
					t.Fatalf("reset at %v, %v past D (bound %v)", at, at.Sub(D), bound.Sub(D))
				}
			})
		}
	}
}

// Starving lasts as long as the caller has no proof; a Feed restores the
// full timeout (and pings).
func TestFeedAfterStarve(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		r.clock.Advance(time.Second)
		if err := r.w.Starve(); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.dev.Timeout(); got != 5 {
		t.Fatalf("device timeout after starving 5s of 10 = %d, want 5", got)
	}
	if st := r.w.Status(); !st.Starving || st.DeviceTimeout != 5*time.Second {
		t.Fatalf("status while starving: %+v", st)
	}
	if err := r.w.Feed(); err != nil {
		t.Fatal(err)
	}
	now := r.clock.Now()
	if r.dev.Timeout() != 10 || !r.dev.Deadline().Equal(now.Add(10*time.Second)) {
		t.Fatalf("after Feed: device timeout %d, deadline %v; want 10, %v", r.dev.Timeout(), r.dev.Deadline(), now.Add(10*time.Second))
	}
	if st := r.w.Status(); st.Starving || !st.LastFeed.Equal(now) {
		t.Fatalf("status after Feed: %+v", st)
	}
	// The next Feed is a plain keepalive.
	before := r.dev.Count(fencetest.OpSetTimeout)
	if err := r.w.Feed(); err != nil {
		t.Fatal(err)
	}
	if r.dev.Count(fencetest.OpSetTimeout) != before {
		t.Fatal("a Feed at the full timeout set the timeout again")
	}
}

// Starve shrinks only: the calls that would not shorten the timeout leave
// the device alone, since a SETTIMEOUT pings.
func TestStarveLeavesDeviceAloneWhenShortest(t *testing.T) {
	r := newRig(t, 4*time.Second, nil)
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	for range 35 {
		r.clock.Advance(100 * time.Millisecond)
		if err := r.w.Starve(); err != nil {
			t.Fatal(err)
		}
	}
	var asked []int
	for _, e := range r.dev.Events() {
		if e.Op == fencetest.OpSetTimeout {
			asked = append(asked, e.Value)
		}
	}
	// Armed with 4: 3.9s..3.0s left → 3, 2.9s..2.0s → 2, 1.9s..1.0s → 1
	// once, then nothing (the machine resets 1s after that).
	if fmt.Sprint(asked) != "[4 3 2 1]" {
		t.Fatalf("timeouts set: %v, want [4 3 2 1]", asked)
	}
}

// A driver whose shortest timeout is 3s: Starve learns it from EINVAL
// (which does not ping) and does not ask again.
func TestStarveDriverMinimum(t *testing.T) {
	r := newRig(t, 10*time.Second, func(d *fencetest.FakeDevice) { d.MinTimeout = 3 })
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	D := r.clock.Now().Add(10 * time.Second)
	for range 30 {
		r.clock.Advance(500 * time.Millisecond)
		if _, reset := r.dev.ResetAt(); reset {
			break
		}
		if err := r.w.Starve(); err != nil {
			t.Fatal(err)
		}
	}
	rejected := 0
	for _, e := range r.dev.Events() {
		if e.Op == fencetest.OpSetTimeout && e.Err != nil {
			rejected++
			if e.Ping {
				t.Fatalf("a rejected SETTIMEOUT pinged: %+v", e)
			}
		}
	}
	if rejected != 1 { // 2, once: then it knows 3 is the shortest
		t.Fatalf("%d rejected SETTIMEOUTs, want 1", rejected)
	}
	at, reset := r.dev.ResetAt()
	if !reset || at.After(D.Add(time.Second)) {
		t.Fatalf("reset %v at %v, D %v", reset, at, D)
	}
}

func TestResetSoon(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(2 * time.Second)
	if err := r.w.ResetSoon(); err != nil {
		t.Fatal(err)
	}
	now := r.clock.Now()
	if r.dev.Timeout() != 1 || !r.dev.Deadline().Equal(now.Add(time.Second)) {
		t.Fatalf("after ResetSoon: timeout %d, deadline %v", r.dev.Timeout(), r.dev.Deadline())
	}
	if st := r.w.Status(); !st.ResetPending || !st.Deadline.Equal(now.Add(time.Second)) {
		t.Fatalf("status after ResetSoon: %+v", st)
	}
	events := len(r.dev.Events())
	if err := r.w.Feed(); !errors.Is(err, fence.ErrResetPending) {
		t.Fatalf("Feed after ResetSoon = %v, want ErrResetPending", err)
	}
	if err := r.w.Arm(); !errors.Is(err, fence.ErrResetPending) {
		t.Fatalf("Arm after ResetSoon = %v, want ErrResetPending", err)
	}
	if err := r.w.Starve(); err != nil {
		t.Fatal(err)
	}
	if err := r.w.ResetSoon(); err != nil {
		t.Fatal(err)
	}
	if n := len(r.dev.Events()); n != events {
		t.Fatalf("the device was touched after ResetSoon: %v", r.dev.Events()[events:])
	}
	r.clock.Advance(1001 * time.Millisecond)
	if at, reset := r.dev.ResetAt(); !reset || !at.Equal(now.Add(time.Second)) {
		t.Fatalf("reset %v at %v, want at %v", reset, at, now.Add(time.Second))
	}
}

func TestResetSoonNotArmedOpens(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if err := r.w.ResetSoon(); err != nil {
		t.Fatal(err)
	}
	if !r.dev.Active() || r.dev.Timeout() != 1 || !r.dev.Deadline().Equal(r.clock.Now().Add(time.Second)) {
		t.Fatalf("ResetSoon without Arm: active %v, timeout %d, deadline %v", r.dev.Active(), r.dev.Timeout(), r.dev.Deadline())
	}
}

func TestDisarmCancelsResetSoon(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	if err := r.w.ResetSoon(); err != nil {
		t.Fatal(err)
	}
	if err := r.w.Disarm(); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(time.Minute)
	if _, reset := r.dev.ResetAt(); reset || r.dev.Active() {
		t.Fatal("the watchdog ran on after Disarm")
	}
	if err := r.w.Feed(); !errors.Is(err, fence.ErrNotArmed) {
		t.Fatalf("Feed after Disarm = %v, want ErrNotArmed", err)
	}
}

func TestDisarm(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(3 * time.Second)
	if err := r.w.Disarm(); err != nil {
		t.Fatal(err)
	}
	if r.dev.Active() || r.dev.IsOpen() || r.dev.Count(fencetest.OpMagicClose) != 1 {
		t.Fatalf("after Disarm: active %v, open %v, events %v", r.dev.Active(), r.dev.IsOpen(), r.dev.Events())
	}
	if st := r.w.Status(); st.Armed || !st.Deadline.IsZero() || st.Starving {
		t.Fatalf("status after Disarm: %+v", st)
	}
	if err := r.w.Disarm(); err != nil {
		t.Fatalf("second Disarm: %v", err)
	}
	r.clock.Advance(time.Hour)
	if _, reset := r.dev.ResetAt(); reset {
		t.Fatal("reset after Disarm")
	}
	// It can be armed again: a fresh open starts it.
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	if !r.dev.Deadline().Equal(r.clock.Now().Add(10 * time.Second)) {
		t.Fatalf("deadline after re-Arm: %v", r.dev.Deadline())
	}
}

func TestDisarmFails(t *testing.T) {
	boom := errors.New("write failed")
	r := newRig(t, 10*time.Second, func(d *fencetest.FakeDevice) {
		d.Fail = func(op fencetest.Op) error {
			if op == fencetest.OpMagicClose {
				return boom
			}
			return nil
		}
	})
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(2 * time.Second)
	err := r.w.Disarm()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "keeps running") {
		t.Fatalf("Disarm = %v, want the write's error and that it keeps running", err)
	}
	st := r.w.Status()
	if st.Armed || !r.dev.Active() || !st.Deadline.Equal(r.dev.Deadline()) || st.Deadline.IsZero() {
		t.Fatalf("after a failed Disarm: status %+v, kernel active %v deadline %v", st, r.dev.Active(), r.dev.Deadline())
	}
}

// A restarted process must not feed a watchdog its dead predecessor left
// running: the predecessor may still be serving through the kernel.
func TestArmRefusesLeftRunning(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(time.Second)
	r.dev.ProcessDied()
	deadline := r.dev.Deadline()

	w2, err := fence.NewWatchdog(fence.WatchdogConfig{Path: "/dev/watchdog", Timeout: 10 * time.Second, Open: r.dev.Open, Now: r.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(time.Second)
	if err := w2.Arm(); !errors.Is(err, fence.ErrLeftRunning) {
		t.Fatalf("Arm over a watchdog left running = %v, want ErrLeftRunning", err)
	}
	if !r.dev.Deadline().Equal(deadline) {
		t.Fatalf("the refused Arm moved the deadline from %v to %v", deadline, r.dev.Deadline())
	}
}

// After its stop succeeded, a restarted process releases the watchdog its
// dead predecessor left running, without pinging it first.
func TestReleaseStopsAWatchdogLeftRunning(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	r.dev.ProcessDied()
	deadline := r.dev.Deadline()
	w2, err := fence.NewWatchdog(fence.WatchdogConfig{Path: "/dev/watchdog", Timeout: 10 * time.Second,
		Open: r.dev.Open, OpenLeftRunning: r.dev.OpenLeftRunning, Now: r.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(2 * time.Second)
	if !r.dev.Deadline().Equal(deadline) {
		t.Fatal("deadline moved before Release")
	}
	if err := w2.Release(); err != nil {
		t.Fatal(err)
	}
	if r.dev.Active() || r.dev.IsOpen() {
		t.Fatal("Release left the watchdog running")
	}
	if st := w2.Status(); st.Armed || !st.Deadline.IsZero() {
		t.Fatalf("status after Release: %+v", st)
	}
	// Nothing to release: it opens (starting it) and stops it again.
	if err := w2.Release(); err != nil || r.dev.Active() {
		t.Fatalf("second Release = %v, active %v", err, r.dev.Active())
	}
}

func TestArmRefusesTimeoutTheDriverRejects(t *testing.T) {
	r := newRig(t, 10*time.Second, func(d *fencetest.FakeDevice) { d.MaxTimeout = 5 })
	err := r.w.Arm()
	if err == nil || !strings.Contains(err.Error(), "set timeout 10s") {
		t.Fatalf("Arm = %v, want the SETTIMEOUT error", err)
	}
	if r.dev.Active() || r.dev.IsOpen() {
		t.Fatal("Arm left the watchdog running after failing")
	}
	if st := r.w.Status(); st.Armed || !st.Deadline.IsZero() {
		t.Fatalf("status after a failed Arm: %+v", st)
	}
}

func TestArmOpenError(t *testing.T) {
	r := newRig(t, 10*time.Second, func(d *fencetest.FakeDevice) {
		d.Fail = func(op fencetest.Op) error {
			if op == fencetest.OpOpen {
				return os.ErrPermission
			}
			return nil
		}
	})
	if err := r.w.Arm(); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("Arm = %v, want the open's error", err)
	}
	if st := r.w.Status(); st.Armed {
		t.Fatalf("armed after a failed open: %+v", st)
	}
}

// ResetSoon on a driver that takes no short timeout says so: the caller
// must reset the machine another way.
func TestResetSoonDriverTakesNoShortTimeout(t *testing.T) {
	r := newRig(t, 10*time.Second, func(d *fencetest.FakeDevice) { d.MinTimeout = 30 })
	err := r.w.ResetSoon()
	if err == nil || !strings.Contains(err.Error(), "took no timeout") {
		t.Fatalf("ResetSoon = %v, want an error", err)
	}
	if n := len(r.dev.Events()); n > 12 {
		t.Fatalf("%d device operations, want at most one open and ten tries", n)
	}
}
