package nsm

import (
	"container/list"
	"net/netip"
	"sync"
	"time"
)

// monLimiter bounds the hosts that callers other than a lock manager may
// add (Config.MonUnprivBurst): an SM_MON from an unprivileged source port
// (lockd calls from a privileged one, and so does a userspace lock
// manager running as root through the usual RPC libraries) that would
// monitor a host no registration names yet must find a token in its
// caller's bucket. Every registered host is notified from the VIP at each
// failover for the notify window, so without a bound one local user could
// make the cluster notify up to max_registrations addresses. Every
// loopback address is one caller: a local user may send from any of
// 127.0.0.0/8.
type monLimiter struct {
	burst int
	every time.Duration
	max   int

	mu      sync.Mutex
	callers lruBuckets[netip.Addr]
}

// monLimitCallers bounds the callers a monLimiter keeps buckets for
// (loopback is one; the others are configured trusted remote callers).
const monLimitCallers = 4096

func newMonLimiter(burst int, every time.Duration) *monLimiter {
	return &monLimiter{
		burst: burst, every: every, max: monLimitCallers,
		callers: lruBuckets[netip.Addr]{m: map[netip.Addr]*list.Element{}, order: list.New()},
	}
}

// loopbackCaller is the one key of every loopback caller.
var loopbackCaller = netip.IPv6Loopback()

// take draws a token for a new host from caller's bucket; false: none left.
func (l *monLimiter) take(caller netip.AddrPort, now time.Time) bool {
	key := callerAddr(caller)
	if key.IsLoopback() {
		key = loopbackCaller
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.callers.get(key, now, l.burst, l.every, l.max)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
