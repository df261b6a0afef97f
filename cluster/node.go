// Package cluster replicates nsmd's state: hashicorp/raft with its log in
// hashicorp/raft-wal (a new data directory) or raft-boltdb/v2 (what an
// older one has; logstore.go), raft-boltdb/v2 for the stable store and a
// file snapshot store in the data directory, the group-commit writer that
// turns NSM writes into raft log entries, gossip membership, and the
// leader loop that owns every leader-only step of a term (takeover, the
// VIP, fencing, the hooks). The VIP itself is a FloatingAddr (package vip
// has both modes'); this package decides when a leader may take it
// (handover.go).
//
// It speaks no NSM: what a term or an applied command means to clients
// (SM_NOTIFY after a takeover, the lock-manager callback of an accepted
// SM_NOTIFY) is done by subscribers given to New (events.go). A Node
// satisfies the NSM service's Registry: writes return only after they are
// committed; reads come from the local state machine.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/nsmd/nsmd/cluster/pki"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/timeline"
)

// Errors.
var (
	// ErrNotLeader means a write reached a node that is not the leader and
	// could not be forwarded.
	ErrNotLeader = errors.New("cluster: not the leader")
	// ErrClosed means the node is shutting down.
	ErrClosed = errors.New("cluster: node closed")
	// ErrNotReadyYet means this node does not know the current sm_state
	// (Ready is false).
	ErrNotReadyYet = errors.New("cluster: current sm_state not known here yet")
)

