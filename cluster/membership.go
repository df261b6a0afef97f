package cluster

// Gossip membership: hashicorp/memberlist finds the other nodes, carries
// each node's addresses in its metadata, forms a new cluster once
// --bootstrap-expect servers see each other, and lets the raft leader keep
// the raft configuration in step with the members (add the alive ones,
// remove the ones that left on purpose; failed ones stay voters).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/fsm"
)

// GossipConfig configures memberlist discovery of the other nodes.
type GossipConfig struct {
	Bind            string        // IP to gossip on
	Port            int           // TCP+UDP gossip port; 0 disables gossip
	Join            []string      // seed addresses host:port
	BootstrapExpect int           // form a new cluster once this many servers see each other
	Key             []byte        // 16/24/32-byte AES key; when set, plaintext gossip is refused
	ReconcileEvery  time.Duration // leader's membership → raft reconcile period (the agent: 2 s)
	// ClusterID names the cluster: members that advertise another one are
	// refused (identity.go); those that advertise none are of
	// DefaultClusterID.
	ClusterID string
}

// MemberStatus is one node as gossip and raft see it.
type MemberStatus struct {
	ID         string
	GossipAddr string
	RaftAddr   string
	NSMAddr    string
	Version    string
	State      string // alive | suspect | dead | left | unknown (in raft only)
	Suffrage   string // Voter | Nonvoter | Staging | "" (not in raft)
	Leader     bool
	Witness    bool
	// Role is leader, follower or witness (what the member is for; a
	// witness that briefly leads is still a witness, with Leader set).
	Role string
}

// Member states as reported by members() and the nsmd_members gauge.
const (
	stateAlive   = "alive"
	stateSuspect = "suspect"
	stateDead    = "dead"
	stateLeft    = "left"
	stateUnknown = "unknown"
)

const (
	metaVersion       = 1
	msgLeaveIntent    = byte(1) // user message: "I am leaving on purpose", then the node id
	statePollEvery    = 250 * time.Millisecond
	diskPollEvery     = 250 * time.Millisecond // how often the disk report is compared with the one advertised
	diskRepublishMin  = time.Second            // a report with no new trouble is re-advertised at most this often
	diskUpdateWait    = 10 * time.Millisecond  // how long refreshDisk waits for memberlist to send its update
	configChangeWait  = 5 * time.Second
	updateNodeTimeout = time.Second
	joinBackoffMin    = 200 * time.Millisecond
	joinBackoffMax    = 5 * time.Second
)

// nodeMeta is what a node tells the others about itself in memberlist's
// node metadata (compact JSON, at most memberlist.MetaMaxSize bytes).
type nodeMeta struct {
	V        int    `json:"v"`
	ID       string `json:"id"`
	Raft     string `json:"raft"`
	NSM      string `json:"nsm,omitempty"`
	Version  string `json:"ver,omitempty"`
	Cluster  string `json:"cid,omitempty"`     // cluster id; "" is DefaultClusterID
	HasState bool   `json:"st,omitempty"`      // already in a raft configuration
	Leaving  bool   `json:"leaving,omitempty"` // shutting down on purpose
	Witness  bool   `json:"w,omitempty"`       // a witness: never leads for long, never serves
	// FSM is the newest optional set of log entry kinds the node applies
	// (fsm.CommandLevel; absent in older releases: 0).
	FSM int `json:"fsm,omitempty"`
	// Disk is the node's data directory as it measures it (diskslow.go);
	// nil from a node that does not report one.
	Disk *diskReport `json:"dk,omitempty"`
	// Promise is the node's fencing promise (promise.go: "none", or
	// mode/timeout/lease/hook/margin in ms); absent in older releases.
	Promise string `json:"fp,omitempty"`
}

func decodeMeta(b []byte) (nodeMeta, error) {
	var md nodeMeta
	if err := json.Unmarshal(b, &md); err != nil {
		return nodeMeta{}, fmt.Errorf("decode gossip metadata: %w", err)
	}
	if md.V < metaVersion || md.ID == "" || md.Raft == "" {
		return nodeMeta{}, fmt.Errorf("gossip metadata v%d lacks id or raft address", md.V)
	}
	return md, nil
}

// peer is one memberlist node as this node last saw it.
type peer struct {
	id         string
	gossipAddr string
	meta       nodeMeta
	metaOK     bool
	state      string // alive | dead | left
	leaving    bool   // a leave intent (message or metadata) was seen
}

