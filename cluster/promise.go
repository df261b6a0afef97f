package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/fsm"
)

// Fencing promises (cluster/DESIGN.md, "Fencing promises"): what each
// serving node promises about how it is fenced, where the others learn
// it, who a new leader must prove stopped, and an operator's confirmation
// that a node is off.
//
// A serving node (one whose Server serves shared storage: ServesStorage,
// or any fence configured) publishes its promise in its gossip metadata
// from its start, and — once every member applies CommandLevel 2 —
// commits it in a serving record (fsm.ServingBegin) before its Server.Serve
// runs; the record is cleared (fsm.ServingEnd) only after its stop
// succeeded. A new leader proves stopped every node with a serving record
// and every other serving voter, each by the node's own promise (never
// less than its own settings): its answer, a fence agent, the watchdog
// bound it promised, or an operator's confirmation. A peer that promised
// no watchdog, or whose promise is unknown (an earlier release), has no
// bound: only an answer, the agent or an operator proves it.

// promiseLevel is the fsm.CommandLevel that applies kinds 15–17.
const promiseLevel = 2

// promises is the node's state about fencing promises.
type promises struct {
	// recMu orders this node's own ServingBegin and ServingEnd commits
	// (serve, servingRecordLoop): an End decided while not serving never
	// lands after a Begin of a term that started meanwhile.
	recMu sync.Mutex
	kick  chan struct{} // wakes servingRecordLoop (a stop succeeded)

	mu sync.Mutex
	// wake is closed and replaced when an operator's confirmation is
	// applied or recorded here.
	wake chan struct{}
	// local holds confirmations taken by this leader while the cluster
	// cannot record them (a member below CommandLevel 2: a rolling
	// upgrade, or a member of an earlier release that is down); they hold
	// for this leadership term only.
	local     map[string]fsm.Confirmation
	localTerm uint64
	unproven  []string // peers of the running wait that no bound can prove
	confirms  prometheus.Counter
}

func (p *promises) init() {
	p.kick = make(chan struct{}, 1)
	p.wake = make(chan struct{})
	p.confirms = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nsmd_fence_confirms_total",
		Help: "Operator confirmations that a node is off (nsmd fence confirm) taken by this node as leader or applied here.",
	})
}

func (p *promises) wakeWaiters() {
	p.mu.Lock()
	close(p.wake)
	p.wake = make(chan struct{})
	p.mu.Unlock()
}

func (p *promises) waitCh() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.wake
}

// servesStorage: this node's Server serves shared storage, so it has a
// promise to publish and a new leader must prove it stopped; and as a
// new leader it proves every other serving node stopped before serving.
func (n *Node) servesStorage() bool {
	return !n.cfg.Witness && (n.cfg.ServesStorage || n.cfg.Watchdog != nil || n.cfg.FenceAgent != nil || n.cfg.FenceTimeout > 0)
}

// ownPromise is what this node promises while it serves: its watchdog's
// timeout (the device takes exactly the configured one or is not armed:
// fence.Watchdog.Arm), its fence lease, hook timeout and the margin.
func (n *Node) ownPromise() fsm.Promise {
	p := fsm.Promise{Mode: fsm.FenceOff, Lease: n.fenceLease(), HookTimeout: n.cfg.HookTimeout, Margin: fenceMargin}
	switch {
	case n.cfg.Watchdog != nil:
		p.Mode, p.WatchdogTimeout = fsm.FenceWatchdog, n.cfg.FenceTimeout
	case n.cfg.FenceAgent != nil:
		p.Mode = fsm.FenceAgent
	}
	return p
}

// Gossip form of a promise (nodeMeta.Promise): "none" for a node that
// serves no storage, else mode/timeout/lease/hook/margin in milliseconds.
const promiseNone = "none"

func encodePromise(p fsm.Promise) string {
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	return strings.Join([]string{p.Mode.String(), ms(p.WatchdogTimeout), ms(p.Lease), ms(p.HookTimeout), ms(p.Margin)}, "/")
}

