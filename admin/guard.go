package admin

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
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
	// the admin API listens on loopback only and the local token is off,
	// or insecure is set.
	Open bool
	// LocalToken: TokenFile is the local token the agent created
	// (CreateLocalToken); refusals name it, so a local operator knows
	// where the credential is.
	LocalToken bool
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
// counted by path. Before that, a request a browser could have been made
// to send (CheckBrowser) gets 403 or 415, counted the same way.
func (g *Guard) Privileged(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if code, err := g.CheckBrowser(r); err != nil {
			g.denied.WithLabelValues(r.URL.Path).Inc()
			httpError(w, code, "%s %s: %v", r.Method, r.URL.Path, err)
			return
		}
		if !g.Authorized(r) {
			g.denied.WithLabelValues(r.URL.Path).Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="nsmd"`)
			if g.cfg.LocalToken {
				httpError(w, http.StatusUnauthorized, "%s %s needs the local admin token %s (nsmd commands on this host read it when they may: run them as root or in the nsmd group) or --token-file", r.Method, r.URL.Path, g.cfg.TokenFile)
				return
			}
			httpError(w, http.StatusUnauthorized, "%s %s needs a client certificate of the cluster CA (--tls-cert/--tls-key) or the admin token (--token-file)", r.Method, r.URL.Path)
			return
		}
		h(w, r)
	}
}

// CheckBrowser refuses a privileged request that a web page could have
// made a browser send (CSRF; a browser holding an operator certificate
// sends it with any request) or that reached a plaintext API under
// another name (DNS rebinding):
//   - without TLS, a Host that is not an IP address or localhost (403):
//     a rebinding page's requests carry its own domain name;
//   - a write (not GET or HEAD) with an Origin header, or with
//     Sec-Fetch-Site other than same-origin or none (403): browsers add
//     them, nsmd's commands and curl do not, and no nsmd page writes;
//   - a write with a body that is not Content-Type application/json
//     (415): an HTML form can send text/plain, form-urlencoded or
//     multipart without asking, never JSON.
func (g *Guard) CheckBrowser(r *http.Request) (int, error) {
	if !g.cfg.TLS && r.TLS == nil && !ipOrLocalhost(r.Host) {
		return http.StatusForbidden, fmt.Errorf("Host %q is not an IP address or localhost (a plaintext admin API answers only those)", r.Host)
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return 0, nil
	}
	if o := r.Header.Get("Origin"); o != "" {
		return http.StatusForbidden, fmt.Errorf("a write with an Origin header (%q) comes from a web page", o)
	}
	if sf := r.Header.Get("Sec-Fetch-Site"); sf != "" && sf != "same-origin" && sf != "none" {
		return http.StatusForbidden, fmt.Errorf("a write with Sec-Fetch-Site %q comes from another site", sf)
	}
	if r.ContentLength != 0 {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			return http.StatusUnsupportedMediaType, fmt.Errorf("a write with a body must be Content-Type application/json, not %q", r.Header.Get("Content-Type"))
		}
	}
	return 0, nil
}

// ipOrLocalhost reports whether host (host or host:port) is an IP
// address or localhost.
func ipOrLocalhost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	_, err := netip.ParseAddr(host)
	return err == nil
}

// CreateLocalToken makes sure path holds a local admin token: it keeps an
// existing file, else writes a new random one (32 bytes, hex) with mode
// 0640 — readable by the agent's user and group (root and the nsmd group
// in the package), by no other local user. It reports whether it created
// the file.
func CreateLocalToken(path string) (bool, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return false, fmt.Errorf("admin local token: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("admin local token: %w", err)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		f.Close()
		os.Remove(path)
		return false, fmt.Errorf("admin local token: %w", err)
	}
	_, err = f.WriteString(hex.EncodeToString(b[:]) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return false, fmt.Errorf("admin local token %s: %w", path, err)
	}
	return true, nil
}
