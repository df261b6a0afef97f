package agent

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/grace"
	"github.com/nsmd/nsmd/service"
	"github.com/nsmd/nsmd/timeline"
)

// The NFSv4 side of each service served in a network namespace of its
// own (DESIGN.md, "A service's NSM state is its own"): the nfsd in that
// namespace sends its client-tracking upcalls on the cld pipe of the
// namespace's own rpc_pipefs (<run dir>/rpc_pipefs/nfsd/cld), answered
// from the service's scope (cluster.ServiceTracking) by a grace.Service
// of the service, which also ends the service's lockd and nfsd grace
// early — looking only at the service's clients (its registrations and
// its NFSv4 records) and writing only the namespace's grace files: its
// nfsd filesystem's v4_end_grace (<run dir>/nfsd) and lockd's
// nlm_end_grace from a thread inside the namespace (lockd's file acts on
// the writer's network namespace). The node's own NFSv4 side (nfsv4.go)
// is not touched. The room opens a service's before its on_leader (nfsd
// looks for the pipe's reader as it starts), starts its grace keeper once
// on_leader returned and closes it after the stop.

// serviceV4StatusFile is, in a service's run directory, the file its hook
// reads for the state of its NFSv4 client tracking
// (NSMD_SERVICE_NFSV4_TRACKING_STATUS; the lines of the node's
// NSMD_NFSV4_TRACKING_STATUS).
const serviceV4StatusFile = "nfsv4-tracking.status"

// serviceV4StatusPath is the status file of the service whose run
// directory is runDir.
func serviceV4StatusPath(runDir string) string { return filepath.Join(runDir, serviceV4StatusFile) }

// roomV4 is a service's NFSv4 side, told the steps of its start and stop
// when it runs in a namespace of its own.
type roomV4 interface {
	// open serves the tracking pipe of the service's namespace ns (run
	// directory runDir) from the service's scope and begins its grace,
	// before on_leader.
	open(spec service.Spec, ns svcNamespace, runDir string) error
	// serving starts ending the service's grace early once on_leader
	// returned (its nfsd and lockd are up), until ctx ends (the run).
	serving(ctx context.Context, id string)
	// close stops serving the pipe once the stop's hook ran.
	close(id string) error
}

// agentRoomV4 is the agent's serviceV4s as a roomV4 (looked up at each
// call: the room is built before it).
type agentRoomV4 struct{ a *Agent }

func (v agentRoomV4) open(spec service.Spec, ns svcNamespace, runDir string) error {
	return v.a.svcV4.open(spec, ns, runDir)
}
func (v agentRoomV4) serving(ctx context.Context, id string) { v.a.svcV4.serving(ctx, id) }
func (v agentRoomV4) close(id string) error                  { return v.a.svcV4.close(id) }

// serviceV4s is the NFSv4 side of the services this node serves in
// namespaces of their own.
type serviceV4s struct {
	node     string
	log      *slog.Logger
	tracking bool   // the node serves NFSv4 client tracking (nfsv4_tracking)
	whyNot   string // why not
	auto     bool   // grace_end auto
	settle   time.Duration
	poll     time.Duration // how often the kernel is read (0: grace's default)
	proc     string        // procfs root ("": /proc; tests: a directory of plain files)
	// scope is service id's tracking (cluster.ServiceTracking).
	scope func(id string) serviceScope
	// tune, when set, adjusts a service's tracking server (tests: a fake
	// kernel's pipe, cld/cldtest).
	tune func(id string, c *cld.Config)

	mu   sync.Mutex
	byID map[string]*serviceV4
}

// serviceScope is a service's scope as its NFSv4 side needs it: package
// grace's Cluster without the timeline (cluster.ServiceTracking).
type serviceScope interface {
	State() int32
	AppliedIndex() uint64
	MonitoredHosts() []string
	Epochs() (current, recovery uint64)
	V4Clients(recovery bool) []fsm.V4Client
	V4Counts() (current, recovery, reclaimed int)
	HasV4Client(name string) (inCurrent, inRecovery bool)
	TrackCreate(ctx context.Context, name, princHash string) error
	TrackRemove(ctx context.Context, name string) error
	TrackCheck(ctx context.Context, name string) (bool, error)
	TrackGraceStart(ctx context.Context) ([]fsm.V4Client, error)
	TrackGraceDone(ctx context.Context) error
}

var _ serviceScope = cluster.ServiceTracking{}

// serviceGraceCluster is a service's scope as package grace's Cluster: a
// service's takeover has no timeline of the node's.
type serviceGraceCluster struct{ serviceScope }

func (serviceGraceCluster) MarkTimeline(int32, func(*timeline.Timeline)) {}

