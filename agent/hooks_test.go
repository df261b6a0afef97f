package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// writeScript writes an executable sh script into dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

type hookHarness struct {
	h   *hookRunner
	reg *prometheus.Registry
	log *testutil.LockedBuffer
}

func newHookHarness(t *testing.T, tune func(*config.Config)) *hookHarness {
	t.Helper()
	cfg := config.Default()
	cfg.NodeID = "node7"
	cfg.VIP = "127.0.0.100/32"
	cfg.HookTimeout = 5 * time.Second
	tune(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the harness runs hooks of configurations a node accepts: %v", err)
	}
	hh := &hookHarness{reg: prometheus.NewRegistry(), log: &testutil.LockedBuffer{}}
	log := slog.New(slog.NewTextHandler(hh.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	hh.h = newHookRunner(cfg, log, hh.reg)
	hh.h.start(context.Background())
	t.Cleanup(hh.h.stop)
	return hh
}

// count reads nsmd_hook_runs_total{hook,result}.
func (hh *hookHarness) count(t *testing.T, hook, result string) float64 {
	t.Helper()
	mfs, err := hh.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "nsmd_hook_runs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["hook"] == hook && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHookEnvironment(t *testing.T) {
	t.Setenv("NSMD_TEST_INHERITED", "from-parent")
	dir := t.TempDir()
	out := filepath.Join(dir, "env")
	script := writeScript(t, dir, "leader.sh", fmt.Sprintf(
		`printf '%%s\n' "$NSMD_EVENT" "$NSMD_NODE_ID" "$NSMD_VIP" "$NSMD_SM_STATE" "$NSMD_ROLE" "$NSMD_REASON" "$NSMD_TEST_INHERITED" > %s
echo "hello from the hook"
echo "and from stderr" >&2
printf 'no newline at the end'
`, out))
	hh := newHookHarness(t, func(c *config.Config) {
		c.OnLeader, c.OnFollower = script, writeScript(t, dir, "follower.sh", "exit 0\n")
	})
	hh.h.leader(context.Background(), fsm.Takeover{Reason: "leader_elected"}, 7)
	hh.h.stop()

	want := "leader\nnode7\n127.0.0.100/32\n7\nleader\nleader_elected\nfrom-parent\n"
	if got := readFile(t, out); got != want {
		t.Errorf("environment:\n got %q\nwant %q", got, want)
	}
	logs := hh.log.String()
	for _, s := range []string{
		`hook=on_leader event=leader`, `stream=stdout line="hello from the hook"`,
		`stream=stderr line="and from stderr"`, `line="no newline at the end"`, `msg="hook done"`,
	} {
		if !strings.Contains(logs, s) {
			t.Errorf("log lacks %q:\n%s", s, logs)
		}
	}
	if n := hh.count(t, "on_leader", hookOK); n != 1 {
		t.Errorf("on_leader ok runs = %v, want 1", n)
	}
	if f := hh.h.lastFailure(); f != nil {
		t.Errorf("lastFailure = %+v, want nil", f)
	}
}

// TestHookOrder: run returns at once while a slow leader hook runs, and
// the hooks run one at a time in the order of the events.
func TestHookOrder(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "order")
	body := fmt.Sprintf(`echo "start $NSMD_EVENT $NSMD_REASON" >> %[1]s
[ "$NSMD_EVENT" = leader ] && sleep 0.2
echo "end $NSMD_EVENT $NSMD_REASON" >> %[1]s
`, out)
	hh := newHookHarness(t, func(c *config.Config) {
		c.OnLeader = writeScript(t, dir, "leader.sh", body)
		c.OnFollower = writeScript(t, dir, "follower.sh", body)
	})
	start := time.Now()
	var want []string
	for i := range 3 {
		hh.h.leader(context.Background(), fsm.Takeover{Reason: strconv.Itoa(2 * i)}, int32(2*i+1))
		hh.h.follower(int32(2*i+1), strconv.Itoa(2*i+1))
		want = append(want, fmt.Sprintf("start leader %d", 2*i), fmt.Sprintf("end leader %d", 2*i),
			fmt.Sprintf("start follower %d", 2*i+1), fmt.Sprintf("end follower %d", 2*i+1))
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("queueing 6 hooks took %v: run must not wait for the scripts", d)
	}
	hh.h.stop() // drains the queue
	got := strings.Split(strings.TrimSpace(readFile(t, out)), "\n")
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("hook order:\n got %q\nwant %q", got, want)
	}
	if time.Since(start) < 600*time.Millisecond {
		t.Errorf("three 0.2s leader hooks finished in %v: not run one at a time", time.Since(start))
	}
}

