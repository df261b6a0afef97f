package main

import (
	"bytes"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
)

// runCLI runs nsmd with args in-process and returns its output.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := rootCmd()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	return out.String(), err
}

// startTLSDev makes a PKI with `nsmd tls init` and starts a 3-node dev
// cluster with mutual TLS on raft and HTTPS on the admin API (the files of
// `nsmd tls init` are what agents load).
func startTLSDev(t *testing.T) (*agent.Dev, agent.DevOptions, string) {
	t.Helper()
	dir := t.TempDir()
	if out, err := runCLI(t, "tls", "init", "--dir", dir, "--node", "node1=127.0.0.1", "--node", "node2=127.0.0.2", "--node", "node3=127.0.0.3"); err != nil {
		t.Fatalf("tls init: %v\n%s", err, out)
	}
	o := agenttest.DevOptions(t, "127.0.0.44", 3)
	o.Tune = func(c *config.Config) { agenttest.UsePKI(dir, c) }
	return agenttest.StartDev(t, o, agent.Options{}), o, dir
}

// TestTLSClusterAdminNeedsCertificateOrToken: a dev cluster on mutual TLS
// forms and serves; its admin API answers reads over HTTPS to anyone who
// trusts the CA, but writes and registrations only with an operator
// certificate or the token; plaintext HTTP is refused and counted.
func TestTLSClusterAdminNeedsCertificateOrToken(t *testing.T) {
	d, o, dir := startTLSDev(t)
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	admin := lead.AdminAddr()
	if !strings.HasPrefix(lead.AdminURL(), "https://") {
		t.Fatalf("admin URL %s is not https", lead.AdminURL())
	}
	ca := []string{"--admin", admin, "--tls-ca", filepath.Join(dir, "ca.pem")}
	operator := append(ca, "--tls-cert", filepath.Join(dir, "operator.pem"), "--tls-key", filepath.Join(dir, "operator-key.pem"))

	out, err := runCLI(t, append([]string{"status", "--json"}, ca...)...)
	if err != nil || !strings.Contains(out, `"tls": true`) {
		t.Fatalf("status with the CA only: %v\n%s", err, out)
	}
	out, err = runCLI(t, append([]string{"registrations"}, ca...)...)
	if err == nil || !strings.Contains(err.Error(), "needs a client certificate") {
		t.Fatalf("registrations without certificate or token: %v\n%s", err, out)
	}
	out, err = runCLI(t, append([]string{"transfer-leadership"}, ca...)...)
	if err == nil || !strings.Contains(err.Error(), "needs a client certificate") {
		t.Fatalf("transfer without certificate or token: %v\n%s", err, out)
	}
	if got := testutil.GatheredValue(t, lead.Registry(), "nsmd_admin_denied_total", "path", "/v1/leadership/transfer"); got != 1 {
		t.Fatalf("nsmd_admin_denied_total{transfer} = %v, want 1", got)
	}
	if lead2 := agenttest.Leader(t, d, nil, time.Second); lead2 != lead {
		t.Fatal("a refused transfer moved leadership")
	}
	out, err = runCLI(t, append([]string{"registrations", "--token-file", filepath.Join(dir, "admin.token")}, ca...)...)
	if err != nil {
		t.Fatalf("registrations with the token: %v\n%s", err, out)
	}
	out, err = runCLI(t, append([]string{"transfer-leadership"}, operator...)...)
	if err != nil || !strings.Contains(out, "leadership transferred") {
		t.Fatalf("transfer with the operator certificate: %v\n%s", err, out)
	}

	// Plaintext to the HTTPS port: refused at the handshake, counted.
	hc := &http.Client{Timeout: 2 * time.Second}
	if resp, err := hc.Get("http://" + admin + "/v1/status"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("plaintext GET answered 200: %s", b)
		}
	}
	// net/http reports the failed handshake before it closes the
	// connection, and the client's request returned after the close.
	if got := testutil.GatheredValue(t, lead.Registry(), "nsmd_tls_handshake_failures_total", "listener", "admin", "reason", "plaintext"); got < 1 {
		t.Fatalf("plaintext refusal not counted (%v)", got)
	}
	_ = o
}
