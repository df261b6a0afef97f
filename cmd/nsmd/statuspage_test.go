package main

import (
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/cluster/pki"
)

// TestStatusPageOverTLSShowsNamesOnlyToOperators: under TLS the page and
// its data are reads (the CA's trust is enough, as for /v1/status); the
// registration rows follow /v1/registrations — a reader without client
// certificate or token gets the count only — and never carry the cookie.
func TestStatusPageOverTLSShowsNamesOnlyToOperators(t *testing.T) {
	d, _, dir := startTLSDev(t)
	lead := devLeader(t, d, nil, 10*time.Second)
	base := "https://" + lead.adminLn.Addr().String()
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
	body, _ := json.Marshal(ImportRequest{Registrations: []RegistrationJSON{{
		MonName: "client-a", MyName: "nfs1", MyProg: 100021, MyVers: 3, MyProc: 16, Priv: priv, Callback: "127.0.0.1",
	}}})
	req, _ := http.NewRequest("POST", base+"/v1/import", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("import: %v %v", err, resp)
	}

	var o Overview
	_, raw := get("/v1/overview", false)
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatal(err)
	}
	r := o.Registrations
	if r.Total != 1 || len(r.Rows) != 0 || r.More != 1 || r.Hidden == "" {
		t.Errorf("overview without certificate or token: registrations %+v, want the count and no rows", r)
	}
	if o.Status.LeaderID != lead.cfg.NodeID || len(o.Members) != 3 || o.LastTakeover == nil {
		t.Errorf("overview: leader %q, %d members, last takeover %v", o.Status.LeaderID, len(o.Members), o.LastTakeover)
	}
	if bytes.Contains(raw, []byte("client-a")) {
		t.Errorf("unprivileged overview names a registration:\n%s", raw)
	}

	_, raw = get("/v1/overview", true)
	o = Overview{}
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

// TestStatusPageLoadsNothingFromElsewhere: the embedded files name no
// other origin (no CDN, no font, no analytics) and the script builds the
// page without innerHTML or other HTML-parsing sinks.
func TestStatusPageLoadsNothingFromElsewhere(t *testing.T) {
	external := regexp.MustCompile(`(?i)(https?:|//[a-z0-9.-]+\.[a-z]{2,}|@import)`)
	sinks := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function`)
	n := 0
	err := fs.WalkDir(statusPageFiles, "statuspage", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		n++
		b, err := statusPageFiles.ReadFile(path)
		if err != nil {
			return err
		}
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers to another origin: %q", path, m)
		}
		if strings.HasSuffix(path, ".js") {
			if m := sinks.Find(b); m != nil {
				t.Errorf("%s uses an HTML sink: %q", path, m)
			}
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("embedded files: %d (%v), want index.html, app.js, style.css", n, err)
	}
}