// decodePromise parses the gossip form; ok is false for anything else
// (then the promise is unknown). Durations are rounded up to the next
// millisecond by the encoder's truncation only in the safe direction:
// see encodePromise's callers (they publish whole seconds and ms).
func decodePromise(s string) (p fsm.Promise, ok bool) {
	f := strings.Split(s, "/")
	if len(f) != 5 {
		return fsm.Promise{}, false
	}
	switch f[0] {
	case "off":
		p.Mode = fsm.FenceOff
	case "agent":
		p.Mode = fsm.FenceAgent
	case "watchdog":
		p.Mode = fsm.FenceWatchdog
	default:
		return fsm.Promise{}, false
	}
	var ds [4]time.Duration
	for i, v := range f[1:] {
		x, err := strconv.ParseInt(v, 10, 64)
		if err != nil || x < 0 || time.Duration(x)*time.Millisecond > fsm.MaxPromiseDuration {
			return fsm.Promise{}, false
		}
		ds[i] = time.Duration(x) * time.Millisecond
	}
	p.WatchdogTimeout, p.Lease, p.HookTimeout, p.Margin = ds[0], ds[1], ds[2], ds[3]
	return p, true
}

// metaPromise is this node's promise as its gossip metadata carries it.
func (n *Node) metaPromise() string {
	if !n.servesStorage() {
		return promiseNone
	}
	p := n.ownPromise()
	// Round up to whole milliseconds: the wire never understates.
	for _, d := range []*time.Duration{&p.WatchdogTimeout, &p.Lease, &p.HookTimeout, &p.Margin} {
		*d = (*d + time.Millisecond - 1).Truncate(time.Millisecond)
	}
	return encodePromise(p)
}

// PeerPromise is what this node knows of another node's promise.
type PeerPromise struct {
	Node    string
	Promise fsm.Promise // Mode FenceUnknown: not known
	// Source: "record" (its serving record), "gossip" (its metadata),
	// "unknown" (neither: an earlier release, or never seen), "none" (it
	// says it serves no storage).
	Source  string
	Serving bool // it has a serving record
	NSMAddr string
}

// peerPromise is what node id promised: its serving record's promise if
// it has one (what it promised while it serves), else what its gossip
// metadata says (its configuration now), else unknown.
func (n *Node) peerPromise(id string) PeerPromise {
	out := PeerPromise{Node: id, Source: "unknown"}
	if r, ok := n.fsm.ServingRecordOf(id); ok {
		out.Promise, out.Source, out.Serving, out.NSMAddr = r.Promise, "record", true, r.NSMAddr
		return out
	}
	if n.member == nil {
		return out
	}
	s, ok := n.member.promiseOf(id)
	switch {
	case !ok:
	case s == promiseNone:
		out.Source = "none"
	default:
		if p, ok := decodePromise(s); ok {
			out.Promise, out.Source = p, "gossip"
		}
	}
	return out
}

// fenceList is every other node a new leader must prove stopped: each
// node with a serving record, whether or not it is still a voter or a
// gossip member, and every other serving voter (witnesses excluded, and
// voters that say they serve no storage). With the negative control
// (fenceControl) only the serving voters, as before promises.
func (n *Node) fenceList() []PeerPromise {
	var out []PeerPromise
	seen := map[string]bool{n.cfg.NodeID: true}
	add := func(id string) {
		if seen[id] || n.IsWitness(id) {
			return
		}
		seen[id] = true
		p := n.peerPromise(id)
		if p.Source == "none" && !n.ownSettingsOnly() {
			return
		}
		out = append(out, p)
	}
	for _, s := range n.servingVoters() {
		add(string(s.ID))
	}
	if !n.ownSettingsOnly() {
		for _, r := range n.fsm.ServingRecords() {
			add(r.Node)
		}
	}
	return out
}

// FenceControlBuild reports whether this binary was built with the
// fencecontrol tag (the drills' negative control: never ship it).
func FenceControlBuild() bool { return fenceControl }

// ownSettingsOnly: the successor waits by its own settings alone, as
// before promises travelled (the tests' negative control: the
// fencecontrol build tag, or Config.ownSettingsOnly).
func (n *Node) ownSettingsOnly() bool { return fenceControl || n.cfg.ownSettingsOnly }

