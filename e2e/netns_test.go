package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
)

// childEnv marks a test process that runs inside a namespace made by inNetns.
const childEnv = "NSMD_E2E_NETNS_CHILD"

var nsSeq atomic.Int32

// canNetns says why namespaces cannot be used here, or "" when they can.
func canNetns() string {
	if os.Geteuid() != 0 {
		return "not root: network namespaces need root"
	}
	for _, tool := range []string{"ip", "unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not installed"
		}
	}
	name := fmt.Sprintf("nsmd-probe-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Sprintf("ip netns add failed: %v: %s", err, strings.TrimSpace(string(out)))
	}
	exec.Command("ip", "netns", "del", name).Run()
	return ""
}

// inNetns runs the calling test again in a child process inside a fresh
// network namespace (only lo, up) and a private mount namespace with its
// own tmpfs on /run, so it may bind port 111 and run rpcbind and rpc.statd
// without touching the host. It returns true in the child, where the test
// body goes on; in the parent it waits for the child, reports its result
// and returns false. It skips, saying why, where namespaces are not usable.
func inNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		return true
	}
	if why := canNetns(); why != "" {
		t.Skip("skipping namespace test: " + why)
	}
	name := fmt.Sprintf("nsmd-e2e-%d-%d", os.Getpid(), nsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	if out, err := exec.Command("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v: %s", name, err, out)
	}
	args := []string{"netns", "exec", name, "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount -t tmpfs nsmd-run /run && mkdir -p /run/rpcbind && exec "$@"`, "sh",
		os.Args[0], "-test.run", "^" + t.Name() + "$", "-test.v", "-test.count=1"}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), childEnv+"=1", "NSMD_BIN="+nsmdBin)
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil || !strings.Contains(text, "--- PASS: "+t.Name()) {
		t.Fatalf("in netns %s: %v\n%s", name, err, text)
	}
	if strings.Contains(text, "--- SKIP: "+t.Name()) {
		t.Skipf("child skipped:\n%s", text)
	}
	t.Logf("passed inside netns %s", name)
	if testing.Verbose() {
		for _, l := range strings.Split(text, "\n") {
			if strings.Contains(l, ".go:") && !strings.Contains(l, "level=") {
				t.Log(strings.TrimSpace(l))
			}
		}
	}
	return false
}
