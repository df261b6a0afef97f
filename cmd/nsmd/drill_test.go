package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/bench/drill"
	"github.com/nsmd/nsmd/config"
)

// checkDrillRun: every milestone reached, at positive and ordered times,
// a new leader, and the state raised by exactly 2.
func checkDrillRun(t *testing.T, r drill.Failover) {
	t.Helper()
	if !r.Complete() {
		t.Fatalf("run %d incomplete: %+v", r.Run, r)
	}
	var prev time.Duration
	for _, m := range r.Milestones {
		if m.After <= 0 || m.After < prev {
			t.Errorf("run %d: %s at %v (previous %v): want positive and ordered", r.Run, m.Name, m.After, prev)
		}
		prev = m.After
	}
	if r.NewLeader == "" || r.NewLeader == r.OldLeader {
		t.Errorf("run %d: leader %q -> %q", r.Run, r.OldLeader, r.NewLeader)
	}
	if r.NewState != r.OldState+2 {
		t.Errorf("run %d: sm_state %d -> %d, want +2", r.Run, r.OldState, r.NewState)
	}
	// The dev cluster has no kernel nfsd: the drill says so for both graces.
	if len(r.Grace) != 2 || r.Grace[0].Running || r.Grace[1].Running {
		t.Errorf("run %d: kernel grace %+v, want lockd and nfsd not running", r.Run, r.Grace)
	}
	// The new leader's steps: at least elected … fan-out complete, in
	// order, the VIP taken by the time SM_STAT on it gave the new state
	// (the anchor), the fan-out complete before the drill saw it so.
	want := []string{"elected", "committed", "vip", "on_leader_done", "notify_started", "notify_done"}
	got := map[string]float64{}
	for i, s := range r.Steps {
		got[s.Name] = s.AfterMS
		if i > 0 && s.AfterMS < r.Steps[i-1].AfterMS {
			t.Errorf("run %d: steps out of order: %+v", r.Run, r.Steps)
		}
	}
	for _, name := range want {
		if _, ok := got[name]; !ok {
			t.Errorf("run %d: step %s missing: %+v", r.Run, name, r.Steps)
		}
	}
	if vip := float64(r.Milestones[drill.MilestoneState].After.Microseconds()) / 1000; got["vip"] != vip {
		t.Errorf("run %d: VIP taken at %v ms, want the anchor %v ms", r.Run, got["vip"], vip)
	}
	if nd := float64(r.Milestones[drill.MilestoneNotify].After.Microseconds()) / 1000; got["notify_done"] > nd+250 {
		t.Errorf("run %d: fan-out complete at %v ms by the leader's timeline, the drill saw it at %v ms", r.Run, got["notify_done"], nd)
	}
	t.Logf("run %d: %s -> %s, %d -> %d: %v %v %v %v", r.Run, r.OldLeader, r.NewLeader, r.OldState, r.NewState,
		r.Milestones[0].After, r.Milestones[1].After, r.Milestones[2].After, r.Milestones[3].After)
}

func checkDrillHTML(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	want := []string{"<svg", "</svg>", "fault (", "node1", "node2", "node3"}
	for _, def := range drill.MilestoneDefs() {
		want = append(want, def.Label, def.Name)
	}
	want = append(want, "The new leader's steps", "notify_done", "SM_NOTIFY fan-out complete")
	for _, w := range want {
		if !strings.Contains(s, w) {
			t.Errorf("report lacks %q", w)
		}
	}
	for _, bad := range []string{"<script", "src=", "<link", "ZgotmplZ"} {
		if strings.Contains(s, bad) {
			t.Errorf("report contains %q (must be self-contained and well escaped)", bad)
		}
	}
}