type membership struct {
	n      *Node
	log    *slog.Logger
	list   *memberlist.Memberlist
	expect int
	every  time.Duration
	seeds  []string

	mu      sync.Mutex
	meta    nodeMeta
	metaRaw []byte
	peers   map[string]*peer

	life   sync.Mutex // orders leave and shutdown of the memberlist
	left   bool
	down   bool
	cancel context.CancelFunc

	kick chan struct{} // nudge: run a step now (gossip events, leader changes)
	wg   sync.WaitGroup

	// Owned by the loop goroutine.
	diskAt        time.Time // when the disk report was last advertised
	hasState      bool
	bootstrapped  bool
	warnedCrowd   bool
	warnedExisted bool

	reconciles atomic.Uint64 // leader reconcile passes (tests wait on it)
	events     atomic.Uint64 // member events handled by updatePeer (tests wait on it)

	clusterID      string
	refusals       *joinRefusals
	versionsWarned map[string]struct{} // version sets already warned about (under mu)

	membersGauge *prometheus.GaugeVec
	changes      *prometheus.CounterVec
}

func newMembership(n *Node) (*membership, error) {
	gc := n.cfg.Gossip
	if gc.Port <= 0 || gc.Port > 65535 {
		return nil, fmt.Errorf("gossip port %d out of range", gc.Port)
	}
	bind := gc.Bind
	bindIP, err := netip.ParseAddr(bind)
	if err != nil {
		return nil, fmt.Errorf("gossip bind %q: %w", bind, err)
	}
	m := &membership{
		n:      n,
		log:    n.log.With("component", "gossip"),
		expect: gc.BootstrapExpect,
		every:  gc.ReconcileEvery,
		peers:  make(map[string]*peer),
		kick:   make(chan struct{}, 1),
		meta: nodeMeta{
			V: metaVersion, ID: n.cfg.NodeID, Raft: string(n.trans.LocalAddr()),
			NSM: n.cfg.NSMAddr, Version: n.cfg.Version, Witness: n.cfg.Witness, FSM: n.cfg.commandLevel(),
			Cluster: gc.ClusterID, Disk: &diskReport{}, Promise: n.metaPromise(),
		},
		clusterID:      gc.ClusterID,
		versionsWarned: map[string]struct{}{},
	}
	m.refusals = newJoinRefusals(m.log, n.cfg.Now)
	// The largest the metadata can ever get must fit, or memberlist panics.
	worst := m.meta
	worst.HasState, worst.Leaving, worst.Witness = true, true, true
	worst.Disk = &diskReport{Slow: true, Suspect: true, Down: true, P50us: math.MaxUint32}
	if b, err := json.Marshal(worst); err != nil {
		return nil, fmt.Errorf("encode gossip metadata: %w", err)
	} else if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("gossip metadata is %d bytes, limit %d: node id or addresses too long", len(b), memberlist.MetaMaxSize)
	}
	m.hasState = m.localHasState()
	m.meta.HasState = m.hasState
	if m.metaRaw, err = json.Marshal(m.meta); err != nil {
		return nil, fmt.Errorf("encode gossip metadata: %w", err)
	}

	mc := memberlist.DefaultLANConfig()
	mc.Name = n.cfg.NodeID
	mc.BindAddr = bindIP.String()
	mc.BindPort = gc.Port
	mc.AdvertisePort = gc.Port
	if !bindIP.IsUnspecified() {
		mc.AdvertiseAddr = bindIP.String()
	}
	// A LAN of a few nodes: detect a failure in a couple of seconds.
	mc.ProbeInterval = 500 * time.Millisecond
	mc.ProbeTimeout = 250 * time.Millisecond
	mc.SuspicionMult = 3
	mc.SuspicionMaxTimeoutMult = 4
	mc.GossipInterval = 100 * time.Millisecond
	mc.TCPTimeout = 3 * time.Second
	// A node replaced at a new address may take over a dead node's name.
	mc.DeadNodeReclaimTime = 10 * time.Second
	mc.Delegate = (*mlDelegate)(m)
	mc.Events = (*mlEvents)(m)
	mc.Alive = (*mlAdmit)(m)
	mc.Merge = (*mlAdmit)(m)
	mc.Logger = log.New(&memberlistLogWriter{line: m.memberlistLine}, "", 0)
	if len(gc.Key) > 0 {
		if err := memberlist.ValidateKey(gc.Key); err != nil {
			return nil, fmt.Errorf("gossip key: %w", err)
		}
		mc.SecretKey = slices.Clone(gc.Key)
		mc.GossipVerifyIncoming = true
		mc.GossipVerifyOutgoing = true
	}
	self := net.JoinHostPort(mc.AdvertiseAddr, fmt.Sprint(gc.Port))
	for _, s := range gc.Join {
		if s = strings.TrimSpace(s); s != "" && s != self {
			m.seeds = append(m.seeds, s)
		}
	}

	m.membersGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nsmd_members", Help: "Gossip members by state, as this node sees them (itself included).",
	}, []string{"state"})
	m.changes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nsmd_membership_changes_total", Help: "Raft configuration changes made by this node's membership reconcile.",
	}, []string{"action"})
	for _, s := range []string{stateAlive, stateSuspect, stateDead, stateLeft} {
		m.membersGauge.WithLabelValues(s)
	}
	m.changes.WithLabelValues("add_voter")
	m.changes.WithLabelValues("remove_server")
	if err := n.cfg.Registerer.Register(m.membersGauge); err != nil {
		return nil, fmt.Errorf("register gossip metrics: %w", err)
	}
	if err := n.cfg.Registerer.Register(m.changes); err != nil {
		n.cfg.Registerer.Unregister(m.membersGauge)
		return nil, fmt.Errorf("register gossip metrics: %w", err)
	}
	if err := n.cfg.Registerer.Register(m.refusals.counter); err != nil {
		n.cfg.Registerer.Unregister(m.membersGauge)
		n.cfg.Registerer.Unregister(m.changes)
		return nil, fmt.Errorf("register gossip metrics: %w", err)
	}

	list, err := memberlist.Create(mc)
	if err != nil {
		n.cfg.Registerer.Unregister(m.membersGauge)
		n.cfg.Registerer.Unregister(m.changes)
		n.cfg.Registerer.Unregister(m.refusals.counter)
		return nil, fmt.Errorf("start memberlist on %s:%d: %w", mc.BindAddr, gc.Port, err)
	}
	m.list = list
	m.log.Info("gossip started", "addr", list.LocalNode().Address(), "encrypted", len(gc.Key) > 0,
		"cluster_id", m.clusterID, "version", m.meta.Version, "bootstrap_expect", m.expect, "seeds", m.seeds)
	return m, nil
}

