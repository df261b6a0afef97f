package pki

import (
	"sync"
	"time"
)

// LogLimiter lets one log line per key through per interval and counts the
// ones it holds back, in bounded memory: refusals (TLS handshakes here,
// gossip members in cluster) come by the thousand from one peer in a flood,
// and each line must say how many were not logged since the last.
type LogLimiter struct {
	mu       sync.Mutex
	now      func() time.Time
	interval time.Duration
	seen     map[string]*limited
}

type limited struct {
	last       time.Time
	suppressed int
}

// maxLimited bounds the limiter's memory: past it, entries older than the
// interval are dropped, and if none is, the map starts over.
const maxLimited = 4096

// NewLogLimiter limits each key to one line per interval on clock now.
func NewLogLimiter(now func() time.Time, interval time.Duration) *LogLimiter {
	return &LogLimiter{now: now, interval: interval, seen: map[string]*limited{}}
}

// SetClock replaces the clock and the interval (tests).
func (l *LogLimiter) SetClock(now func() time.Time, interval time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.now, l.interval = now, interval
}

// Interval is the current interval.
func (l *LogLimiter) Interval() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.interval
}

// Allow reports whether a line for key may be logged now and, if so, how
// many were held back since the last one.
func (l *LogLimiter) Allow(key string) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	e := l.seen[key]
	if e != nil && now.Sub(e.last) < l.interval {
		e.suppressed++
		return false, 0
	}
	if e != nil {
		suppressed = e.suppressed
	}
	if len(l.seen) >= maxLimited {
		for k, v := range l.seen {
			if now.Sub(v.last) >= l.interval {
				delete(l.seen, k)
			}
		}
		if len(l.seen) >= maxLimited {
			clear(l.seen)
		}
	}
	l.seen[key] = &limited{last: now}
	return true, suppressed
}