// TestDrillTransfer: two planned transfers on a dev cluster found from one
// admin address, then the cobra command once with --json and --report.
func TestDrillTransfer(t *testing.T) {
	t.Parallel()
	d, _ := agenttest.Dev(t, "127.0.0.120", 3)
	agenttest.Leader(t, d, nil, 10*time.Second)
	var progress bytes.Buffer
	rep, err := drill.Run(context.Background(), drill.Options{
		Admins: []string{d.Agent(0).AdminURL()}, Fault: drill.FaultTransfer,
		Runs: 2, Timeout: 10 * time.Second, Progress: &progress,
	})
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, progress.String())
	}
	if len(rep.Nodes) != 3 {
		t.Fatalf("discovered %+v, want 3 nodes", rep.Nodes)
	}
	for _, n := range rep.Nodes {
		if n.Admin == "" || !n.Voter {
			t.Errorf("node %+v: admin not found from the dev layout, or not a voter", n)
		}
	}
	if len(rep.Runs) != 2 || rep.Stopped != "" {
		t.Fatalf("runs %d stopped %q\n%s", len(rep.Runs), rep.Stopped, progress.String())
	}
	for _, r := range rep.Runs {
		checkDrillRun(t, r)
	}
	if rep.Runs[1].OldLeader != rep.Runs[0].NewLeader || rep.Runs[1].OldState != rep.Runs[0].NewState {
		t.Errorf("run 2 started from %s/%d, want run 1's result %s/%d", rep.Runs[1].OldLeader, rep.Runs[1].OldState, rep.Runs[0].NewLeader, rep.Runs[0].NewState)
	}
	if len(rep.Stats) != drill.MilestoneCount || rep.Stats[0].N != 2 || rep.Stats[0].MinMS > rep.Stats[0].MaxMS {
		t.Errorf("stats %+v", rep.Stats)
	}
	for _, def := range drill.MilestoneDefs() {
		if !strings.Contains(progress.String(), def.Label) {
			t.Errorf("progress lacks a line for %q:\n%s", def.Label, progress.String())
		}
	}
	html := filepath.Join(t.TempDir(), "drill.html")
	if err := drill.WriteReportFile(html, rep); err != nil {
		t.Fatal(err)
	}
	checkDrillHTML(t, html)
	var table bytes.Buffer
	if err := drill.Print(&table, rep); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"RUN 1", "RUN 2", "P50", "new leader elected"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("summary lacks %q:\n%s", s, table.String())
		}
	}

	// The command: --admin with every node, --json, --report.
	var admins []string
	for _, a := range d.Agents() {
		admins = append(admins, strings.TrimPrefix(a.AdminURL(), "http://"))
	}
	html2 := filepath.Join(t.TempDir(), "cmd.html")
	cmd := drillCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--admin", strings.Join(admins, ","), "--json", "--report", html2, "--timeout", "10s"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("nsmd drill: %v\n%s", err, errOut.String())
	}
	var got drill.Report
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out.String())
	}
	if len(got.Runs) != 1 || !got.Runs[0].Complete() || got.Runs[0].Milestones[3].AfterMS <= 0 || got.Fault != drill.FaultTransfer {
		t.Errorf("--json report %+v", got)
	}
	checkDrillHTML(t, html2)
}

// TestDrillKill: a crash of the leader through /v1/drill/crash; asked for
// two runs, the drill stops after one since the killed dev node never
// comes back and two of three voters cannot lose another.
func TestDrillKill(t *testing.T) {
	t.Parallel()
	d, o := agenttest.Dev(t, "127.0.0.121", 3)
	agenttest.Leader(t, d, nil, 10*time.Second)
	var progress bytes.Buffer
	rep, err := drill.Run(context.Background(), drill.Options{
		Admins: []string{d.Agent(0).AdminURL(), d.Agent(1).AdminURL(), d.Agent(2).AdminURL()},
		VIP:    fmt.Sprintf("%s:%d", o.VIP, o.NSMPort),
		Fault:  drill.FaultKill, Runs: 2, Timeout: 4 * time.Second, Poll: 10 * time.Millisecond, Progress: &progress, TTY: true,
	})
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, progress.String())
	}
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs, want 1\n%s", len(rep.Runs), progress.String())
	}
	checkDrillRun(t, rep.Runs[0])
	if p := progress.String(); !strings.Contains(p, "\r\033[Krun 1/2: ") || !strings.Contains(p, "waiting for leader_elected") ||
		!strings.Contains(p, "notify_done ") {
		t.Errorf("TTY progress does not rewrite one line per run:\n%q", p)
	}
	if !strings.Contains(rep.Stopped, "did not come back") || !strings.Contains(rep.Stopped, rep.Runs[0].OldLeader) {
		t.Errorf("stopped %q, want the killed node named", rep.Stopped)
	}
	for _, a := range d.Agents() {
		if a.Config().NodeID == rep.Runs[0].OldLeader && a.AdminURL() != "" {
			hc := &http.Client{Timeout: time.Second}
			if resp, err := hc.Get(a.AdminURL() + "/healthz"); err == nil {
				resp.Body.Close()
				t.Errorf("killed leader %s still answers its admin API", a.Config().NodeID)
			}
		}
	}
	html := filepath.Join(t.TempDir(), "kill.html")
	if err := drill.WriteReportFile(html, rep); err != nil {
		t.Fatal(err)
	}
	checkDrillHTML(t, html)
}