// serviceV4 is one service's NFSv4 side while its room has it open.
type serviceV4 struct {
	scope  serviceScope
	grace  *grace.Service
	srv    *cld.Server // nil: tracking not served
	whyNot string
	// reg holds the tracking server's metrics of this service (its own
	// registry: the node's carry the node's pipe under the same names);
	// the services' collector exports them with a service label
	// (servicev4metrics.go) while the service is open here.
	reg    *prometheus.Registry
	ctx    context.Context // ends at close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// newServiceV4s is the services' NFSv4 side of agent a, following the
// node's settings (v: the node's own NFSv4 side, whose decision on
// tracking holds for the services too).
func newServiceV4s(a *Agent, v *nfsv4, tune func(string, *cld.Config)) *serviceV4s {
	cfg := a.cfg
	return &serviceV4s{
		node: cfg.NodeID, log: a.log.With("component", "nfsv4"),
		tracking: v.tracking, whyNot: v.trackingWhy,
		auto:   cfg.GraceEnd == config.GraceEndAuto && !cfg.Witness,
		settle: cfg.GraceSettle,
		scope:  func(id string) serviceScope { return a.node.Services().Tracking(id) },
		tune:   tune,
		byID:   map[string]*serviceV4{},
	}
}

// open begins service spec's NFSv4 side in namespace ns: its grace (the
// hosts its registrations name now are expected back), its status file
// and, when tracking is served, the tracking server watching the
// namespace's pipe. Opening one that is open closes the old one first.
func (s *serviceV4s) open(spec service.Spec, ns svcNamespace, runDir string) error {
	if ns == nil {
		return fmt.Errorf("service %s: NFSv4 client tracking: %w", spec.ID, errNoNamespace)
	}
	if err := s.close(spec.ID); err != nil {
		return err
	}
	log := s.log.With("service", spec.ID)
	sc := s.scope(spec.ID)
	g, err := grace.New(grace.Config{
		Node:       s.node,
		Proc:       s.proc,
		Settle:     s.settle,
		Poll:       s.poll,
		Auto:       s.auto,
		StatusFile: serviceV4StatusPath(runDir),
		NFSd:       filepath.Join(runDir, "nfsd"),
		Within:     ns.Do,
		LocksOn:    spec.Mount,
		Logger:     log,
	}, serviceGraceCluster{sc})
	if err != nil {
		return fmt.Errorf("service %s: its grace: %w", spec.ID, err)
	}
	v := &serviceV4{scope: sc, grace: g, whyNot: s.whyNot, reg: prometheus.NewRegistry()}
	if s.tracking {
		c := cld.Config{PipefsDir: filepath.Join(runDir, "rpc_pipefs"), MountPipefs: false, Logger: log, Registerer: v.reg}
		if s.tune != nil {
			s.tune(spec.ID, &c)
		}
		if v.srv, err = cld.NewServer(g.Tracking(), c); err != nil {
			return fmt.Errorf("service %s: NFSv4 client tracking: %w", spec.ID, err)
		}
	}
	// The service's takeover: at its current epoch (placed and leased:
	// the room starts it only then).
	g.Takeover(sc.State())
	v.pipeChanged()
	ctx, cancel := context.WithCancel(context.Background())
	v.ctx, v.cancel = ctx, cancel
	if v.srv != nil {
		serveTracking(ctx, &v.wg, v.srv, v.pipeChanged, func(err error) {
			log.Error("NFSv4 client tracking of the service stopped", "err", err)
		})
	}
	v.awaitWatching()
	s.mu.Lock()
	s.byID[spec.ID] = v
	s.mu.Unlock()
	log.Info("NFSv4 client tracking of the service opened", "pipe", filepath.Join(runDir, "rpc_pipefs", "nfsd", "cld"), "served", v.srv != nil)
	return nil
}

// watchWait bounds open's wait for the tracking server to say where it
// stands (watching the pipe's directory, or why not).
const watchWait = 2 * time.Second

// awaitWatching waits (at most watchWait) until the tracking server has
// left its first state, and writes its state to the status file: the
// hook, run next, reads there whether nfsd will find the pipe's reader.
func (v *serviceV4) awaitWatching() {
	if v.srv == nil {
		return
	}
	t := time.NewTimer(watchWait)
	defer t.Stop()
	for {
		ch := v.srv.StatusChanged()
		if v.srv.Status().State != cld.StateStopped {
			break
		}
		select {
		case <-ch:
			continue
		case <-t.C:
		}
		break
	}
	v.pipeChanged()
}

// pipeChanged hands the pipe's state (or "off" and why) to the status file.
func (v *serviceV4) pipeChanged() { handPipeState(v.grace, v.srv, v.whyNot) }

// serving starts ending service id's grace early (grace_end auto), until
// ctx ends or the service's NFSv4 side closes.
func (s *serviceV4s) serving(ctx context.Context, id string) {
	v := s.get(id)
	if v == nil {
		return
	}
	kctx, cancel := context.WithCancel(ctx)
	context.AfterFunc(v.ctx, cancel)
	v.grace.Serving(kctx)
}

func (s *serviceV4s) get(id string) *serviceV4 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id]
}

// applied hands the service's applied commands to its grace (clients
// coming back); other services' and the node's are not its.
func (s *serviceV4s) applied(sc fsm.Scoped, ev cluster.Applied) {
	if v := s.get(sc.Service); v != nil {
		v.grace.Observe(ev.Index, sc.Cmd, ev.Result)
	}
}

// close ends service id's NFSv4 side: its tracking server (every upcall
// read answered first) and its grace keeper.
func (s *serviceV4s) close(id string) error {
	s.mu.Lock()
	v := s.byID[id]
	delete(s.byID, id)
	s.mu.Unlock()
	if v == nil {
		return nil
	}
	v.cancel()
	v.wg.Wait()
	v.grace.Wait()
	return nil
}

// closeAll closes every service's NFSv4 side (the agent's shutdown).
func (s *serviceV4s) closeAll() {
	if s == nil {
		return
	}
	closeEach(&s.mu, s.byID, s.close)
}