// peerBound is how long after this leader's election peer p must have
// been reset by its watchdog: by p's promise, never less than this node's
// own settings; false when p promised no watchdog or its promise is
// unknown (only its answer, an agent or an operator proves it stopped).
func (n *Node) peerBound(p PeerPromise) (time.Duration, bool) {
	own := n.cfg.FenceTimeout
	if n.ownSettingsOnly() {
		if own <= 0 {
			return 0, false
		}
		return n.fenceLease() + own + fenceMargin, true
	}
	if p.Promise.Mode != fsm.FenceWatchdog || p.Promise.WatchdogTimeout <= 0 {
		return 0, false
	}
	return max(p.Promise.Lease, n.fenceLease()) + max(p.Promise.WatchdogTimeout, own) + max(p.Promise.Margin, fenceMargin), true
}

// peerStandDownWait is how long to let peer p finish a stop before a
// fence agent fences it: its hook timeout (+1 s), never less than ours.
func (n *Node) peerStandDownWait(p PeerPromise) time.Duration {
	if n.ownSettingsOnly() || p.Promise.HookTimeout <= 0 {
		return n.cfg.StandDownWait
	}
	return max(n.cfg.StandDownWait, p.Promise.HookTimeout+time.Second)
}

// confirmedOff reports an operator's confirmation that id is off that
// holds now: committed (and id has not taken over or begun serving since),
// or taken by this leader in this term while the cluster could not record
// it.
func (n *Node) confirmedOff(id string, term uint64) (fsm.Confirmation, bool) {
	if c, ok := n.fsm.Confirmed(id); ok {
		return c, true
	}
	n.prom.mu.Lock()
	defer n.prom.mu.Unlock()
	c, ok := n.prom.local[id]
	return c, ok && n.prom.localTerm == term
}

// awaitConfirmed returns once an operator confirmed id off (true), or
// false when ctx ended first.
func (n *Node) awaitConfirmed(ctx context.Context, id string, term uint64) (fsm.Confirmation, bool) {
	for {
		ch := n.prom.waitCh()
		if c, ok := n.confirmedOff(id, term); ok {
			return c, true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fsm.Confirmation{}, false
		}
	}
}

// Errors of ConfirmOff.
var (
	// ErrConfirmRefused means an operator's confirmation was refused: it
	// named this node, the raft leader, no node, or a node that answers
	// that it serves.
	ErrConfirmRefused = errors.New("cluster: confirmation refused")
)

// ConfirmOff records an operator's confirmation that node is off (nsmd
// fence confirm; by names who confirmed). A new leader waiting for node
// then treats it as stopped. It refuses this node, the raft leader, and a
// node that answers (authenticated) that it serves: those are not off.
// Committed as fsm.FenceConfirm once every member applies it; until then
// the leader keeps it for its current term.
func (n *Node) ConfirmOff(ctx context.Context, node, by string) error {
	switch {
	case node == "" || len(node) > fsm.MaxNameLen:
		return fmt.Errorf("%w: node %q: name a member by its node id", ErrConfirmRefused, node)
	case node == n.cfg.NodeID:
		return fmt.Errorf("%w: %s is this node, and it is running", ErrConfirmRefused, node)
	}
	if _, leader := n.raft.LeaderWithID(); string(leader) == node {
		return fmt.Errorf("%w: %s is the raft leader: it is running", ErrConfirmRefused, node)
	}
	if serving, err := n.askServing(ctx, node); err == nil && serving {
		return fmt.Errorf("%w: %s answers that it serves: it is not off (stop it, or power it off, first)", ErrConfirmRefused, node)
	}
	if len(by) > 256 {
		by = by[:256]
	}
	// On the leader or forwarded to it, applyLocal's gateServing commits
	// it or keeps it there for the term.
	_, err := n.apply(ctx, fsm.FenceConfirm{Node: node, By: by, At: n.cfg.Now().UTC()})
	return err
}

// gateServing is applyLocal's check of kinds 15 and 17: while some member
// cannot apply them (recordsOK false), a ServingBegin is refused and an
// operator's confirmation is kept by this leader for its current term
// instead of committed — a confirmation only while some member, up or
// down, last advertised a lower level. handled is false for every other command, and
// for these when they may be committed.
func (n *Node) gateServing(cmd fsm.Command) (handled bool, err error) {
	switch c := cmd.(type) {
	case fsm.FenceConfirm:
		n.log.Warn("an operator confirmed a node off", "node", c.Node, "by", c.By)
		// A confirmation is about a node that is down, so a member that is
		// down counts by the level it last advertised (as placements do):
		// committed, it reaches every node, the new server of a service
		// the confirmed node held among them.
		if n.recordsOK() || (n.member != nil && n.serversLevel(true) >= promiseLevel) {
			return false, nil
		}
		n.keepConfirmation(c)
		return true, nil
	case fsm.ServingBegin:
		if !n.recordsOK() {
			return true, errors.New("cluster: a member cannot apply serving records yet")
		}
	}
	return false, nil
}

