package agent

import (
	"maps"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/grace"
)

// What an operator sees of each service's NFSv4 side (servicev4.go):
// metrics with a service label and the "nfsv4" and "grace" of the
// service's local status in GET /v1/services. Both exist exactly while
// the service's NFSv4 side is open on this server — from just before its
// start hook until its stop hook ran — and are read from it at each
// scrape or request, so a service that stops here leaves no series
// behind: another server opens the service's only once this one's stop
// returned (or this server was fenced), so no two servers show one
// service's grace at once. The node's own series (nsmd_nfsv4_*,
// nsmd_grace_*, nsmd_cld_*) describe the node's own nfsd and are not
// touched: a service's have names of their own (a metric name has one
// label set).

// Grace states of nsmd_service_grace_state, besides the reasons a grace
// ends (grace.Reason*).
const (
	graceStateIn         = "in_grace"    // the lock manager's grace lasts
	graceStateNotRunning = "not_running" // no such lock manager runs in the service's namespace
	graceStateNotWatched = "not_watched" // grace_end timer: nsmd does not watch (nor end) grace
)

// graceStates lists every state of nsmd_service_grace_state.
func graceStates() []string {
	return []string{graceStateIn, grace.ReasonAllReclaimed, grace.ReasonNothingToReclaim, grace.ReasonKernel,
		graceStateNotRunning, graceStateNotWatched}
}

var (
	svcV4RecordsDesc = prometheus.NewDesc("nsmd_service_nfsv4_client_records",
		"The service's NFSv4 client-tracking records, by epoch: current (clients that may reclaim after the service's next move) and recovery (those that may reclaim in its grace now); only on the server whose NFSv4 side of the service is open.",
		[]string{"service", "epoch"}, nil)
	svcV4ReclaimedDesc = prometheus.NewDesc("nsmd_service_nfsv4_reclaimed_clients",
		"NFSv4 clients of the service's recovery epoch that reclaimed in its grace (0 outside grace); only on the server whose NFSv4 side of the service is open.",
		[]string{"service"}, nil)
	svcV4UpcallsDesc = prometheus.NewDesc("nsmd_service_nfsv4_upcalls_total",
		"Client-tracking upcalls from the nfsd of the service's namespace since the service last started here, by command and result (ok, error, refused, not_serving).",
		[]string{"service", "command", "result"}, nil)
	svcV4PipeOpenDesc = prometheus.NewDesc("nsmd_service_nfsv4_pipe_open",
		"1 while the client-tracking pipe of the service's namespace (its rpc_pipefs nfsd/cld) is open, 0 while not; only where nsmd serves NFSv4 client tracking.",
		[]string{"service"}, nil)
	svcGraceStateDesc = prometheus.NewDesc("nsmd_service_grace_state",
		"1 for the state of the grace of the service's lock manager (nlm: lockd, nfsv4: nfsd) since the service last started here, 0 for the others: in_grace, how it ended (all_reclaimed, nothing_to_reclaim: nsmd ended it; kernel: its timer or every NFSv4.1+ client's RECLAIM_COMPLETE), not_running or not_watched (grace_end timer).",
		[]string{"service", "manager", "state"}, nil)
	svcGraceExpectedDesc = prometheus.NewDesc("nsmd_service_grace_expected_clients",
		"Clients that could reclaim from the service's lock manager in its grace (its hosts monitored at the start; the NFSv4 clients of its recovery epoch).",
		[]string{"service", "manager"}, nil)
	svcGraceBackDesc = prometheus.NewDesc("nsmd_service_grace_back_clients",
		"Clients of nsmd_service_grace_expected_clients that came back to the service's lock manager.",
		[]string{"service", "manager"}, nil)
	svcGraceStartedDesc = prometheus.NewDesc("nsmd_service_grace_started_timestamp_seconds",
		"When the service's grace began: its last start on this server (Unix time).",
		[]string{"service"}, nil)
	svcGraceDurationDesc = prometheus.NewDesc("nsmd_service_grace_duration_seconds",
		"How long the service's last grace of the lock manager lasted, from the service's start here to its end; only once it ended.",
		[]string{"service", "manager"}, nil)
)

// serviceV4Collector exports each open service's NFSv4 side (nothing
// without services, or without service namespaces).
type serviceV4Collector struct{ s *serviceV4s }

