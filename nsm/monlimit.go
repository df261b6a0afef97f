package nsm

import (
	"sync"
	"time"
)

// monLimiter bounds the hosts that local callers other than a lock
// manager may add (Config.MonUnprivBurst): an SM_MON from loopback and an
// unprivileged source port (lockd calls from a privileged one, and so
// does a userspace lock manager running as root through the usual RPC
// libraries) that would monitor a host no registration names yet must
// find a token in the bucket. Every registered host is notified from the
// VIP at each failover for the notify window, so without a bound one
// local user could make the cluster notify up to max_registrations
// addresses. Every loopback caller shares the one bucket: a local user
// may send from any address of 127.0.0.0/8 and from any port. Remote
// callers are trusted by address (trusted_callers) and not bounded here.
type monLimiter struct {
	burst int
	every time.Duration

	mu sync.Mutex
	b  bucket
}

func newMonLimiter(burst int, every time.Duration, now time.Time) *monLimiter {
	return &monLimiter{burst: burst, every: every, b: bucket{tokens: float64(burst), at: now}}
}

// take draws a token for a new host; false: none left.
func (l *monLimiter) take(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := now.Sub(l.b.at); d > 0 {
		l.b.tokens = min(float64(l.burst), l.b.tokens+float64(d)/float64(l.every))
		l.b.at = now
	}
	if l.b.tokens < 1 {
		return false
	}
	l.b.tokens--
	return true
}
