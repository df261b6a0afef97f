package nsm

import (
	"container/list"
	"net/netip"
	"sync"
	"time"
)

// notifyLimiter holds SM_NOTIFYs back before they reach the registry (a
// raft commit, an fsync on every node, each): a token bucket per sender
// address and one per mon_name, both of which an accepted notification
// must find a token in, and a set of the notifications being committed,
// so that a retransmission of one in flight is not committed twice. A
// host that really rebooted sends one notification per name it is known
// by; a sender alternating states, or forging them for someone else's
// name, runs out. A name has two buckets: one for notifications sent from
// that host's own addresses, one for those sent from anywhere else, so
// that forgeries from other addresses never use up the real host's. Held-back notifications get no reply, so a real peer's
// sm-notify retransmits them once a token is back.
type notifyLimiter struct {
	burst int           // tokens a bucket holds
	every time.Duration // one token back per every
	max   int           // buckets kept per kind (least recently used dropped)

	mu       sync.Mutex
	senders  lruBuckets[netip.Addr]
	names    lruBuckets[nameKey]
	inFlight map[notifyKey]struct{}
}

type notifyKey struct {
	monName  string
	from     netip.Addr
	state    int32
	fromHost bool // from is an address of the host monName names
}

// nameKey is a per-name bucket: the host's own notifications, or others'.
type nameKey struct {
	name     string
	fromHost bool
}

// bucket is a token bucket: tokens at time at.
type bucket struct {
	tokens float64
	at     time.Time
}

// lruBuckets are token buckets by key, at most max of them.
type lruBuckets[K comparable] struct {
	m     map[K]*list.Element // of *lruEntry[K]
	order *list.List          // least recently used first
}

type lruEntry[K comparable] struct {
	key K
	b   bucket
}

func newNotifyLimiter(burst int, every time.Duration, max int) *notifyLimiter {
	return &notifyLimiter{
		burst: burst, every: every, max: max,
		senders:  lruBuckets[netip.Addr]{m: map[netip.Addr]*list.Element{}, order: list.New()},
		names:    lruBuckets[nameKey]{m: map[nameKey]*list.Element{}, order: list.New()},
		inFlight: map[notifyKey]struct{}{},
	}
}

// get returns key's bucket, refilled to now; a new one is full.
func (l *lruBuckets[K]) get(key K, now time.Time, burst int, every time.Duration, max int) *bucket {
	if e, ok := l.m[key]; ok {
		l.order.MoveToBack(e)
		b := &e.Value.(*lruEntry[K]).b
		if every > 0 {
			b.tokens = min(float64(burst), b.tokens+float64(now.Sub(b.at))/float64(every))
		}
		b.at = now
		return b
	}
	if l.order.Len() >= max {
		old := l.order.Remove(l.order.Front()).(*lruEntry[K])
		delete(l.m, old.key)
	}
	e := &lruEntry[K]{key: key, b: bucket{tokens: float64(burst), at: now}}
	l.m[key] = l.order.PushBack(e)
	return &e.b
}

// Outcomes of notifyLimiter.begin.
const (
	notifyGo       = iota // commit it, then call end
	notifyLimited         // a bucket is empty
	notifyInFlight        // the same notification is being committed
)

// begin decides whether an acceptable notification is committed now.
// With notifyGo the caller must call end(k) once the commit is done.
func (l *notifyLimiter) begin(k notifyKey, now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.inFlight[k]; ok {
		return notifyInFlight
	}
	var sb *bucket
	if k.from.IsValid() {
		sb = l.senders.get(k.from, now, l.burst, l.every, l.max)
		if sb.tokens < 1 {
			return notifyLimited
		}
	}
	nb := l.names.get(nameKey{k.monName, k.fromHost}, now, l.burst, l.every, l.max)
	if nb.tokens < 1 {
		return notifyLimited
	}
	if sb != nil {
		sb.tokens--
	}
	nb.tokens--
	l.inFlight[k] = struct{}{}
	return notifyGo
}

func (l *notifyLimiter) end(k notifyKey) {
	l.mu.Lock()
	delete(l.inFlight, k)
	l.mu.Unlock()
}
