package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nlm"
)

// nfsv4 is a serving node's kernel NFS side beyond NSM: the NFSv4
// client-tracking upcall (package cld) answered from the replicated table,
// and the grace keeper of each leadership term (package nlm), which ends
// lockd's and nfsd's grace once every client that could reclaim has.
type nfsv4 struct {
	a   *Agent
	log *slog.Logger
	// srv serves <rpc_pipefs>/nfsd/cld; nil when tracking is off.
	srv *cld.Server
	// tracking says whether srv runs, and why not ("off", or auto found no
	// nfsd in this kernel).
	tracking    bool
	trackingWhy string
	// statusPath is the file the nfsd-ha hook reads (KEY=value lines).
	statusPath string
	graceAuto  bool

	endedTotal *prometheus.CounterVec
	graceSecs  *prometheus.HistogramVec

	mu sync.Mutex
	// graceStartState is the sm_state of the term whose nfsd's GraceStart
	// was answered last (the hook waits for its own).
	graceStartState int32
	graceStartAt    time.Time
	keeper          *nlm.Keeper // the current (or last) term's
	keeperFrom      uint64      // applied index when keeper began: later entries count
	keeperState     int32       // its sm_state
	fileWritten     string

	wg sync.WaitGroup
}

// kernelHasNFSd reports whether this machine's kernel can run nfsd: the
// module is loaded or built in, or installed for this kernel.
func kernelHasNFSd() bool {
	if _, err := os.Stat("/sys/module/nfsd"); err == nil {
		return true
	}
	if b, err := os.ReadFile("/proc/filesystems"); err == nil && strings.Contains(string(b), "\tnfsd\n") {
		return true
	}
	rel, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return false
	}
	m, _ := filepath.Glob(filepath.Join("/lib/modules", strings.TrimSpace(string(rel)), "kernel/fs/nfsd/nfsd.ko*"))
	return len(m) > 0
}

