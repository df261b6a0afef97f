package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cluster/pki"
)

// security is an agent's TLS material, who may use its admin API and what
// it runs without (insecure).
type security struct {
	tls      *pki.Store // nil: plaintext
	refusals *pki.Refusals
	guard    *admin.Guard
	// exposures are the unprotected non-loopback ports this agent runs
	// with because insecure is set (empty otherwise).
	exposures []string
}

func (a *Agent) setupSecurity() error {
	s := &a.sec
	var err error
	if s.refusals, err = pki.NewRefusals(a.log.With("component", "tls"), a.reg); err != nil {
		return err
	}
	if a.cfg.TLS() {
		if s.tls, err = pki.Load(pki.Files{CA: a.cfg.TLSCA, Cert: a.cfg.TLSCert, Key: a.cfg.TLSKey}); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		if !s.tls.IsNode() {
			return fmt.Errorf("tls_cert %s is not a node certificate (no %s name): make one with nsmd tls cert --node %s", a.cfg.TLSCert, pki.ServerName, a.cfg.NodeID)
		}
	}
	gc := admin.GuardConfig{
		TokenFile: a.cfg.AdminTokenFile, TLS: s.tls != nil,
		// Without TLS and token: a loopback-only admin API whose local
		// token is off, or insecure.
		Open: a.cfg.AdminLoopback() || a.cfg.Insecure, Registerer: a.reg,
	}
	if local := a.cfg.LocalTokenPath(); local != "" {
		created, err := admin.CreateLocalToken(local)
		if err != nil {
			return fmt.Errorf("%w (admin_local_token_file; none turns the local token off)", err)
		}
		if created {
			a.log.Info("created the local admin token: nsmd commands on this host read it (root, the nsmd group)", "file", local)
		}
		gc.TokenFile, gc.LocalToken, gc.Open = local, true, false
	}
	s.guard, err = admin.NewGuard(gc)
	if err != nil {
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
	cs := []prometheus.Collector{insecure}
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

// Reload re-reads the certificate files and the token file (SIGHUP). On
// error the loaded ones stay in use.
func (a *Agent) Reload() error {
	var errs []error
	if a.sec.tls != nil {
		if err := a.sec.tls.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("tls: %w", err))
		} else {
			a.log.Info("TLS certificates reloaded", "not_after", a.sec.tls.Expiry())
		}
	}
	if err := a.sec.guard.Reload(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// adminListener wraps ln in TLS when the agent has certificates.
func (a *Agent) adminListener(ln net.Listener) net.Listener {
	if a.sec.tls == nil {
		return ln
	}
	return tls.NewListener(ln, a.sec.tls.AdminServerConfig())
}

// httpErrorLog turns net/http's "TLS handshake error from ADDR: ERR" lines
// into counted, rate-limited refusals; anything else goes to the log.
type httpErrorLog struct{ a *Agent }

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

func (a *Agent) adminErrorLog() *log.Logger { return log.New(httpErrorLog{a}, "", 0) }