// TestDrillKillRefused: a leader without drill_crash refuses the crash and
// the drill says so instead of timing a failover that never happens.
func TestDrillKillRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	t.Parallel()
	o := agenttest.DevOptions(t, "127.0.0.122", 3)
	o.Tune = func(c *config.Config) { c.DrillCrash = false }
	d := agenttest.StartDev(t, o, agent.Options{})
	agenttest.Leader(t, d, nil, 10*time.Second)
	_, err := drill.Run(context.Background(), drill.Options{
		Admins: []string{d.Agent(0).AdminURL()}, Fault: drill.FaultKill, Timeout: 5 * time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "drill_crash") {
		t.Fatalf("drill against a node without drill_crash: %v", err)
	}
}

// TestDrillKillRunsOnDevRestart: nsmd dev restarts the node a crash drill
// killed (RestartAfter), so `drill --kill --runs 3` completes every run —
// each a SIGKILL-like crash of the current leader, a new leader with the
// state raised by 2 — and the report aggregates them.
func TestDrillKillRunsOnDevRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	t.Parallel()
	o := agenttest.DevOptions(t, "127.0.0.123", 3)
	o.RestartAfter = 300 * time.Millisecond
	d := agenttest.StartDev(t, o, agent.Options{})
	agenttest.Leader(t, d, nil, 10*time.Second)
	var progress bytes.Buffer
	rep, err := drill.Run(context.Background(), drill.Options{
		Admins: []string{d.Agent(0).AdminURL(), d.Agent(1).AdminURL(), d.Agent(2).AdminURL()},
		VIP:    fmt.Sprintf("%s:%d", o.VIP, o.NSMPort),
		Fault:  drill.FaultKill, Runs: 3, Timeout: 15 * time.Second, Poll: 10 * time.Millisecond, Progress: &progress,
	})
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, progress.String())
	}
	if len(rep.Runs) != 3 || rep.Stopped != "" {
		t.Fatalf("%d runs (stopped: %q), want 3\n%s", len(rep.Runs), rep.Stopped, progress.String())
	}
	killed := map[string]bool{}
	for _, r := range rep.Runs {
		if !r.Complete() {
			// A stalled election: say where every goroutine was.
			buf := make([]byte, 8<<20)
			t.Logf("run %d incomplete; goroutines:\n%s", r.Run, buf[:runtime.Stack(buf, true)])
		}
		// The killed leader, restarted 300 ms later with its whole log,
		// may win the next term itself: a new term and sm_state +2 either way.
		if !r.Complete() || r.NewLeader == "" || r.NewState != r.OldState+2 {
			t.Fatalf("run %d: %s -> %q, sm_state %d -> %d, complete %v", r.Run, r.OldLeader, r.NewLeader, r.OldState, r.NewState, r.Complete())
		}
		t.Logf("run %d: %s -> %s, %d -> %d", r.Run, r.OldLeader, r.NewLeader, r.OldState, r.NewState)
		killed[r.OldLeader] = true
	}
	for _, st := range drill.Stats(rep.Runs) {
		if st.N != 3 || st.P50MS <= 0 || st.MaxMS < st.P50MS {
			t.Errorf("milestone %s over the runs: %+v, want 3 runs with p50 ≤ max", st.Name, st)
		}
	}
	t.Logf("3 kill runs on nsmd dev, leaders killed %v", killed)
}