// start runs the join and reconcile goroutines until ctx ends or shutdown.
func (m *membership) start(ctx context.Context) {
	m.life.Lock()
	defer m.life.Unlock()
	if m.down || m.cancel != nil {
		return
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.wg.Add(1)
	go func() { defer m.wg.Done(); m.loop(ctx) }()
	if len(m.seeds) > 0 {
		m.wg.Add(1)
		go func() { defer m.wg.Done(); m.joinLoop(ctx) }()
	}
}

// leave tells the others that this node goes on purpose (so the leader
// removes it from the raft configuration rather than waiting for it), then
// leaves the memberlist gracefully.
func (m *membership) leave(timeout time.Duration) error {
	m.life.Lock()
	defer m.life.Unlock()
	if m.left || m.down {
		return nil
	}
	m.left = true
	deadline := time.Now().Add(timeout)
	m.setMeta(func(md *nodeMeta) { md.Leaving = true })
	if err := m.list.UpdateNode(timeout / 4); err != nil {
		m.log.Debug("leave: metadata update not broadcast in time", "err", err)
	}
	// Tell every member directly, over TCP, so the intent does not depend on
	// the order gossip messages arrive in.
	msg := append([]byte{msgLeaveIntent}, m.n.cfg.NodeID...)
	done := make(chan struct{})
	var sends sync.WaitGroup
	for _, node := range m.aliveOthers() {
		sends.Add(1)
		m.wg.Add(1) // a send to a dead node may outlive leave; shutdown waits for it (TCPTimeout)
		go func() {
			defer m.wg.Done()
			defer sends.Done()
			if err := m.list.SendReliable(node, msg); err != nil {
				m.log.Debug("leave intent not delivered", "to", node.Name, "err", err)
			}
		}()
	}
	m.wg.Add(1)
	go func() { defer m.wg.Done(); sends.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(deadline) / 2):
	}
	if err := m.list.Leave(max(time.Until(deadline), 10*time.Millisecond)); err != nil {
		return fmt.Errorf("gossip leave: %w", err)
	}
	m.log.Info("left gossip")
	return nil
}