func (c serviceV4Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{svcV4RecordsDesc, svcV4ReclaimedDesc, svcV4UpcallsDesc, svcV4PipeOpenDesc,
		svcGraceStateDesc, svcGraceExpectedDesc, svcGraceBackDesc, svcGraceStartedDesc, svcGraceDurationDesc} {
		ch <- d
	}
}

func (c serviceV4Collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for id, v := range c.s.opened() {
		cur, rec, reclaimed := v.scope.V4Counts()
		gauge(svcV4RecordsDesc, float64(cur), id, "current")
		gauge(svcV4RecordsDesc, float64(rec), id, "recovery")
		gauge(svcV4ReclaimedDesc, float64(reclaimed), id)
		if v.srv != nil {
			gauge(svcV4PipeOpenDesc, b2f(v.srv.Status().State == cld.StateOpen), id)
			for _, u := range v.upcalls() {
				ch <- prometheus.MustNewConstMetric(svcV4UpcallsDesc, prometheus.CounterValue, u.n, id, u.command, u.result)
			}
		}
		st := v.grace.Status()
		if st == nil {
			continue
		}
		gauge(svcGraceStartedDesc, float64(st.Started.UnixNano())/1e9, id)
		for _, m := range grace.Managers() {
			ms := st.Manager(m)
			now := graceStateOf(ms, c.s.auto)
			for _, state := range graceStates() {
				gauge(svcGraceStateDesc, b2f(state == now), id, string(m), state)
			}
			gauge(svcGraceExpectedDesc, float64(ms.Expected), id, string(m))
			gauge(svcGraceBackDesc, float64(ms.Back), id, string(m))
			if ms.Ended != nil {
				gauge(svcGraceDurationDesc, ms.Ended.After.Seconds(), id, string(m))
			}
		}
	}
}

// graceStateOf is the state (graceStates) of a lock manager's grace whose
// status is ms; auto: nsmd watches and ends grace (grace_end auto).
func graceStateOf(ms grace.ManagerStatus, auto bool) string {
	switch {
	case ms.Ended != nil:
		return ms.Ended.Reason
	case ms.Absent:
		return graceStateNotRunning
	case !auto:
		return graceStateNotWatched
	}
	return graceStateIn
}

// upcallCount is one series of the tracking server's upcall counter.
type upcallCount struct {
	command, result string
	n               float64
}

// upcalls reads the service's tracking server's upcall counter
// (nsmd_cld_upcalls_total in its own registry).
func (v *serviceV4) upcalls() []upcallCount {
	fams, err := v.reg.Gather()
	if err != nil {
		return nil
	}
	var out []upcallCount
	for _, f := range fams {
		if f.GetName() != "nsmd_cld_upcalls_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			u := upcallCount{n: m.GetCounter().GetValue()}
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "command":
					u.command = l.GetValue()
				case "result":
					u.result = l.GetValue()
				}
			}
			out = append(out, u)
		}
	}
	return out
}

// opened is a copy of the services whose NFSv4 side is open here, by id.
func (s *serviceV4s) opened() map[string]*serviceV4 {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.byID)
}

// serviceV4Status is a service's NFSv4 tracking as its local status shows
// it (serviceNFSv4JSON maps it to the admin API's).
type serviceV4Status struct {
	Tracking                        bool
	TrackingWhy                     string
	Pipe                            *cld.Status // nil: tracking not served
	CurrentEpoch, RecoveryEpoch     uint64
	Clients, Reclaimable, Reclaimed int
	GraceStartSMState               int32
	GraceStartAt                    time.Time
}

// status is service id's NFSv4 tracking and grace as GET /v1/services's
// local "nfsv4" and "grace" (both nil while its NFSv4 side is not open
// here).
func (s *serviceV4s) status(id string) (*admin.ServiceNFSv4, *admin.Grace) {
	if s == nil {
		return nil, nil
	}
	v := s.get(id)
	if v == nil {
		return nil, nil
	}
	st := serviceV4Status{Tracking: v.srv != nil, TrackingWhy: v.whyNot}
	if v.srv != nil {
		p := v.srv.Status()
		st.Pipe, st.TrackingWhy = &p, ""
	}
	st.CurrentEpoch, st.RecoveryEpoch = v.scope.Epochs()
	st.Clients, st.Reclaimable, st.Reclaimed = v.scope.V4Counts()
	st.GraceStartSMState, st.GraceStartAt = v.grace.LastGraceStart()
	return serviceNFSv4JSON(st), graceJSON(v.grace.Status(), nil)
}
