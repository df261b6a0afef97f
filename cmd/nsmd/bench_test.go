package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/bench"
	"github.com/nsmd/nsmd/bench/drill"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/nsm/nsmtest"
	"github.com/nsmd/nsmd/oncrpc"
)

// checkSVG: the file is one well-formed XML document whose root is an
// SVG element, and it holds at least want <rect>s.
func checkSVG(t *testing.T, path string, wantRects int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	root, rects := "", 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Space + " " + se.Name.Local
			}
			if se.Name.Local == "rect" {
				rects++
			}
		}
	}
	if root != "http://www.w3.org/2000/svg svg" {
		t.Errorf("%s: root element %q, want svg in the SVG namespace", path, root)
	}
	if rects < wantRects {
		t.Errorf("%s: %d <rect>s, want at least %d", path, rects, wantRects)
	}
}

// checkBenchClean: every call answered stat_succ, none failed.
func checkBenchClean(t *testing.T, rep *bench.MonReport, calls int) {
	t.Helper()
	if rep.Calls != calls || rep.OK != calls || rep.Failed != 0 || rep.Stopped != "" {
		t.Fatalf("calls %d ok %d failed %d stopped %q, want %d ok; errors %v %v", rep.Calls, rep.OK, rep.Failed, rep.Stopped, calls, rep.Errors, rep.Samples)
	}
	for k, n := range rep.Errors {
		if n != 0 {
			t.Errorf("%s: %d", k, n)
		}
	}
	if rep.Latency.N != calls || !(rep.Latency.MinMS <= rep.Latency.P50MS && rep.Latency.P50MS <= rep.Latency.P90MS &&
		rep.Latency.P90MS <= rep.Latency.P99MS && rep.Latency.P99MS <= rep.Latency.MaxMS) || rep.Latency.MinMS <= 0 {
		t.Errorf("latency %+v", rep.Latency)
	}
	n := 0
	for _, h := range rep.Hist {
		n += h.Count
		if h.FromMS >= h.ToMS {
			t.Errorf("bucket %+v", h)
		}
	}
	if n != calls {
		t.Errorf("histogram holds %d calls, want %d", n, calls)
	}
}

// TestBenchMonAgainstDevCluster drives the dev cluster's VIP over TCP,
// over UDP with pipelining, and with the SM_UNMON half, and checks that
// the leader holds exactly the registrations the runs leave; then the
// command's --json and --plot output.
func TestBenchMonAgainstDevCluster(t *testing.T) {
	t.Parallel()
	d, o := agenttest.Dev(t, "127.0.0.130", 3)
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	vip := net.JoinHostPort(o.VIP, strconv.Itoa(o.NSMPort))
	ctx := context.Background()
	opts := func(network string, conns, depth, calls int, base string) bench.MonOptions {
		return bench.MonOptions{Addr: vip, Net: network, Conns: conns, Depth: depth, Calls: calls,
			MonBase: netip.MustParseAddr(base), MyName: "127.0.0.1", Privileged: true, Timeout: 5 * time.Second}
	}
	want := 0

	rep, err := bench.RunMon(ctx, opts("tcp", 4, 1, 200, "127.1.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	checkBenchClean(t, rep, 200)
	if len(rep.Procs) != 1 || rep.Procs[0].Proc != "SM_MON" || rep.MonLast != "127.1.0.200" {
		t.Errorf("procs %+v, last name %s", rep.Procs, rep.MonLast)
	}
	want += 200
	if n := lead.Node().View().Count(); n != want {
		t.Errorf("leader holds %d registrations after 200 SM_MON, want %d", n, want)
	}
	if os.Geteuid() == 0 {
		if ap, err := netip.ParseAddrPort(rep.Source); err != nil || !rep.Privileged || ap.Port() >= 1024 {
			t.Errorf("as root: source %q privileged %v, want a port below 1024", rep.Source, rep.Privileged)
		}
	}

	// UDP, 3 sockets with 2 calls outstanding each, after a warmup.
	uo := opts("udp", 3, 2, 150, "127.2.0.1")
	uo.Warmup = 30
	rep, err = bench.RunMon(ctx, uo)
	if err != nil {
		t.Fatal(err)
	}
	checkBenchClean(t, rep, 150)
	if rep.WarmupErrs != 0 || rep.MonLast != "127.2.0.180" {
		t.Errorf("warmup errors %d, last name %s (want 127.2.0.180: 30 warmup + 150)", rep.WarmupErrs, rep.MonLast)
	}
	want += 180
	if n := lead.Node().View().Count(); n != want {
		t.Errorf("leader holds %d registrations after the UDP run, want %d", n, want)
	}

	// Half SM_UNMON: each caller unmonitors a name it monitored before.
	mo := opts("tcp", 2, 2, 200, "127.3.0.1")
	mo.Unmon = true
	rep, err = bench.RunMon(ctx, mo)
	if err != nil {
		t.Fatal(err)
	}
	checkBenchClean(t, rep, 200)
	if len(rep.Procs) != 2 {
		t.Fatalf("procs %+v", rep.Procs)
	}
	mons, unmons := rep.Procs[0].OK, rep.Procs[1].OK
	// Each of the 4 callers alternates, starting with SM_MON.
	if mons+unmons != 200 || unmons < 98 || unmons > 100 {
		t.Errorf("%d SM_MON + %d SM_UNMON, want 200 with about half SM_UNMON", mons, unmons)
	}
	want += mons - unmons
	if n := lead.Node().View().Count(); n != want {
		t.Errorf("leader holds %d registrations after %d SM_MON and %d SM_UNMON, want %d", n, mons, unmons, want)
	}

	// The command: --json parses, --plot is well-formed SVG.
	svg := filepath.Join(t.TempDir(), "lat.svg")
	cmd := benchMonCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--addr", vip, "-c", "2", "-n", "50", "--mon-base", "127.4.0.1", "--json", "--plot", svg})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("bench mon: %v\n%s", err, errOut.String())
	}
	var got bench.MonReport
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out.String())
	}
	if got.OK != 50 || got.Calls != 50 || got.PortFrom != "given" || got.Proto != "tcp" || got.Target != vip ||
		len(got.Hist) == 0 || got.Latency.P99MS <= 0 || got.Errors["stat_fail"] != 0 || len(got.Errors) != 9 { // 9: every error kind bench mon counts
		t.Errorf("--json report: %s", out.String())
	}
	want += 50
	if n := lead.Node().View().Count(); n != want {
		t.Errorf("leader holds %d registrations, want %d", n, want)
	}
	checkSVG(t, svg, 1+len(got.Hist))

	// The table.
	cmd = benchMonCmd()
	out.Reset()
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"--addr", vip, "--proto", "udp", "-n", "10", "--mon-base", "127.4.1.1", "--unmon"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("bench mon: %v", err)
	}
	for _, s := range []string{"SM_MON + SM_UNMON over udp to " + vip, "P99", "SM_UNMON", "all", "127.4.1.1 … "} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, out.String())
		}
	}
}