// shutdown stops the goroutines and the memberlist. Call after leave (or
// without it, for a crash-like stop).
func (m *membership) shutdown() error {
	m.life.Lock()
	if m.down {
		m.life.Unlock()
		return nil
	}
	m.down = true
	if m.cancel != nil {
		m.cancel()
	}
	err := m.list.Shutdown()
	m.life.Unlock()
	m.wg.Wait()
	if err != nil {
		return fmt.Errorf("gossip shutdown: %w", err)
	}
	return nil
}

// nsmAddr is the NSM address a member advertises (any state but left).
func (m *membership) nsmAddr(id string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.peers[id]
	if !ok || !p.metaOK || p.state == stateLeft || p.meta.NSM == "" {
		return "", false
	}
	return p.meta.NSM, true
}

// members is the union of gossip members and raft servers, sorted by id.
func (m *membership) members() []MemberStatus {
	rows := make(map[string]*MemberStatus)
	m.mu.Lock()
	for id, p := range m.peers {
		r := &MemberStatus{ID: id, GossipAddr: p.gossipAddr, State: p.state}
		if p.metaOK {
			r.RaftAddr, r.NSMAddr, r.Version, r.Witness = p.meta.Raft, p.meta.NSM, p.meta.Version, p.meta.Witness
		}
		rows[id] = r
	}
	m.mu.Unlock()
	if f := m.n.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			r, ok := rows[string(s.ID)]
			if !ok {
				r = &MemberStatus{ID: string(s.ID), State: stateUnknown}
				rows[string(s.ID)] = r
			}
			r.Suffrage = s.Suffrage.String()
			if r.RaftAddr == "" {
				r.RaftAddr = string(s.Address)
			}
		}
	}
	_, leader := m.n.raft.LeaderWithID()
	out := make([]MemberStatus, 0, len(rows))
	for _, r := range rows {
		r.Leader = leader != "" && r.ID == string(leader)
		r.Witness = r.Witness || m.n.IsWitness(r.ID)
		r.Role = memberRole(r.Leader, r.Witness)
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b MemberStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func memberRole(leader, witness bool) string {
	switch {
	case witness:
		return "witness"
	case leader:
		return "leader"
	}
	return "follower"
}

// isWitness reports whether gossip says member id is a witness.
func (m *membership) isWitness(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.peers[id]
	return ok && p.metaOK && p.meta.Witness
}

// commandLevel is the lowest fsm.CommandLevel that the members ids
// advertise: 0 if one of them is not alive or suspect in gossip with its
// metadata known (dead, left, never seen, or an older release). With
// lastKnown, a member that is not alive counts by the level it last
// advertised (0 if gossip never had it): placement must go on when a
// server dies, which is when a service needs a new home; a server
// downgraded while it was down is the operator's to avoid (rolling
// upgrades go one way).
func (m *membership) commandLevel(ids []string, lastKnown bool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	level := fsm.CommandLevel
	for _, id := range ids {
		p, ok := m.peers[id]
		if !ok || !p.metaOK || (!lastKnown && p.state != stateAlive && p.state != stateSuspect) {
			return 0
		}
		level = min(level, p.meta.FSM)
	}
	return level
}

// lastLevel is the fsm.CommandLevel member id last advertised, alive or
// not; known is false when gossip never had its metadata.
func (m *membership) lastLevel(id string) (level int, known bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.peers[id]
	if !ok || !p.metaOK {
		return 0, false
	}
	return p.meta.FSM, true
}

// promiseOf is the fencing promise member id last advertised, alive or
// not; ok is false when gossip never had its metadata or it has none.
func (m *membership) promiseOf(id string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.peers[id]
	if !ok || !p.metaOK || p.meta.Promise == "" {
		return "", false
	}
	return p.meta.Promise, true
}

// isAlive reports whether gossip sees member id alive.
func (m *membership) isAlive(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.peers[id]
	return ok && p.state == stateAlive && !p.leaving
}

// answering pings each of ids over gossip at once and reports which
// answered within memberlist's probe timeout (250 ms). A member gossip
// knows no address for counts as not answering.
func (m *membership) answering(ctx context.Context, ids []string) map[string]bool {
	type target struct {
		id   string
		addr net.Addr
	}
	var ts []target
	m.mu.Lock()
	for _, id := range ids {
		p, ok := m.peers[id]
		if !ok {
			continue
		}
		ua, err := net.ResolveUDPAddr("udp", p.gossipAddr)
		if err != nil {
			continue
		}
		ts = append(ts, target{id, ua})
	}
	m.mu.Unlock()
	out := make(map[string]bool, len(ids))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, t := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ctx.Err() != nil {
				return
			}
			if _, err := m.list.Ping(t.id, t.addr); err == nil {
				mu.Lock()
				out[t.id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// joinLoop joins the seeds, retrying with backoff until one answers.
func (m *membership) joinLoop(ctx context.Context) {
	wait := joinBackoffMin
	for attempt := 1; ; attempt++ {
		n, err := m.list.Join(m.seeds)
		if n > 0 {
			m.log.Info("joined gossip", "seeds", m.seeds, "contacted", n, "attempts", attempt)
			return
		}
		lv := slog.LevelDebug
		if attempt%10 == 0 {
			lv = slog.LevelWarn
		}
		m.log.Log(ctx, lv, "gossip join failed; retrying", "seeds", m.seeds, "attempt", attempt, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, joinBackoffMax)
	}
}

// loop keeps the metadata current, bootstraps on --bootstrap-expect and,
// while leading, reconciles the raft configuration with the members.
func (m *membership) loop(ctx context.Context) {
	rec := time.NewTicker(m.every)
	defer rec.Stop()
	poll := time.NewTicker(statePollEvery)
	defer poll.Stop()
	disk := time.NewTicker(diskPollEvery)
	defer disk.Stop()
	m.step(ctx, true)
	for {
		select {
		case <-ctx.Done():
			return
		case <-disk.C:
			if !m.isLeaving() {
				m.refreshDisk(time.Now())
			}
		case <-m.kick:
			m.step(ctx, true)
		case <-rec.C:
			m.step(ctx, true)
		case <-poll.C:
			if !m.hasState {
				m.step(ctx, false)
			}
		}
	}
}

func (m *membership) step(ctx context.Context, reconcile bool) {
	if ctx.Err() != nil || m.isLeaving() {
		return
	}
	m.refreshState()
	m.maybeBootstrap()
	if reconcile {
		m.reconcile(ctx)
	}
}

func (m *membership) isLeaving() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.meta.Leaving
}

func (m *membership) nudge() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *membership) localHasState() bool {
	f := m.n.raft.GetConfiguration()
	return f.Error() == nil && len(f.Configuration().Servers) > 0
}

// refreshState advertises whether this node belongs to a raft configuration.
func (m *membership) refreshState() {
	has := m.localHasState()
	if has == m.hasState {
		return
	}
	m.hasState = has
	m.setMeta(func(md *nodeMeta) { md.HasState = has })
	if err := m.list.UpdateNode(updateNodeTimeout); err != nil {
		m.log.Debug("metadata update not broadcast in time", "err", err)
	}
	m.log.Debug("advertising raft state", "has_state", has)
}

// refreshDisk advertises this node's disk report when it tells the others
// something new: a trouble flag (slow, suspect, unwritable) that turned on
// at once, anything else — a flag that cleared, a median in another
// power-of-two bucket — at most every diskRepublishMin. Every update costs
// each member a metadata event and a reconcile step, and on a loaded
// machine "suspect" can come and go several times a second. It does not
// wait for the broadcast (memberlist queues it either way): this loop also
// runs bootstrap and reconcile.
func (m *membership) refreshDisk(now time.Time) {
	r := m.n.disk.report(now)
	m.mu.Lock()
	cur := *m.meta.Disk
	m.mu.Unlock()
	worse := (r.Slow && !cur.Slow) || (r.Suspect && !cur.Suspect) || (r.Down && !cur.Down)
	if r.sameForGossip(cur) || (!worse && now.Sub(m.diskAt) < diskRepublishMin) {
		return
	}
	m.diskAt = now
	m.setMeta(func(md *nodeMeta) { md.Disk = &r })
	if err := m.list.UpdateNode(diskUpdateWait); err != nil {
		m.log.Debug("disk report queued, not yet broadcast", "err", err)
	}
	if r.Slow != cur.Slow || r.Suspect != cur.Suspect || r.Down != cur.Down {
		m.log.Debug("advertising disk", "slow", r.Slow, "suspect", r.Suspect, "unwritable", r.Down, "write_p50", r.p50())
	}
}

// diskOf is member id's disk report as its gossip metadata says (false:
// none known).
func (m *membership) diskOf(id string) (diskReport, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.peers[id]
	if !ok || !p.metaOK || p.meta.Disk == nil {
		return diskReport{}, false
	}
	return *p.meta.Disk, true
}

func (m *membership) setMeta(f func(*nodeMeta)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&m.meta)
	b, err := json.Marshal(m.meta)
	if err != nil { // cannot happen: plain strings and bools
		m.log.Error("encode gossip metadata", "err", err)
		return
	}
	m.metaRaw = b
}

// maybeBootstrap forms a new cluster once exactly BootstrapExpect alive
// members, none of them with raft state, see each other. Every one of them
// computes the same configuration (the N servers sorted by id), so the
// order they start in does not matter.
func (m *membership) maybeBootstrap() {
	if m.expect <= 1 || m.bootstrapped || m.hasState {
		return
	}
	var fresh []nodeMeta
	existing := ""
	m.mu.Lock()
	for _, p := range m.peers {
		if !p.metaOK || p.meta.clusterOf() != m.clusterID {
			continue
		}
		if p.meta.HasState {
			existing = p.id
		}
		if p.state == stateAlive && !p.leaving {
			fresh = append(fresh, p.meta)
		}
	}
	m.mu.Unlock()
	switch {
	case existing != "":
		if !m.warnedExisted {
			m.warnedExisted = true
			m.log.Info("a member already has raft state; not bootstrapping, waiting to be added by the leader", "member", existing)
		}
		return
	case len(fresh) < m.expect:
		return
	case len(fresh) > m.expect:
		if !m.warnedCrowd {
			m.warnedCrowd = true
			m.log.Warn("more servers without raft state than --bootstrap-expect; not bootstrapping (which subset is ambiguous)",
				"seen", len(fresh), "expect", m.expect)
		}
		return
	}
	slices.SortFunc(fresh, func(a, b nodeMeta) int { return strings.Compare(a.ID, b.ID) })
	servers := make([]raft.Server, 0, len(fresh))
	self := false
	for _, md := range fresh {
		self = self || md.ID == m.n.cfg.NodeID
		servers = append(servers, raft.Server{ID: raft.ServerID(md.ID), Address: raft.ServerAddress(md.Raft), Suffrage: raft.Voter})
	}
	if !self {
		return // our own alive event has not been seen yet
	}
	m.bootstrapped = true
	err := m.n.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	switch {
	case errors.Is(err, raft.ErrCantBootstrap):
		m.log.Info("bootstrap-expect reached but raft already has state", "expect", m.expect)
	case err != nil:
		m.bootstrapped = false // try again on the next pass
		m.log.Error("bootstrap-expect: bootstrap failed", "err", err)
	default:
		ids := make([]string, len(servers))
		for i, s := range servers {
			ids[i] = string(s.ID)
		}
		m.log.Info("bootstrapped new cluster", "expect", m.expect, "servers", ids)
	}
	m.refreshState()
}

// reconcile, on the leader only: alive members missing from the raft
// configuration (or at another raft address) become voters; members that
// left on purpose are removed. Failed members are left alone.
func (m *membership) reconcile(ctx context.Context) {
	r := m.n.raft
	if r.State() != raft.Leader {
		return
	}
	defer m.reconciles.Add(1)
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		m.log.Debug("reconcile: read raft configuration", "err", err)
		return
	}
	servers := f.Configuration().Servers
	inRaft := make(map[raft.ServerID]raft.Server, len(servers))
	voters := 0
	for _, s := range servers {
		inRaft[s.ID] = s
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	self := raft.ServerID(m.n.cfg.NodeID)
	type change struct {
		id   raft.ServerID
		addr raft.ServerAddress
	}
	var adds, removes []change
	m.mu.Lock()
	for _, p := range m.peers {
		id := raft.ServerID(p.id)
		s, ok := inRaft[id]
		switch {
		case id == self:
		case p.state == stateAlive && !p.leaving && p.metaOK && p.meta.clusterOf() == m.clusterID:
			addr := raft.ServerAddress(p.meta.Raft)
			if !ok || s.Address != addr || s.Suffrage != raft.Voter {
				adds = append(adds, change{id, addr})
			}
		case p.state == stateLeft && ok:
			if _, serving := m.n.fsm.ServingRecordOf(p.id); serving {
				// It left, but it is recorded as serving: it may still
				// hold the storage, and stays until it is fenced.
				m.log.Debug("reconcile: keeping a member that left while recorded as serving", "id", p.id)
				continue
			}
			removes = append(removes, change{id, s.Address})
		}
	}
	m.mu.Unlock()
	slices.SortFunc(adds, func(a, b change) int { return strings.Compare(string(a.id), string(b.id)) })
	slices.SortFunc(removes, func(a, b change) int { return strings.Compare(string(a.id), string(b.id)) })

	for _, c := range adds {
		if ctx.Err() != nil || r.State() != raft.Leader {
			return
		}
		old, had := inRaft[c.id]
		if err := r.AddVoter(c.id, c.addr, 0, configChangeWait).Error(); err != nil {
			m.log.Warn("reconcile: add voter failed", "id", c.id, "raft_addr", c.addr, "err", err)
			continue
		}
		m.changes.WithLabelValues("add_voter").Inc()
		if had {
			m.log.Info("reconcile: updated voter", "id", c.id, "raft_addr", c.addr, "was", old.Address, "was_suffrage", old.Suffrage)
		} else {
			m.log.Info("reconcile: added voter", "id", c.id, "raft_addr", c.addr)
		}
	}
	for _, c := range removes {
		if ctx.Err() != nil || r.State() != raft.Leader {
			return
		}
		if inRaft[c.id].Suffrage == raft.Voter {
			if voters-1 < 1 {
				m.log.Warn("reconcile: not removing the last voter", "id", c.id)
				continue
			}
		}
		if err := r.RemoveServer(c.id, 0, configChangeWait).Error(); err != nil {
			m.log.Warn("reconcile: remove server failed", "id", c.id, "err", err)
			continue
		}
		if inRaft[c.id].Suffrage == raft.Voter {
			voters--
		}
		m.changes.WithLabelValues("remove_server").Inc()
		m.log.Info("reconcile: removed server that left", "id", c.id, "raft_addr", c.addr)
	}
}

// aliveOthers are the other live members, built from our own copies of
// their addresses: the *memberlist.Node values Members returns are updated
// by memberlist's own goroutines, so reading them races.
func (m *membership) aliveOthers() []*memberlist.Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*memberlist.Node
	for id, p := range m.peers {
		if id == m.n.cfg.NodeID || p.state != stateAlive {
			continue
		}
		ap, err := netip.ParseAddrPort(p.gossipAddr)
		if err != nil {
			continue
		}
		out = append(out, &memberlist.Node{Name: id, Addr: net.IP(ap.Addr().AsSlice()), Port: ap.Port()})
	}
	return out
}

