package main

import (
	"bytes"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cluster/pki"
)

// security is an agent's TLS material, admin token and what it runs
// without (insecure).
type security struct {
	tls      *pki.Store // nil: plaintext
	refusals *pki.Refusals
	denied   *prometheus.CounterVec
	// exposures are the unprotected non-loopback ports this agent runs
	// with because insecure is set (empty otherwise).
	exposures []string

	tokenFile string
	mu        sync.RWMutex
	token     []byte
}

// minTokenLen keeps a guessable token out of the admin API.
const minTokenLen = 16

func (a *agent) setupSecurity() error {
	s := &a.sec
	var err error
	if s.refusals, err = pki.NewRefusals(a.log.With("component", "tls"), a.reg); err != nil {
		return err
	}
	s.denied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nsmd_admin_denied_total", Help: "Admin API requests refused for lack of a client certificate or token, by path.",
	}, []string{"path"})
	if a.cfg.TLS() {
		if s.tls, err = pki.Load(pki.Files{CA: a.cfg.TLSCA, Cert: a.cfg.TLSCert, Key: a.cfg.TLSKey}); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		if !s.tls.IsNode() {
			return fmt.Errorf("tls_cert %s is not a node certificate (no %s name): make one with nsmd tls cert --node %s", a.cfg.TLSCert, pki.ServerName, a.cfg.NodeID)
		}
	}
	s.tokenFile = a.cfg.AdminTokenFile
	if err := s.loadToken(); err != nil {
		return err
	}
	if a.cfg.Insecure {
		for _, e := range a.cfg.Exposures() {
			s.exposures = append(s.exposures, e.Why)
			a.log.Warn("insecure: running without protection", "key", e.Key, "what", e.Why)
		}
	}
	insecure := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nsmd_insecure", Help: "1 when this node runs raft, gossip or the admin API on a non-loopback address without TLS or a gossip key (insecure: true).",
	}, func() float64 {
		if len(s.exposures) > 0 {
			return 1
		}
		return 0
	})
	cs := []prometheus.Collector{s.denied, insecure}
	if s.tls != nil {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nsmd_tls_cert_expiry_timestamp_seconds", Help: "When this node's TLS certificate expires (Unix time).",
		}, func() float64 { return float64(s.tls.Expiry().Unix()) }))
	}
	for _, c := range cs {
		if err := a.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (s *security) loadToken() error {
	if s.tokenFile == "" {
		return nil
	}
	b, err := os.ReadFile(s.tokenFile)
	if err != nil {
		return fmt.Errorf("admin_token_file: %w", err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) < minTokenLen {
		return fmt.Errorf("admin_token_file %s: token of %d bytes, want at least %d", s.tokenFile, len(tok), minTokenLen)
	}
	s.mu.Lock()
	s.token = tok
	s.mu.Unlock()
	return nil
}

// Reload re-reads the certificate files and the token file (SIGHUP). On
// error the loaded ones stay in use.
func (a *agent) Reload() error {
	var errs []error
	if a.sec.tls != nil {
		if err := a.sec.tls.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("tls: %w", err))
		} else {
			a.log.Info("TLS certificates reloaded", "not_after", a.sec.tls.Expiry())
		}
	}
	if err := a.sec.loadToken(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// authorized reports whether r may use a privileged endpoint (writes,
// registrations): a verified certificate of the cluster CA (node or
// operator), or the bearer token; without TLS and token, only on a
// loopback-only admin API or with insecure set.
func (a *agent) authorized(r *http.Request) bool {
	if pki.PeerRole(r.TLS) != "" {
		return true
	}
	a.sec.mu.RLock()
	tok := a.sec.token
	a.sec.mu.RUnlock()
	if h := r.Header.Get("Authorization"); tok != nil && strings.HasPrefix(h, "Bearer ") {
		if subtle.ConstantTimeCompare([]byte(strings.TrimPrefix(h, "Bearer ")), tok) == 1 {
			return true
		}
	}
	if a.sec.tls == nil && tok == nil {
		return a.cfg.AdminLoopback() || a.cfg.Insecure
	}
	return false
}

// privileged wraps a handler that needs authorized.
func (a *agent) privileged(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(r) {
			a.sec.denied.WithLabelValues(r.URL.Path).Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="nsmd"`)
			httpError(w, http.StatusUnauthorized, "%s %s needs a client certificate of the cluster CA (--tls-cert/--tls-key) or the admin token (--token-file)", r.Method, r.URL.Path)
			return
		}
		h(w, r)
	}
}

// adminListener wraps ln in TLS when the agent has certificates.
func (a *agent) adminListener(ln net.Listener) net.Listener {
	if a.sec.tls == nil {
		return ln
	}
	return tls.NewListener(ln, a.sec.tls.AdminServerConfig())
}

// httpErrorLog turns net/http's "TLS handshake error from ADDR: ERR" lines
// into counted, rate-limited refusals; anything else goes to the log.
type httpErrorLog struct{ a *agent }

func (l httpErrorLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	const prefix = "http: TLS handshake error from "
	if rest, ok := strings.CutPrefix(line, prefix); ok {
		addr, msg, _ := strings.Cut(rest, ": ")
		var peer net.Addr
		if ap, err := net.ResolveTCPAddr("tcp", addr); err == nil {
			peer = ap
		}
		l.a.sec.refusals.Observe("admin", peer, errors.New(msg))
		return len(p), nil
	}
	l.a.log.Warn("admin API", "msg", line)
	return len(p), nil
}

func (a *agent) adminErrorLog() *log.Logger { return log.New(httpErrorLog{a}, "", 0) }