// Config configures a Node. It has no defaults: every setting is given
// (package config's ClusterConfig builds one from an operator's settings)
// and New refuses a zero duration or count. Only the runtime
// dependencies (Logger, Registerer, Now) may be left nil.
type Config struct {
	NodeID    string
	DataDir   string
	RaftBind  string // host:port the raft transport listens on and advertises
	Bootstrap bool   // with no existing state, bootstrap a one-node cluster
	// Voters, when set and there is no existing state, bootstraps a new
	// cluster with exactly these voters (node id → raft address); every
	// member must be given the same map.
	Voters map[string]string

	GracePeriod        time.Duration // NLM grace opened at each takeover
	HeartbeatTimeout   time.Duration // raft's
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	SnapshotThreshold  uint64 // log entries between snapshots
	TrailingLogs       uint64 // log entries kept after a snapshot
	// MaxInflightEntries bounds the group-commit entries handed to raft and
	// not yet applied (the agent: 1): writes that arrive meanwhile are
	// coalesced into the next entry. More lets entries overlap (leader
	// fsync of one while followers fsync another) at the cost of smaller
	// entries and more fsyncs per write; on one shared disk that loses.
	MaxInflightEntries int
	// NoSync skips fsync in bolt (the stable store, and the log when it is
	// in bolt): only for benchmarks that say so. raft-wal always syncs.
	NoSync bool
	// LogStore is where raft's log lives (logstore.go): "wal"
	// (hashicorp/raft-wal segment files under DataDir/wal; one fsync per
	// append), "bolt" (raft-boltdb/v2, the raft.db that also holds the
	// stable store; two), or "auto": the store DataDir has,
	// wal if it has no log yet. Fixed for the life of a data directory:
	// New refuses one whose log is in the other store.
	LogStore string

	// Witness makes this node a witness (witness.go): a voter that serves
	// nothing and passes leadership on at once when it wins an election.
	// VIP is not used, nor Server but for its Fault.
	Witness bool
	// Witnesses names other members that are witnesses where there is no
	// gossip to say so (static Voters clusters).
	Witnesses []string

	// NSMAddr is this node's NSM address (host:port) as other nodes reach
	// it; it is advertised in gossip and followers forward writes to the
	// leader's.
	NSMAddr string
	// Gossip configures memberlist discovery; Port 0 disables it (a single
	// node, or a static Voters map).
	Gossip GossipConfig
	// Version is the nsmd version this node advertises in gossip (at most
	// 64 bytes are kept; tests use DefaultVersion). Members show it, and a
	// mix of versions is logged once per set.
	Version string
	// ClusterKey authenticates forwarded writes (HMAC-SHA256); without it
	// the leader accepts forwards only from raft members' IP addresses.
	ClusterKey []byte
	// PeerNSMAddrs maps node id → NSM address where there is no gossip
	// (static Voters); gossip metadata wins when both know a node.
	PeerNSMAddrs map[string]string
	// StandDownWait bounds how long a new leader keeps asking the previous
	// one, while it answers that it still holds the VIP or is still
	// standing down (Server.Stop running: the on_follower hook), before it
	// falls back to waiting out the VIP's lifetime (the agent: 1 s, or
	// hook_timeout + 1 s when an on_follower hook is set).
	StandDownWait time.Duration
	// DiskProbeInterval is how often a probe file is written and fsynced in
	// DataDir to find a full or failing disk before raft does (the agent:
	// 5 s; every second while the disk fails).
	DiskProbeInterval time.Duration
	// DiskSlowThreshold: a node whose data directory writes take longer
	// than this (median over 2 s) stays out of leadership (diskslow.go);
	// 0 turns the check off.
	DiskSlowThreshold time.Duration
	// ownSettingsOnly: as a new leader this node waits by its own fence
	// settings alone (promise.go; the tests' negative control).
	ownSettingsOnly bool
	// staticRecords: a static Voters cluster (no gossip to advertise
	// levels) whose members all apply kinds 15–17 (tests).
	staticRecords bool
	// memberHealthy, when set, replaces gossip's verdict on another
	// member's health for placement (tests of a static cluster).
	memberHealthy func(id string) bool
	// olderFSM: the node advertises fsm.CommandLevel 0, as a release
	// before owner commands would (tests of the rolling-upgrade gate).
	olderFSM bool
	// unguardedMonitor: SM_MON is proposed unguarded (kind 1), replacing
	// whoever made the registration, as in the releases before guarded
	// registrations (the negative control of the ownership tests only).
	unguardedMonitor bool
	// noServiceProof: a new owner serves a service without proving its
	// last holder stopped (the negative control of the services' tests).
	noServiceProof bool
	// noSlowLastResort: a slow node never becomes eligible again while
	// slow (the negative control of the last resort, in tests only).
	noSlowLastResort bool
	// HoldTimeout bounds how long a write waits for a leader during an
	// election before it fails (the agent: 5 s).
	HoldTimeout time.Duration
	// Transport, when set, replaces the raft TCP transport on RaftBind
	// (tests use raft's in-memory transport so they can cut links).
	Transport raft.Transport
	// RaftTLS, when set, puts raft on mutual TLS (raft_tls.go): peers must
	// present a certificate from its CA naming pki.ServerName. Refused
	// handshakes go to TLSRefusals (may be nil).
	RaftTLS     *pki.Store
	TLSRefusals *pki.Refusals
	// RaftHandshakesPerHost caps the raft TLS handshakes in progress from
	// one IP address (1…64; 64 in all). Required with RaftTLS.
	RaftHandshakesPerHost int

	// VIP, when set, is acquired by each new leader after its Takeover
	// committed (and after a previous holder's lifetime ran out) and
	// released first when leadership ends.
	VIP FloatingAddr
	// Subscribers hear of the node's events (events.go): every applied
	// command, and each term this node serves. They are fixed when New
	// starts raft, so none misses a command raft applies before Start.
	Subscribers []Subscriber
	// Server is what this node serves (the agent: grace, hooks, tickle
	// ACKs); the leader loop calls it in a takeover's order (server.go).
	// nil: the node serves nothing of its own (a witness; tests).
	Server Server
	// StopAtStart: a previous process of this node may have died while it
	// served (the agent: an on_follower hook is set), so Server.Stop runs
	// with StopStart before this node's first term. Until it succeeded
	// the node answers that it serves; if it fails, the watchdog resets the
	// node.
	StopAtStart bool
	// HookTimeout bounds Server.Serve: the watchdog is fed during the on_leader
	// hook only until HookTimeout (+ 2 s) after it started.
	HookTimeout time.Duration

	// Fencing (serving.go). Watchdog, when set, is armed before Server.Serve and
	// fed only while this node may prove it may serve. FenceTimeout is the
	// watchdog timeout of every serving node of the cluster: a new leader
	// waits elected + lease + FenceTimeout + margin for a node it cannot
	// ask, unless FenceAgent (retried until it succeeds; onAttempt hears of
	// each failed try) reports that node off first. With neither, a new
	// leader serves without waiting: fencing is off.
	//
	// ServesStorage says Server serves shared storage (an on_leader
	// hook): the node publishes its fencing promise, records that it serves
	// before Server.Serve, and as a new leader proves every other serving node
	// stopped by that node's promise (promise.go). Any fence setting
	// implies it. Without it (no hook: a plain statd replacement, the dev
	// cluster) nobody waits for anything.
	ServesStorage bool
	Watchdog      Watchdog
	FenceTimeout  time.Duration
	FenceAgent    func(ctx context.Context, node string, onAttempt func(try int, err error)) error

	// Services is what this node declares of the cluster's NFS services
	// and how its leader places them (placer.go); zero: it declares none.
	Services ServiceConfig
	// ServiceServer, when set, serves the services placed on this node
	// (servicerun.go); nil: placements are recorded and nothing is served
	// for them here.
	ServiceServer ServiceServer

	// Runtime dependencies; nil: discard the log, a private registry,
	// time.Now.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Now        func() time.Time
}

