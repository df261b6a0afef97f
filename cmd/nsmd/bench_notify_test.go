package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestBenchNotifyHostListIsDistinctLoopbackWithEvenlySpreadDeadHosts(t *testing.T) {
	seen := map[string]bool{}
	for i := range benchNotifyMaxHosts {
		a := benchNotifyAddr(i)
		b := a.As4()
		if b[0] != 127 || b[1] == 0 || b[3] == 0 || b[3] == 255 || seen[a.String()] {
			t.Fatalf("host %d: address %v (127.x.y.z with x ≥ 1, z in 1..254, distinct)", i, a)
		}
		seen[a.String()] = true
	}
	for _, c := range []struct {
		hosts int
		pct   float64
		dead  int
	}{{50, 10, 5}, {1000, 10, 100}, {10000, 0, 0}, {10000, 10, 1000}, {7, 50, 3}, {100, 2.5, 2}} {
		dead, run, maxRun := 0, 0, 0
		for i := range c.hosts {
			if benchNotifyDead(i, c.pct) {
				dead++
				run++
				maxRun = max(maxRun, run)
			} else {
				run = 0
			}
		}
		if dead != c.dead || (c.pct <= 50 && maxRun > 1) {
			t.Errorf("%d hosts, %v%% dead: %d dead (want %d), longest run of dead hosts %d", c.hosts, c.pct, dead, c.dead, maxRun)
		}
		if live := len(benchNotifyLive(c.hosts, c.pct)); live != c.hosts-c.dead {
			t.Errorf("%d hosts, %v%% dead: %d live", c.hosts, c.pct, live)
		}
	}
}

func TestBenchNotifyRefusesBadOptions(t *testing.T) {
	good := benchNotifyOptions{Hosts: 10, DeadMode: benchDeadSilent, Fault: benchFaultKill, Timeout: time.Second, SMNotifyTimeout: time.Second, Conns: 1}
	if err := good.validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*benchNotifyOptions){
		"no hosts":       func(o *benchNotifyOptions) { o.Hosts = 0 },
		"too many hosts": func(o *benchNotifyOptions) { o.Hosts = benchNotifyMaxHosts + 1 },
		"all dead":       func(o *benchNotifyOptions) { o.DeadPct = 100 },
		"fault":          func(o *benchNotifyOptions) { o.Fault = "reboot" },
		"dead mode":      func(o *benchNotifyOptions) { o.DeadMode = "zombie" },
		"timeout":        func(o *benchNotifyOptions) { o.Timeout = 0 },
		"conns":          func(o *benchNotifyOptions) { o.Conns = 0 },
	} {
		o := good
		mod(&o)
		if err := o.validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, o)
		}
	}
}

func TestBenchNotifyPrintsTableJSONAndPlot(t *testing.T) {
	rep := &benchNotifyReport{Hosts: 10, Live: 9, Dead: 1, Fault: benchFaultKill, Nodes: 3, OldState: 3, NewState: 5,
		NSMD: benchNotifyPhase{Name: "nsmd", Live: 9, Notified: 9, CompleteMS: 12, MaxMS: 12, P50MS: 5,
			Curve: []benchNotifyPoint{{MS: 1, Count: 1}, {MS: 12, Count: 9}}},
		SMNotify: &benchNotifyPhase{Name: "sm-notify", Live: 9, Notified: 8, CompleteMS: 3000,
			Curve: []benchNotifyPoint{{MS: 10, Count: 1}, {MS: 200, Count: 8}}},
		Ratio: 250, RatioBound: true}
	var b bytes.Buffer
	printBenchNotify(&b, rep)
	for _, want := range []string{"9/9", "8/9", ">3s", "at least 250.0×", "sm_state 3 → 5"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	svg := benchNotifySVG(rep)
	if !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<polyline") != 2 || !strings.HasSuffix(svg, "</svg>\n") {
		t.Errorf("plot:\n%s", svg)
	}
	raw, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back benchNotifyReport
	if err := json.Unmarshal(raw, &back); err != nil || back.SMNotify == nil || back.NSMD.Notified != 9 {
		t.Errorf("JSON round trip: %v %+v", err, back)
	}
}

// benchNotifyCanNetns says why the namespace bench cannot run here ("" if it can).
func benchNotifyCanNetns() string {
	if runtime.GOOS != "linux" {
		return "needs Linux"
	}
	if os.Geteuid() != 0 {
		return "needs root (network namespaces, port 111)"
	}
	for _, bin := range []string{"ip", "unshare", "mount"} {
		if _, err := exec.LookPath(bin); err != nil {
			return "needs " + bin
		}
	}
	return ""
}

