package nsm

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/oncrpc"
)

// Metrics are the NSM program's Prometheus metrics. Every method is safe on
// a nil *Metrics (a no-op), so metrics are optional everywhere.
type Metrics struct {
	rpcRequests    *prometheus.CounterVec
	rpcDuration    *prometheus.HistogramVec
	monRefused     *prometheus.CounterVec
	notReady       *prometheus.CounterVec
	callbacks      *prometheus.CounterVec
	notifyTargets  *prometheus.GaugeVec
	notifyLatency  prometheus.Histogram
	notifyReceived *prometheus.CounterVec
	notifySends    *prometheus.CounterVec
	notifySendsBy  [2][2]prometheus.Counter // [getport][retry]
	unmonKept      prometheus.Counter
}

// NewMetrics creates the metrics and registers them on reg (never the
// global registry). A nil reg creates unregistered metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rpcRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_rpc_requests_total",
			Help: "RPC calls served, by procedure and accept status.",
		}, []string{"proc", "result"}),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nsmd_rpc_duration_seconds",
			Help:    "Time to serve an RPC call, by procedure.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"proc"}),
		monRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_mon_refused_total",
			Help: "SM_MON/SM_UNMON/SM_UNMON_ALL/SM_SIMU_CRASH requests refused, by reason.",
		}, []string{"reason"}),
		notReady: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_rpc_not_ready_total",
			Help: "NSM calls left unanswered because this node did not know the current sm_state yet, by procedure.",
		}, []string{"proc"}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_callbacks_total",
			Help: "Lock-manager callback attempts, by outcome (delivered, retried, failed, dropped).",
		}, []string{"outcome"}),
		notifyTargets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nsmd_notify_targets",
			Help: "Hosts of the current (or last) SM_NOTIFY fan-out, by state.",
		}, []string{"state"}),
		notifyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nsmd_notify_latency_seconds",
			Help:    "Time from the start of an SM_NOTIFY fan-out until a host acknowledged.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900},
		}),
		notifyReceived: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_notify_received_total",
			Help: "SM_NOTIFY calls received from rebooted peers, by result (accepted, ignored, error, rate_limited: held back by the per-sender or per-name limit, in_flight: the same one is being committed; both unanswered, so the peer retransmits; wrong_sender: ignored under notify_strict_sender, not sent from an address of the host it names; not_vip: ignored, not sent to the VIP, the one address a cluster takes SM_NOTIFY on).",
		}, []string{"result"}),
		notifySends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_notify_sends_total",
			Help: "Datagrams the SM_NOTIFY fan-out sent, by call (getport, notify) and kind (first to a host, retry).",
		}, []string{"call", "kind"}),
		unmonKept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nsmd_unmon_kept_total",
			Help: "SM_UNMON/SM_UNMON_ALL answered without removing anything because this node does not serve now: its lock manager unmonitors every host as it stops with the NFS server, and the next server must still notify them.",
		}),
	}
	// Known label values start at zero, so that a first failure shows up
	// in rate() and increase() (and in alerts on them).
	for _, o := range []string{"delivered", "retried", "failed", "dropped"} {
		m.callbacks.WithLabelValues(o)
	}
	for i, call := range []string{"notify", "getport"} {
		for j, kind := range []string{"first", "retry"} {
			m.notifySendsBy[i][j] = m.notifySends.WithLabelValues(call, kind)
		}
	}
	if reg != nil {
		reg.MustRegister(m.rpcRequests, m.rpcDuration, m.monRefused, m.notReady, m.callbacks,
			m.notifyTargets, m.notifyLatency, m.notifyReceived, m.notifySends, m.unmonKept)
	}
	return m
}

// ObserveRPC records one served call; it fits oncrpc.ServerConfig.Observe.
func (m *Metrics) ObserveRPC(c *oncrpc.Call, err error, d time.Duration) {
	if m == nil || c == nil {
		return
	}
	proc := procLabel(c.Prog, c.Proc)
	m.rpcRequests.WithLabelValues(proc, resultLabel(err)).Inc()
	m.rpcDuration.WithLabelValues(proc).Observe(d.Seconds())
}

var nsmProcNames = [...]string{"null", "stat", "mon", "unmon", "unmon_all", "simu_crash", "notify"}
var pmapProcNames = [...]string{"pmap_null", "pmap_set", "pmap_unset", "pmap_getport", "pmap_dump", "pmap_callit"}

// procLabel keeps the label set bounded whatever callers send.
func procLabel(prog, proc uint32) string {
	switch {
	case prog == Program.Prog && proc < uint32(len(nsmProcNames)):
		return nsmProcNames[proc]
	case prog == oncrpc.PmapProg && proc < uint32(len(pmapProcNames)):
		return pmapProcNames[proc]
	case prog == Program.Prog:
		return "unknown"
	}
	return "other"
}

func resultLabel(err error) string {
	switch {
	case err == nil:
		return "success"
	case errors.Is(err, oncrpc.ErrProcUnavail):
		return "proc_unavail"
	case errors.Is(err, oncrpc.ErrGarbageArgs):
		return "garbage_args"
	case errors.Is(err, oncrpc.ErrProgUnavail):
		return "prog_unavail"
	case errors.Is(err, oncrpc.ErrProgMismatch):
		return "prog_mismatch"
	case errors.Is(err, oncrpc.ErrNoReply):
		return "no_reply"
	case errors.Is(err, oncrpc.ErrAuth):
		return "auth_error"
	}
	return "system_err"
}

func (m *Metrics) monRefusedInc(reason string) {
	if m != nil {
		m.monRefused.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) notReadyInc(proc uint32) {
	if m != nil {
		m.notReady.WithLabelValues(procLabel(Program.Prog, proc)).Inc()
	}
}

func (m *Metrics) callback(outcome string) {
	if m != nil {
		m.callbacks.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) notifyProgress(pending, done, failed int) {
	if m != nil {
		m.notifyTargets.WithLabelValues("pending").Set(float64(pending))
		m.notifyTargets.WithLabelValues("done").Set(float64(done))
		m.notifyTargets.WithLabelValues("failed").Set(float64(failed))
	}
}

func (m *Metrics) notifyAcked(d time.Duration) {
	if m != nil {
		m.notifyLatency.Observe(d.Seconds())
	}
}

// notifySent counts one fan-out datagram: a GETPORT (getport true) or an
// SM_NOTIFY, the host's first of that kind or a retry.
func (m *Metrics) notifySent(getport, retry bool) {
	if m != nil {
		m.notifySendsBy[b2i(getport)][b2i(retry)].Inc()
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (m *Metrics) notifyReceivedInc(result string) {
	if m != nil {
		m.notifyReceived.WithLabelValues(result).Inc()
	}
}
