package fsm

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Who serves the shared storage, and what each serving node promised
// (entry kinds 15–17, CommandLevel 2). A node with an on_leader hook
// commits ServingBegin before the hook runs and ServingEnd only after its
// stop (the on_follower hook) succeeded; an operator's FenceConfirm says
// a node is off. So the replicated state always names every node that may
// still serve — whether or not it is still a raft voter or a gossip
// member — with the fencing it promised while it served; a new leader
// fences each of them before it serves (package cluster).

// FenceMode is how a serving node is fenced when it can no longer prove
// it may serve.
type FenceMode uint8

// The fence modes a node promises. FenceUnknown is never recorded: it is
// what a successor assumes of a node whose promise it does not know (a
// node of an earlier release).
const (
	FenceUnknown  FenceMode = 0
	FenceOff      FenceMode = 1 // nothing: neither a watchdog nor a fence agent
	FenceAgent    FenceMode = 2 // no watchdog: only a fence agent run by the others
	FenceWatchdog FenceMode = 3 // its watchdog resets it (a fence agent may also be set)
)

// String names the mode as status and logs show it.
func (m FenceMode) String() string {
	switch m {
	case FenceOff:
		return "off"
	case FenceAgent:
		return "agent"
	case FenceWatchdog:
		return "watchdog"
	}
	return "unknown"
}

// MaxPromiseDuration bounds every duration of a Promise (encode, decode,
// restore): a day is far beyond any watchdog (65535 s at most) or hook.
const MaxPromiseDuration = 24 * time.Hour

// maxConfirmations bounds the operator confirmations kept: beyond it the
// oldest is dropped (the same on every replica).
const maxConfirmations = 64

// Promise is what a serving node promises while it serves: with
// FenceWatchdog, that its watchdog (WatchdogTimeout, what the device
// took) resets it within Lease + WatchdogTimeout + Margin of the last
// time a quorum confirmed its leadership; HookTimeout bounds its hooks
// (a successor waits that long for one that stands down before a fence
// agent fences it).
type Promise struct {
	Mode            FenceMode
	WatchdogTimeout time.Duration
	Lease           time.Duration
	HookTimeout     time.Duration
	Margin          time.Duration
}

// Bound is how long after a successor's election the node that made p
// must have been reset (Lease + WatchdogTimeout + Margin), and false
// when p promises no such bound (no watchdog, or unknown).
func (p Promise) Bound() (time.Duration, bool) {
	if p.Mode != FenceWatchdog || p.WatchdogTimeout <= 0 {
		return 0, false
	}
	return p.Lease + p.WatchdogTimeout + p.Margin, true
}

// ServingBegin records that Node begins serving with Promise (committed
// before its on_leader hook runs). NSMAddr is where it answers the
// question whether it serves, kept for when gossip no longer knows it.
type ServingBegin struct {
	Node    string
	NSMAddr string
	Promise Promise
	At      time.Time
}

// ServingEnd records that Node stopped serving: its on_follower hook (or
// its stop at start) succeeded.
type ServingEnd struct {
	Node string
	At   time.Time
}

// FenceConfirm is an operator's confirmation that Node is off (nsmd
// fence confirm): it clears Node's serving record and is kept, with who
// and when, until Node takes over or begins serving again.
type FenceConfirm struct {
	Node string
	By   string
	At   time.Time
}

func (ServingBegin) isCommand() {}
func (ServingEnd) isCommand()   {}
func (FenceConfirm) isCommand() {}

// ServingRecord is one node that may serve, as the replicated state has it.
type ServingRecord struct {
	Node    string
	NSMAddr string
	Promise Promise
	Since   time.Time
}

// Confirmation is an operator's confirmation that Node is off.
type Confirmation struct {
	Node string
	By   string
	At   time.Time
}

// Entry kinds of this file (codec.go has the format).
const (
	kindServingBegin = 15
	kindServingEnd   = 16
	kindFenceConfirm = 17

	maxAddrLen = 256 // ServingBegin.NSMAddr (host:port)
	maxByLen   = 256 // FenceConfirm.By
)

