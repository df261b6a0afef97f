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
	"testing"
	"time"

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
	statdBin, rpcbindBin := lookTool(t, "rpc.statd"), lookTool(t, "rpcbind")
	if out, err := exec.Command("ip", "addr", "add", "10.77.6.1/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("add a non-loopback caller address: %v %s", err, out)
	}
	rb := exec.Command(rpcbindBin, "-f", "-w")
	if err := rb.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { rb.Process.Kill(); rb.Wait() }()
	pm := oncrpc.NewPmapClient("127.0.0.1", oncrpc.ClientConfig{Timeout: 300 * time.Millisecond})
	waitFor(t, 5*time.Second, "rpcbind", func() (bool, string) { _, err := pm.Dump(context.Background()); return err == nil, "" })
	dir := t.TempDir()
	for _, sub := range []string{"sm", "sm.bak"} {
		os.Mkdir(filepath.Join(dir, sub), 0o700)
	}
	statd := exec.Command(statdBin, "-F", "-L", "-P", dir)
	if err := statd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { statd.Process.Kill(); statd.Wait() }()
	var statdPort uint16
	waitFor(t, 5*time.Second, "rpc.statd registered", func() (bool, string) {
		p, err := pm.GetPort(context.Background(), 100024, 1, oncrpc.IPProtoTCP)
		statdPort = p
		return err == nil && p != 0, ""
	})
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
