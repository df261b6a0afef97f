package testutil

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// NetnsPair is a pair of fresh network namespaces, A and B, for a test
// that runs again inside A: the parent process makes them (with ip
// netns), wires them with the commands Setup returns, runs the test in a
// child process inside A and reports the child's result; the child goes
// on with the test. Both namespaces are deleted by name at the end. The
// caller picks the names, so nothing but its own is ever deleted.
type NetnsPair struct {
	// Base names the namespaces: Base+"a" and Base+"b".
	Base string
	// ChildEnv is set to 1 in the child; PeerEnv to B's name.
	ChildEnv, PeerEnv string
	// Env is more of the child's environment.
	Env []string
	// Usable, when set, says why namespaces cannot be used here ("":
	// they can), beyond the root and ip (iproute2) that Run checks.
	Usable func() string
	// Setup runs in the parent once A and B exist; it returns the ip
	// commands (without "ip") that wire them, run in order. It may
	// register cleanups: they run before A and B are deleted.
	Setup func(t *testing.T, a, b string) [][]string
	// Timeout bounds the child.
	Timeout time.Duration
}

// Run runs the calling test in A. In the child it returns B's name and
// the test goes on; in the parent it waits for the child, reports its
// result (a child that skipped skips) and returns "". It skips, saying
// why, where namespaces are not usable.
func (p NetnsPair) Run(t *testing.T) string {
	t.Helper()
	if os.Getenv(p.ChildEnv) != "" {
		return os.Getenv(p.PeerEnv)
	}
	if why := p.whyNot(); why != "" {
		t.Skip("skipping namespace test: " + why)
	}
	a, b := p.Base+"a", p.Base+"b"
	for _, ns := range []string{a, b} {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
		}
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
	}
	for _, c := range p.Setup(t, a, b) {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", a, os.Args[0],
		"-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), p.ChildEnv+"=1", p.PeerEnv+"="+b, QuickRaceExit())
	cmd.Env = append(cmd.Env, p.Env...)
	out, err := cmd.CombinedOutput()
	text := string(out)
	if strings.Contains(text, "--- SKIP: "+t.Name()) {
		t.Skipf("child skipped:\n%s", text)
	}
	if err != nil || !strings.Contains(text, "--- PASS: "+t.Name()) {
		t.Fatalf("in netns %s: %v\n%s", a, err, text)
	}
	t.Logf("passed inside netns %s:\n%s", a, text)
	return ""
}

func (p NetnsPair) whyNot() string {
	if os.Geteuid() != 0 {
		return "not root: network namespaces need root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "ip (iproute2) not installed"
	}
	if p.Usable != nil {
		return p.Usable()
	}
	return ""
}

// QuickRaceExit is GORACE for a child test process: a race-enabled
// binary otherwise sleeps a second at exit (atexit_sleep_ms).
func QuickRaceExit() string {
	return strings.TrimSpace("GORACE=" + os.Getenv("GORACE") + " atexit_sleep_ms=0")
}