// applyServing applies kinds 15–17; the maps are replaced, never changed
// in place, so a view taken before (a snapshot being written) keeps its
// own. mu is held exclusively.
func (s *state) applyServing(c Command) {
	switch c := c.(type) {
	case ServingBegin:
		s.serving = with(s.serving, c.Node, ServingRecord{Node: c.Node, NSMAddr: c.NSMAddr, Promise: c.Promise, Since: c.At})
		s.unconfirm(c.Node)
	case ServingEnd:
		if _, ok := s.serving[c.Node]; ok {
			s.serving = without(s.serving, c.Node)
		}
	case FenceConfirm:
		if _, ok := s.serving[c.Node]; ok {
			s.serving = without(s.serving, c.Node)
		}
		conf := with(s.confirmed, c.Node, Confirmation(c))
		for len(conf) > maxConfirmations {
			oldest := slices.MinFunc(slices.Collect(maps.Values(conf)), func(a, b Confirmation) int {
				return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Node, b.Node))
			})
			delete(conf, oldest.Node)
		}
		s.confirmed = conf
	}
}

// unconfirm drops node's confirmation: it took over or serves again, so
// the operator's word that it is off no longer holds.
func (s *state) unconfirm(node string) {
	if _, ok := s.confirmed[node]; ok {
		s.confirmed = without(s.confirmed, node)
	}
}

func with[V any](m map[string]V, k string, v V) map[string]V {
	out := make(map[string]V, len(m)+1)
	maps.Copy(out, m)
	out[k] = v
	return out
}

func without[V any](m map[string]V, k string) map[string]V {
	out := maps.Clone(m)
	delete(out, k)
	if len(out) == 0 {
		return nil
	}
	return out
}

