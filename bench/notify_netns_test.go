package bench_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/bench"
)

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
// it runs that too on the same hosts. Both ways of giving the fake hosts
// sockets: their own (per-host), and the wildcard sockets answering from
// each call's destination address — the notifier, which drops a reply
// from any address but the one it asked, and sm-notify must both accept
// those.
func TestBenchNotifyNotifiesEveryLiveHostAfterAKill(t *testing.T) {
	if os.Getenv(bench.NotifyChildEnv) != "" {
		t.Skip("inside the bench child")
	}
	if why := benchNotifyCanNetns(); why != "" {
		t.Skip("bench notify: " + why)
	}
	for _, fakes := range []string{bench.FakesPerHost, bench.FakesWildcard} {
		t.Run(fakes, func(t *testing.T) { testBenchNotify(t, fakes) })
	}
}

func testBenchNotify(t *testing.T, fakes string) {
	o := bench.NotifyOptions{Hosts: 50, DeadPct: 10, DeadMode: bench.DeadSilent, Fakes: fakes, Fault: bench.FaultKill, Timeout: 30 * time.Second,
		SMNotifyPath: "/usr/sbin/sm-notify", SMNotifyTimeout: 30 * time.Second, Conns: 2, LogLevel: "error"}
	if _, err := os.Stat(o.SMNotifyPath); err == nil {
		o.SMNotify = true
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := bench.NotifyInNetns(ctx, o, os.Args[0], []string{"-test.run=^TestBenchNotifyChild$"}, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var table bytes.Buffer
	bench.PrintNotify(&table, rep)
	t.Log("\n" + table.String())

	if rep.Fakes != fakes {
		t.Errorf("fake hosts on %q sockets, want %q", rep.Fakes, fakes)
	}
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
	if os.Getenv(bench.NotifyChildEnv) == "" {
		t.Skip("the bench child (runs inside the namespace the bench test creates)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := bench.NotifyChild(ctx, os.Stderr); err != nil {
		t.Fatal(err)
	}
}
