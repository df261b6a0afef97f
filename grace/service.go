package grace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/timeline"
)

// Cluster is what a node's grace needs of the cluster: reads of the
// replicated state and the NFSv4 client-tracking commands, each committed
// through raft on the serving leader before it returns. It is declared
// here, where it is used; the agent satisfies it over its cluster node,
// the tests over a bare state machine.
type Cluster interface {
	// State is the current sm_state; AppliedIndex the index of the last
	// entry applied here.
	State() int32
	AppliedIndex() uint64
	// MonitoredHosts are the distinct hosts monitored now (the SM_NOTIFY
	// fan-out's targets).
	MonitoredHosts() []string
	// Epochs, V4Clients and HasV4Client read the client-tracking table
	// (fsm.FSM's methods of the same names).
	Epochs() (current, recovery uint64)
	V4Clients(recovery bool) []fsm.V4Client
	HasV4Client(name string) (inCurrent, inRecovery bool)
	// TrackCreate, TrackRemove, TrackCheck, TrackGraceStart and
	// TrackGraceDone commit one client-tracking command each (cld's
	// upcalls); TrackGraceStart returns the recovery epoch's records.
	TrackCreate(ctx context.Context, name, princHash string) error
	TrackRemove(ctx context.Context, name string) error
	TrackCheck(ctx context.Context, name string) (bool, error)
	TrackGraceStart(ctx context.Context) ([]fsm.V4Client, error)
	TrackGraceDone(ctx context.Context) error
	// MarkTimeline records steps of the takeover whose sm_state is state;
	// a mark for another takeover is dropped.
	MarkTimeline(state int32, mark func(*timeline.Timeline))
}