// TestBenchMonCommandFailsOnFailedCalls: calls the server refuses are
// counted in the --json report and make the command exit non-zero. The
// server is a real ONC RPC server that answers NULL and refuses every
// other procedure (PROC_UNAVAIL), standing in for a broken NSM.
func TestBenchMonCommandFailsOnFailedCalls(t *testing.T) {
	t.Parallel()
	h := oncrpc.HandlerFunc(func(_ context.Context, c *oncrpc.Call, _ *oncrpc.Writer) error {
		if c.Proc == nsm.ProcNull {
			return nil
		}
		return oncrpc.ErrProcUnavail
	})
	addr := nsmtest.ServeNSM(t, h)

	cmd := benchMonCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.SetArgs([]string{"--addr", addr, "-n", "8", "--mon-base", "127.1.0.4", "--timeout", "300ms", "--json"})
	err := cmd.ExecuteContext(context.Background())
	if err == nil || !strings.Contains(err.Error(), "calls failed") {
		t.Fatalf("bench mon against a refusing server: %v", err)
	}
	var got bench.MonReport
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Failed != got.Calls || got.Calls != 8 || got.Errors["proc_unavail"] != 8 {
		t.Errorf("report of a refusing server: %d of %d failed, errors %v", got.Failed, got.Calls, got.Errors)
	}
}

// TestBenchFailoverTransfer: the command against a dev cluster, two
// planned transfers, --json and --plot.
func TestBenchFailoverTransfer(t *testing.T) {
	t.Parallel()
	d, _ := agenttest.Dev(t, "127.0.0.131", 3)
	agenttest.Leader(t, d, nil, 10*time.Second)
	svg := filepath.Join(t.TempDir(), "failover.svg")
	cmd := benchFailoverCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--admin", strings.TrimPrefix(d.Agent(0).AdminURL(), "http://"), "--transfer", "--runs", "2",
		"--timeout", "10s", "--json", "--plot", svg})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("bench failover: %v\n%s", err, errOut.String())
	}
	got := bench.FailoverReport{Report: &drill.Report{}}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("--json: %v\n%s", err, out.String())
	}
	if got.Fault != drill.FaultTransfer || len(got.Runs) != 2 || got.Failover.N != 2 || got.Failover.Name != "new_sm_state" ||
		got.Failover.P50MS <= 0 || got.Failover.MaxMS < got.Failover.P50MS || got.Cluster != "given (--admin)" {
		t.Errorf("report %s", out.String())
	}
	for _, r := range got.Runs {
		if r.NewState != r.OldState+2 {
			t.Errorf("run %d: sm_state %d -> %d", r.Run, r.OldState, r.NewState)
		}
	}
	checkSVG(t, svg, 1+2*drill.MilestoneCount)
}