// keepConfirmation keeps c on this leader for its current raft term.
func (n *Node) keepConfirmation(c fsm.FenceConfirm) {
	term := n.raft.CurrentTerm()
	n.prom.mu.Lock()
	if n.prom.localTerm != term {
		n.prom.local, n.prom.localTerm = map[string]fsm.Confirmation{}, term
	}
	if len(n.prom.local) < 64 {
		n.prom.local[c.Node] = fsm.Confirmation(c)
	}
	n.prom.mu.Unlock()
	n.prom.confirms.Inc()
	n.prom.wakeWaiters()
}

// observeServing runs inside Apply for kinds 15–17 (it must not block).
func (n *Node) observeServing(cmd fsm.Command) {
	if _, ok := cmd.(fsm.FenceConfirm); ok {
		n.prom.confirms.Inc()
		n.prom.wakeWaiters()
	}
}

// recordServing commits this node's serving record before its Server.Serve
// runs (serve), when every member applies kind 15; false when it could
// not be committed (then the node does not serve).
func (n *Node) recordServing(ctx context.Context) error {
	if !n.servesStorage() || !n.recordsOK() {
		return nil
	}
	n.prom.recMu.Lock()
	defer n.prom.recMu.Unlock()
	_, err := n.applyLocal(ctx, fsm.ServingBegin{Node: n.cfg.NodeID, NSMAddr: n.cfg.NSMAddr, Promise: n.ownPromise(), At: n.cfg.Now().UTC()})
	if err != nil {
		return fmt.Errorf("record that this node serves: %w", err)
	}
	return nil
}

// recordServingAny is recordServing for a node that serves services
// (servicerun.go): it may be a follower, which forwards the record.
func (n *Node) recordServingAny(ctx context.Context) error {
	if _, ok := n.fsm.ServingRecordOf(n.cfg.NodeID); ok {
		return nil // recorded already (its promise is fixed for the process)
	}
	if n.raft.State() == raft.Leader {
		return n.recordServing(ctx)
	}
	if !n.servesStorage() || !n.recordsOK() {
		return nil
	}
	n.prom.recMu.Lock()
	defer n.prom.recMu.Unlock()
	if _, err := n.apply(ctx, fsm.ServingBegin{Node: n.cfg.NodeID, NSMAddr: n.cfg.NSMAddr, Promise: n.ownPromise(), At: n.cfg.Now().UTC()}); err != nil {
		return fmt.Errorf("record that this node serves: %w", err)
	}
	return nil
}

// recordsOK: kinds 15–17 may be proposed — every server of the
// configuration advertises CommandLevel 2 in gossip (a static cluster,
// which has no gossip to say so, only in tests that say every member
// applies them).
func (n *Node) recordsOK() bool {
	if n.member == nil {
		return n.cfg.staticRecords
	}
	return n.clusterLevel() >= promiseLevel
}

// stoppedRecording wakes servingRecordLoop after a stop succeeded.
func (n *Node) stoppedRecording() {
	select {
	case n.prom.kick <- struct{}{}:
	default:
	}
}

// servingRecordLoop clears this node's serving record once it no longer
// serves (its stop, or its stop at start, succeeded), retrying until it
// is committed: forwarded to the leader when this node does not lead.
// Every member applied the record's kind 15, so kind 16 is safe to
// propose whatever gossip shows now.
func (n *Node) servingRecordLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.prom.kick:
		case <-t.C:
		}
		n.clearServingRecord(n.ctx)
	}
}

