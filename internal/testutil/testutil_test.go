package testutil

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// failing records the failure of a helper under test instead of failing
// the test that runs it.
type failing struct {
	testing.TB
	msg string
}

func (f *failing) Helper() {}

func (f *failing) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failure runs body with a failing TB and returns its failure ("" if none).
func failure(body func(testing.TB)) string {
	f := &failing{}
	done := make(chan struct{})
	go func() { defer close(done); body(f) }()
	<-done
	return f.msg
}

func TestWaitForSeenReportsTheLastThingSeen(t *testing.T) {
	n := 0
	msg := failure(func(tb testing.TB) {
		WaitForSeen(tb, 30*time.Millisecond, "n to reach a million", func() (bool, string) {
			n++
			return false, fmt.Sprintf("n=%d", n)
		})
	})
	if !strings.Contains(msg, "n to reach a million") || !strings.Contains(msg, fmt.Sprintf("last seen: n=%d", n)) {
		t.Fatalf("failure %q, want the condition and the last value seen (n=%d)", msg, n)
	}
}

func TestWaitForTimeSaysWhenTheConditionWasFirstSeen(t *testing.T) {
	var flipped atomic.Int64
	go func() {
		time.Sleep(20 * time.Millisecond) // the change being timed
		flipped.Store(time.Now().UnixNano())
	}()
	at := WaitForTime(t, 5*time.Second, time.Millisecond, "the flip", func() bool { return flipped.Load() != 0 })
	if f := time.Unix(0, flipped.Load()); at.Before(f) {
		t.Fatalf("seen at %v, before the flip at %v", at, f)
	}
}

func TestHoldsForFailsTheFirstTimeTheConditionBreaks(t *testing.T) {
	if msg := failure(func(tb testing.TB) {
		HoldsFor(tb, 20*time.Millisecond, time.Millisecond, "truth", func() (bool, string) { return true, "" })
	}); msg != "" {
		t.Fatalf("a condition that held failed: %q", msg)
	}
	calls := 0
	start := time.Now()
	msg := failure(func(tb testing.TB) {
		HoldsFor(tb, 10*time.Second, time.Millisecond, "the counter below 3", func() (bool, string) {
			calls++
			return calls < 3, fmt.Sprintf("calls=%d", calls)
		})
	})
	if !strings.Contains(msg, "the counter below 3") || !strings.Contains(msg, "calls=3") {
		t.Fatalf("failure %q, want the condition and what broke it", msg)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("HoldsFor watched on after the condition broke")
	}
}

func TestFreePortsAreNeverHandedOutTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 10 {
		for _, p := range FreePorts(t, 4, "127.0.0.1", "127.0.0.2") {
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
		}
	}
}
