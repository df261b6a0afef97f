package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Refusals counts and logs failed handshakes: every one in the metric
// nsmd_tls_handshake_failures_total{listener,reason}, at most one log line
// per listener, peer address and Interval (with the number suppressed
// since), so a peer that retries in a loop cannot flood the log.
type Refusals struct {
	log     *slog.Logger
	counter *prometheus.CounterVec
	limit   *LogLimiter // keyed by listener + " " + peer IP
}

// NewRefusals registers the metric on reg (nil: not registered).
func NewRefusals(log *slog.Logger, reg prometheus.Registerer) (*Refusals, error) {
	r := &Refusals{
		log: log, limit: NewLogLimiter(time.Now, time.Minute),
		counter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_tls_handshake_failures_total",
			Help: "TLS handshakes refused, by listener (raft, admin, raft_dial) and reason (plaintext, no_certificate, unknown_authority, expired, invalid_certificate, wrong_name, timeout, too_many, other).",
		}, []string{"listener", "reason"}),
	}
	// Every series from zero, so that the first refusal of a kind shows
	// up in rate() and increase() (and in alerts on them).
	for _, l := range []string{"raft", "raft_dial", "admin"} {
		for _, reason := range reasons {
			r.counter.WithLabelValues(l, reason)
		}
	}
	if reg != nil {
		if err := reg.Register(r.counter); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// SetClock replaces the clock and the log interval (tests).
func (r *Refusals) SetClock(now func() time.Time, interval time.Duration) {
	r.limit.SetClock(now, interval)
}

// Observe records one failed handshake with peer on listener.
func (r *Refusals) Observe(listener string, peer net.Addr, err error) {
	if r == nil {
		return
	}
	reason := Reason(err)
	r.counter.WithLabelValues(listener, reason).Inc()
	host := peerHost(peer)
	ok, suppressed := r.limit.Allow(listener + " " + host)
	if !ok {
		return
	}
	r.log.Warn("TLS handshake refused", "listener", listener, "peer", host, "reason", reason,
		"err", err, "suppressed_since_last", suppressed, "next_log_after", r.limit.Interval())
}

// Count is the metric's value for listener and reason (tests, status).
func (r *Refusals) Count(listener, reason string) float64 {
	c, err := r.counter.GetMetricWithLabelValues(listener, reason)
	if err != nil {
		return 0
	}
	return counterValue(c)
}

func peerHost(a net.Addr) string {
	if a == nil {
		return "?"
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

// reasons are the values Reason gives for a refusal.
var reasons = []string{"plaintext", "no_certificate", "unknown_authority", "expired", "invalid_certificate", "wrong_name", "timeout", "too_many", "other"}

// ErrTooManyHandshakes is a connection closed before its handshake because
// too many were in progress (from its address, or in all).
var ErrTooManyHandshakes = errors.New("too many TLS handshakes in progress")

// Reason classifies a handshake error for the metric.
func Reason(err error) string {
	var rh tls.RecordHeaderError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	var he x509.HostnameError
	var ne net.Error
	switch {
	case err == nil:
		return "none"
	case errors.As(err, &rh):
		return "plaintext"
	case errors.Is(err, ErrTooManyHandshakes):
		return "too_many"
	case errors.Is(err, ErrWrongName), errors.As(err, &he):
		return "wrong_name"
	case errors.As(err, &ua):
		return "unknown_authority"
	case errors.As(err, &ci):
		if ci.Reason == x509.Expired {
			return "expired"
		}
		return "invalid_certificate"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	// The peer's side of a refusal arrives as an alert.
	s := err.Error()
	switch {
	case strings.Contains(s, "didn't provide a certificate"), strings.Contains(s, "certificate required"):
		return "no_certificate"
	case strings.Contains(s, "unknown certificate authority"), strings.Contains(s, "bad certificate"):
		return "unknown_authority"
	case strings.Contains(s, "expired certificate"):
		return "expired"
	case strings.Contains(s, "first record does not look like a TLS handshake"), strings.Contains(s, "client sent an HTTP request to an HTTPS server"):
		return "plaintext"
	}
	return "other"
}
