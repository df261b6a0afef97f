package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/grace"
)

// nfsv4 is a serving node's kernel NFS side beyond NSM: the NFSv4
// client-tracking upcall (package cld), answered by the node's grace
// (package grace), which also ends lockd's and nfsd's grace once every
// client that could reclaim has.
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
	grace      *grace.Service
	// seen: when each NFSv4 client was last seen (nil on a witness).
	seen *clientsSeen

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
func newNFSv4(a *Agent, tune func(string, *cld.Config), seenProc func(string) string) (*nfsv4, error) {
	cfg := a.cfg
	v := &nfsv4{
		a:          a,
		log:        a.log.With("component", "nfsv4"),
		statusPath: filepath.Join(cfg.DataDir, "nfsv4-tracking.status"),
	}
	g, err := grace.New(grace.Config{
		Node:       cfg.NodeID,
		Settle:     cfg.GraceSettle,
		Auto:       cfg.GraceEnd == config.GraceEndAuto && !cfg.Witness,
		StatusFile: v.statusPath,
		Logger:     v.log,
		Registerer: a.reg,
	}, graceCluster{a})
	if err != nil {
		return nil, err
	}
	v.grace = g
	f := func() *cluster.Node { return a.node }
	if !cfg.Witness {
		proc := ""
		if seenProc != nil {
			proc = seenProc(cfg.NodeID)
		}
		v.seen = newClientsSeen(v.log, proc, f)
		a.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nsmd_nfsv4_clients_seen",
			Help: "NFSv4 clients this node knows when a server of the cluster last saw (its own nfsd's while it leads, else the leader's last list): a grace that waits for one says when it was last seen.",
		}, func() float64 { return float64(v.seen.known()) }))
	}
	for _, g := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nsmd_nfsv4_client_records", Help: "NFSv4 client-tracking records in the current epoch (clients that may reclaim after the next failover).", ConstLabels: prometheus.Labels{"epoch": "current"}},
			func() float64 { c, _, _ := f().View().V4Counts(); return float64(c) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nsmd_nfsv4_client_records", Help: "NFSv4 client-tracking records in the current epoch (clients that may reclaim after the next failover).", ConstLabels: prometheus.Labels{"epoch": "recovery"}},
			func() float64 { _, r, _ := f().View().V4Counts(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nsmd_nfsv4_reclaimed_clients", Help: "NFSv4 clients of the recovery epoch that reclaimed in this grace period (0 outside grace)."},
			func() float64 { _, _, n := f().View().V4Counts(); return float64(n) }),
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
	srv, err := cld.NewServer(g.Tracking(), ccfg)
	if err != nil {
		return nil, fmt.Errorf("nfsv4 client tracking: %w", err)
	}
	v.srv = srv
	return v, nil
}

// start runs the tracking server, keeps the hook's status file current
// and learns when the NFSv4 clients were last seen; all stop with ctx.
func (v *nfsv4) start(ctx context.Context) {
	v.pipeChanged()
	if v.seen != nil {
		v.wg.Add(1)
		go func() {
			defer v.wg.Done()
			v.seen.run(ctx)
		}()
	}
	if v.srv == nil {
		return
	}
	serveTracking(ctx, &v.wg, v.srv, v.pipeChanged, func(err error) {
		v.log.Error("NFSv4 client tracking stopped", "err", err)
	})
}

// serveTracking runs the tracking server srv until ctx ends (stopped gets
// the error it stopped with, if any) and calls changed at once and at
// each change of the pipe's state; both goroutines are wg's. The node's
// NFSv4 side and each service's use it.
func serveTracking(ctx context.Context, wg *sync.WaitGroup, srv *cld.Server, changed func(), stopped func(error)) {
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := srv.Run(ctx); err != nil {
			stopped(err)
		}
	}()
	go func() {
		defer wg.Done()
		for {
			ch := srv.StatusChanged()
			changed()
			select {
			case <-ctx.Done():
				return
			case <-ch:
			}
		}
	}()
}

// wait waits for every goroutine of v (after their ctx ended).
func (v *nfsv4) wait() {
	v.wg.Wait()
	v.grace.Wait()
}

// pipeChanged hands the pipe's state (or "off" and why) to the hook's
// status file.
func (v *nfsv4) pipeChanged() { handPipeState(v.grace, v.srv, v.trackingWhy) }

// handPipeState hands the state of srv's pipe to g's status file, or
// "off" and whyNot without a tracking server (srv nil).
func handPipeState(g *grace.Service, srv *cld.Server, whyNot string) {
	if srv == nil {
		g.PipeChanged("off", whyNot)
		return
	}
	st := srv.Status()
	g.PipeChanged(st.State, st.Err)
}

// hookEnv is what the hooks are told about NFSv4 tracking.
func (v *nfsv4) hookEnv() []string {
	on := "off"
	if v.tracking {
		on = "on"
	}
	return []string{"NSMD_NFSV4_TRACKING=" + on, "NSMD_NFSV4_TRACKING_STATUS=" + v.statusPath}
}

// status is the NFSv4 part of GET /v1/status.
func (v *nfsv4) status() admin.NFSv4Status {
	f := v.a.node.View()
	s := admin.NFSv4Status{NFSv4Tracking: admin.NFSv4Tracking{Tracking: v.tracking, TrackingWhy: v.trackingWhy}}
	s.CurrentEpoch, s.RecoveryEpoch = f.Epochs()
	s.Clients, s.Reclaimable, s.Reclaimed = f.V4Counts()
	if v.srv != nil {
		s.Pipe = pipeJSON(v.srv.Status())
	}
	if v.seen != nil {
		s.ClientsSeen = v.seen.known()
	}
	state, at := v.grace.LastGraceStart()
	s.GraceStartSMState = state
	if !at.IsZero() {
		at = at.UTC()
		s.GraceStartAt = &at
	}
	return s
}

// clients is GET /v1/nfsv4/clients.
func (v *nfsv4) clients() admin.V4ClientPage {
	f := v.a.node.View()
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