// TestHookTimeoutKillsGroup: a script that outlives hook_timeout is killed
// with its children; the run counts as a timeout and fires on_fault.
func TestHookTimeoutKillsGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	faultOut := filepath.Join(dir, "fault")
	hh := newHookHarness(t, func(c *config.Config) {
		c.HookTimeout = time.Second // on_fault (an echo) must finish within it on a loaded machine
		c.OnFollower = writeScript(t, dir, "follower.sh", fmt.Sprintf("sleep 60 &\necho $! > %s\nsleep 60\n", pidFile))
		c.OnFault = writeScript(t, dir, "fault.sh", fmt.Sprintf(`echo "$NSMD_EVENT|$NSMD_ROLE|$NSMD_REASON" >> %s`+"\n", faultOut))
	})
	start := time.Now()
	hh.h.follower(5, "leadership_lost")
	hh.h.stop()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timed-out hook held the runner for %v", d)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, pidFile)))
	if err != nil {
		t.Fatal(err)
	}
	if processAlive(pid) {
		t.Errorf("the script's child %d (sleep 60) survived the timeout", pid)
	}
	if n := hh.count(t, "on_follower", hookTimeout); n != 1 {
		t.Errorf("on_follower timeout runs = %v, want 1", n)
	}
	f := hh.h.lastFailure()
	if f == nil || f.Hook != "on_follower" || !strings.Contains(f.Err, "timed out") {
		t.Fatalf("lastFailure = %+v, want an on_follower timeout", f)
	}
	got := strings.TrimSpace(readFile(t, faultOut))
	if !strings.HasPrefix(got, "fault|follower|hook on_follower failed: ") || !strings.Contains(got, "timed out") {
		t.Errorf("on_fault got %q", got)
	}
}

// processAlive: the pid exists and is not a zombie (a container's pid 1
// may never reap the killed child).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

// TestHookFailureFiresFault: a non-zero exit is recorded with its output,
// on_fault runs once with NSMD_REASON naming the hook, and a failing
// on_fault does not run itself again.
func TestHookFailureFiresFault(t *testing.T) {
	dir := t.TempDir()
	faultOut := filepath.Join(dir, "fault")
	hh := newHookHarness(t, func(c *config.Config) {
		c.OnLeader = writeScript(t, dir, "leader.sh", "echo 'cannot add route' >&2\nexit 3\n")
		c.OnFollower = writeScript(t, dir, "follower.sh", "exit 0\n")
		c.OnFault = writeScript(t, dir, "fault.sh", fmt.Sprintf(`echo "$NSMD_EVENT|$NSMD_SM_STATE|$NSMD_REASON" >> %s`+"\nexit 1\n", faultOut))
	})
	hh.h.leader(context.Background(), fsm.Takeover{Reason: "leader_elected"}, 9)
	hh.h.stop()

	got := strings.Split(strings.TrimSpace(readFile(t, faultOut)), "\n")
	if len(got) != 1 || !strings.HasPrefix(got[0], "fault|9|hook on_leader failed: ") || !strings.Contains(got[0], "exit status 3") {
		t.Errorf("on_fault runs: %q, want one naming on_leader and exit status 3", got)
	}
	if n := hh.count(t, "on_leader", hookFailed); n != 1 {
		t.Errorf("on_leader failed runs = %v, want 1", n)
	}
	if n := hh.count(t, "on_fault", hookFailed); n != 1 {
		t.Errorf("on_fault failed runs = %v, want 1", n)
	}
	f := hh.h.lastFailure() // the fault hook failed last
	if f == nil || f.Hook != "on_fault" || !strings.Contains(f.Err, "exit status 1") || !strings.Contains(f.Reason, "hook on_leader failed") {
		t.Errorf("lastFailure = %+v, want the on_fault failure", f)
	}
	if logs := hh.log.String(); !strings.Contains(logs, `line="cannot add route"`) || !strings.Contains(logs, `msg="hook failed"`) {
		t.Errorf("log lacks the failing hook's output:\n%s", logs)
	}
}

