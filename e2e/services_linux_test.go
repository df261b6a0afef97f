package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/bench/drill"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
)

// The services drill's three services: id → address on the bridge, and
// the server each prefers (so that each starts on its own server).
var drillServices = []struct{ id, addr, prefer string }{
	{"a", topoNet + ".101", "n1"},
	{"b", topoNet + ".102", "n2"},
	{"c", topoNet + ".103", "n3"},
}

// TestServicesEveryServerServesAndAKillMovesOneService: three agents in
// their own network namespaces, three services (services:, each with its
// own address on eth0, a hook per service, no watchdog, a fence agent
// that stands in for a power switch). At start each server serves one
// service: its address answers NSM, and each client host monitors itself
// at one service's address. SIGKILL of the server of a moves a alone:
// its new server sends SM_NOTIFY from a's address with a's new state
// (2·epoch+1) to a's client, and b's and c's clients hear nothing; b and
// c are never stopped. `nsmd move a --to n1` brings a back to the
// restarted n1, with a newer state again; the status API shows where each
// service runs.
func TestServicesEveryServerServesAndAKillMovesOneService(t *testing.T) {
	if why := canNetns(); why != "" {
		t.Skip(why)
	}
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook")
	agent := filepath.Join(dir, "fence-agent")
	var yaml strings.Builder
	yaml.WriteString("services:\n")
	for _, s := range drillServices {
		fmt.Fprintf(&yaml, "  - id: %s\n    address: %s/%d\n    interface: eth0\n    prefer: [%s]\n", s.id, s.addr, topoBits, s.prefer)
	}
	conf := filepath.Join(dir, "nsmd.yaml")
	for path, body := range map[string]string{
		// Each node's hook records what it was asked, per node; a start
		// records the addresses inside the service's namespace and in the
		// node's own, and starts the real rpcbind inside the namespace
		// (with the service's private /run), as a service's hook does:
		// nsmd registers the service's NSM there.
		hook: "#!/bin/sh\necho \"$NSMD_NODE_ID $NSMD_ROLE $NSMD_REASON $NSMD_SERVICE $NSMD_SERVICE_EPOCH $NSMD_SM_STATE\" >> " + dir + "/hooks.log\n" +
			"if [ \"$NSMD_EVENT\" = leader ] && [ \"$NSMD_SERVICE_NAMESPACES\" = on ]; then\n" +
			"  ip netns exec \"$NSMD_SERVICE_NAMESPACE\" ip -o -4 addr show > " + dir + "/addr.$NSMD_NODE_ID.$NSMD_SERVICE\n" +
			"  ip -o -4 addr show > " + dir + "/hostaddr.$NSMD_NODE_ID.$NSMD_SERVICE\n" +
			"  ip netns exec \"$NSMD_SERVICE_NAMESPACE\" sh -c 'mkdir -p \"$NSMD_SERVICE_RUN_DIR/run/rpcbind\" && mount --bind \"$NSMD_SERVICE_RUN_DIR/run\" /run && exec rpcbind -f' >/dev/null 2>&1 &\n" +
			"  echo $! >> " + dir + "/rpcbind.pids\n" +
			"fi\nexit 0\n",
		// A stand-in for a power switch: it says the node is off without
		// touching it (the test kills it itself).
		agent: "#!/bin/sh\ncat >/dev/null\nexit 0\n",
		conf:  yaml.String(),
	} {
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { killPIDsIn(t, filepath.Join(dir, "rpcbind.pids")) })
	c := startClusterWith(t, clusterSpec{clients: 3, fakeClients: true, noVIP: true, extraArgs: func(n *nsmNode) []string {
		return []string{"--config", conf, "--on-leader", hook, "--on-follower", hook, "--fence-watchdog", "off",
			"--fence-agent", agent, "--fence-nodes", "n1:plug=n1,n2:plug=n2,n3:plug=n3", "--nfsv4-tracking", "off",
			"--service-settle", "20s"}
	}})
	c.settle(t, 60*time.Second, 1)

	owners := waitServices(t, c, map[string]string{"a": "n1", "b": "n2", "c": "n3"}, 90*time.Second)
	// Each service's address is inside its own namespace on its server
	// (service_namespaces auto: on with vip_mode netlink), not in the
	// server's own.
	for i, s := range drillServices {
		node := fmt.Sprintf("n%d", i+1)
		var inside, host []byte
		testutil.WaitForSeen(t, 30*time.Second, "service "+s.id+"'s start hook on "+node, func() (bool, string) {
			inside, _ = os.ReadFile(filepath.Join(dir, "addr."+node+"."+s.id))
			host, _ = os.ReadFile(filepath.Join(dir, "hostaddr."+node+"."+s.id))
			return len(inside) > 0 && len(host) > 0, ""
		})
		if !strings.Contains(string(inside), " "+s.addr+"/") || strings.Contains(string(host), " "+s.addr+"/") {
			t.Errorf("service %s on %s: its namespace has\n%s\nthe server's own namespace has\n%s", s.id, node, inside, host)
		}
	}
	// Each client host monitors itself at one service: c1 at a, c2 at b,
	// c3 at c. The answer comes from the service's own NSM, with its state.
	for i, s := range drillServices {
		cl := c.clients[i]
		var l clientLine
		testutil.WaitForSeen(t, 30*time.Second, cl.host.name+" monitored at service "+s.id, func() (bool, string) {
			var err error
			l, err = cl.do(clientCmd{Op: "mon", Addr: s.addr, MyName: cl.myName}, 10*time.Second)
			if err != nil {
				return false, err.Error()
			}
			return nsm.Res(l.Res) == nsm.StatSucc, fmt.Sprintf("res %d state %d", l.Res, l.State)
		})
		if want := fsm.ServiceSMState(owners[s.id].Epoch); l.State != want {
			t.Fatalf("SM_MON at service %s answered state %d, want the service's %d", s.id, l.State, want)
		}
	}
	noticesBefore := func() []int {
		var n []int
		for _, cl := range c.clients {
			n = append(n, len(cl.Notices()))
		}
		return n
	}
	before := noticesBefore()

	// SIGKILL of a's server: a alone moves.
	n1 := c.nodes[0]
	if !n1.kill(syscall.SIGKILL, 10*time.Second) {
		t.Fatal("n1 did not die")
	}
	moved := waitServicesFrom(t, c, c.nodes[1], func(st map[string]admin.ServiceStatus) bool {
		return st["a"].Owner != "" && st["a"].Owner != "n1" && st["a"].Epoch > owners["a"].Epoch
	}, 90*time.Second)
	wantState := fsm.ServiceSMState(moved["a"].Epoch)
	checkServiceNotified(t, c.clients[0], drillServices[0].addr, wantState, 60*time.Second)
	// a's new server says it serves a, and how it had n1 proven stopped:
	// the fence agent's off (n1 promised no watchdog).
	for _, n := range c.nodes {
		if n.id != moved["a"].Owner {
			continue
		}
		st := waitServicesFrom(t, c, n, func(st map[string]admin.ServiceStatus) bool {
			return st["a"].State == admin.ServiceServing && st["a"].Run != nil
		}, 30*time.Second)
		if r := st["a"].Run; r.Node != n.id || r.Epoch != moved["a"].Epoch || r.LeaseSeconds <= 0 || r.Proof == nil || r.Proof.Node != "n1" || r.Proof.By != "agent" {
			t.Errorf("a on its new server %s: run %+v (proof %+v), want serving at epoch %d, n1 fenced by the agent", n.id, r, r.Proof, moved["a"].Epoch)
		}
	}
	for _, s := range []string{"b", "c"} {
		if moved[s].Owner != owners[s].Owner || moved[s].Epoch != owners[s].Epoch {
			t.Errorf("service %s moved (%s@%d → %s@%d) when a's server died", s, owners[s].Owner, owners[s].Epoch, moved[s].Owner, moved[s].Epoch)
		}
	}
	for i, cl := range c.clients[1:] {
		if got := len(cl.Notices()); got != before[i+1] {
			t.Errorf("%s (a client of %s) was notified when a moved: %+v", cl.host.name, drillServices[i+1].id, cl.Notices())
		}
	}

	// n1 comes back (as systemd would start it); the planned move brings a
	// back to it.
	n1.start(t)
	c.settle(t, 60*time.Second, 1)
	// n1 is back and a member again: a stays where it went (no
	// service_failback), until the operator moves it.
	if st := waitServicesFrom(t, c, n1, func(st map[string]admin.ServiceStatus) bool { return st["a"].Owner != "" }, 30*time.Second); st["a"].Owner != moved["a"].Owner || st["a"].Epoch != moved["a"].Epoch {
		t.Errorf("a after n1 came back: %s@%d, want still %s@%d (no failback)", st["a"].Owner, st["a"].Epoch, moved["a"].Owner, moved["a"].Epoch)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", c.top.hosts[0].ns, nsmdBin, "move", "a", "--to", "n1",
		"--admin", c.nodes[1].admin}, c.pki.cliArgs()...)...)
	testutil.WaitForSeen(t, 60*time.Second, "nsmd move a --to n1 accepted", func() (bool, string) {
		out, err := cmd.CombinedOutput()
		cmd = exec.Command(cmd.Path, cmd.Args[1:]...)
		return err == nil, string(out)
	})
	back := waitServicesFrom(t, c, c.nodes[2], func(st map[string]admin.ServiceStatus) bool {
		return st["a"].Owner == "n1" && st["a"].Epoch > moved["a"].Epoch
	}, 60*time.Second)
	checkServiceNotified(t, c.clients[0], drillServices[0].addr, fsm.ServiceSMState(back["a"].Epoch), 60*time.Second)
	if m := back["a"].LastMove; m == nil || m.To != "n1" || m.From != moved["a"].Owner {
		t.Errorf("a's last move %+v, want from %s to n1", m, moved["a"].Owner)
	}
	for i, cl := range c.clients[1:] {
		if got := len(cl.Notices()); got != before[i+1] {
			t.Errorf("%s (a client of %s) was notified by a's moves: %+v", cl.host.name, drillServices[i+1].id, cl.Notices())
		}
	}
	// The acknowledged SM_MONs are the services' own: a's holds c1's and
	// not c2's, on every node, after both moves; the node's own holds none.
	for _, n := range c.nodes {
		var a, own admin.RegistrationPage
		if err := n.get("/v1/registrations?service=a", &a); err != nil {
			t.Fatal(err)
		}
		if err := n.get("/v1/registrations", &own); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range a.Registrations {
			names = append(names, r.MonName)
		}
		if !slices.Equal(names, []string{c.clients[0].host.ip.String()}) || len(own.Registrations) != 0 {
			t.Errorf("%s: service a's registrations %v (want only %s's), the node's own %d", n.id, names, c.clients[0].host.name, len(own.Registrations))
		}
	}
	log, _ := os.ReadFile(filepath.Join(dir, "hooks.log"))
	for _, s := range []string{"b", "c"} {
		if strings.Count(string(log), " start "+s+" ") != 1 {
			t.Errorf("service %s started more than once:\n%s", s, log)
		}
	}
	// The operator's drill of one service: a planned move of b, timed; it
	// moves nothing else.
	var admins []string
	for _, n := range c.nodes {
		admins = append(admins, n.admin)
	}
	out, err := exec.Command("ip", append([]string{"netns", "exec", c.top.hosts[0].ns, nsmdBin, "drill", "--service", "b",
		"--admin", strings.Join(admins, ","), "--json", "--timeout", "40s"}, c.pki.cliArgs()...)...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("nsmd drill --service b: %v\n%s\n%s", err, out, stderr)
	}
	var rep drill.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("drill report: %v\n%s", err, out)
	}
	if len(rep.Runs) != 1 || !rep.Runs[0].Complete() || rep.Service != "b" || len(rep.Runs[0].AlsoMoved) > 0 ||
		rep.Runs[0].NewState != rep.Runs[0].OldState+2 {
		t.Errorf("nsmd drill --service b: %s", out)
	} else {
		t.Logf("nsmd drill --service b: %s → %s, milestones %+v", rep.Runs[0].OldLeader, rep.Runs[0].NewLeader, rep.Runs[0].Milestones)
	}
	t.Logf("hooks:\n%s", log)
}

