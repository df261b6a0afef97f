package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
)

// TestVersionCommandAndFlag: `nsmd version`, `nsmd --version` and
// `nsmd version --json` report the build, with the Go version that built it.
func TestVersionCommandAndFlag(t *testing.T) {
	want := agent.Build().String()
	if !strings.HasPrefix(want, "nsmd ") || !strings.HasSuffix(want, runtime.Version()) {
		t.Fatalf("build info %q: want nsmd … %s", want, runtime.Version())
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := runCLI(t, args...)
		if err != nil || strings.TrimSpace(out) != want {
			t.Errorf("nsmd %v = %q %v, want %q", args, out, err, want)
		}
	}
	out, err := runCLI(t, "version", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var b admin.BuildInfo
	if err := json.Unmarshal([]byte(out), &b); err != nil || b.GoVersion != runtime.Version() || b.Version == "" {
		t.Errorf("version --json %q: %+v %v", out, b, err)
	}
}

func getJSON(t *testing.T, url string, out any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("decode %s: %v", url, err)
	}
}

// TestAgentRefusesNodeOfAnotherCluster: an agent of cluster beta whose
// gossip seed is a node of cluster alpha is refused by it and refuses it
// in turn: neither lists the other as a member, alpha's raft has one
// voter, beta never gets a leader, both count the refusal in
// nsmd_cluster_join_refused_total{reason="cluster_id"}. /v1/status says
// each one's cluster_id and version; /metrics has nsmd_build_info; the
// CLI shows them.
func TestAgentRefusesNodeOfAnotherCluster(t *testing.T) {
	start := func(id, vip string, tune func(*config.Config)) (*agent.Dev, agent.DevOptions) {
		o := agenttest.DevOptions(t, vip, 1)
		o.Tune = func(c *config.Config) { c.ClusterID = id; tune(c) }
		return agenttest.StartDev(t, o, agent.Options{Logger: agenttest.Logger(slog.LevelError)}), o
	}
	alpha, ao := start("alpha", "127.0.0.151", func(*config.Config) {})
	beta, _ := start("beta", "127.0.0.152", func(c *config.Config) {
		c.NodeID = "beta1"
		c.Join = []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(ao.GossipPort))}
	})
	a := agenttest.Leader(t, alpha, nil, 10*time.Second)
	b := beta.Agents()[0]
	refused := func(ag *agent.Agent) float64 {
		return testutil.GatheredValue(t, ag.Registry(), "nsmd_cluster_join_refused_total", "reason", cluster.RefusedClusterID)
	}
	testutil.WaitForSeen(t, 10*time.Second, "both clusters to count a refusal", func() (bool, string) {
		ra, rb := refused(a), refused(b)
		return ra >= 1 && rb >= 1, fmt.Sprintf("refusals: alpha %v, beta %v", ra, rb)
	})

	for _, c := range []struct {
		ag       *agent.Agent
		id, node string
	}{{a, "alpha", "node1"}, {b, "beta", "beta1"}} {
		var st admin.Status
		getJSON(t, c.ag.AdminURL()+"/v1/status", &st)
		if st.ClusterID != c.id || st.Version.GoVersion != runtime.Version() || st.Version.Version == "" {
			t.Errorf("%s status: cluster_id %q, version %+v", c.node, st.ClusterID, st.Version)
		}
		var ms []admin.Member
		getJSON(t, c.ag.AdminURL()+"/v1/members", &ms)
		if len(ms) != 1 || ms[0].ID != c.node || ms[0].Version != agent.Build().Gossip() {
			t.Errorf("%s members %+v, want only itself with version %q", c.node, ms, agent.Build().Gossip())
		}
	}
	if v, err := a.Node().Voters(); err != nil || len(v) != 1 {
		t.Errorf("alpha's raft configuration %v %v, want one server", v, err)
	}
	if v, err := b.Node().Voters(); err != nil || len(v) != 0 {
		t.Errorf("beta's raft configuration %v %v, want none (never added by alpha)", v, err)
	}

	resp, err := http.Get(a.AdminURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	bi := agent.Build()
	revision := bi.Revision // with +modified for a build from a changed work tree
	if bi.Modified && revision != "" {
		revision += "+modified"
	}
	wantInfo := `nsmd_build_info{goversion="` + bi.GoVersion + `",revision="` + revision + `",version="` + bi.Version + `"} 1`
	if !strings.Contains(string(body), wantInfo) {
		t.Errorf("/metrics lacks %s", wantInfo)
	}

	admin := a.AdminAddr()
	out, err := runCLI(t, "status", "--admin", admin)
	if err != nil || !strings.Contains(out, "cluster_id     alpha") || !strings.Contains(out, "version        "+bi.Gossip()) ||
		!strings.Contains(out, "takeover       sm_state ") || !strings.Contains(out, "elected +0ms") {
		t.Errorf("nsmd status: %v\n%s", err, out)
	}
	out, err = runCLI(t, "members", "--admin", admin)
	if err != nil || !strings.Contains(out, "VERSION") || !strings.Contains(out, bi.Gossip()) || strings.Contains(out, "beta1") {
		t.Errorf("nsmd members: %v\n%s", err, out)
	}
}
