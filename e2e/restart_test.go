package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/nsm/nsmtest"
)

// agentArgs are the flags of a one-node agent on loopback. Its admin API
// needs the local token it creates in dataDir: the test's nsmd commands
// and getJSON find it through NSMD_ADMIN_LOCAL_TOKEN_FILE.
func agentArgs(t *testing.T, dataDir, nsmAddr, adm string, raftPort, pmapPort int) []string {
	t.Setenv("NSMD_ADMIN_LOCAL_TOKEN_FILE", filepath.Join(dataDir, "admin.token"))
	return []string{"agent",
		"--node-id", "n1", "--data-dir", dataDir, "--bind", "127.0.0.1",
		"--raft-port", strconv.Itoa(raftPort), "--nsm-addr", nsmAddr, "--admin-addr", adm,
		"--rpcbind", "off", "--pmap-port", strconv.Itoa(pmapPort), "--gossip-port", strconv.Itoa(freePort(t, "127.0.0.1")),
		"--notify-name", "nfs.test", "--notify-window", "1m", "--log-level", "debug"}
}

// TestKilledNodeRestartsAsRebootedServer is the core restart contract
// (DESIGN.md invariants 1, 2 and 4 on one node): SIGKILL right after an
// SM_MON is answered stat_succ; on restart the registration is still there,
// sm_state has risen by exactly 2 and is odd, and the monitored host's
// statd — found through its portmapper, as sm-notify does — receives
// SM_NOTIFY{mon_name: notify name, state: the new state}.
func TestKilledNodeRestartsAsRebootedServer(t *testing.T) {
	dir := t.TempDir()
	pmapPort := freePort(t, "127.0.0.50")
	client := nsmtest.StartHost(t, "127.0.0.50", pmapPort)
	nsmAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	adm := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	args := agentArgs(t, dir, nsmAddr, adm, freePort(t, "127.0.0.1"), pmapPort)

	first := startNsmd(t, args...)
	s1 := waitLeader(t, adm, 0)

	var priv [16]byte
	rand.Read(priv[:])
	mon := nsm.Mon{ID: nsm.MonID{MonName: "127.0.0.50", My: nsm.MyID{MyName: "nfs-server-1", Prog: 100021, Vers: 3, Proc: 16}}, Priv: priv}
	var res nsm.SMStatRes
	c := dialNSM(t, "tcp", nsmAddr)
	if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res); err != nil {
		t.Fatalf("SM_MON: %v", err)
	}
	if res.Res != nsm.StatSucc || res.State != s1.SMState {
		t.Fatalf("SM_MON = %+v, want stat_succ with state %d", res, s1.SMState)
	}
	first.kill(syscall.SIGKILL) // right after the reply: the registration must already be durable
	c.Close()

	startNsmd(t, args...)
	s2 := waitLeader(t, adm, s1.SMState)
	if s2.SMState != s1.SMState+2 {
		t.Errorf("sm_state after restart = %d, want %d (+2)", s2.SMState, s1.SMState+2)
	}
	if s2.Registrations != 1 {
		t.Errorf("registrations after restart = %d, want 1", s2.Registrations)
	}
	if s2.GraceUntil == nil || time.Until(*s2.GraceUntil) < 60*time.Second {
		t.Errorf("grace_until = %v, want about 90s ahead", s2.GraceUntil)
	}
	var page admin.RegistrationPage
	if err := getJSON(adm, "/v1/registrations", &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Registrations) != 1 || page.Registrations[0].MonName != "127.0.0.50" || page.Registrations[0].Priv != hex.EncodeToString(priv[:]) {
		t.Errorf("registrations after restart = %+v", page.Registrations)
	}

	select {
	case n := <-client.Notified:
		if n.Arg.MonName != "nfs.test" || n.Arg.State != s2.SMState {
			t.Errorf("SM_NOTIFY = %+v, want {nfs.test %d}", n.Arg, s2.SMState)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no SM_NOTIFY reached the monitored host within 10s of the restart")
	}
	testutil.WaitForSeen(t, 5*time.Second, "notify done", func() (bool, string) {
		var s admin.Status
		if err := getJSON(adm, "/v1/status", &s); err != nil {
			return false, err.Error()
		}
		return s.Notify.Done == 1 && s.Notify.Pending == 0, fmt.Sprintf("%+v", s.Notify)
	})
}
