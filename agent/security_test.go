package agent

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/config"
)

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
	a := &Agent{cfg: cfg, log: slog.New(slog.NewTextHandler(&logs, nil)), reg: prometheus.NewRegistry()}
	if err := a.setupSecurity(); err != nil {
		t.Fatal(err)
	}
	if len(a.sec.exposures) != 3 || !strings.Contains(logs.String(), "insecure") {
		t.Fatalf("exposures %q, log:\n%s", a.sec.exposures, logs.String())
	}
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "nsmd_insecure" {
			v = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if v != 1 {
		t.Fatalf("nsmd_insecure = %v", v)
	}
	req, _ := http.NewRequest("POST", "/v1/leadership/transfer", nil)
	if !a.sec.guard.Authorized(req) {
		t.Fatal("insecure without TLS or token: a write was refused")
	}

	// A missing certificate file is an error naming the file.
	cfg.Insecure = false
	cfg.Bind, cfg.AdminAddr = "127.0.0.1", "127.0.0.1:0"
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = "/nonexistent/ca.pem", "/nonexistent/n1.pem", "/nonexistent/n1-key.pem"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "tls_ca: stat /nonexistent/ca.pem") {
		t.Fatalf("Validate with missing files: %v", err)
	}
	_, err = Start(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Fatalf("Start with a missing CA file: %v", err)
	}
}
