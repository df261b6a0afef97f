package cld

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Result labels of nsmd_cld_upcalls_total.
const (
	resultOK         = "ok"          // answered as the store said (Check: 0 or -EACCES)
	resultError      = "error"       // the store failed or the upcall timed out: an error status
	resultRefused    = "refused"     // malformed: an error downcall, no store call
	resultNotServing = "not_serving" // the store said ErrNotServing: an error status
)

// metrics are the server's Prometheus metrics, registered on the
// Config.Registerer (never the global registry).
type metrics struct {
	upcalls       *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	pipeOpen      prometheus.Gauge
	trackingError prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		upcalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_cld_upcalls_total",
			Help: "NFSv4 client-tracking upcalls from nfsd, by command and result (ok, error, refused, not_serving).",
		}, []string{"command", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nsmd_cld_upcall_duration_seconds",
			Help:    "Time from reading an NFSv4 client-tracking upcall to writing its answer, by command.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 15},
		}, []string{"command"}),
		pipeOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nsmd_cld_pipe_open",
			Help: "1 while the nfsd client-tracking pipe (rpc_pipefs nfsd/cld) is open.",
		}),
		trackingError: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nsmd_cld_tracking_error",
			Help: "1 while NFSv4 client tracking cannot work: rpc_pipefs missing or the pipe cannot be opened.",
		}),
	}
	// Known label values start at zero, so that a first failure shows in
	// rate() and increase().
	for c := Command(0); c.Valid(); c++ {
		for _, r := range []string{resultOK, resultError, resultRefused, resultNotServing} {
			m.upcalls.WithLabelValues(c.label(), r)
		}
	}
	m.upcalls.WithLabelValues(Command(255).label(), resultRefused)
	if reg != nil {
		cs := []prometheus.Collector{m.upcalls, m.duration, m.pipeOpen, m.trackingError}
		for i, c := range cs {
			if err := reg.Register(c); err != nil {
				for _, done := range cs[:i] {
					reg.Unregister(done)
				}
				return nil, fmt.Errorf("cld: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) upcall(c Command, result string, d time.Duration) {
	m.upcalls.WithLabelValues(c.label(), result).Inc()
	m.duration.WithLabelValues(c.label()).Observe(d.Seconds())
}

func resultOf(err error) string {
	switch {
	case err == nil:
		return resultOK
	case errors.Is(err, ErrNotServing):
		return resultNotServing
	}
	return resultError
}