// setRuntime fills in the runtime dependencies a caller may leave out:
// a discarding logger, a private metrics registry, the wall clock. No
// setting has a default here: package config owns them, and Validate
// refuses a zero one.
func (c *Config) setRuntime() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports a config that cannot work. Every setting must be given:
// a zero duration or count is refused rather than replaced by a value the
// operator never chose.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("cluster: "+format, a...)) }
	if c.NodeID == "" {
		bad("NodeID is empty")
	}
	if c.DataDir == "" {
		bad("DataDir is empty")
	}
	if _, err := netip.ParseAddrPort(c.RaftBind); err != nil {
		bad("RaftBind %q: %w", c.RaftBind, err)
	}
	if c.Version == "" {
		bad("Version is empty")
	}
	switch c.LogStore {
	case LogStoreAuto, LogStoreWAL, LogStoreBolt:
	default:
		bad("LogStore %q is not one of auto, wal, bolt", c.LogStore)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"GracePeriod", c.GracePeriod},
		{"HeartbeatTimeout", c.HeartbeatTimeout},
		{"ElectionTimeout", c.ElectionTimeout},
		{"LeaderLeaseTimeout", c.LeaderLeaseTimeout},
		{"StandDownWait", c.StandDownWait},
		{"DiskProbeInterval", c.DiskProbeInterval},
		{"HoldTimeout", c.HoldTimeout},
		{"HookTimeout", c.HookTimeout},
	} {
		if d.v <= 0 {
			bad("%s %v: must be positive", d.name, d.v)
		}
	}
	if c.SnapshotThreshold == 0 {
		bad("SnapshotThreshold is 0: must be positive")
	}
	if c.TrailingLogs == 0 {
		bad("TrailingLogs is 0: must be positive")
	}
	if c.MaxInflightEntries <= 0 {
		bad("MaxInflightEntries %d: must be positive", c.MaxInflightEntries)
	}
	if c.DiskSlowThreshold < 0 {
		bad("DiskSlowThreshold %v: must not be negative (0 turns the check off)", c.DiskSlowThreshold)
	}
	if c.Gossip.Port != 0 {
		if c.Gossip.ClusterID == "" {
			bad("Gossip.ClusterID is empty")
		}
		if c.Gossip.ReconcileEvery <= 0 {
			bad("Gossip.ReconcileEvery %v: must be positive", c.Gossip.ReconcileEvery)
		}
	}
	if c.RaftTLS != nil && (c.RaftHandshakesPerHost < 1 || c.RaftHandshakesPerHost > maxRaftHandshakes) {
		bad("RaftHandshakesPerHost %d: must be 1…%d with RaftTLS", c.RaftHandshakesPerHost, maxRaftHandshakes)
	}
	if c.Watchdog != nil && c.FenceTimeout <= 0 {
		bad("a Watchdog needs its FenceTimeout")
	}
	return errors.Join(errs...)
}

