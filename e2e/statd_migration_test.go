package e2e

import (
	"context"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/nsm/nsmtest"
)

// TestMigrationFromRealStatdAndBackToRealSmNotify, in a private network and
// mount namespace: the real rpc.statd (with the real rpcbind) takes an
// SM_MON and writes its monitor record; `nsmd import-statd` reads that
// directory into a running node (sm_state raised above statd's); `nsmd
// export-statd` writes the node's registrations back in statd's format;
// and the real sm-notify, run on the exported directory, notifies the
// monitored host — so the exported files are a working fallback.
func TestMigrationFromRealStatdAndBackToRealSmNotify(t *testing.T) {
	if !inNetns(t) {
		return
	}
	smNotify := lookTool(t, "sm-notify")
	// The monitored client host lives at 10.77.5.5 inside this namespace.
	if out, err := exec.Command("ip", "addr", "add", "10.77.5.5/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("add client address: %v %s", err, out)
	}

	// 1. The real rpc.statd takes an SM_MON, as Linux lockd sends it.
	rs := startRealStatd(t)
	statdDir, statdPort := rs.dir, rs.port
	priv := [16]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	c := dialNSM(t, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(statdPort))))
	mon := nsm.Mon{ID: nsm.MonID{MonName: "10.77.5.5", My: nsm.MyID{MyName: "nfs-old", Prog: 100021, Vers: 3, Proc: 16}}, Priv: priv}
	var res nsm.SMStatRes
	if err := c.Call(context.Background(), 100024, 1, nsm.ProcMon, &mon, &res); err != nil || res.Res != nsm.StatSucc {
		t.Fatalf("SM_MON to the real rpc.statd: %+v %v", res, err)
	}
	statdState := res.State
	rs.stop() // frees port 111 for the client host below

	// 2. Import into a running nsmd node.
	port := freePort(t, "127.0.0.1")
	adm := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	pmapPort := freePort(t, "10.77.5.5")
	startNsmd(t, agentArgs(t, t.TempDir(), net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), adm, freePort(t, "127.0.0.1"), pmapPort)...)
	waitLeader(t, adm, 0)
	out, err := exec.Command(nsmdBin, "import-statd", statdDir, "--admin", adm).CombinedOutput()
	if err != nil {
		t.Fatalf("import-statd: %v\n%s", err, out)
	}
	t.Logf("import-statd: %s", strings.TrimSpace(string(out)))
	var page admin.RegistrationPage
	if err := getJSON(adm, "/v1/registrations", &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Registrations) != 1 {
		t.Fatalf("registrations after import: %+v", page.Registrations)
	}
	got := page.Registrations[0]
	if got.MonName != "10.77.5.5" || got.MyName != "nfs-old" || got.Priv != hex.EncodeToString(priv[:]) || got.Callback != "127.0.0.1" {
		t.Errorf("imported %+v, want mon_name 10.77.5.5 my_name nfs-old priv %x callback 127.0.0.1", got, priv)
	}
	var s admin.Status
	if err := getJSON(adm, "/v1/status", &s); err != nil {
		t.Fatal(err)
	}
	if s.SMState <= statdState || s.SMState%2 != 1 {
		t.Errorf("sm_state after import %d; statd's was %d: want odd and above", s.SMState, statdState)
	}

	// 3. Export, and let the real sm-notify notify the host from it.
	exportDir := t.TempDir()
	if out, err := exec.Command(nsmdBin, "export-statd", exportDir, "--admin", adm).CombinedOutput(); err != nil {
		t.Fatalf("export-statd: %v\n%s", err, out)
	}
	host := nsmtest.StartHost(t, "10.77.5.5", 111)
	drain(host)
	sn := exec.Command(smNotify, "-d", "-f", "-n", "-P", exportDir, "-v", "127.0.0.1", "-m", "1")
	snOut, err := sn.CombinedOutput()
	if err != nil {
		t.Fatalf("sm-notify: %v\n%s", err, snOut)
	}
	n := host.WaitState(t, s.SMState, 5*time.Second)
	// sm-notify sends the canonical name of -v's argument.
	if n.Arg.MonName != "localhost" && n.Arg.MonName != "127.0.0.1" {
		t.Errorf("sm-notify sent mon_name %q, want 127.0.0.1's canonical name", n.Arg.MonName)
	}
	if _, err := os.Stat(filepath.Join(exportDir, "sm")); err != nil {
		t.Error(err)
	}
}

// drain empties a fake host's inbox (the node notified it after import).
func drain(h *nsmtest.Host) {
	for {
		select {
		case <-h.Notified:
		default:
			return
		}
	}
}