// newNFSv4 builds the NFSv4 side of agent a (nothing runs before start).
func newNFSv4(a *Agent, tune func(string, *cld.Config)) (*nfsv4, error) {
	cfg := a.cfg
	v := &nfsv4{
		a:          a,
		log:        a.log.With("component", "nfsv4"),
		statusPath: filepath.Join(cfg.DataDir, "nfsv4-tracking.status"),
		graceAuto:  cfg.GraceEnd == config.GraceEndAuto && !cfg.Witness,
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
	if err := a.reg.Register(v.endedTotal); err != nil {
		return nil, err
	}
	if err := a.reg.Register(v.graceSecs); err != nil {
		return nil, err
	}
	f := func() *cluster.Node { return a.node }
	for _, g := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nsmd_nfsv4_client_records", Help: "NFSv4 client-tracking records in the current epoch (clients that may reclaim after the next failover).", ConstLabels: prometheus.Labels{"epoch": "current"}},
			func() float64 { c, _, _ := f().V4Counts(); return float64(c) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nsmd_nfsv4_client_records", Help: "NFSv4 client-tracking records in the current epoch (clients that may reclaim after the next failover).", ConstLabels: prometheus.Labels{"epoch": "recovery"}},
			func() float64 { _, r, _ := f().V4Counts(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nsmd_nfsv4_reclaimed_clients", Help: "NFSv4 clients of the recovery epoch that reclaimed in this grace period (0 outside grace)."},
			func() float64 { _, _, n := f().V4Counts(); return float64(n) }),
	} {
		if err := a.reg.Register(g); err != nil {
			return nil, err
		}
	}

	switch {
	case cfg.Witness:
		v.trackingWhy = "witness"
	case cfg.NFSv4Tracking == config.TrackingOff:
		v.trackingWhy = "nfsv4_tracking is off"
	case cfg.NFSv4Tracking == config.TrackingAuto && !kernelHasNFSd():
		v.trackingWhy = "nfsv4_tracking auto: this kernel has no nfsd"
	default:
		v.tracking = true
	}
	if !v.tracking {
		v.log.Info("NFSv4 client tracking not served", "why", v.trackingWhy)
		return v, nil
	}
	ccfg := cld.Config{
		PipefsDir:   cfg.RPCPipefs,
		MountPipefs: true,
		Logger:      v.log,
		Registerer:  a.reg,
	}
	if tune != nil {
		tune(cfg.NodeID, &ccfg)
	}
	srv, err := cld.NewServer(trackingStore{v}, ccfg)
	if err != nil {
		return nil, fmt.Errorf("nfsv4 client tracking: %w", err)
	}
	v.srv = srv
	return v, nil
}

// start runs the tracking server and keeps the hook's status file
// current; both stop with ctx.
func (v *nfsv4) start(ctx context.Context) {
	v.writeStatusFile()
	if v.srv == nil {
		return
	}
	v.wg.Add(2)
	go func() {
		defer v.wg.Done()
		if err := v.srv.Run(ctx); err != nil {
			v.log.Error("NFSv4 client tracking stopped", "err", err)
		}
	}()
	go func() {
		defer v.wg.Done()
		for {
			ch := v.srv.StatusChanged()
			v.writeStatusFile()
			select {
			case <-ctx.Done():
				return
			case <-ch:
			}
		}
	}()
}

// wait waits for every goroutine of v (after their ctx ended).
func (v *nfsv4) wait() { v.wg.Wait() }

// writeStatusFile rewrites the hook's view of tracking (atomically, and
// only when it changed): state (the pipe's: waiting, open …, or off),
// error, and grace_start_sm_state, the sm_state of the term whose nfsd's
// GraceStart nsmd answered last.
func (v *nfsv4) writeStatusFile() {
	state, errText := "off", v.trackingWhy
	if v.srv != nil {
		st := v.srv.Status()
		state, errText = st.State, st.Err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	body := fmt.Sprintf("state=%s\nerror=%s\ngrace_start_sm_state=%d\n", state, oneLine(errText), v.graceStartState)
	if body == v.fileWritten {
		return
	}
	tmp := v.statusPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err == nil {
		err = os.Rename(tmp, v.statusPath)
		if err == nil {
			v.fileWritten = body
			return
		}
	}
	v.log.Warn("cannot write the NFSv4 tracking status file", "path", v.statusPath)
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// hookEnv is what the hooks are told about NFSv4 tracking.
func (v *nfsv4) hookEnv() []string {
	on := "off"
	if v.tracking {
		on = "on"
	}
	return []string{"NSMD_NFSV4_TRACKING=" + on, "NSMD_NFSV4_TRACKING_STATUS=" + v.statusPath}
}

// takeover starts a new term's grace keeper, before on_leader runs: every
// host monitored now was sent (or will be sent) SM_NOTIFY, and each that
// held NLM locks comes back through this node's lockd.
func (v *nfsv4) takeover(state int32) {
	targets := v.a.node.Targets()
	hosts := make([]string, len(targets))
	for i, t := range targets {
		hosts[i] = t.MonName
	}
	mark := func(f func(*cluster.Timeline, time.Time)) {
		at := time.Now()
		v.a.node.MarkTimeline(state, func(tl *cluster.Timeline) { f(tl, at) })
	}
	k := nlm.NewKeeper(nlm.KeeperConfig{
		Settle: v.a.cfg.GraceSettle,
		Logger: v.log,
		OnEnd: func(m nlm.Manager, reason string, after time.Duration) {
			v.endedTotal.WithLabelValues(string(m), reason).Inc()
			v.graceSecs.WithLabelValues(string(m)).Observe(after.Seconds())
			mark(func(tl *cluster.Timeline, at time.Time) {
				if m == nlm.NLM {
					tl.NLMGraceEnd = at
				} else {
					tl.NFSv4GraceEnd = at
				}
			})
		},
		OnBack: func(m nlm.Manager, _ string, last bool) {
			mark(func(tl *cluster.Timeline, at time.Time) {
				first, all := &tl.NLMFirstBack, &tl.NLMAllBack
				if m == nlm.NFSv4 {
					first, all = &tl.NFSv4FirstBack, &tl.NFSv4AllBack
				}
				if first.IsZero() {
					*first = at
				}
				if last && all.IsZero() {
					*all = at
				}
			})
		},
	}, hosts, time.Now())
	v.mu.Lock()
	v.keeper, v.keeperFrom, v.keeperState = k, v.a.node.AppliedIndex(), state
	v.mu.Unlock()
}

// serving runs the term's grace keeper once on_leader returned (nfsd is
// up), until both grace periods are over or the term ends.
func (v *nfsv4) serving(ctx context.Context) {
	v.mu.Lock()
	k := v.keeper
	v.mu.Unlock()
	if k == nil || !v.graceAuto {
		return
	}
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		k.Run(ctx)
	}()
}

// observe sees every applied command (a cluster.Subscriber; must not
// block): an SM_MON or an NFSv4 Create after the takeover is a client
// coming back.
func (v *nfsv4) observe(index uint64, cmd fsm.Command, _ fsm.Result) {
	v.mu.Lock()
	k, from := v.keeper, v.keeperFrom
	v.mu.Unlock()
	if k == nil || index <= from {
		return
	}
	switch c := cmd.(type) {
	case fsm.Register:
		k.Back(nlm.NLM, c.Reg.ID.MonName)
	case fsm.ClientCreate:
		k.Back(nlm.NFSv4, c.Name)
	}
}

// graceStatus is the current (or last) term's grace, nil before any.
func (v *nfsv4) graceStatus() *nlm.GraceStatus {
	v.mu.Lock()
	k, state := v.keeper, v.keeperState
	v.mu.Unlock()
	if k == nil {
		return nil
	}
	s := k.Status()
	s.SMState = state
	if !v.graceAuto {
		s.Error = "grace_end is timer: nsmd does not end grace"
	}
	return &s
}

// status is the NFSv4 part of GET /v1/status.
func (v *nfsv4) status() admin.NFSv4Status {
	f := v.a.node
	s := admin.NFSv4Status{Tracking: v.tracking, TrackingWhy: v.trackingWhy}
	s.CurrentEpoch, s.RecoveryEpoch = f.Epochs()
	s.Clients, s.Reclaimable, s.Reclaimed = f.V4Counts()
	if v.srv != nil {
		st := v.srv.Status()
		s.Pipe = &st
	}
	v.mu.Lock()
	s.GraceStartSMState = v.graceStartState
	if !v.graceStartAt.IsZero() {
		t := v.graceStartAt.UTC()
		s.GraceStartAt = &t
	}
	v.mu.Unlock()
	return s
}

// clients is GET /v1/nfsv4/clients.
func (v *nfsv4) clients() admin.V4ClientPage {
	f := v.a.node
	p := admin.V4ClientPage{Clients: []admin.V4ClientJSON{}}
	p.CurrentEpoch, p.RecoveryEpoch = f.Epochs()
	for _, e := range []struct {
		name     string
		recovery bool
	}{{"current", false}, {"recovery", true}} {
		for _, c := range f.V4Clients(e.recovery) {
			p.Clients = append(p.Clients, admin.V4ClientRow(e.name, c))
		}
	}
	return p
}

// trackingStore is the cld.Store of a node: each upcall is one command
// committed through raft on the serving leader (cluster.Node.Track*).
type trackingStore struct{ v *nfsv4 }

var _ cld.Store = trackingStore{}

func (s trackingStore) node() *cluster.Node { return s.v.a.node }

func (s trackingStore) Create(ctx context.Context, name, princHash []byte) error {
	return s.node().TrackCreate(ctx, string(name), string(princHash))
}

func (s trackingStore) Remove(ctx context.Context, name []byte) error {
	return s.node().TrackRemove(ctx, string(name))
}

func (s trackingStore) Check(ctx context.Context, name []byte) (bool, error) {
	return s.node().TrackCheck(ctx, string(name))
}

// GraceStart commits the new epoch, tells the term's grace keeper which
// NFSv4 clients may reclaim, and records the term for the hook.
func (s trackingStore) GraceStart(ctx context.Context) ([]cld.Record, error) {
	recs, err := s.node().TrackGraceStart(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]cld.Record, len(recs))
	names := make([]string, len(recs))
	for i, r := range recs {
		out[i] = cld.Record{Name: []byte(r.Name), PrincHash: []byte(r.PrincHash)}
		names[i] = r.Name
	}
	v := s.v
	v.mu.Lock()
	k := v.keeper
	v.graceStartState, v.graceStartAt = s.node().State(), time.Now()
	state, at := v.graceStartState, v.graceStartAt
	v.mu.Unlock()
	s.node().MarkTimeline(state, func(tl *cluster.Timeline) { tl.NFSdGraceStart = at })
	if k != nil {
		k.ExpectV4(names)
	}
	v.log.Info("nfsd grace start: clients that may reclaim sent to the kernel", "clients", len(recs))
	v.writeStatusFile()
	return out, nil
}

// GraceDone first carries over the NFSv4.0 clients that reclaimed: their
// reclaims send no Create (a reclaimed open needs no OPEN_CONFIRM), so
// without this a v4.0 client would lose its record at GraceDone and could
// not reclaim after the next failover. A v4.0 client that nfsd lists as
// confirmed now, and that may reclaim in this grace, is recorded in the
// current epoch. Then the grace period ends in the table.
func (s trackingStore) GraceDone(ctx context.Context) error {
	f := s.node()
	if _, rec := f.Epochs(); rec != 0 {
		if err := s.carryV40(ctx, f); err != nil {
			return err
		}
	}
	return s.node().TrackGraceDone(ctx)
}

func (s trackingStore) carryV40(ctx context.Context, f *cluster.Node) error {
	clients, err := nlm.NFSdClients("")
	if errors.Is(err, nlm.ErrNoManager) {
		return nil
	}
	if err != nil {
		s.v.log.Warn("cannot list nfsd's clients; NFSv4.0 clients that reclaimed are not carried over", "err", err)
		return nil
	}
	recovery := map[string]string{}
	for _, r := range f.V4Clients(true) {
		recovery[r.Name] = r.PrincHash
	}
	for _, c := range clients {
		if c.Minor != 0 || !c.Confirmed() {
			continue
		}
		princ, may := recovery[c.Name]
		if cur, _ := f.HasV4Client(c.Name); !may || cur {
			continue
		}
		if err := s.node().TrackCreate(ctx, c.Name, princ); err != nil {
			return fmt.Errorf("carry NFSv4.0 client %q into the new epoch: %w", c.Name, err)
		}
		s.v.log.Info("NFSv4.0 client reclaimed: record carried into the new epoch", "client", c.Name)
	}
	return nil
}