// Node is one member of an nsmd cluster.
type Node struct {
	cfg     Config
	log     *slog.Logger
	fsm     *fsm.FSM
	raft    *raft.Raft
	store   *raftboltdb.BoltStore
	wal     *walLog // the log store when cfg.LogStore resolved to wal
	trans   raft.Transport
	member  *membership // nil without gossip
	metrics *metrics
	subs    []Subscriber // Config.Subscribers, fixed at New
	disk    *diskHealth
	// stableGate turns away stable-store writes once the stores close.
	stableGate *storeGate

	// bootIndex is the last log index present when the node started: the
	// FSM replays entries up to it, and their side effects (callbacks)
	// already happened before the restart.
	bootIndex uint64

	writes   chan *write
	writeSeq atomic.Uint64 // numbers writes as they arrive
	// Of the last completed entry: writes, commit time, and writeSeq when
	// it completed (awaitReturning).
	lastBatch       atomic.Uint64
	lastCommitNanos atomic.Int64
	lastDoneSeq     atomic.Uint64
	inflight        chan *batch
	slots           chan struct{} // one per entry in raft (Config.MaxInflightEntries)
	leaderCh        chan bool     // raft's NotifyCh; only observeLeadership reads it
	termCh          chan bool     // the latest of leaderCh, for leaderLoop (one slot)
	// quitTerms: a graceful stop asks the leader loop to end its term (the
	// on_follower hook) while raft still commits, and to start no other.
	quitTerms chan chan struct{}
	running   atomic.Bool // Start ran: the leader loop answers quitTerms
	crashCh   chan int32

	fwd    forwarder
	replay replayCache // MACs of forwarded writes accepted within the skew window
	// vipConns: the leader's last sample of its VIP connections (conns.go).
	vipConns atomic.Pointer[VIPConns]
	// clientsSeen: this leader's last sample of its NFSv4 clients (seen.go).
	clientsSeen atomic.Pointer[[]ClientSeen]
	// svcConns: the samples of the services served here, and the
	// clients asking the other servers for theirs (svcconns.go).
	svcConns serviceConns
	fwdLog   denialLog // spaces the log lines about denied forwarded writes
	// Kept by observeLeadership (leadership.go).
	lcMu sync.Mutex
	lcCh chan struct{} // closed and replaced at each leader change
	// prevLeader is the last other node seen leading (for the VIP hand-over).
	prevLeader string

	mu       sync.Mutex
	leading  bool
	timeline timeline.Timeline

	started      time.Time
	leaseAt      atomic.Int64  // mono(): the lease's start, no later than when the quorum's acknowledgements that confirmed it were sent (leaseLoop, ackclock.go)
	acks         *ackClock     // the raft transport, noting when acknowledged requests were sent
	handoffs     atomic.Uint64 // leadership hand-offs made as a witness
	standingDown atomic.Bool   // Server.Stop is running after leadership ended
	serving      atomic.Bool   // from before Server.Serve until a stop succeeded (serving.go)
	stopFailed   atomic.Bool   // the last stop failed: the watchdog resets this node
	fence        fencing
	prom         promises     // fencing promises, serving records, confirmations (promise.go)
	placer       *placer      // where services run (placer.go)
	leases       leases       // the leader's side of the services' leases (servicelease.go)
	runs         *serviceRuns // the services served here (servicerun.go)
	// scopedWaits: writes of a service's NFSv4 tracking waiting to see
	// their command applied here (servicetracking.go).
	scopedWaits scopedWaits
	// vipUnsureUntil (unix ns): a term of this node ended before it took
	// the VIP, so a previous holder may still have it until then; asked
	// about the VIP, this node says "held" (cluster/vip.go).
	vipUnsureUntil atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed sync.Once
}