// killPIDsIn kills the processes whose pids the file lists, one per line
// (what the test's hooks started; absent: none).
func killPIDsIn(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// waitServices waits until every service runs on the server want names,
// as every running node sees it, and returns the services by id.
func waitServices(t *testing.T, c *e2eCluster, want map[string]string, timeout time.Duration) map[string]admin.ServiceStatus {
	t.Helper()
	return waitServicesFrom(t, c, c.nodes[0], func(st map[string]admin.ServiceStatus) bool {
		for id, node := range want {
			// placed as the others see it, serving as its owner does.
			if st[id].Owner != node || st[id].State != admin.ServicePlaced && st[id].State != admin.ServiceServing {
				return false
			}
		}
		return true
	}, timeout)
}

// waitServicesFrom polls GET /v1/services on node n until ok holds.
func waitServicesFrom(t *testing.T, c *e2eCluster, n *nsmNode, ok func(map[string]admin.ServiceStatus) bool, timeout time.Duration) map[string]admin.ServiceStatus {
	t.Helper()
	var st map[string]admin.ServiceStatus
	testutil.WaitForSeen(t, timeout, "services as wanted, seen from "+n.id, func() (bool, string) {
		var list []admin.ServiceStatus
		if err := n.get("/v1/services", &list); err != nil {
			return false, err.Error()
		}
		st = map[string]admin.ServiceStatus{}
		var desc []string
		for _, s := range list {
			st[s.ID] = s
			desc = append(desc, fmt.Sprintf("%s=%s@%d(%s)", s.ID, s.Owner, s.Epoch, s.State))
		}
		slices.Sort(desc)
		return ok(st), strings.Join(desc, " ")
	})
	return st
}

// checkServiceNotified waits until client host cl received SM_NOTIFY with
// state from the service address addr.
func checkServiceNotified(t *testing.T, cl *clientHost, addr string, state int32, timeout time.Duration) {
	t.Helper()
	want := netip.MustParseAddr(addr)
	testutil.WaitForSeen(t, timeout, fmt.Sprintf("%s notified with state %d from %s", cl.host.name, state, addr), func() (bool, string) {
		ns := cl.Notices()
		for _, n := range ns {
			if n.from.Addr() == want && n.state == state {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", ns)
	})
}
