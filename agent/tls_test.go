package agent_test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/cluster/pki"
)

// TestReloadPicksUpANewCertificate: Reload (SIGHUP) swaps the node's
// certificate for the next handshake; a broken file keeps the old one.
func TestReloadPicksUpANewCertificate(t *testing.T) {
	d, _, dir := agenttest.TLSDev(t, "127.0.0.44")
	a := d.Agent(0)
	serial := func() string {
		c, err := tls.Dial("tcp", a.AdminAddr(), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serial()
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	keyPEM, _ := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	ca, err := pki.ParseCA(caPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := ca.Issue(pki.Request{Node: "node1", Validity: time.Hour, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "node1.pem"), c, 0o644)
	os.WriteFile(filepath.Join(dir, "node1-key.pem"), k, 0o600)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	after := serial()
	if after == before {
		t.Fatalf("serial %s unchanged after reload", after)
	}
	os.WriteFile(filepath.Join(dir, "node1.pem"), []byte("broken"), 0o644)
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "node1.pem") {
		t.Fatalf("reload of a broken file: %v (want an error naming it)", err)
	}
	if s := serial(); s != after {
		t.Fatalf("a failed reload changed the certificate (%s → %s)", after, s)
	}
}

// TestStatusPageOverTLSShowsNamesOnlyToOperators: under TLS the page and
// its data are reads (the CA's trust is enough, as for /v1/status); the
// registration rows follow /v1/registrations — a reader without client
// certificate or token gets the count only — and never carry the cookie.
func TestStatusPageOverTLSShowsNamesOnlyToOperators(t *testing.T) {
	d, _, dir := agenttest.TLSDev(t, "127.0.0.44")
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	base := "https://" + lead.AdminAddr()
	tc, err := pki.VerifyOnlyConfig(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	tok, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string, token bool) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		if token {
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s: %s", path, resp.Status, b)
		}
		return resp, b
	}

	resp, page := get("/", false)
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("GET / Content-Security-Policy = %q", csp)
	}
	if !bytes.Contains(page, []byte(`src="/ui/app.js"`)) {
		t.Errorf("GET / does not load /ui/app.js:\n%s", page)
	}
	if resp, _ := get("/ui/app.js", false); !strings.Contains(resp.Header.Get("Content-Type"), "javascript") {
		t.Errorf("/ui/app.js Content-Type = %q", resp.Header.Get("Content-Type"))
	}

	const priv = "0123456789abcdef0123456789abcdef"
	body, _ := json.Marshal(admin.ImportRequest{Registrations: []admin.RegistrationJSON{{
		MonName: "client-a", MyName: "nfs1", MyProg: 100021, MyVers: 3, MyProc: 16, Priv: priv, Callback: "127.0.0.1",
	}}})
	req, _ := http.NewRequest("POST", base+"/v1/import", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("import: %v %v", err, resp)
	}

	var o admin.Overview
	_, raw := get("/v1/overview", false)
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatal(err)
	}
	r := o.Registrations
	if r.Total != 1 || len(r.Rows) != 0 || r.More != 1 || r.Hidden == "" {
		t.Errorf("overview without certificate or token: registrations %+v, want the count and no rows", r)
	}
	if o.Status.LeaderID != lead.Config().NodeID || len(o.Members) != 3 || o.LastTakeover == nil {
		t.Errorf("overview: leader %q, %d members, last takeover %v", o.Status.LeaderID, len(o.Members), o.LastTakeover)
	}
	if bytes.Contains(raw, []byte("client-a")) {
		t.Errorf("unprivileged overview names a registration:\n%s", raw)
	}

	_, raw = get("/v1/overview", true)
	o = admin.Overview{}
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatal(err)
	}
	r = o.Registrations
	if r.Total != 1 || len(r.Rows) != 1 || r.Rows[0].MonName != "client-a" || r.Rows[0].MyName != "nfs1" || r.Hidden != "" {
		t.Errorf("overview with the token: registrations %+v", r)
	}
	if bytes.Contains(raw, []byte(priv)) || bytes.Contains(raw, []byte(`"priv"`)) {
		t.Errorf("overview carries the lock manager's cookie:\n%s", raw)
	}
}
