package e2e

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

func lookTool(t *testing.T, name string) string {
	t.Helper()
	for _, p := range []string{name, "/usr/sbin/" + name, "/sbin/" + name} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skipf("%s not installed (.ci/run installs the Debian packages rpcbind and nfs-common)", name)
	return ""
}

func rpcinfo(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(lookTool(t, "rpcinfo"), args...).CombinedOutput()
	return string(out), err
}

// startLoopbackNode starts a one-node agent on 127.0.0.1 with the given
// rpcbind mode and waits for its takeover; it returns the NSM port.
func startLoopbackNode(t *testing.T, rpcbindMode string) (*proc, int, string) {
	t.Helper()
	port := freePort(t, "127.0.0.1")
	admin := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	args := agentArgs(t, t.TempDir(), net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), admin, freePort(t, "127.0.0.1"), 111)
	for i, a := range args {
		if a == "--rpcbind" {
			args[i+1] = rpcbindMode
		}
	}
	p := startNsmd(t, args...)
	waitLeader(t, admin, 0)
	return p, port, admin
}

// TestRealRpcinfoWithEmbeddedPortmapper runs Debian's rpcinfo against a
// node that serves PMAP v2 itself (--rpcbind embedded), in a private
// network namespace because it binds port 111: `rpcinfo -p` lists 100024
// over UDP and TCP at our port, and `rpcinfo -t|-u` and `-n PORT` call NULL.
// (Debian's rpcinfo asks the portmapper on 111 even with -n.)
func TestRealRpcinfoWithEmbeddedPortmapper(t *testing.T) {
	if !inNetns(t) {
		return
	}
	_, port, _ := startLoopbackNode(t, "embedded")
	out, err := rpcinfo(t, "-p", "127.0.0.1")
	if err != nil {
		t.Fatalf("rpcinfo -p: %v\n%s", err, out)
	}
	for _, proto := range []string{"udp", "tcp"} {
		if !hasMapping(out, "100024", "1", proto, port) {
			t.Errorf("rpcinfo -p does not list 100024 v1 %s port %d:\n%s", proto, port, out)
		}
	}
	for _, args := range [][]string{
		{"-t", "127.0.0.1", "100024", "1"},
		{"-u", "127.0.0.1", "100024", "1"},
		{"-n", strconv.Itoa(port), "-t", "127.0.0.1", "100024", "1"},
		{"-n", strconv.Itoa(port), "-u", "127.0.0.1", "100024", "1"},
	} {
		if out, err := rpcinfo(t, args...); err != nil || !strings.Contains(out, "ready and waiting") {
			t.Errorf("rpcinfo %s: err=%v output=%q", strings.Join(args, " "), err, out)
		}
	}
	// A version we do not serve: PROG_MISMATCH with our range 1..1.
	// (rpcinfo cannot show it: it asks the portmapper, which has no v2.)
	c := dialNSM(t, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	var mm *oncrpc.MismatchError
	err = c.Call(context.Background(), 100024, 2, 0, oncrpc.Void{}, nil)
	if !errors.As(err, &mm) || !errors.Is(err, oncrpc.ErrProgMismatch) || mm.Low != 1 || mm.High != 1 {
		t.Errorf("NULL on version 2: %v, want PROG_MISMATCH 1..1", err)
	}
}

// hasMapping finds "prog vers proto port" in `rpcinfo -p` output.
func hasMapping(out, prog, vers, proto string, port int) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == prog && f[1] == vers && f[2] == proto && f[3] == strconv.Itoa(port) {
			return true
		}
	}
	return false
}

// TestRegistersWithRealRpcbind: with --rpcbind register the node registers
// 100024 v1 (UDP and TCP) with the real Debian rpcbind, rpcinfo reaches it
// through rpcbind, and a clean shutdown unregisters it.
func TestRegistersWithRealRpcbind(t *testing.T) {
	if !inNetns(t) {
		return
	}
	rb := exec.Command(lookTool(t, "rpcbind"), "-f", "-w")
	if err := rb.Start(); err != nil {
		t.Fatalf("start rpcbind: %v", err)
	}
	t.Cleanup(func() { rb.Process.Kill(); rb.Wait() })
	pm := oncrpc.NewPmapClient("127.0.0.1", oncrpc.ClientConfig{Timeout: 300 * time.Millisecond})
	testutil.WaitForSeen(t, 5*time.Second, "rpcbind to answer", func() (bool, string) {
		_, err := pm.Dump(context.Background())
		return err == nil, ""
	})

	p, port, _ := startLoopbackNode(t, "register")
	for _, prot := range []uint32{oncrpc.IPProtoUDP, oncrpc.IPProtoTCP} {
		got, err := pm.GetPort(context.Background(), 100024, 1, prot)
		if err != nil || int(got) != port {
			t.Errorf("rpcbind GETPORT 100024/1/%d = %d, %v; want %d", prot, got, err, port)
		}
	}
	if out, err := rpcinfo(t, "-t", "127.0.0.1", "100024", "1"); err != nil || !strings.Contains(out, "ready and waiting") {
		t.Errorf("rpcinfo -t through rpcbind: %v %q", err, out)
	}
	p.kill(syscall.SIGTERM)
	for _, prot := range []uint32{oncrpc.IPProtoUDP, oncrpc.IPProtoTCP} {
		if got, err := pm.GetPort(context.Background(), 100024, 1, prot); err == nil && got != 0 {
			t.Errorf("after shutdown rpcbind still maps 100024/1/%d to %d", prot, got)
		}
	}
}