// updatePeer applies a memberlist event; state "" keeps the current one.
func (m *membership) updatePeer(node *memberlist.Node, state string) {
	meta, err := decodeMeta(node.Meta)
	if err == nil && meta.ID != node.Name {
		err = fmt.Errorf("gossip metadata id %q differs from member name", meta.ID)
	}
	if err == nil && meta.clusterOf() != m.clusterID {
		// NotifyAlive refuses these first; never let one reach the peers
		// that bootstrap and reconcile raft.
		m.refusals.observe(RefusedClusterID, node.Name+"@"+node.Address(), "ignoring a gossip member of another cluster",
			"member", node.Name, "addr", node.Address(), "member_cluster_id", meta.clusterOf(), "cluster_id", m.clusterID)
		m.mu.Lock()
		delete(m.peers, node.Name)
		m.updateGaugeLocked()
		m.mu.Unlock()
		return
	}
	m.mu.Lock()
	p, ok := m.peers[node.Name]
	if !ok {
		p = &peer{id: node.Name}
		m.peers[node.Name] = p
	}
	prev := p.state
	p.gossipAddr = node.Address()
	if err == nil {
		p.meta, p.metaOK = meta, true
	} else if len(node.Meta) > 0 {
		m.log.Warn("ignoring member metadata", "member", node.Name, "err", err)
	}
	switch state {
	case stateAlive:
		p.leaving = p.metaOK && p.meta.Leaving
		p.state = stateAlive
	case stateDead: // left if it said it would leave
		p.leaving = p.leaving || (p.metaOK && p.meta.Leaving)
		p.state = stateDead
		if p.leaving {
			p.state = stateLeft
		}
	default: // metadata update
		p.leaving = p.leaving || (p.metaOK && p.meta.Leaving)
		if p.state == "" {
			p.state = stateAlive
		}
	}
	cur := p.state
	m.updateGaugeLocked()
	warnVersions := m.checkVersionsLocked()
	m.mu.Unlock()
	m.events.Add(1)
	if warnVersions != nil {
		warnVersions()
	}
	if prev != cur {
		lv := slog.LevelInfo
		if cur == stateDead {
			lv = slog.LevelWarn
		}
		m.log.Log(context.Background(), lv, "member "+cur, "member", node.Name, "addr", node.Address(), "was", prev)
	}
	m.nudge()
}