// Config configures a Service.
type Config struct {
	// Proc is the procfs root ("" = /proc): the kernel's grace files,
	// /proc/locks and nfsd's client list are read under it.
	Proc string
	// NFSd and Within, when set, are where the nfsd filesystem of the
	// lock managers' network namespace is and how their grace files are
	// touched (KernelGrace's fields of the same names): a service's
	// namespace.
	NFSd   string
	Within func(fn func() error) error
	// LocksOn: only locks on the filesystem of this path count as reclaim
	// activity (KeeperConfig.LocksOn).
	LocksOn string
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Settle is how long reclaims must be quiet after the last expected
	// client came back before a grace is ended (default 3 s); Poll how
	// often the kernel is read (default 200 ms).
	Settle time.Duration
	Poll   time.Duration
	// Node is this node's id: only an SM_MON taken here (a Register this
	// node proposed that was not refused) is a client coming back to this
	// node's lockd; "": any node's (tests of a lone node).
	Node string
	// Auto: nsmd ends grace as soon as the rule allows (grace_end auto);
	// otherwise the kernel's timer alone does (grace_end timer).
	Auto bool
	// StatusFile is the file the hook reads to know the state of NFSv4
	// client tracking ("" = none).
	StatusFile string
	Logger     *slog.Logger
	// Registerer takes the grace metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Service is a serving node's kernel grace, one takeover at a time: at
// each takeover it starts a Keeper expecting the hosts monitored then;
// it answers nfsd's client-tracking upcalls (Tracking) — at GraceStart it
// tells the Keeper which NFSv4 clients may reclaim, at GraceDone it first
// carries the NFSv4.0 clients that reclaimed into the new epoch (CarryV40,
// DESIGN.md invariant 8); it hears every applied command (Observe: who
// came back); it marks the takeover's timeline and keeps the hook's status
// file. It is safe for concurrent use.
type Service struct {
	cfg Config
	c   Cluster
	log *slog.Logger

	endedTotal *prometheus.CounterVec
	graceSecs  *prometheus.HistogramVec
	file       *statusFile
	// carry is the NFSv4.0 carry-over rule (CarryV40; tests replace it
	// to show what breaks without it).
	carry func(ctx context.Context, c Cluster, proc string, log *slog.Logger) error

	mu sync.Mutex
	// graceStartState is the sm_state of the term whose nfsd's GraceStart
	// was answered last (the hook waits for its own).
	graceStartState int32
	graceStartAt    time.Time
	keeper          *Keeper // the current (or last) term's
	keeperFrom      uint64  // applied index when keeper began: later entries count
	keeperState     int32   // its sm_state

	wg sync.WaitGroup
}

// New builds the grace service of a node over c (nothing runs before
// Serving).
func New(cfg Config, c Cluster) (*Service, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{
		cfg:   cfg,
		c:     c,
		carry: CarryV40,
		log:   cfg.Logger.With("component", "grace"),
		endedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_grace_ended_total",
			Help: "Kernel grace periods ended, by lock manager (nlm: lockd, nfsv4: nfsd) and reason (all_reclaimed, nothing_to_reclaim: ended by nsmd; kernel: its timer, or every NFSv4.1+ client sent RECLAIM_COMPLETE).",
		}, []string{"manager", "reason"}),
		graceSecs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nsmd_grace_duration_seconds",
			Help:    "From the takeover to the end of a kernel grace period, by lock manager.",
			Buckets: []float64{1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180},
		}, []string{"manager"}),
	}
	if cfg.NFSd != "" || cfg.Within != nil {
		k := KernelGrace{Proc: cfg.Proc, NFSd: cfg.NFSd, Within: cfg.Within}
		s.carry = func(ctx context.Context, c Cluster, _ string, log *slog.Logger) error {
			return carryV40(ctx, c, k.Clients, log)
		}
	}
	if cfg.StatusFile != "" {
		s.file = &statusFile{path: cfg.StatusFile, log: s.log}
	}
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{s.endedTotal, s.graceSecs} {
			if err := cfg.Registerer.Register(m); err != nil {
				return nil, fmt.Errorf("grace metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Takeover starts the grace of a new term, before on_leader runs: every
// host monitored now was sent (or will be sent) SM_NOTIFY, and each that
// held NLM locks comes back through this node's lockd.
func (s *Service) Takeover(state int32) {
	now := s.cfg.Now()
	mark := func(f func(*timeline.Timeline)) { s.c.MarkTimeline(state, f) }
	k := NewKeeper(KeeperConfig{
		Proc:    s.cfg.Proc,
		NFSd:    s.cfg.NFSd,
		Within:  s.cfg.Within,
		LocksOn: s.cfg.LocksOn,
		Settle:  s.cfg.Settle,
		Poll:    s.cfg.Poll,
		Logger:  s.cfg.Logger,
		Now:     s.cfg.Now,
		OnEnd: func(m Manager, reason string, after time.Duration) {
			s.endedTotal.WithLabelValues(string(m), reason).Inc()
			s.graceSecs.WithLabelValues(string(m)).Observe(after.Seconds())
			at := s.cfg.Now()
			mark(func(tl *timeline.Timeline) { tl.Mark(m.steps().end, at) })
		},
		OnBack: func(m Manager, _ string, last bool) {
			at := s.cfg.Now()
			mark(func(tl *timeline.Timeline) {
				tl.MarkFirst(m.steps().first, at)
				if last {
					tl.MarkFirst(m.steps().all, at)
				}
			})
		},
	}, s.c.MonitoredHosts(), now)
	s.mu.Lock()
	s.keeper, s.keeperFrom, s.keeperState = k, s.c.AppliedIndex(), state
	s.mu.Unlock()
}

// managerSteps are a lock manager's steps in the takeover's timeline.
type managerSteps struct{ first, all, end timeline.Step }

func (m Manager) steps() managerSteps {
	if m == NLM {
		return managerSteps{timeline.NLMFirstBack, timeline.NLMAllBack, timeline.NLMGraceEnd}
	}
	return managerSteps{timeline.NFSv4FirstBack, timeline.NFSv4AllBack, timeline.NFSv4GraceEnd}
}

// Serving runs the term's Keeper once on_leader returned (nfsd is up),
// until both grace periods are over or ctx ends; Wait waits for it.
func (s *Service) Serving(ctx context.Context) {
	s.mu.Lock()
	k := s.keeper
	s.mu.Unlock()
	if k == nil || !s.cfg.Auto {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		k.Run(ctx)
	}()
}

// Wait waits for the Keepers Serving started (after their ctx ended).
func (s *Service) Wait() { s.wg.Wait() }

// Observe sees every applied command (the cluster's observer, with its
// signature; it does not block): an SM_MON taken on this node (Config.Node)
// and not refused, or an NFSv4 Create, after the takeover is a client
// coming back. An SM_MON taken on another member is not: that member's
// lockd holds no locks here, and a local user there could otherwise end
// this node's lockd grace before the real clients reclaimed.
func (s *Service) Observe(index uint64, cmd fsm.Command, res fsm.Result) {
	s.mu.Lock()
	k, from := s.keeper, s.keeperFrom
	s.mu.Unlock()
	if k == nil || index <= from {
		return
	}
	switch c := cmd.(type) {
	case fsm.Register:
		if !res.Refused && (s.cfg.Node == "" || c.Reg.Node == s.cfg.Node) {
			k.Back(NLM, c.Reg.ID.MonName)
		}
	case fsm.ClientCreate:
		k.Back(NFSv4, c.Name)
	}
}

// Status is the current (or last) term's grace, nil before any.
func (s *Service) Status() *Status {
	s.mu.Lock()
	k, state := s.keeper, s.keeperState
	s.mu.Unlock()
	if k == nil {
		return nil
	}
	st := k.Status()
	st.SMState = state
	if !s.cfg.Auto {
		st.Error = "grace_end is timer: nsmd does not end grace"
	}
	return &st
}

// LastGraceStart is the sm_state of the term whose nfsd's GraceStart this
// node answered last, and when (0 and the zero time: none).
func (s *Service) LastGraceStart() (state int32, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.graceStartState, s.graceStartAt
}

// PipeChanged rewrites the hook's status file with the state of the
// client-tracking pipe ("off" and why, when tracking is not served).
func (s *Service) PipeChanged(state, errText string) {
	if s.file != nil {
		s.file.pipe(state, errText)
	}
}

// Tracking is the cld.Store of this node: each upcall is one command
// committed through the cluster on the serving leader.
func (s *Service) Tracking() cld.Store { return tracking{s} }

type tracking struct{ s *Service }

var _ cld.Store = tracking{}

func (t tracking) Create(ctx context.Context, name, princHash []byte) error {
	return t.s.c.TrackCreate(ctx, string(name), string(princHash))
}

func (t tracking) Remove(ctx context.Context, name []byte) error {
	return t.s.c.TrackRemove(ctx, string(name))
}

func (t tracking) Check(ctx context.Context, name []byte) (bool, error) {
	return t.s.c.TrackCheck(ctx, string(name))
}

// GraceStart commits the new epoch, tells the term's Keeper which NFSv4
// clients may reclaim, marks the timeline and records the term for the
// hook.
func (t tracking) GraceStart(ctx context.Context) ([]cld.Record, error) {
	s := t.s
	recs, err := s.c.TrackGraceStart(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]cld.Record, len(recs))
	names := make([]string, len(recs))
	for i, r := range recs {
		out[i] = cld.Record{Name: []byte(r.Name), PrincHash: []byte(r.PrincHash)}
		names[i] = r.Name
	}
	state, at := s.c.State(), s.cfg.Now()
	s.mu.Lock()
	k := s.keeper
	s.graceStartState, s.graceStartAt = state, at
	s.mu.Unlock()
	s.c.MarkTimeline(state, func(tl *timeline.Timeline) { tl.Mark(timeline.NFSdGraceStart, at) })
	if k != nil {
		k.ExpectV4(names)
	}
	s.log.Info("nfsd grace start: clients that may reclaim sent to the kernel", "clients", len(recs))
	if s.file != nil {
		s.file.graceStart(state)
	}
	return out, nil
}

// GraceDone first carries the NFSv4.0 clients that reclaimed into the
// new epoch (CarryV40), then ends the grace period in the table: the
// recovery records go.
func (t tracking) GraceDone(ctx context.Context) error {
	s := t.s
	if _, rec := s.c.Epochs(); rec != 0 {
		if err := s.carry(ctx, s.c, s.cfg.Proc, s.log); err != nil {
			return err
		}
	}
	return s.c.TrackGraceDone(ctx)
}

// CarryV40 is the NFSv4.0 carry-over rule (DESIGN.md invariant 8): a
// client of the recovery epoch that nfsd lists as a confirmed NFSv4.0
// client now reclaimed in this grace, yet sent no Create (a reclaimed
// open needs no OPEN_CONFIRM, and NFSv4.0 has no RECLAIM_COMPLETE), so
// without this it would lose its record at GraceDone and could not
// reclaim after the next failover. Each such client not yet in the
// current epoch is recorded there (with its principal's hash). Without
// nfsd's client list (no nfsd, a kernel before 5.3) nothing is carried;
// a list that cannot be read is logged and carries nothing either, since
// GraceDone must still be answered.
func CarryV40(ctx context.Context, c Cluster, proc string, log *slog.Logger) error {
	return carryV40(ctx, c, func() ([]V4Client, error) { return NFSdClients(proc) }, log)
}

// carryV40 is CarryV40 with nfsd's clients listed by list.
func carryV40(ctx context.Context, c Cluster, list func() ([]V4Client, error), log *slog.Logger) error {
	clients, err := list()
	if errors.Is(err, ErrNoManager) {
		return nil
	}
	if err != nil {
		log.Warn("cannot list nfsd's clients; NFSv4.0 clients that reclaimed are not carried over", "err", err)
		return nil
	}
	recovery := map[string]string{}
	for _, r := range c.V4Clients(true) {
		recovery[r.Name] = r.PrincHash
	}
	for _, cl := range clients {
		if cl.Minor != 0 || !cl.Confirmed() {
			continue
		}
		princ, may := recovery[cl.Name]
		if cur, _ := c.HasV4Client(cl.Name); !may || cur {
			continue
		}
		if err := c.TrackCreate(ctx, cl.Name, princ); err != nil {
			return fmt.Errorf("grace: carry NFSv4.0 client %q into the new epoch: %w", cl.Name, err)
		}
		log.Info("NFSv4.0 client reclaimed: record carried into the new epoch", "client", cl.Name)
	}
	return nil
}
