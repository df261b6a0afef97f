package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fence"
	"github.com/nsmd/nsmd/internal/testutil"
)

const secret = "pw-S3cr3t-42"

// fakeAgent writes a shell script into a temporary directory: it appends
// its standard input, then a line "--", to the file "calls" there, then
// runs body.
type fakeAgent struct {
	dir  string
	path string
}

func newFakeAgent(t *testing.T, body string) *fakeAgent {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "fence_fake")
	script := "#!/bin/sh\nD=" + dir + "\n{ cat; echo --; } >> \"$D/calls\"\n" + body + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return &fakeAgent{dir: dir, path: path}
}

// calls are the standard inputs of the invocations so far, as lines.
func (f *fakeAgent) calls(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, "calls"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	var cur []string
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSuffix(line, "\n")
		if line == "--" {
			out = append(out, cur)
			cur = nil
			continue
		}
		cur = append(cur, line)
	}
	return out
}

type agentOpts struct {
	timeout, backoff, maxBackoff time.Duration
	log                          *testutil.LockedBuffer
}

func newAgent(t *testing.T, f *fakeAgent, o agentOpts) *fence.Agent {
	t.Helper()
	cfg := fence.AgentConfig{
		Path: f.path,
		Args: map[string]string{"ip": "10.0.0.9", "username": "admin", "password": secret, "plug": "default"},
		NodeArgs: map[string]map[string]string{
			"s2": {"plug": "vm-s2"},
			"s3": {},
		},
		Timeout:    o.timeout,
		Backoff:    o.backoff,
		MaxBackoff: o.maxBackoff,
	}
	if o.log != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(o.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	a, err := fence.NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAgentOffStdin(t *testing.T) {
	f := newFakeAgent(t, "exit 0")
	a := newAgent(t, f, agentOpts{})
	if err := a.Off(t.Context(), "s2"); err != nil {
		t.Fatal(err)
	}
	if err := a.Off(t.Context(), "s3"); err != nil {
		t.Fatal(err)
	}
	calls := f.calls(t)
	want := [][]string{
		{"action=off", "ip=10.0.0.9", "nodename=s2", "password=" + secret, "plug=vm-s2", "username=admin"},
		{"action=off", "ip=10.0.0.9", "nodename=s3", "password=" + secret, "plug=default", "username=admin"},
	}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("stdin:\n got %q\nwant %q", calls, want)
	}
}

func TestAgentOffFails(t *testing.T) {
	f := newFakeAgent(t, `echo "Failed: Unable to connect/login to fencing device" >&2; exit 1`)
	a := newAgent(t, f, agentOpts{})
	err := a.Off(t.Context(), "s2")
	var ae *fence.AgentError
	if !errors.As(err, &ae) {
		t.Fatalf("Off = %v, want an *AgentError", err)
	}
	if ae.ExitCode != 1 || ae.TimedOut || ae.Action != "off" || ae.Node != "s2" {
		t.Fatalf("AgentError %+v", ae)
	}
	for _, w := range []string{"fence_fake action=off node=s2", "exit 1", "Unable to connect/login"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

func TestAgentUnknownNode(t *testing.T) {
	f := newFakeAgent(t, "exit 0")
	a := newAgent(t, f, agentOpts{})
	if err := a.Off(t.Context(), "s9"); !errors.Is(err, fence.ErrUnknownNode) {
		t.Fatalf("Off(unknown) = %v, want ErrUnknownNode", err)
	}
	if _, err := a.Status(t.Context(), "s9"); !errors.Is(err, fence.ErrUnknownNode) {
		t.Fatalf("Status(unknown) = %v, want ErrUnknownNode", err)
	}
	if err := a.Fence(t.Context(), "s9", nil); !errors.Is(err, fence.ErrUnknownNode) {
		t.Fatalf("Fence(unknown) = %v, want ErrUnknownNode", err)
	}
	if calls := f.calls(t); len(calls) != 0 {
		t.Fatalf("the agent ran for an unknown node: %q", calls)
	}
}

func TestAgentStatus(t *testing.T) {
	for _, c := range []struct {
		exit    int
		off     bool
		wantErr bool
	}{{0, false, false}, {2, true, false}, {1, false, true}, {8, false, true}} {
		f := newFakeAgent(t, "exit "+strconv.Itoa(c.exit))
		a := newAgent(t, f, agentOpts{})
		off, err := a.Status(t.Context(), "s2")
		if off != c.off || (err != nil) != c.wantErr {
			t.Errorf("exit %d: Status = %v, %v; want off %v, error %v", c.exit, off, err, c.off, c.wantErr)
		}
		var ae *fence.AgentError
		if c.wantErr && (!errors.As(err, &ae) || ae.ExitCode != c.exit) {
			t.Errorf("exit %d: error %v does not carry the exit code", c.exit, err)
		}
		if calls := f.calls(t); len(calls) != 1 || calls[0][0] != "action=status" {
			t.Errorf("exit %d: stdin %q", c.exit, calls)
		}
	}
}

func TestAgentMonitor(t *testing.T) {
	f := newFakeAgent(t, "exit 0")
	a := newAgent(t, f, agentOpts{})
	if err := a.Monitor(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{"action=monitor", "ip=10.0.0.9", "password=" + secret, "plug=default", "username=admin"}
	if calls := f.calls(t); len(calls) != 1 || !slices.Equal(calls[0], want) {
		t.Fatalf("stdin %q, want %q (no nodename)", calls, want)
	}

	f = newFakeAgent(t, "exit 4")
	a = newAgent(t, f, agentOpts{})
	var ae *fence.AgentError
	if err := a.Monitor(t.Context()); !errors.As(err, &ae) || ae.ExitCode != 4 || ae.Node != "" {
		t.Fatalf("Monitor = %v, want exit 4", err)
	}
}

func TestAgentOutputTail(t *testing.T) {
	f := newFakeAgent(t, `i=0; while [ $i -lt 300 ]; do echo "line $i of padding padding padding"; i=$((i+1)); done; echo LAST-LINE >&2; exit 1`)
	a := newAgent(t, f, agentOpts{})
	var ae *fence.AgentError
	if err := a.Off(t.Context(), "s2"); !errors.As(err, &ae) {
		t.Fatalf("Off = %v", err)
	}
	if !strings.HasSuffix(strings.TrimSpace(ae.Output), "LAST-LINE") || strings.Contains(ae.Output, "line 0 ") {
		t.Fatalf("output is not the tail: %q", ae.Output)
	}
	if n := len(ae.Output); n > 2048+len("…") || n < 2000 {
		t.Fatalf("output tail is %d bytes, want about 2 KiB", n)
	}
}

// Secrets stay out of logs and errors, even when the agent echoes them.
func TestAgentSecretsNotLogged(t *testing.T) {
	log := &testutil.LockedBuffer{}
	f := newFakeAgent(t, `cat "$D/calls"; exit 1`)
	a := newAgent(t, f, agentOpts{log: log, backoff: time.Millisecond})
	err := a.Off(t.Context(), "s2")
	if err == nil {
		t.Fatal("Off succeeded")
	}
	if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "password=***") {
		t.Fatalf("error does not mask the password: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	err = a.Fence(ctx, "s2", func(try int, err error) {
		if try == 2 {
			cancel()
		}
	})
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("Fence = %v", err)
	}
	out := log.String()
	if strings.Contains(out, secret) {
		t.Fatalf("the log holds the secret:\n%s", out)
	}
	if !strings.Contains(out, "password") || !strings.Contains(out, "exit=1") {
		t.Fatalf("the log does not name the keys and exit code:\n%s", out)
	}
}

func TestAgentFenceRetriesUntilSuccess(t *testing.T) {
	f := newFakeAgent(t, `n=$(cat "$D/n" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$D/n"
if [ $n -ge 3 ]; then echo "Success: Powered OFF"; exit 0; fi
echo "try $n failed"; exit 1`)
	a := newAgent(t, f, agentOpts{backoff: 20 * time.Millisecond})
	var tries []int
	var errs []error
	err := a.Fence(t.Context(), "s2", func(try int, err error) {
		tries = append(tries, try)
		errs = append(errs, err)
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(tries) != "[1 2]" {
		t.Fatalf("onAttempt tries %v, want [1 2]", tries)
	}
	if !strings.Contains(errs[1].Error(), "try 2 failed") {
		t.Fatalf("try 2's error %v does not carry its output", errs[1])
	}
	if n := len(f.calls(t)); n != 3 {
		t.Fatalf("%d invocations, want 3", n)
	}
}

func TestAgentFenceBackoffGrows(t *testing.T) {
	f := newFakeAgent(t, "exit 1")
	const backoff, maxBackoff = 20 * time.Millisecond, 80 * time.Millisecond
	a := newAgent(t, f, agentOpts{backoff: backoff, maxBackoff: maxBackoff})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var at []time.Time
	err := a.Fence(ctx, "s2", func(try int, err error) {
		at = append(at, time.Now())
		if try == 6 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Fence = %v, want context.Canceled", err)
	}
	var ae *fence.AgentError
	if !errors.As(err, &ae) || ae.ExitCode != 1 {
		t.Fatalf("Fence's error %v does not carry the last try's", err)
	}
	if len(at) != 6 {
		t.Fatalf("%d tries, want 6", len(at))
	}
	// Between the end of try i and the end of try i+1 there is at least
	// the backoff: 20, 40, 80, 80, 80 ms.
	want := backoff
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < want {
			t.Errorf("gap before try %d: %v, want at least %v", i+1, gap, want)
		}
		want = min(2*want, maxBackoff)
	}
	if n := len(f.calls(t)); n != 6 {
		t.Fatalf("%d invocations, want 6 (none after the cancel)", n)
	}
}

// isGone reports whether process pid has exited (a zombie counts: it runs
// no more).
func isGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// A hung agent, and the child it started, are killed at the timeout; no
// goroutine is left behind.
func TestAgentHangKilledAtTimeout(t *testing.T) {
	f := newFakeAgent(t, `sleep 300 & echo $! > "$D/child"; wait`)
	const timeout = 300 * time.Millisecond
	a := newAgent(t, f, agentOpts{timeout: timeout})
	goroutines := runtime.NumGoroutine()
	start := time.Now()
	err := a.Off(t.Context(), "s2")
	took := time.Since(start)
	var ae *fence.AgentError
	if !errors.As(err, &ae) || !ae.TimedOut || ae.ExitCode != -1 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Off = %v, want a timeout", err)
	}
	if !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("error %q does not say it timed out", err)
	}
	if took < timeout || took > timeout+3*time.Second {
		t.Fatalf("Off returned after %v, timeout %v", took, timeout)
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "child"))
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 2*time.Second, "the agent's child to die", func() bool { return isGone(child) })
	testutil.WaitFor(t, 2*time.Second, "no goroutine left behind", func() bool { return runtime.NumGoroutine() <= goroutines })
}

