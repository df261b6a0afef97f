package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nsmd/nsmd/cluster/pki"
)

// Auth is how a client reaches a node's admin API: plaintext, or HTTPS
// checked against the cluster CA with an operator (or node) certificate,
// and/or a bearer token. The zero Auth is plain HTTP without a token.
type Auth struct {
	CA, Cert, Key string // PEM files: cluster CA, client certificate, its key
	TokenFile     string // file with the admin bearer token
	// LocalTokenFile is the local admin token of an agent on this host
	// (admin_local_token_file), sent when TokenFile is empty and the
	// address is on loopback; skipped when it cannot be read (not root,
	// not in the nsmd group, no such agent).
	LocalTokenFile string
}

// DefaultLocalTokenFile is where the packaged agent keeps its local
// admin token (<data_dir>/admin.token with data_dir /var/lib/nsmd).
const DefaultLocalTokenFile = "/var/lib/nsmd/admin.token"

// scheme is https with a CA, else http.
func (o *Auth) scheme() string {
	if o.CA != "" {
		return "https"
	}
	return "http"
}

// URL is addr (host:port, or a URL) as a URL without a trailing slash.
func (o *Auth) URL(addr string) string {
	if !strings.Contains(addr, "://") {
		addr = o.scheme() + "://" + addr
	}
	return strings.TrimRight(addr, "/")
}

// Transport builds the HTTP transport for these settings; its user closes
// its idle connections when done.
func (o *Auth) Transport() (*http.Transport, error) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
	}
	switch {
	case o.Cert != "" || o.Key != "":
		st, err := pki.Load(pki.Files{CA: o.CA, Cert: o.Cert, Key: o.Key})
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = st.ClientConfig()
	case o.CA != "":
		c, err := pki.VerifyOnlyConfig(o.CA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		tr.TLSClientConfig = c
	}
	return tr, nil
}

// Authorize adds the bearer token, if any, to req: TokenFile's, else, for
// an address on loopback, LocalTokenFile's if it can be read.
func (o *Auth) Authorize(req *http.Request) error {
	if o.TokenFile == "" {
		if o.LocalTokenFile == "" || !loopbackHost(req.URL.Hostname()) {
			return nil
		}
		b, err := os.ReadFile(o.LocalTokenFile)
		if tok := bytes.TrimSpace(b); err == nil && len(tok) > 0 {
			req.Header.Set("Authorization", "Bearer "+string(tok))
		}
		return nil
	}
	b, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return fmt.Errorf("--token-file: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+string(bytes.TrimSpace(b)))
	return nil
}

// loopbackHost reports whether host is localhost or a loopback address.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// Client calls one node's admin API, as `nsmd status` and the other
// commands do.
type Client struct {
	Addr string // host:port or URL of the node's admin API
	Auth Auth
}

// clientTimeout bounds one call, answer included.
const clientTimeout = 15 * time.Second

// Do sends method path with body (may be nil) and decodes a 2xx answer
// into out (may be nil). It returns the answer's body as it came (also
// for a non-2xx answer, whose error then carries the node's message).
func (c *Client) Do(ctx context.Context, method, path string, body io.Reader, out any) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.Auth.URL(c.Addr)+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json") // every body of the admin API is JSON
	}
	if err := c.Auth.Authorize(req); err != nil {
		return nil, err
	}
	tr, err := c.Auth.Transport()
	if err != nil {
		return nil, err
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Timeout: clientTimeout, Transport: tr}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API %s: %w", c.Addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read admin API answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e ErrorBody
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return b, fmt.Errorf("%s %s: %s", method, path, e.Error)
		}
		return b, fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return b, fmt.Errorf("decode %s: %w", path, err)
		}
	}
	return b, nil
}

// Get is Do for a GET.
func (c *Client) Get(ctx context.Context, path string, out any) ([]byte, error) {
	return c.Do(ctx, http.MethodGet, path, nil, out)
}

// Status is GET /v1/status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	_, err := c.Get(ctx, "/v1/status", &s)
	return s, err
}

// Registrations is one page of GET /v1/registrations: at most limit rows
// after the token after ("": from the start), of monName only if set.
func (c *Client) Registrations(ctx context.Context, limit int, monName, after string) (RegistrationPage, error) {
	var page RegistrationPage
	_, err := c.Get(ctx, "/v1/registrations?"+RegistrationsQuery(limit, monName, after), &page)
	return page, err
}

// RegistrationsQuery is the query string of GET /v1/registrations.
func RegistrationsQuery(limit int, monName, after string) string {
	return ServiceRegistrationsQuery("", limit, monName, after)
}

// ServiceRegistrationsQuery is RegistrationsQuery of one service's own
// registrations ("": the node's).
func ServiceRegistrationsQuery(service string, limit int, monName, after string) string {
	q := url.Values{}
	if service != "" {
		q.Set("service", service)
	}
	q.Set("limit", fmt.Sprint(limit))
	if monName != "" {
		q.Set("mon_name", monName)
	}
	if after != "" {
		q.Set("after", after)
	}
	return q.Encode()
}

// TransferLeadership is POST /v1/leadership/transfer on the leader, to
// node to ("": any serving voter); it returns the new leader.
func (c *Client) TransferLeadership(ctx context.Context, to string) (string, error) {
	path := "/v1/leadership/transfer"
	if to != "" {
		path += "?to=" + url.QueryEscape(to)
	}
	var res TransferResult
	_, err := c.Do(ctx, http.MethodPost, path, nil, &res)
	return res.LeaderID, err
}

// Import is POST /v1/import.
func (c *Client) Import(ctx context.Context, req ImportRequest) (ImportResult, error) {
	var res ImportResult
	body, err := json.Marshal(req)
	if err != nil {
		return res, err
	}
	_, err = c.Do(ctx, http.MethodPost, "/v1/import", bytes.NewReader(body), &res)
	return res, err
}