// TestBenchNotifyNotifiesEveryLiveHostAfterAKill runs the bench itself at
// a small scale: 50 hosts, 5 of them dead, in a namespace of its own, with
// the leader crashed; every live host must have SM_NOTIFY with the new
// state from the VIP, and the report must add up. With sm-notify installed
// it runs that too on the same hosts.
func TestBenchNotifyNotifiesEveryLiveHostAfterAKill(t *testing.T) {
	if os.Getenv(benchNotifyChildEnv) != "" {
		t.Skip("inside the bench child")
	}
	if why := benchNotifyCanNetns(); why != "" {
		t.Skip("bench notify: " + why)
	}
	o := benchNotifyOptions{Hosts: 50, DeadPct: 10, DeadMode: benchDeadSilent, Fault: benchFaultKill, Timeout: 30 * time.Second,
		SMNotifyPath: "/usr/sbin/sm-notify", SMNotifyTimeout: 30 * time.Second, Conns: 2, LogLevel: "error"}
	if _, err := os.Stat(o.SMNotifyPath); err == nil {
		o.SMNotify = true
	}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := benchNotifyNetns(ctx, o, os.Args[0], []string{"-test.run=^TestBenchNotifyChild$"}, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var table bytes.Buffer
	printBenchNotify(&table, rep)
	t.Log("\n" + table.String())

	if rep.Hosts != 50 || rep.Live != 45 || rep.Dead != 5 {
		t.Errorf("hosts %d live %d dead %d, want 50/45/5", rep.Hosts, rep.Live, rep.Dead)
	}
	if !strings.HasPrefix(rep.Netns, "nsmd-bench-") {
		t.Errorf("netns %q", rep.Netns)
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), rep.Netns) {
		t.Errorf("namespace %s still there after the run", rep.Netns)
	}
	if rep.NewState != rep.OldState+2 || rep.OldState%2 != 1 {
		t.Errorf("sm_state %d → %d, want odd and +2", rep.OldState, rep.NewState)
	}
	if rep.EarlyNotify != 0 {
		t.Errorf("%d SM_NOTIFY before the fault", rep.EarlyNotify)
	}
	n := rep.NSMD
	if n.Notified != rep.Live || n.TimedOut {
		t.Errorf("nsmd notified %d of %d live hosts (timed out %v)", n.Notified, rep.Live, n.TimedOut)
	}
	if !(n.FirstMS <= n.P50MS && n.P50MS <= n.P90MS && n.P90MS <= n.P99MS && n.P99MS <= n.MaxMS && n.MaxMS == n.CompleteMS) {
		t.Errorf("latencies out of order: %+v", n)
	}
	if n.WrongSource != 0 || n.WrongMonName != 0 || n.NotifyRx < int64(n.Notified) || n.GetportRx < int64(n.Notified) {
		t.Errorf("nsmd phase: %d from a wrong source, %d wrong mon_name, %d SM_NOTIFY and %d GETPORT received for %d hosts",
			n.WrongSource, n.WrongMonName, n.NotifyRx, n.GetportRx, n.Notified)
	}
	if last := n.Curve[len(n.Curve)-1]; last.Count != n.Notified || last.MS != n.MaxMS {
		t.Errorf("curve ends at %+v, want %d hosts at %v ms", last, n.Notified, n.MaxMS)
	}
	// Every host, dead or alive, was asked for its statd port; only the
	// live ones could be sent SM_NOTIFY.
	if s := rep.Sends; s.GetportFirst != int64(rep.Hosts) || s.NotifyFirst != int64(rep.Live) {
		t.Errorf("notifier sends %+v: want a first GETPORT to each of %d hosts and a first SM_NOTIFY to each of %d live ones", s, rep.Hosts, rep.Live)
	}
	if p := rep.SMNotify; p != nil {
		if p.Notified != rep.Live || p.WrongSource != 0 {
			t.Errorf("sm-notify notified %d of %d live hosts, %d from a wrong source: %s", p.Notified, rep.Live, p.WrongSource, p.Note)
		}
		if rep.Ratio <= 0 || rep.RatioBound {
			t.Errorf("ratio %v (lower bound %v)", rep.Ratio, rep.RatioBound)
		}
	}
}

// TestBenchNotifyChild is not a test of its own: it is the process inside
// the namespace for TestBenchNotifyNotifiesEveryLiveHostAfterAKill.
func TestBenchNotifyChild(t *testing.T) {
	if os.Getenv(benchNotifyChildEnv) == "" {
		t.Skip("the bench child (runs inside the namespace the bench test creates)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := benchNotifyChildMain(ctx, os.Stderr); err != nil {
		t.Fatal(err)
	}
}