// Fence does not report success on a hang: each hung try fails, and a
// cancel stops it.
func TestAgentFenceHangNeverSucceeds(t *testing.T) {
	f := newFakeAgent(t, `sleep 300`)
	a := newAgent(t, f, agentOpts{timeout: 100 * time.Millisecond, backoff: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var timedOut int
	err := a.Fence(ctx, "s2", func(try int, err error) {
		var ae *fence.AgentError
		if errors.As(err, &ae) && ae.TimedOut {
			timedOut++
		}
		if try == 3 {
			cancel()
		}
	})
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Fence = %v, want a failure after the cancel", err)
	}
	if timedOut != 3 {
		t.Fatalf("%d tries timed out, want 3", timedOut)
	}
}

// A cancel while the agent runs stops it at once: it is not a timeout.
func TestAgentCancelKillsRunningAgent(t *testing.T) {
	f := newFakeAgent(t, `sleep 300`)
	a := newAgent(t, f, agentOpts{timeout: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- a.Off(ctx, "s2") }()
	testutil.WaitFor(t, 5*time.Second, "the agent to start", func() bool { return len(f.calls(t)) == 1 })
	cancel()
	err := <-done
	var ae *fence.AgentError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ae) || ae.TimedOut {
		t.Fatalf("Off = %v, want context.Canceled, not a timeout", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Off took %v after the cancel", took)
	}
}

func TestNewAgentValidates(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "fence_ok")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "fence_plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  fence.AgentConfig
		want string
	}{
		{"relative", fence.AgentConfig{Path: "fence_ok"}, "must be absolute"},
		{"missing", fence.AgentConfig{Path: filepath.Join(dir, "nope")}, "no such file"},
		{"directory", fence.AgentConfig{Path: dir}, "not a regular file"},
		{"bad key", fence.AgentConfig{Path: exe, Args: map[string]string{"ip addr": "x"}}, "keys are"},
		{"action", fence.AgentConfig{Path: exe, Args: map[string]string{"action": "reboot"}}, "the Agent's own"},
		{"node action", fence.AgentConfig{Path: exe, NodeArgs: map[string]map[string]string{"s1": {"action": "on"}}}, "the Agent's own"},
		{"nodename in args", fence.AgentConfig{Path: exe, Args: map[string]string{"nodename": "x"}}, "nodename is per node"},
		{"newline", fence.AgentConfig{Path: exe, Args: map[string]string{"password": "a\nb"}}, "line break"},
		{"trailing space", fence.AgentConfig{Path: exe, Args: map[string]string{"password": "ab "}}, "white space"},
		{"empty node", fence.AgentConfig{Path: exe, NodeArgs: map[string]map[string]string{"": {}}}, "empty node ID"},
		{"backoff", fence.AgentConfig{Path: exe, Backoff: time.Minute, MaxBackoff: time.Second}, "max backoff"},
	} {
		_, err := fence.NewAgent(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: NewAgent = %v, want an error with %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "a\nb") {
			t.Errorf("%s: the error holds the value: %v", c.name, err)
		}
	}
	// Root too: execute access needs an x bit for everyone.
	if _, err := fence.NewAgent(fence.AgentConfig{Path: plain}); err == nil || !strings.Contains(err.Error(), "not executable") {
		t.Errorf("not executable: NewAgent = %v", err)
	}
	if _, err := fence.NewAgent(fence.AgentConfig{Path: exe, NodeArgs: map[string]map[string]string{"s1": {"nodename": "host-1"}}}); err != nil {
		t.Errorf("valid: %v", err)
	}
}

// A value in double quotes keeps them: the agent strips one pair.
func TestAgentQuotedValue(t *testing.T) {
	f := newFakeAgent(t, "exit 0")
	a, err := fence.NewAgent(fence.AgentConfig{
		Path:     f.path,
		NodeArgs: map[string]map[string]string{"s1": {"nodename": "host-1", "plug": `"vm 1"`}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Off(t.Context(), "s1"); err != nil {
		t.Fatal(err)
	}
	want := []string{"action=off", "nodename=host-1", `plug=""vm 1""`}
	if calls := f.calls(t); len(calls) != 1 || !slices.Equal(calls[0], want) {
		t.Fatalf("stdin %q, want %q", calls, want)
	}
}

func TestAgentContextDoneBeforeStart(t *testing.T) {
	f := newFakeAgent(t, "exit 0")
	a := newAgent(t, f, agentOpts{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := a.Off(ctx, "s2"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Off = %v, want context.Canceled", err)
	}
	if err := a.Fence(ctx, "s2", nil); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "gave up after try 1") {
		t.Fatalf("Fence = %v, want context.Canceled after one try", err)
	}
	if calls := f.calls(t); len(calls) != 0 {
		t.Fatalf("the agent ran: %q", calls)
	}
}