func TestHookLastFailureOutputAndStartError(t *testing.T) {
	dir := t.TempDir()
	hh := newHookHarness(t, func(c *config.Config) {
		c.OnLeader = writeScript(t, dir, "leader.sh", "for i in $(seq 1 30); do echo line$i; done\nexit 2\n")
		c.OnFollower = filepath.Join(dir, "missing.sh")
	})
	hh.h.leader(context.Background(), fsm.Takeover{}, 3)
	hh.h.stop()
	f := hh.h.lastFailure()
	if f == nil || f.Hook != "on_leader" || f.Event != "leader" || f.At.IsZero() {
		t.Fatalf("lastFailure = %+v", f)
	}
	lines := strings.Split(f.Output, "\n")
	if len(lines) != hookTailLines || lines[0] != "line11" || lines[len(lines)-1] != "line30" {
		t.Errorf("output tail = %q, want line11..line30", lines)
	}

	// A script that cannot start fails like any other.
	hh = newHookHarness(t, func(c *config.Config) { c.OnFollower = filepath.Join(dir, "missing.sh") })
	hh.h.follower(3, "shutdown")
	hh.h.stop()
	if f := hh.h.lastFailure(); f == nil || f.Hook != "on_follower" || !strings.Contains(f.Err, "missing.sh") {
		t.Errorf("lastFailure = %+v, want on_follower cannot start", f)
	}
	if n := hh.count(t, "on_follower", hookFailed); n != 1 {
		t.Errorf("on_follower failed runs = %v, want 1", n)
	}
}

func TestHookUnconfiguredAndNil(t *testing.T) {
	hh := newHookHarness(t, func(c *config.Config) {})
	hh.h.leader(context.Background(), fsm.Takeover{}, 1)
	hh.h.fault("leader", 1, "vip_acquire", fmt.Errorf("boom"))
	hh.h.stop()
	if f := hh.h.lastFailure(); f != nil {
		t.Errorf("lastFailure = %+v with no hooks configured", f)
	}
	var nilRunner *hookRunner // an agent without hooks
	nilRunner.start(context.Background())
	nilRunner.leader(context.Background(), fsm.Takeover{}, 1)
	nilRunner.follower(1, "")
	nilRunner.fault("", 0, "", nil)
	nilRunner.stop()
	if nilRunner.lastFailure() != nil {
		t.Error("nil runner has a failure")
	}
}

// The leader hook's channel closes only once the script (and the on_fault
// its failure triggers) has run: the agent's OnLeader waits on it, so
// SM_NOTIFY goes out after on_leader (nfsd must be up before the clients
// are told to reclaim).
func TestLeaderHookDoneOnlyAfterTheScriptAndItsFaultHookRan(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "release")
	if err := syscallMkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	leader := writeScript(t, dir, "leader", fmt.Sprintf("echo started > %s/started\nread x < %s\nexit 3\n", dir, fifo))
	fault := writeScript(t, dir, "fault", fmt.Sprintf("echo \"$NSMD_REASON\" > %s/fault.out\n", dir))
	hh := newHookHarness(t, func(c *config.Config) {
		c.OnLeader, c.OnFollower, c.OnFault = leader, writeScript(t, dir, "follower", "exit 0\n"), fault
	})
	done := hh.h.leader(context.Background(), fsm.Takeover{Reason: "leader_elected"}, 5)
	testutil.WaitFor(t, 5*time.Second, "the hook to start", func() bool {
		_, err := os.Stat(filepath.Join(dir, "started"))
		return err == nil
	})
	select {
	case <-done:
		t.Fatal("leader hook reported done while its script still runs")
	default:
	}
	if err := os.WriteFile(fifo, []byte("go\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("leader hook not done 5 s after its script was released")
	}
	b, err := os.ReadFile(filepath.Join(dir, "fault.out"))
	if err != nil || !strings.Contains(string(b), "on_leader failed") {
		t.Fatalf("on_fault had not run when the leader hook was done: %q %v", b, err)
	}
	if f := hh.h.lastFailure(); f == nil || f.Hook != "on_leader" {
		t.Fatalf("last failure: %+v", f)
	}
}
