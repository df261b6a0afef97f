// Package testutil holds the helpers that tests of several packages share:
// a log sink a test can read while the code under test writes to it,
// polling for a condition that has no event to wait on (another process's
// state, a server's internal bookkeeping), always with a bound, or watching
// one that must keep holding for a while; free ports for the nodes a test
// starts; reading one metric's value; running a test again inside a
// fresh pair of network namespaces (NetnsPair). It imports nothing of
// nsmd but internal/freeport, so any package's tests can use it.
package testutil

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// LockedBuffer is a bytes.Buffer that a logger (or a child process's
// output) and a test may use at once.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines are the lines written so far that contain substr (each with its
// newline).
func (l *LockedBuffer) Lines(substr string) []string {
	var out []string
	for line := range strings.Lines(l.String()) {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// pollMax is the longest pause between two polls: the first ones come
// after a millisecond, then the pause doubles up to this.
const pollMax = 20 * time.Millisecond

// WaitFor polls cond until it holds, and fails t if it does not within
// timeout; what names the condition in that failure.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	WaitForSeen(t, timeout, what, func() (bool, string) { return cond(), "" })
}

// WaitForSeen is WaitFor for a condition that also says what it saw; the
// failure reports the last of those.
func WaitForSeen(t testing.TB, timeout time.Duration, what string, cond func() (ok bool, seen string)) {
	t.Helper()
	pause := time.Millisecond
	poll(t, timeout, what, cond, func() time.Duration {
		p := pause
		pause = min(2*pause, pollMax)
		return p
	})
}

// WaitForTime is WaitFor for a test that measures when a change happened
// (an address leaving the kernel, a new state answering): it polls cond
// every interval throughout (again at once when interval is 0), where
// WaitFor's growing pauses would blur the time, and returns when cond was
// first seen to hold.
func WaitForTime(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	return poll(t, timeout, what, func() (bool, string) { return cond(), "" }, func() time.Duration { return interval })
}

// poll calls cond, sleeping next() between calls, until it holds, and
// returns when it did; it fails t once timeout passed.
func poll(t testing.TB, timeout time.Duration, what string, cond func() (bool, string), next func() time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, seen := cond()
		now := time.Now()
		if ok {
			return now
		}
		if now.After(deadline) {
			if seen != "" {
				t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, seen)
			}
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		if p := next(); p > 0 {
			time.Sleep(p)
		}
	}
}

// HoldsFor checks cond every interval for d and fails t the first time it
// does not hold, with what it saw; what names the condition. It is for a
// property that no event would report broken (an address that must stay,
// a term that must not move), watched for a bounded while.
func HoldsFor(t testing.TB, d, interval time.Duration, what string, cond func() (ok bool, seen string)) {
	t.Helper()
	start := time.Now()
	for {
		if ok, seen := cond(); !ok {
			t.Fatalf("%s broke after %v: %s", what, time.Since(start).Round(time.Millisecond), seen)
		}
		if time.Since(start) >= d {
			return
		}
		time.Sleep(interval)
	}
}

// MetricValue reads the one counter or gauge c collects.
func MetricValue(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var pb dto.Metric
	if err := (<-ch).Write(&pb); err != nil {
		t.Fatal(err)
	}
	if pb.Counter != nil {
		return pb.Counter.GetValue()
	}
	return pb.Gauge.GetValue()
}

// GatheredValue is the value of the first counter or gauge named name in
// g whose labels include every pair of labelPairs ("key", "value", …); 0
// if there is none.
func GatheredValue(t testing.TB, g prometheus.Gatherer, name string, labelPairs ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labelPairs); i += 2 {
				if v, ok := have[labelPairs[i]]; !ok || v != labelPairs[i+1] {
					continue next
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

// EnvInt reads a positive integer setting of a measurement or test tier
// from the environment (def if unset); anything else fails the test.
func EnvInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
