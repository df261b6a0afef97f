package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// outcome is what an NSM server answered to one call, in comparable form.
func outcome(res nsm.SMStatRes, err error) string {
	var mm *oncrpc.MismatchError
	switch {
	case errors.Is(err, oncrpc.ErrGarbageArgs):
		return "GARBAGE_ARGS"
	case errors.Is(err, oncrpc.ErrProcUnavail):
		return "PROC_UNAVAIL"
	case errors.As(err, &mm):
		return fmt.Sprintf("MISMATCH %d-%d", mm.Low, mm.High)
	case err != nil:
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%s state=%d", res.Res, map[bool]int32{true: -1, false: 0}[res.State == -1])
}

// rawArgs sends pre-encoded arguments (for strings over the limit, which
// our own encoder would happily write).
type rawArgs []byte

func (r rawArgs) MarshalXDR(w *oncrpc.Writer) { w.FixedOpaque(r) }

// TestAccessControlParityWithRealStatd sends the calls rpc.statd refuses
// to the real rpc.statd and to nsmd, side by side in one private network
// namespace, and requires the same result for each: SM_MON from a
// non-loopback caller, my_prog other than NLM, my_proc other than 16/24,
// mon_name with '/' or a leading '.', and strings over SM_MAXSTRLEN (1024);
// plus an unknown procedure and a wrong version. (Where nsmd deliberately
// differs — every 127/8 address and ::1 count as local — no case is sent.)
func TestAccessControlParityWithRealStatd(t *testing.T) {
	if !inNetns(t) {
		return
	}
	if out, err := exec.Command("ip", "addr", "add", "10.77.6.1/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("add a non-loopback caller address: %v %s", err, out)
	}
	rs := startRealStatd(t)
	statdPort := rs.port
	nsmdPort := freePort(t, "127.0.0.1")
	admin := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	startNsmd(t, agentArgs(t, t.TempDir(), net.JoinHostPort("0.0.0.0", strconv.Itoa(nsmdPort)), admin, freePort(t, "127.0.0.1"), 111)...)
	waitLeader(t, admin, 0)

	good := nsm.MyID{MyName: "nfs-server", Prog: 100021, Vers: 3, Proc: 16}
	mon := func(monName string, my nsm.MyID) *nsm.Mon { return &nsm.Mon{ID: nsm.MonID{MonName: monName, My: my}} }
	long := strings.Repeat("a", 1025)
	over := oncrpc.NewWriter(nil)
	over.String(long) // mon_name<1024> with 1025 bytes
	over.String("nfs-server")
	over.Uint32(100021)
	over.Uint32(3)
	over.Uint32(16)
	over.FixedOpaque(make([]byte, 16))
	type call struct {
		name   string
		from   string // source address
		vers   uint32
		proc   uint32
		args   oncrpc.Marshaler
		expect string // what both must answer (documents statd's behaviour)
	}
	cases := []call{
		{"control: SM_MON from 127.0.0.1", "127.0.0.1", 1, nsm.ProcMon, mon("10.77.6.9", good), "stat_succ state=0"},
		{"SM_MON from a non-loopback address", "10.77.6.1", 1, nsm.ProcMon, mon("10.77.6.9", good), "stat_fail state=-1"},
		{"my_prog not NLM", "127.0.0.1", 1, nsm.ProcMon, mon("10.77.6.9", nsm.MyID{MyName: "s", Prog: 100003, Vers: 3, Proc: 16}), "stat_fail state=-1"},
		{"my_proc 17", "127.0.0.1", 1, nsm.ProcMon, mon("10.77.6.9", nsm.MyID{MyName: "s", Prog: 100021, Vers: 3, Proc: 17}), "stat_fail state=-1"},
		{"mon_name with /", "127.0.0.1", 1, nsm.ProcMon, mon("a/b", good), "stat_fail state=-1"},
		{"mon_name starting with .", "127.0.0.1", 1, nsm.ProcMon, mon(".hidden", good), "stat_fail state=-1"},
		{"mon_name over 1024 bytes", "127.0.0.1", 1, nsm.ProcMon, rawArgs(over.Bytes()), "GARBAGE_ARGS"},
		{"unknown procedure 7", "127.0.0.1", 1, 7, oncrpc.Void{}, "PROC_UNAVAIL"},
	}
	servers := map[string]int{"rpc.statd": int(statdPort), "nsmd": nsmdPort}
	for _, tc := range cases {
		got := map[string]string{}
		for name, port := range servers {
			c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
				Timeout: 3 * time.Second, LocalAddr: netip.MustParseAddr(tc.from)})
			if err != nil {
				t.Fatalf("%s: dial %s: %v", tc.name, name, err)
			}
			var res nsm.SMStatRes
			err = c.Call(context.Background(), 100024, tc.vers, tc.proc, tc.args, &res)
			c.Close()
			got[name] = outcome(res, err)
		}
		if got["rpc.statd"] != got["nsmd"] || got["nsmd"] != tc.expect {
			t.Errorf("%s: rpc.statd %q, nsmd %q, want both %q", tc.name, got["rpc.statd"], got["nsmd"], tc.expect)
		} else {
			t.Logf("%-36s both: %s", tc.name, got["nsmd"])
		}
	}
}

// realStatd is the Debian rpc.statd with its own rpcbind, in the calling
// test's private namespace (see inNetns).
type realStatd struct {
	dir   string // its state directory (sm/, sm.bak/, state)
	port  uint16 // its TCP port, from rpcbind
	log   *testutil.LockedBuffer
	cmd   *exec.Cmd
	rpcbd *exec.Cmd
}

// startRealStatd starts rpcbind and `rpc.statd -F -d -L -P DIR`, waits
// until statd is registered, and stops both when the test ends (or
// earlier with stop). It logs statd's output if the test failed.
func startRealStatd(t *testing.T) *realStatd {
	t.Helper()
	statdBin, rpcbindBin := lookTool(t, "rpc.statd"), lookTool(t, "rpcbind")
	rs := &realStatd{dir: t.TempDir(), log: &testutil.LockedBuffer{}}
	rs.rpcbd = exec.Command(rpcbindBin, "-f", "-w")
	if err := rs.rpcbd.Start(); err != nil {
		t.Fatal(err)
	}
	pm := oncrpc.NewPmapClient("127.0.0.1", oncrpc.ClientConfig{Timeout: 300 * time.Millisecond})
	testutil.WaitForSeen(t, 5*time.Second, "rpcbind", func() (bool, string) { _, err := pm.Dump(context.Background()); return err == nil, "" })
	for _, sub := range []string{"sm", "sm.bak"} { // statd does not create them
		if err := os.Mkdir(filepath.Join(rs.dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	rs.cmd = exec.Command(statdBin, "-F", "-d", "-L", "-P", rs.dir)
	rs.cmd.Stdout, rs.cmd.Stderr = rs.log, rs.log
	if err := rs.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rs.stop()
		if t.Failed() {
			t.Logf("rpc.statd log:\n%s", rs.log)
		}
	})
	testutil.WaitForSeen(t, 5*time.Second, "rpc.statd registered", func() (bool, string) {
		p, err := pm.GetPort(context.Background(), 100024, 1, oncrpc.IPProtoTCP)
		rs.port = p
		return err == nil && p != 0, ""
	})
	return rs
}

// stop ends statd (SIGTERM: it unregisters and exits) and rpcbind.
func (rs *realStatd) stop() {
	for _, c := range []*exec.Cmd{rs.cmd, rs.rpcbd} {
		if c.Process != nil && c.ProcessState == nil {
			c.Process.Signal(syscall.SIGTERM)
			c.Wait()
		}
	}
}
