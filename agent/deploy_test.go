package agent_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cld/cldtest"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// What an operator installs to watch a cluster (deploy/prometheus,
// deploy/grafana) is checked here against promtool and against the metrics
// a running cluster exports.

const (
	rulesFile     = "../deploy/prometheus/nsmd-rules.yml"
	rulesTestFile = "../deploy/prometheus/nsmd-rules.test.yml"
	dashboardFile = "../deploy/grafana/nsmd-dashboard.json"
)

func promtoolPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus; .ci/run installs it): the Prometheus rules are not checked")
	}
	return p
}

func promtool(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	return string(out), err
}

// TestPrometheusRulesPassPromtool: the rules are valid (promtool check
// rules), their unit tests pass (promtool test rules: series in, alerts
// out, negative cases), those tests fail when an important alert is
// broken, and every dashboard expression is valid PromQL.
func TestPrometheusRulesPassPromtool(t *testing.T) {
	bin := promtoolPath(t)
	if out, err := promtool(t, bin, "check", "rules", rulesFile); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := promtool(t, bin, "test", "rules", rulesTestFile); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}

	// The unit tests catch a broken alert: each mutation must fail them.
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ what, old, new string }{
		{"no-holder threshold", "expr: nsmd:vip_holders:sum == 0", "expr: nsmd:vip_holders:sum == 5"},
		{"two-holders threshold", "expr: nsmd:vip_holders:sum > 1", "expr: nsmd:vip_holders:sum > 2"},
		{"holders summed across clusters", "sum by (job, cluster) (nsmd_vip_held)", "sum(nsmd_vip_held)"},
		{"grace for", "expr: max by (job, cluster) (nsmd_grace_active) == 1\n        for: 15m", "expr: max by (job, cluster) (nsmd_grace_active) == 1\n        for: 1m"},
		{"disk for", "expr: nsmd_disk_writable == 0\n        for: 1m", "expr: nsmd_disk_writable == 0\n        for: 0s"},
		{"slow disk for", "expr: nsmd_disk_slow == 1\n        for: 5m", "expr: nsmd_disk_slow == 1\n        for: 1m"},
		{"tracking threshold", "expr: nsmd_cld_tracking_error == 1", "expr: nsmd_cld_tracking_error == 0"},
		{"unfenced threshold", "expr: nsmd_fence_off == 1", "expr: nsmd_fence_off == 2"},
		{"unproven threshold", "expr: nsmd_fence_unproven_nodes > 0", "expr: nsmd_fence_unproven_nodes > 1"},
		{"promise mismatch for", "(nsmd_fence_promise_mismatch) == 1\n        for: 10m", "(nsmd_fence_promise_mismatch) == 1\n        for: 1m"},
		{"pause uncovered threshold", "expr: nsmd_fence_pause_uncovered == 1", "expr: nsmd_fence_pause_uncovered == 0"},
		{"stop-failed leader check", "and on (job, instance) nsmd_is_leader == 0", "and on (job, instance) nsmd_is_leader >= 0"},
		{"registrations cap threshold", "0.8 * nsmd_registrations_max", "1.8 * nsmd_registrations_max"},
		{"backlog on any node", "nsmd_notify_targets{state=\"pending\"} > 0 and on (job, instance) nsmd_is_leader == 1", "nsmd_notify_targets{state=\"pending\"} > 0"},
		{"service not served: serving threshold", "max by (job, cluster, service) (nsmd_service_serving) == 1\n        for: 2m", "max by (job, cluster, service) (nsmd_service_serving) == 0\n        for: 2m"},
		{"service not served: the owner's view only", "(nsmd_service_state{state=~\"placed|serving\"}) == 1", "(nsmd_service_state{state=\"serving\"}) == 1"},
		{"service served twice: for", "(nsmd_service_serving) > 1\n        for: 1m", "(nsmd_service_serving) > 1\n        for: 0s"},
		{"service served twice: summed across services", "sum by (job, cluster, service) (nsmd_service_serving) > 1", "sum by (job, cluster) (nsmd_service_serving) > 1"},
		{"service conflict for", "(nsmd_service_state{state=\"conflict\"}) == 1\n        for: 5m", "(nsmd_service_state{state=\"conflict\"}) == 1\n        for: 1m"},
		{"service unplaced: declared by no server", "(nsmd_service_declared_servers) > 0", "(nsmd_service_declared_servers) >= 0"},
		{"service notify backlog for", "nsmd_service_notify_targets{state=\"pending\"} > 0\n        for: 20m", "nsmd_service_notify_targets{state=\"pending\"} > 0\n        for: 5m"},
	} {
		if !strings.Contains(string(rules), m.old) {
			t.Fatalf("mutation %q: %q not in the rules", m.what, m.old)
		}
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "nsmd-rules.yml"), strings.Replace(string(rules), m.old, m.new, 1))
		writeFile(t, filepath.Join(dir, "nsmd-rules.test.yml"), string(tests))
		if out, err := promtool(t, bin, "test", "rules", filepath.Join(dir, "nsmd-rules.test.yml")); err == nil {
			t.Errorf("rules with a broken %s still pass their tests:\n%s", m.what, out)
		}
	}

	// Dashboard expressions: promtool parses them as recording rules.
	d := loadDashboard(t)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range d.exprs {
		e = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m").Replace(e)
		q, _ := json.Marshal(e)
		fmt.Fprintf(&b, "      - record: dashboard:expr_%d\n        expr: %s\n", i, q)
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "dashboard.yml"), b.String())
	if out, err := promtool(t, bin, "check", "rules", filepath.Join(dir, "dashboard.yml")); err != nil {
		t.Fatalf("dashboard expressions are not valid PromQL: %v\n%s", err, out)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

type dashboard struct {
	raw    map[string]any
	exprs  []string // every PromQL expression: targets, annotations, variables
	panels []map[string]any
}

// loadDashboard parses the dashboard and checks what an import into a
// current Grafana relies on.
func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d.raw); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if regexp.MustCompile(`https?://`).Match(b) {
		t.Errorf("%s refers to an external address (no external assets)", dashboardFile)
	}
	inputs, _ := d.raw["__inputs"].([]any)
	if len(inputs) != 1 || inputs[0].(map[string]any)["name"] != "DS_PROMETHEUS" || inputs[0].(map[string]any)["pluginId"] != "prometheus" {
		t.Errorf("__inputs = %v, want one prometheus datasource input DS_PROMETHEUS", inputs)
	}
	if v, _ := d.raw["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion %v: want a current one (≥ 36, Grafana 9+)", v)
	}
	if d.raw["uid"] == "" || d.raw["title"] == "" {
		t.Error("dashboard without uid or title")
	}
	checkDS := func(where string, ds any) {
		m, _ := ds.(map[string]any)
		if m["type"] != "prometheus" || m["uid"] != "${DS_PROMETHEUS}" {
			t.Errorf("%s: datasource %v, want the ${DS_PROMETHEUS} input", where, ds)
		}
	}
	ids := map[float64]bool{}
	panels, _ := d.raw["panels"].([]any)
	for _, p := range panels {
		pm := p.(map[string]any)
		title, _ := pm["title"].(string)
		id, _ := pm["id"].(float64)
		if ids[id] {
			t.Errorf("panel %q: id %v used twice", title, id)
		}
		ids[id] = true
		g, _ := pm["gridPos"].(map[string]any)
		if x, w := g["x"].(float64), g["w"].(float64); w <= 0 || x+w > 24 {
			t.Errorf("panel %q: gridPos %v outside the 24 columns", title, g)
		}
		if pm["type"] == "row" {
			continue
		}
		d.panels = append(d.panels, pm)
		checkDS("panel "+title, pm["datasource"])
		targets, _ := pm["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no query", title)
		}
		for _, tg := range targets {
			tm := tg.(map[string]any)
			checkDS("panel "+title+" target", tm["datasource"])
			e, _ := tm["expr"].(string)
			if e == "" {
				t.Errorf("panel %q: a target without expr", title)
			}
			d.exprs = append(d.exprs, e)
		}
	}
	if ann, ok := d.raw["annotations"].(map[string]any); ok {
		for _, a := range ann["list"].([]any) {
			if e, _ := a.(map[string]any)["expr"].(string); e != "" {
				d.exprs = append(d.exprs, e)
			}
		}
	}
	if tmpl, ok := d.raw["templating"].(map[string]any); ok {
		for _, v := range tmpl["list"].([]any) {
			vm := v.(map[string]any)
			checkDS("variable "+vm["name"].(string), vm["datasource"])
			q, _ := vm["definition"].(string)
			if m := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`).FindStringSubmatch(q); m != nil {
				q = m[1]
			}
			d.exprs = append(d.exprs, q)
		}
	}
	return d
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// loadRules returns the rules' expressions and the recording rules' names.
func loadRules(t *testing.T) (exprs []string, records map[string]bool) {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	records = map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records[r.Record] = true
			}
			exprs = append(exprs, r.Expr)
		}
	}
	return exprs, records
}

var (
	promqlStrings  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlMatchers = regexp.MustCompile(`\{[^{}]*\}|\[[^\[\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promqlTokens   = regexp.MustCompile(`[0-9][0-9a-zA-Z_.]*|[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"inf": true, "nan": true, "Inf": true, "NaN": true, "atan2": true, "group_left": true, "group_right": true}
)

// metricNames lists the metric names an expression selects: what is left
// once strings, label matchers, ranges, grouping clauses, function calls,
// numbers and keywords are taken out.
func metricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, m := range promqlTokens.FindAllStringSubmatch(s, -1) {
		tok := m[0]
		if m[1] != "" || tok[0] >= '0' && tok[0] <= '9' || promqlKeywords[tok] {
			continue // a function or aggregation, a number, a keyword
		}
		names = append(names, tok)
	}
	return names
}

// unknownMetrics returns the names exprs use that are neither exported
// (series names as scraped: histograms as _bucket, _sum, _count) nor
// recording rules, nor Prometheus' own `up`.
func unknownMetrics(exprs []string, exported, records map[string]bool) []string {
	var bad []string
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			if !exported[n] && !records[n] && n != "up" {
				bad = append(bad, n+" (in "+e+")")
			}
		}
	}
	return bad
}

// withoutServiceMetrics is bad (unknownMetrics' answer) without the
// services' metrics.
func withoutServiceMetrics(bad []string) []string {
	var out []string
	for _, b := range bad {
		if !strings.HasPrefix(b, "nsmd_service_") {
			out = append(out, b)
		}
	}
	return out
}

// serviceMetricNames is every nsmd_service_* name the rules and the
// dashboard use.
func serviceMetricNames(t *testing.T) []string {
	t.Helper()
	exprs, _ := loadRules(t)
	exprs = append(exprs, loadDashboard(t).exprs...)
	seen := map[string]bool{}
	var out []string
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			if strings.HasPrefix(n, "nsmd_service_") && !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	return out
}

// scrapeSeriesNames reads an agent's /metrics and returns the series names.
func scrapeSeriesNames(t *testing.T, hc *http.Client, a *agent.Agent) map[string]float64 {
	t.Helper()
	resp, err := hc.Get(a.AdminURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s %v", resp.Status, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		series, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, _ := strconv.ParseFloat(val, 64)
		out[series] = v // with labels: `name{l="v"}`
	}
	return out
}

func seriesNames(series map[string]float64) map[string]bool {
	names := map[string]bool{}
	for s := range series {
		n, _, _ := strings.Cut(s, "{")
		names[n] = true
	}
	return names
}

// startMonitoredDev starts a 3-node dev cluster with mutual TLS (so the
// TLS metrics exist) and a fast disk probe, and returns an HTTPS client
// that trusts its CA.
func startMonitoredDev(t *testing.T, vip string) (*agent.Dev, agent.DevOptions, *http.Client) {
	t.Helper()
	dir := t.TempDir()
	agenttest.PKI(t, dir, 3)
	o := agenttest.DevOptions(t, vip, 3)
	o.Tune = func(c *config.Config) {
		c.TLSCA = filepath.Join(dir, "ca.pem")
		c.TLSCert = filepath.Join(dir, c.NodeID+".pem")
		c.TLSKey = filepath.Join(dir, c.NodeID+"-key.pem")
		c.GossipKeyFile = filepath.Join(dir, "gossip.key")
		// NFSv4 tracking on, each node facing a fake kernel's pipe
		// (cld/cldtest), so that its metrics are exported too.
		c.NFSv4Tracking = config.TrackingOn
		c.RPCPipefs = filepath.Join(dir, "pipefs-"+c.NodeID)
	}
	kernels := map[string]*cldtest.Kernel{}
	for _, id := range []string{"node1", "node2", "node3"} {
		k, err := cldtest.New(filepath.Join(dir, "pipefs-"+id))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		kernels[id] = k
	}
	d := agenttest.StartDev(t, o, agent.Options{TuneCluster: func(c *cluster.Config) { c.DiskProbeInterval = 50 * time.Millisecond },
		TuneTracking: func(id string, c *cld.Config) {
			c.OpenPipe, c.IsPipefs, c.MountPipefs = kernels[id].OpenPipe, kernels[id].IsPipefs, false
		}})
	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return d, o, hc
}

// TestDashboardAndRulesUseOnlyExportedMetrics: the dashboard imports
// (valid JSON, a ${DS_PROMETHEUS} input, no external assets), and every
// metric named in a dashboard query or a rule is exported by a running
// cluster (scraped from all three nodes after an SM_MON) or is a
// recording rule of the rules file: renaming a metric fails this test.
func TestDashboardAndRulesUseOnlyExportedMetrics(t *testing.T) {
	d := loadDashboard(t)
	ruleExprs, records := loadRules(t)

	// The checker itself finds a renamed metric and a missing record.
	exported := map[string]bool{"nsmd_vip_held": true, "nsmd_rpc_duration_seconds_bucket": true}
	if bad := unknownMetrics([]string{`sum by (job) (nsmd_vip_held{job=~"$job"}) == 1`,
		`histogram_quantile(0.99, sum by (le) (rate(nsmd_rpc_duration_seconds_bucket{proc="mon"}[$__rate_interval])))`}, exported, nil); len(bad) != 0 {
		t.Fatalf("checker: false alarm %v", bad)
	}
	for _, e := range []string{`sum(nsmd_vip_holders)`, `nsmd:vip_holders:sum == 0`, `rate(nsmd_rpc_duration_seconds[5m])`, `nsmd_vip_held and on (job) other_metric`} {
		if bad := unknownMetrics([]string{e}, exported, nil); len(bad) != 1 {
			t.Fatalf("checker: %q gives %v, want one unknown name", e, bad)
		}
	}

	dc, o, hc := startMonitoredDev(t, "127.0.0.45")
	agenttest.Leader(t, dc, nil, 10*time.Second)
	c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: net.JoinHostPort(o.VIP, strconv.Itoa(o.NSMPort)), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mon := nsm.Mon{ID: nsm.MonID{MonName: "127.0.0.81", My: nsm.MyID{MyName: "lockd-host", Prog: 100021, Vers: 3, Proc: 16}}}
	var res nsm.SMStatRes
	if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res); err != nil || res.Res != nsm.StatSucc {
		t.Fatalf("SM_MON on the VIP: %+v %v", res, err)
	}
	names := map[string]bool{}
	for _, a := range dc.Agents() {
		for n := range seriesNames(scrapeSeriesNames(t, hc, a)) {
			names[n] = true
		}
	}
	// The services' metrics (nsmd_service_*) exist only with services:;
	// TestServicesShowWhatEachServerDoes checks them on a cluster that
	// serves services.
	if bad := withoutServiceMetrics(unknownMetrics(d.exprs, names, records)); len(bad) > 0 {
		t.Errorf("the dashboard uses metrics no node exports:\n  %s", strings.Join(bad, "\n  "))
	}
	if bad := withoutServiceMetrics(unknownMetrics(ruleExprs, names, records)); len(bad) > 0 {
		t.Errorf("the rules use metrics no node exports:\n  %s", strings.Join(bad, "\n  "))
	}
	// Every panel draws from the cluster: a dashboard without the asked-for
	// views would pass the name check too.
	used := map[string]bool{}
	for _, e := range d.exprs {
		for _, n := range metricNames(e) {
			used[strings.TrimSuffix(n, "_bucket")] = true
		}
	}
	for _, n := range []string{"nsmd_vip_held", "nsmd_is_leader", "nsmd_takeovers_total", "nsmd_failover_duration_seconds",
		"nsmd_grace_active", "nsmd_notify_targets", "nsmd_rpc_requests_total", "nsmd_rpc_duration_seconds",
		"nsmd_apply_duration_seconds", "nsmd_disk_write_duration_seconds", "nsmd_registrations", "nsmd_sm_state",
		"nsmd_tls_handshake_failures_total", "nsmd_tls_cert_expiry_timestamp_seconds", "nsmd_service_serving", "nsmd_service_epoch"} {
		if !used[n] {
			t.Errorf("no dashboard panel shows %s", n)
		}
	}
}

// TestMonitoringMetricsMoveOnFailover: the metrics added for the
// dashboard and alerts follow the cluster: exactly one node reports
// nsmd_vip_held (the leader), every node nsmd_ready, raft log and probe
// writes are timed, and a planned failover is observed in nsmd_failover_duration_seconds on the new leader
// while nsmd_vip_held moves with it.
func TestMonitoringMetricsMoveOnFailover(t *testing.T) {
	dc, _, hc := startMonitoredDev(t, "127.0.0.46")
	lead := agenttest.Leader(t, dc, nil, 10*time.Second)
	scrapeAll := func() map[*agent.Agent]map[string]float64 {
		m := map[*agent.Agent]map[string]float64{}
		for _, a := range dc.Agents() {
			m[a] = scrapeSeriesNames(t, hc, a)
		}
		return m
	}
	// The probe runs every 50ms here; wait until every node timed one.
	var s map[*agent.Agent]map[string]float64
	testutil.WaitForSeen(t, 5*time.Second, "every node to time a disk probe and become ready", func() (bool, string) {
		s = scrapeAll()
		n := 0
		for _, m := range s {
			if m[`nsmd_disk_write_duration_seconds_count{op="probe"}`] > 0 && m["nsmd_ready"] == 1 {
				n++
			}
		}
		return n == len(dc.Agents()), fmt.Sprintf("%d of %d", n, len(dc.Agents()))
	})
	for a, m := range s {
		want := 0.0
		if a == lead {
			want = 1
		}
		if m["nsmd_vip_held"] != want || m["nsmd_is_leader"] != want {
			t.Errorf("%s: nsmd_vip_held %v nsmd_is_leader %v, want %v", a.Config().NodeID, m["nsmd_vip_held"], m["nsmd_is_leader"], want)
		}
		if m[`nsmd_disk_write_duration_seconds_count{op="raft_log"}`] < 1 || m[`nsmd_disk_write_duration_seconds_sum{op="raft_log"}`] <= 0 {
			t.Errorf("%s: raft log writes not timed: count %v", a.Config().NodeID, m[`nsmd_disk_write_duration_seconds_count{op="raft_log"}`])
		}
		if v, ok := m["nsmd_tls_cert_expiry_timestamp_seconds"]; !ok || v < float64(time.Now().Unix()) {
			t.Errorf("%s: nsmd_tls_cert_expiry_timestamp_seconds = %v, want a future time", a.Config().NodeID, v)
		}
	}

	// Elections while the cluster formed may count already (a node that
	// heard from a short-lived first leader); the transfer adds one.
	before := map[*agent.Agent]float64{}
	for a, m := range s {
		before[a] = m["nsmd_failover_duration_seconds_count"]
	}
	start := time.Now()
	if err := lead.Node().TransferLeadership(""); err != nil {
		t.Fatalf("transfer leadership: %v", err)
	}
	next := agenttest.Leader(t, dc, lead, 10*time.Second)
	// The observation lands once the new leader serves (on_leader done).
	testutil.WaitFor(t, 5*time.Second, "the new leader to observe a failover", func() bool {
		return scrapeSeriesNames(t, hc, next)["nsmd_failover_duration_seconds_count"] > before[next]
	})
	took := time.Since(start)
	s = scrapeAll()
	if n := s[next]["nsmd_failover_duration_seconds_count"]; n != before[next]+1 {
		t.Errorf("new leader: %v failovers observed, want %v", n, before[next]+1)
	}
	sum := s[next]["nsmd_failover_duration_seconds_sum"]
	if sum <= 0 || before[next] == 0 && sum > took.Seconds()+1 {
		t.Errorf("failover duration %.3fs: want > 0 and about the transfer's %v", sum, took)
	}
	holders := 0.0
	for a, m := range s {
		holders += m["nsmd_vip_held"]
		if a != next && m["nsmd_failover_duration_seconds_count"] != before[a] {
			t.Errorf("%s observed a failover it did not make", a.Config().NodeID)
		}
	}
	if holders != 1 || s[next]["nsmd_vip_held"] != 1 {
		t.Errorf("after the failover: %v VIP holders, new leader %v; want exactly the new leader", holders, s[next]["nsmd_vip_held"])
	}
	t.Logf("planned failover: %.1f ms from last contact with the old leader to serving (transfer call to observed: %v)", sum*1000, took.Round(time.Millisecond))
}

// TestPrometheusScrapesClusterAndCountsOneVIPHolder: a real Prometheus
// (Debian's) scrapes a TLS dev cluster as README's Monitoring section says
// (HTTPS, the CA only) with the rules loaded: it sees three nodes up, the
// recording rules count exactly one VIP holder and one leader, no alert
// fires, and every dashboard query runs on its engine.
func TestPrometheusScrapesClusterAndCountsOneVIPHolder(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (Debian package prometheus; .ci/run installs it)")
	}
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	dc, _, _ := startMonitoredDev(t, "127.0.0.47")
	agenttest.Leader(t, dc, nil, 10*time.Second)
	dir := t.TempDir()
	var targets []string
	for _, a := range dc.Agents() {
		targets = append(targets, fmt.Sprintf("'%s'", a.AdminAddr()))
	}
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ['%s']
scrape_configs:
  - job_name: nsmd
    scheme: https
    tls_config: {ca_file: '%s'}
    static_configs: [{targets: [%s]}]
`, rules, dc.Agents()[0].Config().TLSCA, strings.Join(targets, ", "))
	writeFile(t, filepath.Join(dir, "prometheus.yml"), cfg)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testutil.FreePort(t, "127.0.0.1")))
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var logs testutil.LockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	type sample struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	query := func(q string) ([]sample, error) {
		resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []sample `json:"result"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return nil, err
		}
		if r.Status != "success" {
			return nil, fmt.Errorf("%s: %s", r.Status, r.Error)
		}
		return r.Data.Result, nil
	}
	value := func(q string) string {
		s, err := query(q)
		if err != nil || len(s) != 1 {
			return fmt.Sprintf("%d results, err %v", len(s), err)
		}
		v, _ := s[0].Value[1].(string)
		return v
	}
	// Every node scraped three times, and the rules evaluated since.
	testutil.WaitForSeen(t, 30*time.Second, "prometheus to scrape the cluster 9 times", func() (bool, string) {
		n, _ := strconv.Atoi(value(`sum(count_over_time(up{job="nsmd"}[1m]))`))
		return n >= 9 && value(`count(nsmd:vip_holders:sum)`) == "1", "up " + value(`up`)
	})
	// Seen together once: on a loaded machine one scrape may miss its 1 s
	// timeout (up 0 for that node) or a lease lapse for a moment (a node
	// not ready), and that is no fault of the rules.
	testutil.WaitForSeen(t, 30*time.Second, "three nodes up and ready, one VIP holder and one leader", func() (bool, string) {
		var wrong []string
		for _, c := range []struct{ q, want string }{
			{`sum(up{job="nsmd"})`, "3"},
			{`nsmd:vip_holders:sum{job="nsmd"}`, "1"},
			{`nsmd:leaders:sum{job="nsmd"}`, "1"},
			{`nsmd:nodes_ready:sum{job="nsmd"}`, "3"},
		} {
			if got := value(c.q); got != c.want {
				wrong = append(wrong, fmt.Sprintf("%s = %s, want %s", c.q, got, c.want))
			}
		}
		return len(wrong) == 0, strings.Join(wrong, "; ")
	})
	// Nothing fires or is pending, but for the grace a fresh takeover opened.
	alerts, err := query(`ALERTS`)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		if a.Metric["alertname"] != "NsmdGraceOpenTooLong" || a.Metric["alertstate"] != "pending" {
			t.Errorf("alert in a healthy cluster: %v", a.Metric)
		}
	}
	d := loadDashboard(t)
	vars := strings.NewReplacer("$__rate_interval", "5s", "$__interval", "1s", "$job", "nsmd", "$instance", ".*")
	for _, e := range d.exprs {
		if _, err := query(vars.Replace(e)); err != nil {
			t.Errorf("dashboard query %s: %v", e, err)
		}
	}
}
