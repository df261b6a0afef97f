package cluster

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fence"
	"github.com/nsmd/nsmd/fence/fencetest"
	"github.com/nsmd/nsmd/internal/testutil"
)

// FeedWithin on the test machine: its pings are instantaneous, so a ping
// asked within the proof lands within it.
func (m *machine) FeedWithin(proofEnd func() time.Time) error {
	if !time.Now().Before(proofEnd()) {
		return fence.ErrNoProof
	}
	return m.Feed()
}

// oldOrder feeds as nsmd did before a ping had to land within its proof:
// the proof checked, then a plain Feed, whenever it returns. The negative
// control of the tests below.
type oldOrder struct{ *fence.Watchdog }

func (w oldOrder) FeedWithin(proofEnd func() time.Time) error {
	if !time.Now().Before(proofEnd()) {
		return fence.ErrNoProof
	}
	return w.Feed()
}

// diesAfterSlowFeed is the node's process dying as soon as a slow ping
// returns to it (before its next tick): the kernel closes the device
// without the magic character, which pings it once more with the timeout
// it has.
type diesAfterSlowFeed struct {
	Watchdog
	dev  *fencetest.FakeDevice
	slow *atomic.Bool // set by the device while a slow ping runs
}

func (w diesAfterSlowFeed) FeedWithin(proofEnd func() time.Time) error {
	err := w.Watchdog.FeedWithin(proofEnd)
	if w.slow.Load() {
		w.dev.ProcessDied()
	}
	return err
}

// A serving leader whose watchdog ping takes 3 s (the real fence.Watchdog
// over a fake device whose keepalive ioctl blocks 3 s, as an IPMI
// watchdog's round trip to a busy BMC can) is cut off while the ping is in
// flight: the ping returns long after its fence lease ended, and the
// process dies right then (the kernel's close pings once more). The
// successor counts on the reset by lease end + fence_timeout (+1 s of
// whole-second rounding); the device's reset must come by then. The
// negative control feeds in the old order (check, then a plain Feed): the
// ping's full timeout counts from its late return, and the reset comes
// ~2 s past the bound.
func TestASlowPingThatReturnsAfterTheLeaseCannotMoveTheReset(t *testing.T) {
	for _, control := range []bool{false, true} {
		name := "feed_within_proof"
		if control {
			name = "control_old_order"
		}
		t.Run(name, func(t *testing.T) {
			const fenceTimeout = 5 * time.Second
			devs := map[string]*fencetest.FakeDevice{}
			slowNext, slowRan := map[string]*atomic.Bool{}, map[string]*atomic.Bool{}
			entered := make(chan string, 4)
			fc := newFencedCluster(t, 3, 0, func(cfg *Config) {
				id := cfg.NodeID
				slow, ran := &atomic.Bool{}, &atomic.Bool{}
				// A fake device: nothing on a test machine resets it.
				dev := &fencetest.FakeDevice{Now: time.Now}
				dev.Delay = func(op fencetest.Op) {
					if op == fencetest.OpKeepalive && slow.CompareAndSwap(true, false) {
						ran.Store(true)
						entered <- id
						time.Sleep(3 * time.Second) // the slow ioctl itself
					}
				}
				w, err := fence.NewWatchdog(fence.WatchdogConfig{Path: "/dev/watchdog", Timeout: fenceTimeout, Open: dev.Open, OpenLeftRunning: dev.OpenLeftRunning})
				if err != nil {
					t.Fatal(err)
				}
				devs[id], slowNext[id], slowRan[id] = dev, slow, ran
				cfg.FenceTimeout = fenceTimeout
				var wd Watchdog = w
				if control {
					wd = oldOrder{w}
				}
				cfg.Watchdog = diesAfterSlowFeed{Watchdog: wd, dev: dev, slow: ran}
			})
			first := fc.waitTakeover(10 * time.Second)
			li := nodeIndex(fc.tcluster, first.node)
			dev, n := devs[first.node], fc.nodes[li].n
			testutil.WaitFor(t, 5*time.Second, "fed", func() bool { return dev.Count(fencetest.OpKeepalive) > 0 })
			// The stop hangs, as an unmount behind a hung disk would: only
			// the watchdog ends this node's serving.
			m := fc.machines[first.node]
			block := make(chan struct{})
			defer close(block)
			m.mu.Lock()
			m.stopBlock = block
			m.mu.Unlock()
			slowNext[first.node].Store(true)
			if id := <-entered; id != first.node {
				t.Fatalf("slow ping on %s, not the leader %s", id, first.node)
			}
			fc.partition(li) // while the ping is in flight
			testutil.WaitForTime(t, 20*time.Second, 50*time.Millisecond, "the watchdog reset the leader's machine", func() bool {
				_, reset := dev.ResetAt()
				return reset
			})
			at, _ := dev.ResetAt()
			leaseEnd := n.started.Add(time.Duration(n.leaseAt.Load()) + n.fenceLease())
			bound := leaseEnd.Add(fenceTimeout + time.Second)
			late := at.After(bound)
			t.Logf("reset %v after the lease ended (bound %v)", at.Sub(leaseEnd).Round(time.Millisecond), bound.Sub(leaseEnd))
			if late != control {
				t.Fatalf("reset %v after the fence lease ended, bound fence_timeout + 1s = %v (old order: %v)", at.Sub(leaseEnd), fenceTimeout+time.Second, control)
			}
			if !control {
				if got := testutil.MetricValue(t, n.metrics.watchdogLateFeeds); got < 1 {
					t.Fatalf("late feeds counted: %v, want at least 1", got)
				}
			}
		})
	}
}
