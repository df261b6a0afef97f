package nsm

import (
	"sync"
	"time"
)

// readyGate is where TCP calls held for readiness wait: one goroutine,
// running only while some call waits, checks Ready on the Registry's
// events (ReadyNotifier) and every poll interval, and wakes every waiter
// at once when it finds it true. However many calls wait — up to a
// thousand connections' worth during an election — there is one ticker
// and one Ready check per interval, not one per call.
type readyGate struct {
	reg  Registry
	rn   ReadyNotifier // nil: the poll only
	poll time.Duration

	mu      sync.Mutex
	waiters int
	running bool
	ready   chan struct{} // closed when Ready was found true; then replaced
}

func newReadyGate(reg Registry, poll time.Duration) *readyGate {
	g := &readyGate{reg: reg, poll: poll, ready: make(chan struct{})}
	g.rn, _ = reg.(ReadyNotifier)
	return g
}

// join counts a waiter in (starting the checker if it is the first) and
// returns the channel closed at the next time Ready is found true. The
// caller must call leave once it stops waiting.
func (g *readyGate) join() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.waiters++
	if !g.running {
		g.running = true
		go g.check()
	}
	return g.ready
}

// next returns the channel for the next time Ready is found true (after
// a wake-up that found it false again).
func (g *readyGate) next() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ready
}

func (g *readyGate) leave() {
	g.mu.Lock()
	g.waiters--
	g.mu.Unlock()
}

// check is the one checker. It belongs to the waiters: it ends at the
// first look that finds none left (so at most one poll interval after the
// last call stopped waiting, also at shutdown).
func (g *readyGate) check() {
	t := time.NewTicker(g.poll)
	defer t.Stop()
	for {
		var changed <-chan struct{} // nil: no events, only the poll
		if g.rn != nil {
			changed = g.rn.ReadyChanged()
		}
		g.mu.Lock()
		if g.waiters == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		// After taking the event channel: no event is missed.
		if g.reg.Ready() {
			g.mu.Lock()
			close(g.ready)
			g.ready = make(chan struct{})
			g.mu.Unlock()
		}
		select {
		case <-changed:
		case <-t.C:
		}
	}
}
