package fence_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fence"
	"github.com/nsmd/nsmd/fence/fencetest"
)

// A ping whose ioctl takes 3 s (ipmi_watchdog asks the board's BMC), asked
// 1 s before the proof ends, lands after it: the reset must still come by
// the proof's end + the timeout (+ 1 s of whole-second rounding), whatever
// the process does next — keeps running and starving, or dies (the
// kernel's ping at an unclean close). The negative control feeds the old
// way (Feed, no check when the ping returns) and overshoots by the ping.
func TestASlowPingNeverMovesTheResetPastItsProof(t *testing.T) {
	const timeout = 10 * time.Second
	const slow = 3 * time.Second
	for _, c := range []struct {
		name    string
		oldFeed bool
		die     bool
	}{
		{name: "starves"}, {name: "dies", die: true},
		{name: "control_old_order", oldFeed: true}, {name: "control_old_order_dies", oldFeed: true, die: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r *rig
			r = newRig(t, timeout, func(d *fencetest.FakeDevice) {
				d.Delay = func(op fencetest.Op) {
					if op == fencetest.OpKeepalive || op == fencetest.OpSetTimeout {
						r.clock.Advance(slow)
					}
				}
			})
			if err := r.w.Arm(); err != nil { // slow too: the timeout is set
				t.Fatal(err)
			}
			proofEnd := r.clock.Now().Add(time.Second)
			proof := func() time.Time { return proofEnd }
			var err error
			if c.oldFeed {
				err = r.w.Feed()
			} else {
				err = r.w.FeedWithin(proof)
				if !errors.Is(err, fence.ErrLateFeed) {
					t.Fatalf("FeedWithin of a ping that returned 2s after its proof: %v, want ErrLateFeed", err)
				}
				if !r.w.Status().Starving {
					t.Fatal("a late ping does not leave the watchdog starving")
				}
			}
			bound := proofEnd.Add(timeout + time.Second)
			if c.die {
				r.dev.ProcessDied()
			} else {
				for range 40 { // the fence loop's ticks, without proof
					r.clock.Advance(500 * time.Millisecond)
					if _, reset := r.dev.ResetAt(); reset {
						break
					}
					if !c.oldFeed {
						if err := r.w.FeedWithin(proof); !errors.Is(err, fence.ErrNoProof) {
							t.Fatalf("FeedWithin past its proof: %v, want ErrNoProof", err)
						}
					}
					_ = r.w.Starve()
				}
			}
			r.clock.Advance(time.Minute)
			at, reset := r.dev.ResetAt()
			if !reset {
				t.Fatal("the machine was never reset")
			}
			late := at.After(bound)
			if c.oldFeed != late {
				t.Fatalf("reset %v after the proof ended (bound: timeout + 1s = %v); old order: %v", at.Sub(proofEnd), timeout+time.Second, c.oldFeed)
			}
		})
	}
}

// A proof renewed while the ping was in flight counts: a healthy node
// behind a slow driver keeps its full timeout.
func TestASlowPingWithARenewedProofFeeds(t *testing.T) {
	var r *rig
	r = newRig(t, 10*time.Second, func(d *fencetest.FakeDevice) {
		d.Delay = func(op fencetest.Op) {
			if op == fencetest.OpKeepalive {
				r.clock.Advance(3 * time.Second)
			}
		}
	})
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		// The lease loop renews the proof every quarter lease, so when
		// the ping returns the proof runs a second past it.
		if err := r.w.FeedWithin(func() time.Time { return r.clock.Now().Add(time.Second) }); err != nil {
			t.Fatalf("FeedWithin with a proof renewed during the ping: %v", err)
		}
		if st := r.w.Status(); st.Starving || st.DeviceTimeout != 10*time.Second {
			t.Fatalf("status %+v", st)
		}
	}
	if _, reset := r.dev.ResetAt(); reset {
		t.Fatal("reset")
	}
}

// Without proof nothing is pinged.
func TestFeedWithinWithoutProofDoesNotPing(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	if err := r.w.Arm(); err != nil {
		t.Fatal(err)
	}
	before := r.dev.Deadline()
	r.clock.Advance(time.Second)
	if err := r.w.FeedWithin(func() time.Time { return time.Time{} }); !errors.Is(err, fence.ErrNoProof) {
		t.Fatalf("err %v", err)
	}
	if !r.dev.Deadline().Equal(before) || r.dev.Count(fencetest.OpKeepalive) != 0 {
		t.Fatal("pinged without proof")
	}
}

// A standby's start releases a watchdog only if one was left running: with
// nowayout, an open starts a timer nothing can stop, so the release must
// not open one that is not running. The negative control is a kernel that
// does not say (no sysfs): the release opens it, and the standby is reset
// a timeout later.
func TestReleaseAtAStandbysStartDoesNotStartANoWayOutWatchdog(t *testing.T) {
	for _, noSysfs := range []bool{false, true} {
		r := newRig(t, 10*time.Second, func(d *fencetest.FakeDevice) { d.NoWayOut, d.NoSysfs = true, noSysfs })
		w, err := fence.NewWatchdog(fence.WatchdogConfig{Path: "/dev/watchdog", Timeout: 10 * time.Second,
			Open: r.dev.Open, OpenLeftRunning: r.dev.OpenLeftRunning, Now: r.clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Release(); err != nil {
			t.Fatalf("no sysfs %v: Release = %v", noSysfs, err)
		}
		r.clock.Advance(2 * time.Minute)
		_, reset := r.dev.ResetAt()
		if reset != noSysfs {
			t.Fatalf("no sysfs %v: the standby was reset: %v (opens: %d)", noSysfs, reset, r.dev.Count(fencetest.OpOpen))
		}
		if !noSysfs && len(r.dev.Events()) != 1 { // the one refused open, nothing opened
			t.Fatalf("release touched the device: %+v", r.dev.Events())
		}
	}
}

// A device another process holds (systemd's RuntimeWatchdogSec) can be
// neither armed nor released, and says why.
func TestAWatchdogHeldByAnotherProcessIsNeitherArmedNorReleased(t *testing.T) {
	r := newRig(t, 10*time.Second, nil)
	r.dev.HeldByOther()
	w, err := fence.NewWatchdog(fence.WatchdogConfig{Path: "/dev/watchdog", Timeout: 10 * time.Second,
		Open: r.dev.Open, OpenLeftRunning: r.dev.OpenLeftRunning, Now: r.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Release(); !errors.Is(err, fence.ErrHeldByOther) {
		t.Errorf("Release = %v, want ErrHeldByOther", err)
	}
	if err := w.Arm(); !errors.Is(err, fence.ErrHeldByOther) {
		t.Errorf("Arm = %v, want ErrHeldByOther", err)
	}
}