// New opens (or creates) the node's state in DataDir and starts raft.
// Call Start to run the leader loop, Close to stop.
func New(cfg Config) (*Node, error) {
	cfg.setRuntime()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Version) > maxVersionLen {
		cfg.Version = cfg.Version[:maxVersionLen]
	}
	n := &Node{
		cfg:        cfg,
		subs:       slices.Clone(cfg.Subscribers),
		log:        cfg.Logger.With("node", cfg.NodeID),
		writes:     make(chan *write, 4096),
		stableGate: &storeGate{},
		inflight:   make(chan *batch, cfg.MaxInflightEntries),
		slots:      make(chan struct{}, cfg.MaxInflightEntries),
		leaderCh:   make(chan bool, 64),
		termCh:     make(chan bool, 1),
		quitTerms:  make(chan chan struct{}),
		crashCh:    make(chan int32, 1),
		lcCh:       make(chan struct{}),
		started:    time.Now(),
	}
	// Until its stop at start succeeded, a node whose previous process may
	// have served says it serves (serving.go).
	n.serving.Store(cfg.StopAtStart && cfg.Server != nil)
	n.prom.init()
	n.placer = newPlacer(n, cfg.Services)
	n.leases.n = n
	marks, err := loadReleaseMarks(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	n.runs = newServiceRuns(n, cfg.ServiceServer, marks)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	m, err := newMetrics(cfg.Registerer, n)
	if err != nil {
		return nil, err
	}
	n.metrics = m
	n.fsm = fsm.New(fsm.Options{Observer: n.observe})

	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("cluster: create data dir: %w", err)
	}
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.DataDir, "raft.db"), NoSync: cfg.NoSync})
	if err != nil {
		return nil, fmt.Errorf("cluster: open raft store: %w", err)
	}
	n.store = store
	hl := newHclog(cfg.Logger.With("node", cfg.NodeID), "raft", slog.LevelInfo)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hl.Named("snapshots"))
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("cluster: open snapshot store: %w", err)
	}
	trans, err := openTransport(cfg, hl)
	if err != nil {
		store.Close()
		return nil, err
	}
	n.acks, trans = newAckClock(trans, n.mono)
	n.trans = trans

	rc := raftConfig(cfg, n.leaderCh, hl)
	if err := raft.ValidateConfig(rc); err != nil {
		n.closeStores()
		return nil, fmt.Errorf("cluster: raft config: %w", err)
	}

	n.disk = newDiskHealth(n, cfg.DataDir)
	logs, err := n.openLogs(store, hl)
	if err != nil {
		n.closeStores()
		return nil, err
	}
	existing, err := raft.HasExistingState(logs, store, snaps)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("cluster: inspect state: %w", err)
	}
	r, err := raft.NewRaft(rc, n.fsm, logs, guardedStable{StableStore: store, d: n.disk, gate: n.stableGate}, snaps, trans)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	n.raft = r
	n.disk.raft.Store(r)
	if !existing && (cfg.Bootstrap || len(cfg.Voters) > 0) {
		servers := []raft.Server{{ID: rc.LocalID, Address: trans.LocalAddr(), Suffrage: raft.Voter}}
		if len(cfg.Voters) > 0 {
			servers = servers[:0]
			for _, id := range slices.Sorted(maps.Keys(cfg.Voters)) {
				servers = append(servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(cfg.Voters[id]), Suffrage: raft.Voter})
			}
		}
		f := r.BootstrapCluster(raft.Configuration{Servers: servers})
		if err := f.Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			r.Shutdown()
			n.closeStores()
			return nil, fmt.Errorf("cluster: bootstrap: %w", err)
		}
	}
	if cfg.Gossip.Port != 0 {
		if n.member, err = newMembership(n); err != nil {
			r.Shutdown()
			n.closeStores()
			return nil, fmt.Errorf("cluster: gossip: %w", err)
		}
	}
	n.log.Info("raft started", "addr", trans.LocalAddr(), "existing_state", existing, "boot_index", n.bootIndex)
	return n, nil
}

// Start runs the node's goroutines: the group-commit writer, the leader
// loop, leadership observation, the lease loop and the disk probe. They
// stop on Close.
func (n *Node) Start() {
	n.running.Store(true)
	if n.member != nil {
		n.member.start(n.ctx)
	}
	n.wg.Add(7)
	go func() { defer n.wg.Done(); n.placer.loop(n.ctx) }()
	if n.runs.srv != nil {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.runs.loop(n.ctx) }()
	}
	if n.cfg.Watchdog != nil {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.fenceLoop() }()
	}
	if n.servesStorage() {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.servingRecordLoop() }()
	}
	go func() { defer n.wg.Done(); n.leaseLoop() }()
	go func() { defer n.wg.Done(); n.disk.run(n.ctx.Done(), n.cfg.DiskProbeInterval) }()
	go func() { defer n.wg.Done(); n.observeLeadership() }()
	go func() { defer n.wg.Done(); n.commitLoop() }()
	go func() { defer n.wg.Done(); n.waitLoop() }()
	go func() { defer n.wg.Done(); n.leaderLoop() }()
}