// clearServingRecord commits ServingEnd for this node when it has a
// record and no longer serves; true when there is nothing left to clear.
func (n *Node) clearServingRecord(ctx context.Context) bool {
	n.prom.recMu.Lock()
	defer n.prom.recMu.Unlock()
	if _, ok := n.fsm.ServingRecordOf(n.cfg.NodeID); !ok {
		return true
	}
	if n.serving.Load() || n.stopFailed.Load() || n.standingDown.Load() || n.runs.active() {
		return false
	}
	end := fsm.ServingEnd{Node: n.cfg.NodeID, At: n.cfg.Now().UTC()}
	var err error
	if n.raft.State() == raft.Leader {
		_, err = n.applyLocal(ctx, end) // also a leader that ended its term to shut down
	} else {
		_, err = n.apply(ctx, end)
	}
	if err != nil {
		n.log.Warn("cannot record that this node stopped serving yet; retrying", "err", err)
		return false
	}
	n.log.Info("recorded that this node stopped serving")
	return true
}

// mayStillServe: this node serves, or its last stop failed (its storage
// may still be held). Such a node never announces a gossip leave, so no
// reconcile removes it from the configuration.
func (n *Node) mayStillServe() bool { return n.serving.Load() || n.stopFailed.Load() }

// ServerPromise is one serving node's promise as this node sees it.
type ServerPromise = PeerPromise

// PromiseView is the fencing promises as this node sees them (status).
type PromiseView struct {
	Own     fsm.Promise // zero Mode: this node serves no storage
	Servers []ServerPromise
	// Mismatch: the known promises of the serving nodes differ (mode,
	// watchdog timeout or lease), or some server's is unknown.
	Mismatch      bool
	Confirmations []fsm.Confirmation
	// Unproven: peers of the wait running now that only their answer, a
	// fence agent or an operator's confirmation can prove stopped.
	Unproven []string
}

// Promises reports the fencing promises of this node and of every other
// serving node it knows (the voters and the nodes with serving records).
func (n *Node) Promises() PromiseView {
	var v PromiseView
	if n.servesStorage() {
		v.Own = n.ownPromise()
	}
	v.Servers = n.fenceList()
	if v.Own.Mode != fsm.FenceUnknown {
		v.Servers = append([]ServerPromise{{Node: n.cfg.NodeID, Promise: v.Own, Source: "self"}}, v.Servers...)
	}
	v.Mismatch = promisesDiffer(v.Servers)
	v.Confirmations = n.fsm.Confirmations()
	n.prom.mu.Lock()
	v.Unproven = slices.Clone(n.prom.unproven)
	if n.prom.localTerm == n.raft.CurrentTerm() && n.raft.State() == raft.Leader {
		for _, c := range n.prom.local {
			v.Confirmations = append(v.Confirmations, c)
		}
	}
	n.prom.mu.Unlock()
	return v
}

// promisesDiffer: two servers promise differently (mode, watchdog
// timeout, lease), or one server's promise is unknown.
func promisesDiffer(ss []ServerPromise) bool {
	type key struct {
		mode    fsm.FenceMode
		timeout time.Duration
		lease   time.Duration
	}
	keys := map[key]bool{}
	for _, s := range ss {
		if s.Source == "none" {
			continue
		}
		keys[key{s.Promise.Mode, s.Promise.WatchdogTimeout, s.Promise.Lease}] = true
	}
	return len(keys) > 1
}

// promiseMetrics are the node's promise gauges and counter.
func promiseMetrics(n *Node) []prometheus.Collector {
	if n.prom.confirms == nil { // a Node not made by New (tests of parts)
		n.prom.init()
	}
	return []prometheus.Collector{
		n.prom.confirms,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nsmd_fence_promise_mismatch",
			Help: "1 when the serving nodes' fencing promises differ (fence mode, watchdog timeout or lease) or one is unknown: a successor waits by the longest, and a node that promises no watchdog is fenced only by an answer, an agent or an operator.",
		}, func() float64 {
			if n.raft == nil || !n.servesStorage() {
				return 0
			}
			if promisesDiffer(n.Promises().Servers) {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nsmd_fence_unproven_nodes",
			Help: "Nodes this new leader waits for that only their answer, a fence agent or an operator's confirmation (nsmd fence confirm) can prove stopped: it does not serve until then.",
		}, func() float64 {
			n.prom.mu.Lock()
			defer n.prom.mu.Unlock()
			return float64(len(n.prom.unproven))
		}),
	}
}