// TestDrillFaultFlags: --fault and the flags of the old faults and of the
// node-level ones: conflicts and flags a fault does not use are refused,
// naming both, before any cluster is asked.
func TestDrillFaultFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // error substring; "" = accepted (then fails later: no cluster)
	}{
		{[]string{"--fault", "nsmd-kill", "--kill"}, "--fault nsmd-kill and --kill: give one"},
		{[]string{"--fault", "kill", "--kill-cmd", "true"}, "--fault kill and --kill-cmd: give one"},
		{[]string{"--kill", "--kill-cmd", "true"}, "[kill kill-cmd]"},
		{[]string{"--fault", "meltdown"}, `--fault "meltdown": not one of transfer, kill, nsmd-kill, nsmd-hang, partition, freeze`},
		{[]string{"--fault", "partition", "--hang-for", "3s", "--node-cmd", "ssh {addr}"}, "--hang-for is for --fault nsmd-hang, not partition"},
		{[]string{"--fault", "transfer", "--node-cmd", "ssh {addr}"}, "--node-cmd is for --fault nsmd-kill or nsmd-hang or partition, not transfer"},
		{[]string{"--kill", "--cut-for", "3s"}, "--cut-for is for --fault partition, not kill"},
		{[]string{"--fault", "freeze", "--freeze-cmd", "virsh suspend {node}"}, "give --freeze-cmd and --thaw-cmd"},
		{[]string{"--fault", "freeze", "--node-cmd", "ssh {addr}", "--freeze-cmd", "a", "--thaw-cmd", "b"}, "--node-cmd is for"},
		{[]string{"--fault", "nsmd-hang", "--node-cmd", "ssh {addr}", "--hang-for", "9s", "--nsmd-pidfile", "/run/nsmd.pid"}, ""},
		{[]string{"--kill-cmd", "true"}, ""},
		{[]string{"--fault", "kill-cmd"}, "give --kill-cmd CMD"},
	} {
		cmd := drillCmd()
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		// An admin address nothing listens on: accepted flags fail at the cluster.
		cmd.SetArgs(append([]string{"--admin", "127.0.0.1:1", "--timeout", "1s"}, c.args...))
		err := cmd.ExecuteContext(context.Background())
		switch {
		case c.want == "" && (err == nil || !strings.Contains(err.Error(), "no admin API answered")):
			t.Errorf("%v: %v, want it accepted (and the cluster not found)", c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestDrillNSMDKillOnDev: on nsmd dev, --fault nsmd-kill is the
// in-process crash; the report says no fence wait was needed (no node
// serves storage) and that the old node came back restarted. The faults
// that need a machine of their own are refused first, saying why and
// what to use, with nothing done to the cluster.
func TestDrillNSMDKillOnDev(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	t.Parallel()
	o := agenttest.DevOptions(t, "127.0.0.124", 3)
	o.RestartAfter = 300 * time.Millisecond
	d := agenttest.StartDev(t, o, agent.Options{})
	agenttest.Leader(t, d, nil, 10*time.Second)
	term := func() uint64 { return d.Agent(0).Status().Term }
	before := term()
	for _, args := range [][]string{{"--fault", "nsmd-hang", "--node-cmd", "ssh root@{addr}"}, {"--fault", "partition", "--node-cmd", "ssh root@{addr}"},
		{"--fault", "freeze", "--freeze-cmd", "virsh suspend {node}", "--thaw-cmd", "virsh resume {node}"}} {
		cmd := drillCmd()
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs(append([]string{"--admin", d.Agent(0).AdminURL()}, args...))
		err := cmd.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), "cannot run on nsmd dev") || !strings.Contains(err.Error(), "--node-cmd") ||
			!strings.Contains(err.Error(), "e2e") || !strings.Contains(err.Error(), "nsmd-kill") {
			t.Errorf("%v on nsmd dev: %v", args, err)
		}
	}
	if term() != before {
		t.Fatalf("a refused drill changed the term %d -> %d", before, term())
	}

	html := filepath.Join(t.TempDir(), "nsmd-kill.html")
	cmd := drillCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--admin", d.Agent(0).AdminURL(), "--fault", "nsmd-kill", "--json", "--report", html, "--timeout", "15s", "--poll", "10ms"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("nsmd drill --fault nsmd-kill: %v\n%s", err, errOut.String())
	}
	var rep drill.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, out.String())
	}
	if rep.Fault != drill.FaultNSMDKill || len(rep.Runs) != 1 || !strings.Contains(rep.FaultDetail, "in-process") {
		t.Fatalf("report %+v", rep)
	}
	r := rep.Runs[0]
	// The killed node, restarted 300 ms later on its data, may win the
	// new term itself: a new term and sm_state +2 either way.
	if !r.Complete() || r.NewLeader == "" || r.NewState != r.OldState+2 {
		t.Fatalf("run %+v\n%s", r, errOut.String())
	}
	f := r.Fence
	if f == nil || f.Mode != "none" || f.By != "" || !strings.Contains(f.Note, "serves no storage") {
		t.Errorf("fence %+v, want no wait on nsmd dev", f)
	}
	if f != nil && (f.Old.Outcome != drill.OldRestarted || !f.Old.Unreachable || f.Old.BackAfterMS < 300) {
		t.Errorf("old server %+v, want restarted after being unreachable for at least the restart delay", f.Old)
	}
	if !strings.Contains(errOut.String(), "old server "+r.OldLeader+": no fence wait") || !strings.Contains(errOut.String(), "nsmd restarted") {
		t.Errorf("progress:\n%s", errOut.String())
	}
	b, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"old server proven stopped", "nsmd restarted (same boot)", "in-process"} {
		if !strings.Contains(string(b), w) {
			t.Errorf("HTML lacks %q", w)
		}
	}
}