// ServingRecords lists the nodes recorded as serving, by node id.
func (f *FSM) ServingRecords() []ServingRecord {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := slices.Collect(maps.Values(f.st.serving))
	slices.SortFunc(out, func(a, b ServingRecord) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// ServingRecordOf returns node's serving record.
func (f *FSM) ServingRecordOf(node string) (ServingRecord, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r, ok := f.st.serving[node]
	return r, ok
}

// Confirmed returns the operator's confirmation that node is off, if one
// was committed since node last took over or began serving.
func (f *FSM) Confirmed(node string) (Confirmation, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c, ok := f.st.confirmed[node]
	return c, ok
}

// Confirmations lists the operator confirmations that still hold, by node.
func (f *FSM) Confirmations() []Confirmation {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := slices.Collect(maps.Values(f.st.confirmed))
	slices.SortFunc(out, func(a, b Confirmation) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// servingCommand encodes kinds 15–17 (ok false for other commands).
func (e *encoder) servingCommand(c Command) (ok bool, err error) {
	switch c := c.(type) {
	case ServingBegin:
		e.b = append(e.b, kindServingBegin)
		return true, e.servingRecord(&ServingRecord{Node: c.Node, NSMAddr: c.NSMAddr, Promise: c.Promise, Since: c.At})
	case ServingEnd:
		e.b = append(e.b, kindServingEnd)
		if err := e.nodeName(c.Node); err != nil {
			return true, err
		}
		return true, e.time(c.At, "at")
	case FenceConfirm:
		e.b = append(e.b, kindFenceConfirm)
		return true, e.confirmation(&Confirmation{Node: c.Node, By: c.By, At: c.At})
	}
	return false, nil
}

// servingRecord = str(node) str(nsm_addr) promise time(since); the body of
// kind 15 and an entry of the snapshot's serving section.
func (e *encoder) servingRecord(r *ServingRecord) error {
	if err := e.nodeName(r.Node); err != nil {
		return err
	}
	if err := e.str(r.NSMAddr, maxAddrLen, "nsm address"); err != nil {
		return err
	}
	if err := e.promise(r.Promise); err != nil {
		return err
	}
	return e.time(r.Since, "at")
}

// confirmation = str(node) str(by) time(at); the body of kind 17 and an
// entry of the snapshot's confirmed section.
func (e *encoder) confirmation(c *Confirmation) error {
	if err := e.nodeName(c.Node); err != nil {
		return err
	}
	if err := e.str(c.By, maxByLen, "by"); err != nil {
		return err
	}
	return e.time(c.At, "at")
}

func (e *encoder) nodeName(s string) error {
	if s == "" {
		return fmt.Errorf("empty node")
	}
	return e.str(s, MaxNameLen, "node")
}

// promise = mode:u8(1…3) watchdog_timeout lease hook_timeout margin, each
// duration a uvarint of nanoseconds ≤ MaxPromiseDuration.
func (e *encoder) promise(p Promise) error {
	if p.Mode < FenceOff || p.Mode > FenceWatchdog {
		return fmt.Errorf("fence mode %d (want 1…3)", p.Mode)
	}
	e.b = append(e.b, byte(p.Mode))
	for _, d := range []time.Duration{p.WatchdogTimeout, p.Lease, p.HookTimeout, p.Margin} {
		if d < 0 || d > MaxPromiseDuration {
			return fmt.Errorf("promise duration %v (want 0…%v)", d, MaxPromiseDuration)
		}
		e.b = binary.AppendUvarint(e.b, uint64(d))
	}
	return nil
}

// servingCommand decodes kinds 15–17 (ok false for another kind).
func (d *decoder) servingCommand(k byte) (Command, bool) {
	switch k {
	case kindServingBegin:
		r := d.servingRecord()
		return ServingBegin{Node: r.Node, NSMAddr: r.NSMAddr, Promise: r.Promise, At: r.Since}, true
	case kindServingEnd:
		return ServingEnd{Node: d.nodeName(), At: d.time()}, true
	case kindFenceConfirm:
		return FenceConfirm(d.confirmation()), true
	}
	return nil, false
}

func (d *decoder) servingRecord() ServingRecord {
	return ServingRecord{Node: d.nodeName(), NSMAddr: d.str(maxAddrLen, "nsm address"), Promise: d.promise(), Since: d.time()}
}

func (d *decoder) confirmation() Confirmation {
	return Confirmation{Node: d.nodeName(), By: d.str(maxByLen, "by"), At: d.time()}
}

func (d *decoder) nodeName() string {
	b := d.strBytes(MaxNameLen, "node")
	if d.err == nil && len(b) == 0 {
		d.fail("empty node")
	}
	return string(b)
}

func (d *decoder) promise() Promise {
	m := FenceMode(d.u8())
	if d.err == nil && (m < FenceOff || m > FenceWatchdog) {
		d.fail("fence mode %d (want 1…3)", m)
	}
	var ds [4]time.Duration
	for i := range ds {
		v := d.uvarint()
		if d.err == nil && v > uint64(MaxPromiseDuration) {
			d.fail("promise duration %d ns (max %v)", v, MaxPromiseDuration)
		}
		ds[i] = time.Duration(v)
	}
	if d.err != nil {
		return Promise{}
	}
	return Promise{Mode: m, WatchdogTimeout: ds[0], Lease: ds[1], HookTimeout: ds[2], Margin: ds[3]}
}

// servingSections writes the snapshot's sections 6 (serving records) and
// 7 (confirmations), each sorted by node (version 4 only).
func (w *snapWriter) servingSections(st *state) error {
	w.begin(tagServing)
	for _, node := range slices.Sorted(maps.Keys(st.serving)) {
		r := st.serving[node]
		if err := w.frame.servingRecord(&r); err != nil {
			return fmt.Errorf("serving record %q: %w", node, err)
		}
		w.maybeFlush(tagServing)
	}
	w.flush()
	w.begin(tagConfirm)
	for _, node := range slices.Sorted(maps.Keys(st.confirmed)) {
		c := st.confirmed[node]
		if err := w.frame.confirmation(&c); err != nil {
			return fmt.Errorf("confirmation %q: %w", node, err)
		}
		w.maybeFlush(tagConfirm)
	}
	w.flush()
	return w.err
}

// servingReader reads sections 6 and 7, checking the order by node
// across frames and the bound on confirmations.
type servingReader struct {
	prev [2]string
	n    [2]int
}

func (v *servingReader) read(d *decoder, tag int, st *state) {
	i := tag - tagServing
	for len(d.b) > 0 && d.err == nil {
		var node string
		if tag == tagServing {
			r := d.servingRecord()
			node = r.Node
			if d.err == nil {
				if st.serving == nil {
					st.serving = map[string]ServingRecord{}
				}
				st.serving[node] = r
			}
		} else {
			c := d.confirmation()
			node = c.Node
			if d.err == nil {
				if st.confirmed == nil {
					st.confirmed = map[string]Confirmation{}
				}
				st.confirmed[node] = c
			}
		}
		if d.err != nil {
			return
		}
		if v.n[i] > 0 && node <= v.prev[i] {
			d.fail("section %d out of order at %q", tag, node)
			return
		}
		v.prev[i] = node
		v.n[i]++
		if tag == tagConfirm && v.n[i] > maxConfirmations {
			d.fail("more than %d confirmations", maxConfirmations)
			return
		}
	}
}