// leaveIntent records a member's "leaving on purpose" message.
func (m *membership) leaveIntent(id string) {
	m.mu.Lock()
	p, ok := m.peers[id]
	if !ok {
		p = &peer{id: id}
		m.peers[id] = p
	}
	p.leaving = true
	changed := p.state == stateDead
	if changed {
		p.state = stateLeft
	}
	m.updateGaugeLocked()
	m.mu.Unlock()
	m.log.Debug("member announced it is leaving", "member", id)
	if changed {
		m.log.Info("member left", "member", id, "was", stateDead)
	}
	m.nudge()
}

func (m *membership) updateGaugeLocked() {
	counts := map[string]int{stateAlive: 0, stateSuspect: 0, stateDead: 0, stateLeft: 0}
	for _, p := range m.peers {
		if p.state != "" {
			counts[p.state]++
		}
	}
	for s, c := range counts {
		m.membersGauge.WithLabelValues(s).Set(float64(c))
	}
}

// mlDelegate is the memberlist Delegate: metadata and leave intents.
type mlDelegate membership

func (d *mlDelegate) NodeMeta(limit int) []byte {
	m := (*membership)(d)
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.metaRaw) > limit { // checked in newMembership; never panic memberlist
		return nil
	}
	return slices.Clone(m.metaRaw)
}

