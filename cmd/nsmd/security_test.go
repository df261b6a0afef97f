package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cluster/pki"
	"github.com/nsmd/nsmd/config"
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
// cluster with mutual TLS on raft and HTTPS on the admin API.
func startTLSDev(t *testing.T) (*devCluster, devOptions, string) {
	t.Helper()
	dir := t.TempDir()
	if out, err := runCLI(t, "tls", "init", "--dir", dir, "--node", "node1=127.0.0.1", "--node", "node2=127.0.0.2", "--node", "node3=127.0.0.3"); err != nil {
		t.Fatalf("tls init: %v\n%s", err, out)
	}
	ips := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.44"}
	o := devOptions{
		Nodes: 3, DataDir: t.TempDir(), VIP: "127.0.0.44", LogLevel: "warn",
		NSMPort: portFreeOn(t, ips...), RaftPort: portFreeOn(t, ips...),
		AdminPort: portFreeOn(t, ips...), GossipPort: portFreeOn(t, ips...),
		Tune: func(c *config.Config) {
			c.TLSCA = filepath.Join(dir, "ca.pem")
			c.TLSCert = filepath.Join(dir, c.NodeID+".pem")
			c.TLSKey = filepath.Join(dir, c.NodeID+"-key.pem")
			c.GossipKeyFile = filepath.Join(dir, "gossip.key")
			c.AdminTokenFile = filepath.Join(dir, "admin.token")
		},
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := startDev(o, agentOptions{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, o, dir
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// TestTLSClusterAdminNeedsCertificateOrToken: a dev cluster on mutual TLS
// forms and serves; its admin API answers reads over HTTPS to anyone who
// trusts the CA, but writes and registrations only with an operator
// certificate or the token; plaintext HTTP is refused and counted.
func TestTLSClusterAdminNeedsCertificateOrToken(t *testing.T) {
	d, o, dir := startTLSDev(t)
	lead := devLeader(t, d, nil, 10*time.Second)
	admin := lead.adminLn.Addr().String()
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
	if got := metricValue(t, lead.reg, "nsmd_admin_denied_total", map[string]string{"path": "/v1/leadership/transfer"}); got != 1 {
		t.Fatalf("nsmd_admin_denied_total{transfer} = %v, want 1", got)
	}
	if lead2 := devLeader(t, d, nil, time.Second); lead2 != lead {
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
	if got := metricValue(t, lead.reg, "nsmd_tls_handshake_failures_total", map[string]string{"listener": "admin", "reason": "plaintext"}); got < 1 {
		t.Fatalf("plaintext refusal not counted (%v)", got)
	}
	_ = o
}

// TestReloadPicksUpANewCertificate: Reload (SIGHUP) swaps the node's
// certificate for the next handshake; a broken file keeps the old one.
func TestReloadPicksUpANewCertificate(t *testing.T) {
	d, _, dir := startTLSDev(t)
	a := d.agents[0]
	serial := func() string {
		c, err := tls.Dial("tcp", a.adminLn.Addr().String(), &tls.Config{InsecureSkipVerify: true})
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

// TestInsecureIsSaidEverywhere: insecure lets a non-loopback agent run
// without TLS, and it says so in status and a metric; without insecure the
// config is refused naming what to fix.
func TestInsecureIsSaidEverywhere(t *testing.T) {
	cfg := config.Default()
	cfg.NodeID, cfg.DataDir, cfg.Bind, cfg.AdminAddr = "n1", t.TempDir(), "10.77.0.11", "10.77.0.11:8024"
	err := cfg.Validate()
	for _, want := range []string{"bind: raft on 10.77.0.11", "gossip_key_file:", "admin_addr: admin API on 10.77.0.11:8024"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate: %v; want it to contain %q", err, want)
		}
	}
	cfg.Insecure = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	a := &agent{cfg: cfg, log: slog.New(slog.NewTextHandler(&logs, nil)), reg: prometheus.NewRegistry()}
	if err := a.setupSecurity(); err != nil {
		t.Fatal(err)
	}
	if len(a.sec.exposures) != 3 || !strings.Contains(logs.String(), "insecure") {
		t.Fatalf("exposures %q, log:\n%s", a.sec.exposures, logs.String())
	}
	if v := metricValue(t, a.reg, "nsmd_insecure", nil); v != 1 {
		t.Fatalf("nsmd_insecure = %v", v)
	}
	req, _ := http.NewRequest("POST", "/v1/leadership/transfer", nil)
	if !a.authorized(req) {
		t.Fatal("insecure without TLS or token: a write was refused")
	}

	// A missing certificate file is an error naming the file.
	cfg.Insecure = false
	cfg.Bind, cfg.AdminAddr = "127.0.0.1", "127.0.0.1:0"
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = "/nonexistent/ca.pem", "/nonexistent/n1.pem", "/nonexistent/n1-key.pem"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "tls_ca: stat /nonexistent/ca.pem") {
		t.Fatalf("Validate with missing files: %v", err)
	}
	_, err = startAgent(cfg, agentOptions{Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Fatalf("startAgent with a missing CA file: %v", err)
	}
}
