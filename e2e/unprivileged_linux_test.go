package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// unusedID finds a uid and gid in [60000, 65000) that no user or group
// has, so the agent runs as nobody this machine knows (as the packaged
// nsmd system user would be: no home, no groups).
func unusedID(t *testing.T) (uid, gid int) {
	t.Helper()
	for id := 60000 + os.Getpid()%4000; id < 65000; id++ {
		if _, err := user.LookupId(strconv.Itoa(id)); err == nil {
			continue
		}
		if _, err := user.LookupGroupId(strconv.Itoa(id)); err == nil {
			continue
		}
		return id, id
	}
	t.Fatal("no unused uid/gid in 60000-65000")
	return 0, 0
}

// setprivArgs runs argv as uid/gid with only the given capabilities
// (inheritable, ambient and bounding set), as the packaged systemd unit
// does with User=, AmbientCapabilities= and CapabilityBoundingSet=.
func setprivArgs(uid, gid int, caps []string, argv ...string) []string {
	plus := "+" + strings.Join(caps, ",+")
	if len(caps) == 0 {
		plus = ""
	}
	args := []string{"--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid), "--clear-groups", "--no-new-privs"}
	if plus != "" {
		args = append(args, "--inh-caps=-all,"+plus, "--ambient-caps="+plus, "--bounding-set=-all,"+plus)
	} else {
		args = append(args, "--inh-caps=-all", "--bounding-set=-all")
	}
	return append(append(args, "--"), argv...)
}

// TestAgentRunsUnprivilegedWithThreeCapabilities proves the packaged
// unit's least-privilege setup works: in a network namespace, the agent
// runs under setpriv as an unused uid/gid with only CAP_NET_ADMIN,
// CAP_NET_RAW and CAP_NET_BIND_SERVICE, on the packaged
// /etc/nsmd/nsmd.yaml (port 662, rpcbind register) plus a netlink VIP.
// It holds the VIP (the address is on an interface), answers SM_STAT on
// port 662 on loopback and on the VIP, and is registered with the real
// rpcbind. The same run without CAP_NET_ADMIN fails at start with an error
// naming CAP_NET_ADMIN and the VIP.
func TestAgentRunsUnprivilegedWithThreeCapabilities(t *testing.T) {
	if !inNetns(t) {
		return
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	// A veth pair inside the namespace: an interface with a MAC, so the
	// VIP is announced (the dummy driver may not be built).
	const vip, vipDev = "10.77.60.10/24", "nsmdvipdev0"
	for _, c := range [][]string{
		{"link", "add", vipDev, "type", "veth", "peer", "name", vipDev + "p"},
		{"addr", "add", "10.77.60.1/24", "dev", vipDev},
		{"link", "set", vipDev, "up"},
		{"link", "set", vipDev + "p", "up"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
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

	uid, gid := unusedID(t)
	// Everything the agent reads or writes, reachable by that uid: the
	// binary, the packaged config and the data directory.
	dir, err := os.MkdirTemp("", "nsmd-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "nsmd")
	conf := filepath.Join(dir, "nsmd.yaml")
	for src, dst := range map[string]string{nsmdBin: bin, "../deploy/etc/nsmd.yaml": conf} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "state")
	if err := os.Mkdir(data, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, uid, gid); err != nil {
		t.Fatal(err)
	}
	agent := []string{bin, "agent", "--config", conf, "--node-id", "solo", "--data-dir", data,
		"--vip", vip, "--vip-interface", vipDev, "--vip-mode", "netlink", "--log-level", "debug"}
	caps := []string{"net_admin", "net_raw", "net_bind_service"}

	// Without CAP_NET_ADMIN: refused at start, naming it.
	out, err := exec.Command(setpriv, setprivArgs(uid, gid, caps[1:], agent...)...).CombinedOutput()
	if err == nil {
		t.Fatalf("agent without CAP_NET_ADMIN started:\n%s", out)
	}
	if !strings.Contains(string(out), "missing capability CAP_NET_ADMIN, needed for vip_mode netlink: add the VIP "+vip) ||
		strings.Contains(string(out), "CAP_NET_RAW") || strings.Contains(string(out), "CAP_NET_BIND_SERVICE") {
		t.Errorf("agent without CAP_NET_ADMIN: want an error naming CAP_NET_ADMIN only, got:\n%s", out)
	}
	t.Logf("without CAP_NET_ADMIN: %s", strings.TrimSpace(string(out)))

	// With the three: it runs.
	p := startSetpriv(t, setpriv, setprivArgs(uid, gid, caps, agent...))
	pid := p.cmd.Process.Pid
	testutil.WaitForSeen(t, 15*time.Second, "the unprivileged agent to lead and hold the VIP", func() (bool, string) {
		var s admin.Status
		if err := getJSON("127.0.0.1:8024", "/v1/status", &s); err != nil {
			return false, err.Error()
		}
		return s.Role == "leader" && s.VIPHeld, statusLine(s)
	})
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("Uid:\t%d\t%d\t%d\t%d", uid, uid, uid, uid),
		fmt.Sprintf("Gid:\t%d\t%d\t%d\t%d", gid, gid, gid, gid),
		"CapEff:\t0000000000003400", // bits 10, 12, 13
		"CapBnd:\t0000000000003400",
	} {
		if !strings.Contains(string(status), want+"\n") {
			t.Errorf("/proc/%d/status lacks %q:\n%s", pid, want, status)
		}
	}
	addr, err := exec.Command("ip", "-o", "addr", "show", "to", strings.Split(vip, "/")[0]).CombinedOutput()
	if err != nil || !strings.Contains(string(addr), "inet "+vip) {
		t.Errorf("VIP %s not on any interface: %v %s", vip, err, addr)
	}
	t.Logf("VIP: %s", strings.TrimSpace(string(addr)))
	for _, to := range []string{"127.0.0.1:662", "10.77.60.10:662"} {
		for _, network := range []string{"udp", "tcp"} {
			var res nsm.SMStatRes
			c := dialNSM(t, network, to)
			if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: "client1"}, &res); err != nil {
				t.Errorf("SM_STAT %s %s: %v", network, to, err)
			} else if res.Res != nsm.StatSucc || res.State%2 != 1 {
				t.Errorf("SM_STAT %s %s = %+v, want stat_succ with an odd state", network, to, res)
			}
		}
	}
	for _, prot := range []uint32{oncrpc.IPProtoUDP, oncrpc.IPProtoTCP} {
		got, err := pm.GetPort(context.Background(), nsm.Program.Prog, nsm.Program.Vers, prot)
		if err != nil || got != 662 {
			t.Errorf("rpcbind GETPORT 100024/1/%d = %d, %v; want 662", prot, got, err)
		}
	}
	p.kill(syscall.SIGTERM)
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("agent exit code %d after SIGTERM", code)
	}
	if addr, _ := exec.Command("ip", "-o", "addr", "show", "to", strings.Split(vip, "/")[0]).CombinedOutput(); len(strings.TrimSpace(string(addr))) > 0 {
		t.Errorf("VIP still held after shutdown: %s", addr)
	}
}

// startSetpriv runs setpriv args... like startNsmd runs nsmd (setpriv
// execs the agent, so the pid is the agent's).
func startSetpriv(t *testing.T, setpriv string, args []string) *proc {
	t.Helper()
	p := &proc{t: t, args: args, log: &testutil.LockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(setpriv, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start setpriv: %v", err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("unprivileged nsmd log:\n%s", p.log.String())
		}
	})
	return p
}