func (d *mlDelegate) NotifyMsg(b []byte) {
	if len(b) < 2 || b[0] != msgLeaveIntent {
		return
	}
	(*membership)(d).leaveIntent(string(b[1:]))
}

func (d *mlDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *mlDelegate) LocalState(join bool) []byte                { return nil }
func (d *mlDelegate) MergeRemoteState(buf []byte, join bool)     {}

// mlEvents is the memberlist EventDelegate. memberlist calls it with its
// node lock held: record and nudge only, never call back into memberlist.
// (memberlist v0.5.4 does not fill Node.State, so a leave is "dead" unless
// the member announced it was leaving.)
type mlEvents membership

func (e *mlEvents) NotifyJoin(n *memberlist.Node)   { (*membership)(e).updatePeer(n, stateAlive) }
func (e *mlEvents) NotifyLeave(n *memberlist.Node)  { (*membership)(e).updatePeer(n, stateDead) }
func (e *mlEvents) NotifyUpdate(n *memberlist.Node) { (*membership)(e).updatePeer(n, "") }

// memberlistLogWriter turns memberlist's "[LEVEL] memberlist: msg" lines
// into calls of line (membership.memberlistLine) at the matching level.
type memberlistLogWriter struct{ line func(slog.Level, string) }

func (w *memberlistLogWriter) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		lv, msg := parseMemberlistLine(line)
		if msg != "" {
			w.line(lv, msg)
		}
	}
	return len(p), nil
}

func parseMemberlistLine(line string) (slog.Level, string) {
	msg := strings.TrimSpace(line)
	lv := slog.LevelInfo
	if strings.HasPrefix(msg, "[") {
		if i := strings.IndexByte(msg, ']'); i > 0 {
			switch msg[1:i] {
			case "ERR", "ERROR":
				lv = slog.LevelError
			case "WARN":
				lv = slog.LevelWarn
			case "DEBUG", "TRACE":
				lv = slog.LevelDebug
			}
			msg = strings.TrimSpace(msg[i+1:])
		}
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	return lv, msg
}
