package admin

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cluster/pki"
)

// MinTokenLen keeps a guessable token out of the admin API.
const MinTokenLen = 16

// GuardConfig says who may use the privileged endpoints of one node's
// admin API.
type GuardConfig struct {
	// TokenFile holds the bearer token ("": none); re-read by Reload.
	TokenFile string
	// TLS: the admin API is HTTPS with client certificates of the cluster
	// CA (a verified certificate is enough).
	TLS bool
	// Open allows every request when there is neither TLS nor a token:
	// the admin API listens on loopback only, or insecure is set.
	Open bool
	// Registerer gets nsmd_admin_denied_total (nil: unregistered).
	Registerer prometheus.Registerer
}

// Guard decides which requests may use a privileged endpoint (writes,
// registrations) and counts the refusals.
type Guard struct {
	cfg    GuardConfig
	denied *prometheus.CounterVec

	mu    sync.RWMutex
	token []byte
}

// NewGuard loads the token of c and registers the refusal counter.
func NewGuard(c GuardConfig) (*Guard, error) {
	g := &Guard{cfg: c, denied: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nsmd_admin_denied_total", Help: "Admin API requests refused for lack of a client certificate or token, by path.",
	}, []string{"path"})}
	if c.Registerer != nil {
		if err := c.Registerer.Register(g.denied); err != nil {
			return nil, err
		}
	}
	if err := g.Reload(); err != nil {
		return nil, err
	}
	return g, nil
}

// Reload re-reads the token file; on error the loaded token stays.
func (g *Guard) Reload() error {
	if g.cfg.TokenFile == "" {
		return nil
	}
	b, err := os.ReadFile(g.cfg.TokenFile)
	if err != nil {
		return fmt.Errorf("admin_token_file: %w", err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) < MinTokenLen {
		return fmt.Errorf("admin_token_file %s: token of %d bytes, want at least %d", g.cfg.TokenFile, len(tok), MinTokenLen)
	}
	g.mu.Lock()
	g.token = tok
	g.mu.Unlock()
	return nil
}

// Authorized reports whether r may use a privileged endpoint: a verified
// certificate of the cluster CA (node or operator), or the bearer token;
// without TLS and token, only when the guard is open.
func (g *Guard) Authorized(r *http.Request) bool {
	if pki.PeerRole(r.TLS) != "" {
		return true
	}
	g.mu.RLock()
	tok := g.token
	g.mu.RUnlock()
	if h := r.Header.Get("Authorization"); tok != nil && strings.HasPrefix(h, "Bearer ") {
		if subtle.ConstantTimeCompare([]byte(strings.TrimPrefix(h, "Bearer ")), tok) == 1 {
			return true
		}
	}
	if !g.cfg.TLS && tok == nil {
		return g.cfg.Open
	}
	return false
}

// Privileged wraps a handler that needs Authorized: others get 401,
// counted by path.
func (g *Guard) Privileged(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !g.Authorized(r) {
			g.denied.WithLabelValues(r.URL.Path).Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="nsmd"`)
			httpError(w, http.StatusUnauthorized, "%s %s needs a client certificate of the cluster CA (--tls-cert/--tls-key) or the admin token (--token-file)", r.Method, r.URL.Path)
			return
		}
		h(w, r)
	}
}
