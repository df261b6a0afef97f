package e2e

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// vipWatchEvery is how often each node namespace is sampled.
const vipWatchEvery = 20 * time.Millisecond

// vipEvent is one observed change: node started or stopped holding the VIP.
type vipEvent struct {
	node  string
	at    time.Time
	held  bool
	valid uint32 // valid_lft in seconds when held (0xffffffff: forever)
}

// vipOverlap is a stretch of time when two or more nodes held the VIP.
type vipOverlap struct {
	nodes []string
	from  time.Time
	dur   time.Duration
}

// vipWatcher samples, every 20 ms, whether each node namespace has the
// VIP configured (a netlink address dump from a thread inside the
// namespace) and keeps the history of changes and of overlaps.
type vipWatcher struct {
	vip  netip.Addr
	stop chan struct{}
	wg   sync.WaitGroup

	mu         sync.Mutex
	held       map[string]time.Time // node → first sample that saw it
	events     []vipEvent
	overlapAt  time.Time // start of the current overlap, zero if none
	overlapOn  []string
	overlaps   []vipOverlap // every overlap, in order
	maxOverlap time.Duration
	maxValid   uint32 // largest valid_lft seen: about the VIP lifetime
	errs       []string
}

func startVIPWatcher(vip netip.Addr, nodes []*netHost) *vipWatcher {
	w := &vipWatcher{vip: vip, stop: make(chan struct{}), held: make(map[string]time.Time)}
	for _, n := range nodes {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			err := inNetnsThread(n.ns, func() error { return w.watch(n.name) })
			if err != nil {
				w.mu.Lock()
				w.errs = append(w.errs, fmt.Sprintf("%s: %v", n.name, err))
				w.mu.Unlock()
			}
		}()
	}
	return w
}

// Stop ends the sampling (before the namespaces go away).
func (w *vipWatcher) Stop() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

// watch runs on a thread inside node's namespace.
func (w *vipWatcher) watch(node string) error {
	tick := time.NewTicker(vipWatchEvery)
	defer tick.Stop()
	was := false
	for {
		held, valid, err := addrConfigured(w.vip)
		if err != nil {
			return err
		}
		if held != was {
			w.record(vipEvent{node: node, at: time.Now(), held: held, valid: valid})
			was = held
		} else if held {
			w.mu.Lock()
			w.maxValid = max(w.maxValid, valid)
			w.mu.Unlock()
		}
		select {
		case <-w.stop:
			return nil
		case <-tick.C:
		}
	}
}

func (w *vipWatcher) record(e vipEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, e)
	if e.held {
		w.held[e.node] = e.at
		if e.valid != 0xffffffff {
			w.maxValid = max(w.maxValid, e.valid)
		}
	} else {
		delete(w.held, e.node)
	}
	switch {
	case len(w.held) >= 2 && w.overlapAt.IsZero():
		w.overlapAt = e.at
		w.overlapOn = w.holdersLocked()
	case len(w.held) < 2 && !w.overlapAt.IsZero():
		d := e.at.Sub(w.overlapAt)
		w.overlaps = append(w.overlaps, vipOverlap{nodes: w.overlapOn, from: w.overlapAt, dur: d})
		w.maxOverlap = max(w.maxOverlap, d)
		w.overlapAt = time.Time{}
	}
}

func (w *vipWatcher) holdersLocked() []string {
	out := make([]string, 0, len(w.held))
	for n := range w.held {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Holders lists the nodes that have the VIP configured now.
func (w *vipWatcher) Holders() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.holdersLocked()
}

// vipMark is a position in the event and overlap history.
type vipMark struct{ events, overlaps int }

// Mark returns the current position in the history.

func (w *vipWatcher) Mark() vipMark {
	w.mu.Lock()
	defer w.mu.Unlock()
	return vipMark{len(w.events), len(w.overlaps)}
}

// EventsSince returns the changes after m.
func (w *vipWatcher) EventsSince(m vipMark) []vipEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]vipEvent(nil), w.events[m.events:]...)
}

// OverlapsSince returns the overlaps that ended after m, plus one still
// going on (with its duration so far).
func (w *vipWatcher) OverlapsSince(m vipMark) []vipOverlap {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := append([]vipOverlap(nil), w.overlaps[m.overlaps:]...)
	if !w.overlapAt.IsZero() {
		out = append(out, vipOverlap{nodes: w.overlapOn, from: w.overlapAt, dur: time.Since(w.overlapAt)})
	}
	return out
}

// Summary says the largest overlap and VIP lifetime seen, and any errors.
func (w *vipWatcher) Summary() (maxOverlap time.Duration, maxValid uint32, errs []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxOverlap, w.maxValid, append([]string(nil), w.errs...)
}

// firstChange returns the first of evs in which node took (held) or
// dropped the VIP.
func firstChange(evs []vipEvent, node string, held bool) (vipEvent, bool) {
	for _, e := range evs {
		if e.node == node && e.held == held {
			return e, true
		}
	}
	return vipEvent{}, false
}

func formatEvents(evs []vipEvent, since time.Time) string {
	var b strings.Builder
	for _, e := range evs {
		verb := "dropped"
		if e.held {
			verb = fmt.Sprintf("took (valid_lft %ds)", e.valid)
		}
		fmt.Fprintf(&b, "  +%v %s %s\n", e.at.Sub(since).Round(time.Millisecond), e.node, verb)
	}
	return b.String()
}

// addrConfigured dumps the IPv4 addresses of the calling thread's network
// namespace and reports whether a is among them, with its valid_lft.
func addrConfigured(a netip.Addr) (bool, uint32, error) {
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_INET)
	if err != nil {
		return false, 0, fmt.Errorf("netlink address dump: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return false, 0, fmt.Errorf("parse netlink dump: %w", err)
	}
	want := a.As4()
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != syscall.RTM_NEWADDR {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return false, 0, fmt.Errorf("parse address attributes: %w", err)
		}
		var match bool
		var valid uint32 = 0xffffffff
		for _, at := range attrs {
			switch at.Attr.Type {
			case syscall.IFA_LOCAL:
				match = len(at.Value) == 4 && [4]byte(at.Value) == want
			case syscall.IFA_CACHEINFO: // struct ifa_cacheinfo{prefered, valid, cstamp, tstamp}
				if len(at.Value) >= 8 {
					valid = binary.NativeEndian.Uint32(at.Value[4:8])
				}
			}
		}
		if match {
			return true, valid, nil
		}
	}
	return false, 0, nil
}