// Close stops the node. When it leads a cluster with other voters it first
// hands leadership over, so the failover is planned rather than detected.
func (n *Node) Close() error { return n.stop(true) }

// Kill stops the node as a crash would: no leadership transfer, no gossip
// leave. Tests use it to play SIGKILL inside one process.
func (n *Node) Kill() error { return n.stop(false) }

func (n *Node) stop(graceful bool) error {
	var err error
	n.closed.Do(func() {
		if graceful && n.raft.State() == raft.Leader && len(n.servingVoters()) > 0 {
			if _, e := n.moveLeadership(moveShutdown); e != nil {
				n.log.Warn("leadership transfer on shutdown failed", "err", e)
			}
		}
		if graceful && n.running.Load() {
			// The term ends while raft still commits: stopping nfsd makes
			// lockd send SM_UNMON for its hosts, which must be answered
			// (a leader that found no one to hand over to, the last server
			// of a pair, still has the witness for a quorum).
			ack := make(chan struct{})
			select {
			case n.quitTerms <- ack:
				<-ack
			case <-n.ctx.Done():
			}
			n.runs.stopAll() // the services too, while raft still commits
		}
		if graceful && n.servesStorage() && !n.mayStillServe() {
			// Its stop succeeded: say so before leaving, so the record
			// that names it does not outlive it.
			cctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
			n.clearServingRecord(cctx)
			cancel()
		}
		if graceful && n.member != nil && n.mayStillServe() {
			// Its stop failed (or never ran): it may still hold the
			// storage, so it stays a member for the next leader to fence.
			n.log.Error("this node may still serve (its stop failed): not leaving the cluster, so the next leader fences it")
		} else if graceful && n.member != nil {
			if e := n.member.leave(2 * time.Second); e != nil {
				n.log.Warn("gossip leave failed", "err", e)
			}
		}
		if a, ok := n.cfg.VIP.(abandoner); ok && !graceful {
			a.Abandon() // a crash leaves the address to expire by itself
		}
		n.cancel()
		if e := n.raft.Shutdown().Error(); e != nil {
			err = fmt.Errorf("cluster: raft shutdown: %w", e)
		}
		if n.member != nil {
			n.member.shutdown()
		}
		n.wg.Wait()
		n.stopLeading(false)
		n.fwd.close()
		n.svcConns.peers.close()
		n.closeStores()
	})
	return err
}

func (n *Node) closeStores() {
	n.stableGate.close() // a late heartbeat's term write is dropped: see guardedStable
	if c, ok := n.trans.(io.Closer); ok && n.trans != nil {
		c.Close()
	}
	if n.wal != nil {
		n.wal.Close()
	}
	if n.store != nil {
		n.store.Close()
	}
}

// observe runs inside FSM.Apply on every node: it hands the applied
// command to the subscribers, marking the entries that were already in
// the log at start-up (replays), and wakes what waits for a takeover.
func (n *Node) observe(index uint64, cmd fsm.Command, res fsm.Result) {
	n.applied(Applied{Index: index, Cmd: cmd, Result: res, Replay: index <= n.bootIndex})
	switch cmd.(type) {
	case fsm.ServingBegin, fsm.ServingEnd, fsm.FenceConfirm:
		n.observeServing(cmd)
	case fsm.ServicesDeclared, fsm.ServicePlaced, fsm.ServiceForgotten, fsm.ServiceReleased:
		n.placer.wake()
		n.runs.wake()
	}
	if _, ok := cmd.(fsm.Takeover); ok {
		// This node may know the current incarnation now (Ready): wake
		// the calls and writes waiting for it.
		n.wakeWriters()
	}
}

// ID is the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// IsLeader reports whether this node leads.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Members lists the cluster's nodes as gossip and raft see them.
func (n *Node) Members() []MemberStatus {
	if n.member != nil {
		return n.member.members()
	}
	var out []MemberStatus
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	_, leader := n.raft.LeaderWithID()
	for _, s := range f.Configuration().Servers {
		w := n.IsWitness(string(s.ID))
		out = append(out, MemberStatus{ID: string(s.ID), RaftAddr: string(s.Address), State: "unknown",
			Suffrage: s.Suffrage.String(), Leader: s.ID == leader, Witness: w, Role: memberRole(s.ID == leader, w)})
	}
	return out
}
