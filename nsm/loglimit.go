package nsm

import (
	"container/list"
	"net/netip"
	"sync"
	"time"
)

// logLimiter lets through at most one log line per key (a caller's
// address) per interval and counts the lines it held back, to be reported
// with the key's next line: an untrusted flood of refused calls writes one
// line a minute per address, not one per datagram. It remembers at most
// max keys (the one whose last line is the oldest is forgotten first).
type logLimiter struct {
	interval time.Duration
	max      int

	mu    sync.Mutex
	keys  map[netip.Addr]*list.Element // of *logEntry
	order *list.List                   // oldest line first
}

type logEntry struct {
	key  netip.Addr
	at   time.Time
	held int
}

func newLogLimiter(interval time.Duration, max int) *logLimiter {
	return &logLimiter{interval: interval, max: max, keys: map[netip.Addr]*list.Element{}, order: list.New()}
}

// allow reports whether a line about key may be written at now, and how
// many were held back since the key's last line.
func (l *logLimiter) allow(key netip.Addr, now time.Time) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, found := l.keys[key]; found {
		le := e.Value.(*logEntry)
		if now.Sub(le.at) < l.interval {
			le.held++
			return false, 0
		}
		held, le.held, le.at = le.held, 0, now
		l.order.MoveToBack(e)
		return true, held
	}
	if l.order.Len() >= l.max {
		old := l.order.Remove(l.order.Front()).(*logEntry)
		delete(l.keys, old.key)
	}
	l.keys[key] = l.order.PushBack(&logEntry{key: key, at: now})
	return true, 0
}
