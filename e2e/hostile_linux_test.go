package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
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

// Attacks by hostile local users and hosts on a running cluster. A local
// user is a process without privileges (setpriv to an unused uid, no
// capabilities) in a member's network namespace; lockd is a root process
// on the serving node's loopback with a privileged source port.

// nsmCallEnv carries an nsmCall to TestNSMCallHelper.
const nsmCallEnv = "NSMD_E2E_NSMCALL"

// nsmCall is one batch of NSM calls a helper process makes: op "mon"
// (SM_MON of each of MonNames), "unmon" (SM_UNMON of each) or
// "unmon_all" (SM_UNMON_ALL), as the lock manager MyName, over TCP to Addr.
type nsmCall struct {
	Addr       string   `json:"addr"`
	Op         string   `json:"op"`
	MyName     string   `json:"my_name"`
	MonNames   []string `json:"mon_names,omitempty"`
	Privileged bool     `json:"privileged,omitempty"`
	Count      int      `json:"count,omitempty"` // hold: connections to open and keep idle
	State      int32    `json:"state,omitempty"` // notify: this state every time (0: alternate 3, 5)
}

// nsmCallResult is what the helper prints: one answer per call.
type nsmCallResult struct {
	Res    []int32 `json:"res"` // stat_succ/stat_fail (mon); -1 for the others
	States []int32 `json:"states"`
	Err    string  `json:"err,omitempty"`
}

const nsmCallMarker = "NSMCALL-RESULT "

// TestNSMCallHelper is the helper process of the hostile tests; it does
// nothing in a normal run.
func TestNSMCallHelper(t *testing.T) {
	spec := os.Getenv(nsmCallEnv)
	if spec == "" {
		t.Skip("helper process of the hostile tests (runs inside a member's namespace)")
	}
	var call nsmCall
	var out nsmCallResult
	if err := json.Unmarshal([]byte(spec), &call); err != nil {
		t.Fatal(err)
	}
	if err := doNSMCall(call, &out); err != nil {
		out.Err = err.Error()
	}
	b, _ := json.Marshal(out)
	fmt.Println(nsmCallMarker + string(b))
}

func doNSMCall(call nsmCall, out *nsmCallResult) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if call.Op == "hold" {
		// Open Count idle connections, say so, and keep them until killed.
		var conns []net.Conn
		for range call.Count {
			c, err := net.Dial("tcp", call.Addr)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		fmt.Printf("HOLDING %d\n", len(conns))
		select {}
	}
	if call.Op == "pmap" {
		// SET 100021/4/udp → port Count, then UNSET 100024/1, at the
		// portmapper on Addr (from a privileged port when this process may
		// bind one): Res holds 1 for each change the portmapper made.
		p := oncrpc.NewPmapClient(call.Addr, oncrpc.ClientConfig{Timeout: 3 * time.Second})
		set, err := p.Set(ctx, oncrpc.Mapping{Prog: 100021, Vers: 4, Prot: oncrpc.IPProtoUDP, Port: uint32(call.Count)})
		if err != nil {
			return err
		}
		unset, err := p.Unset(ctx, oncrpc.Mapping{Prog: nsm.Program.Prog, Vers: nsm.Program.Vers})
		if err != nil {
			return err
		}
		for _, ok := range []bool{set, unset} {
			out.Res = append(out.Res, map[bool]int32{false: 0, true: 1}[ok])
		}
		return nil
	}
	network := "tcp"
	if call.Op == "notify" {
		network = "udp" // as sm-notify sends it
	}
	c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: network, Addr: call.Addr, Privileged: call.Privileged, Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	my := nsm.MyID{MyName: call.MyName, Prog: 100021, Vers: 4, Proc: 16}
	switch call.Op {
	case "mon":
		for i, name := range call.MonNames {
			args := nsm.Mon{ID: nsm.MonID{MonName: name, My: my}, Priv: [16]byte{byte(i), 0xee}}
			var res nsm.SMStatRes
			if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &args, &res); err != nil {
				return err
			}
			out.Res = append(out.Res, int32(res.Res))
			out.States = append(out.States, res.State)
		}
	case "unmon":
		for _, name := range call.MonNames {
			args := nsm.MonID{MonName: name, My: my}
			var res nsm.SMStat
			if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcUnmon, &args, &res); err != nil {
				return err
			}
			out.Res = append(out.Res, -1)
			out.States = append(out.States, res.State)
		}
	case "notify":
		// Count SM_NOTIFYs for MonNames[0], states alternating 3, 5, 3, …:
		// each differs from the last one seen. A held-back one gets no
		// reply; it is not waited for long.
		for i := range call.Count {
			args := nsm.StatChge{MonName: call.MonNames[0], State: int32(3 + 2*(i%2))}
			if call.State != 0 {
				args.State = call.State
			}
			cctx, ccancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err := c.Call(cctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcNotify, &args, &oncrpc.Void{})
			ccancel()
			if err == nil {
				out.Res = append(out.Res, 1)
			} else {
				out.Res = append(out.Res, 0)
			}
		}
	case "unmon_all":
		var res nsm.SMStat
		if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcUnmonAll, &my, &res); err != nil {
			return err
		}
		out.Res = append(out.Res, -1)
		out.States = append(out.States, res.State)
	default:
		return fmt.Errorf("unknown op %q", call.Op)
	}
	return nil
}

// hostile is what the attack tests share: a copy of this test binary that
// an unprivileged user may run, and the uid/gid it runs as.
type hostile struct {
	bin      string
	setpriv  string
	uid, gid int
}

func newHostile(t *testing.T) *hostile {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "nsmd-hostile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "e2e.test")
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	uid, gid := unusedID(t)
	return &hostile{bin: bin, setpriv: setpriv, uid: uid, gid: gid}
}

// run makes call from namespace ns ("": this process's): as root with a
// privileged port (lockd) when asUser is false, else as the unprivileged
// user.
func (h *hostile) run(t *testing.T, ns string, asUser bool, call nsmCall) nsmCallResult {
	t.Helper()
	argv := []string{h.bin, "-test.run", "^TestNSMCallHelper$", "-test.count=1", "-test.v"}
	if asUser {
		argv = append([]string{h.setpriv}, setprivArgs(h.uid, h.gid, nil, argv...)...)
	}
	spec, _ := json.Marshal(call)
	cmd := exec.Command(argv[0], argv[1:]...)
	if ns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	}
	cmd.Env = append(os.Environ(), nsmCallEnv+"="+string(spec))
	cmd.Dir = os.TempDir()
	b, err := cmd.CombinedOutput()
	text := string(b)
	i := strings.Index(text, nsmCallMarker)
	if i < 0 {
		t.Fatalf("helper in %s (user=%v) %s: %v\n%s", ns, asUser, spec, err, text)
	}
	var out nsmCallResult
	line, _, _ := strings.Cut(text[i+len(nsmCallMarker):], "\n")
	if err := json.Unmarshal([]byte(line), &out); err != nil {
		t.Fatalf("helper output %q: %v", line, err)
	}
	if out.Err != "" {
		t.Fatalf("helper in %s (user=%v) %s: %s", ns, asUser, spec, out.Err)
	}
	return out
}

// lockdRegistrations lists n's registrations of lock manager myName, as
// MonNames.
func lockdRegistrations(t *testing.T, n *nsmNode, myName string) []string {
	return registrationsOf(t, n, myName, "")
}

// registrationsOf lists n's registrations of lock manager myName taken on
// node owner ("": on any node), as MonNames.
func registrationsOf(t *testing.T, n *nsmNode, myName, owner string) []string {
	t.Helper()
	var page admin.RegistrationPage
	if err := n.get("/v1/registrations?limit=10000", &page); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range page.Registrations {
		if r.MyName == myName && (owner == "" || r.Node == owner) {
			out = append(out, r.MonName)
		}
	}
	return out
}

// TestHostileUnmonAllFromAnotherMember: lockd on the serving node makes
// five registrations; a local user on the standby server and one on the
// witness each send SM_MON naming the serving node's lock manager for
// every one of its clients (to take them over: the registration's node
// would become theirs), then SM_UNMON_ALL and SM_UNMON naming it, all to
// their own node's loopback NSM port. Each SM_MON is answered stat_fail;
// every registration stays, on every member, still the serving node's;
// and lockd's own SM_MON and SM_UNMON_ALL on the serving node still work.
// On a build without the ownership rules the attack removes all five
// (the negative control: run it with NSMD_BIN of such a build; the
// previous release loses them to the SM_MONs followed by SM_UNMON_ALL).
func TestHostileUnmonAllFromAnotherMember(t *testing.T) {
	h := newHostile(t)
	c := startClusterWith(t, clusterSpec{witness: true})
	v := c.settle(t, 60*time.Second, 1)
	leader := v.leader
	lockdName := nodeHostname(leader.id)
	lo := fmt.Sprintf("127.0.0.1:%d", nsmPort)
	hosts := []string{"10.77.9.1", "10.77.9.2", "10.77.9.3", "10.77.9.4", "10.77.9.5"}

	mon := h.run(t, leader.host.ns, false, nsmCall{Addr: lo, Op: "mon", MyName: lockdName, MonNames: hosts, Privileged: true})
	for i, r := range mon.Res {
		if nsm.Res(r) != nsm.StatSucc {
			t.Fatalf("lockd's SM_MON of %s: res %d", hosts[i], r)
		}
	}
	if got := lockdRegistrations(t, leader, lockdName); len(got) != len(hosts) {
		t.Fatalf("lockd's registrations: %v, want %v", got, hosts)
	}

	for _, n := range c.others(leader) {
		role := "standby server"
		if n.witness {
			role = "witness"
		}
		stolen := h.run(t, n.host.ns, true, nsmCall{Addr: lo, Op: "mon", MyName: lockdName, MonNames: hosts})
		for i, r := range stolen.Res {
			if nsm.Res(r) != nsm.StatFail {
				t.Errorf("SM_MON of %s naming %s's lockd from a local user on %s: res %d, want stat_fail", hosts[i], leader.id, n.id, r)
			}
		}
		h.run(t, n.host.ns, true, nsmCall{Addr: lo, Op: "unmon_all", MyName: lockdName})
		h.run(t, n.host.ns, true, nsmCall{Addr: lo, Op: "unmon", MyName: lockdName, MonNames: hosts[:2]})
		t.Logf("a local user on %s (%s) sent SM_MON, SM_UNMON_ALL and SM_UNMON naming %s's lockd", n.id, role, leader.id)
	}
	// The changes, had they been accepted, are committed before the
	// helper got its answer; every member has applied them once it shows
	// the leader's applied index.
	want := registrationsOf(t, leader, lockdName, leader.id)
	if len(want) != len(hosts) {
		t.Fatalf("after the attack the serving node has %d of lockd's %d registrations: %v", len(want), len(hosts), want)
	}
	for _, n := range c.nodes {
		waitApplied(t, n, leader)
		got := registrationsOf(t, n, lockdName, leader.id)
		if len(got) != len(hosts) {
			t.Fatalf("%s has %d of lockd's %d registrations after the attack: %v", n.id, len(got), len(hosts), got)
		}
	}

	// The service still answers lockd: a new SM_MON, then lockd's own
	// SM_UNMON_ALL removes all of them.
	again := h.run(t, leader.host.ns, false, nsmCall{Addr: lo, Op: "mon", MyName: lockdName, MonNames: []string{"10.77.9.6"}, Privileged: true})
	if nsm.Res(again.Res[0]) != nsm.StatSucc {
		t.Fatalf("lockd's SM_MON after the attack: res %d", again.Res[0])
	}
	h.run(t, leader.host.ns, false, nsmCall{Addr: lo, Op: "unmon_all", MyName: lockdName, Privileged: true})
	if got := lockdRegistrations(t, leader, lockdName); len(got) != 0 {
		t.Fatalf("lockd's own SM_UNMON_ALL left %v", got)
	}
}

// TestHostileUnmonDuringRollingUpgrade: one member runs an older release
// (NSMD_E2E_OLD_BIN, a build from before registrations had owners; the
// test skips without it). The new members do not propose the owner
// commands or the guarded registrations the old one would refuse: the
// attack from a new member's loopback (SM_MON naming the serving node's
// lockd, refused by the leader on its own state, then SM_UNMON_ALL)
// changes nothing, every member — the old one included — keeps
// the same registrations, and lockd's own SM_UNMON_ALL still removes them
// everywhere (no divergence).
func TestHostileUnmonDuringRollingUpgrade(t *testing.T) {
	old := os.Getenv("NSMD_E2E_OLD_BIN")
	if old == "" {
		t.Skip("NSMD_E2E_OLD_BIN (an nsmd of the previous release; make e2e builds it with make prev-release) not set")
	}
	h := newHostile(t)
	c := startClusterWith(t, clusterSpec{bins: map[string]string{}})
	v := c.settle(t, 60*time.Second, 1)
	leader := v.leader
	// A follower goes back to the older release (killed, so it stays a
	// voter, and restarted on its data): a member not upgraded yet.
	oldNode := c.others(leader)[0]
	newVersion := memberVersion(t, leader, oldNode.id)
	oldNode.kill(syscall.SIGKILL, 10*time.Second)
	c.spec.bins[oldNode.id] = old
	oldNode.start(t)
	v = c.settle(t, 60*time.Second, v.leaderStatus().SMState)
	if v.leader != leader {
		t.Fatalf("leader changed from %s to %s when %s restarted", leader.id, v.leader.id, oldNode.id)
	}
	// A downgrade is not an upgrade step (rolling upgrades go one way):
	// until gossip carries the restarted node's own advertisement, the
	// others still hold what it advertised before it was killed, and the
	// leader would take it for a member of this release. Going on only
	// once every member has it is what the emulation of "not upgraded
	// yet" needs.
	for _, n := range c.nodes {
		testutil.WaitForSeen(t, 30*time.Second, fmt.Sprintf("%s to see %s advertise the previous release", n.id, oldNode.id), func() (bool, string) {
			got := memberVersion(t, n, oldNode.id)
			return got != newVersion, "version " + got
		})
	}
	lockdName := nodeHostname(leader.id)
	lo := fmt.Sprintf("127.0.0.1:%d", nsmPort)
	hosts := []string{"10.77.9.1", "10.77.9.2", "10.77.9.3"}
	mon := h.run(t, leader.host.ns, false, nsmCall{Addr: lo, Op: "mon", MyName: lockdName, MonNames: hosts, Privileged: true})
	for i, r := range mon.Res {
		if nsm.Res(r) != nsm.StatSucc {
			t.Fatalf("lockd's SM_MON of %s: res %d", hosts[i], r)
		}
	}
	attacked := 0
	for _, n := range c.others(leader) {
		if n == oldNode {
			continue // the old release removes them: what the upgrade fixes
		}
		// The leader checks the owner on its state (not every member
		// applies guarded registrations) and refuses.
		stolen := h.run(t, n.host.ns, true, nsmCall{Addr: lo, Op: "mon", MyName: lockdName, MonNames: hosts})
		for i, r := range stolen.Res {
			if nsm.Res(r) != nsm.StatFail {
				t.Errorf("SM_MON of %s naming %s's lockd from a local user on %s: res %d, want stat_fail", hosts[i], leader.id, n.id, r)
			}
		}
		h.run(t, n.host.ns, true, nsmCall{Addr: lo, Op: "unmon_all", MyName: lockdName})
		attacked++
	}
	if attacked == 0 {
		t.Fatalf("no new member besides leader %s to attack from", leader.id)
	}
	for _, n := range c.nodes {
		waitApplied(t, n, leader)
		if got := registrationsOf(t, n, lockdName, leader.id); len(got) != len(hosts) {
			t.Fatalf("%s has %d of lockd's %d registrations after the attack: %v", n.id, len(got), len(hosts), got)
		}
	}
	h.run(t, leader.host.ns, false, nsmCall{Addr: lo, Op: "unmon_all", MyName: lockdName, Privileged: true})
	for _, n := range c.nodes {
		waitApplied(t, n, leader)
		if got := lockdRegistrations(t, n, lockdName); len(got) != 0 {
			t.Fatalf("%s kept %v after lockd's own SM_UNMON_ALL (states diverged)", n.id, got)
		}
	}
}

// memberVersion is the version n's gossip shows member id advertising.
func memberVersion(t *testing.T, n *nsmNode, id string) string {
	t.Helper()
	var ms []admin.Member
	if err := n.get("/v1/members", &ms); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.ID == id {
			return m.Version
		}
	}
	return ""
}

// waitApplied waits until n has applied everything leader had applied
// when it was called.
func waitApplied(t *testing.T, n, leader *nsmNode) {
	t.Helper()
	ls, err := leader.status()
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitForSeen(t, 10*time.Second, fmt.Sprintf("%s to apply index %d", n.id, ls.AppliedIndex), func() (bool, string) {
		s, err := n.status()
		if err != nil {
			return false, err.Error()
		}
		return s.AppliedIndex >= ls.AppliedIndex, fmt.Sprintf("applied %d", s.AppliedIndex)
	})
}

// TestHostileImportAtTheEndOfTheStateRange: an import of a state near the
// end of the int32 range (which would leave later takeovers repeating one
// state every client ignores) is refused with 400 and changes nothing;
// the next failover still raises sm_state to a new odd value. A build
// without the range check accepts it (the negative control).
func TestHostileImportAtTheEndOfTheStateRange(t *testing.T) {
	c := startClusterWith(t, clusterSpec{})
	v := c.settle(t, 60*time.Second, 1)
	leader := v.leader
	before := v.leaderStatus().SMState
	body := `{"state": 2147483640, "registrations": []}`
	resp, err := leader.http.Post("https://"+leader.admin+"/v1/import", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("import of state 2147483640: %s %s, want 400", resp.Status, msg)
	}
	t.Logf("refused: %s", strings.TrimSpace(string(msg)))
	s, err := leader.status()
	if err != nil {
		t.Fatal(err)
	}
	if s.SMState != before {
		t.Fatalf("sm_state %d after a refused import, was %d", s.SMState, before)
	}
	leader.kill(syscall.SIGKILL, 10*time.Second)
	v = c.settle(t, 60*time.Second, before+2, leader)
	if st := v.leaderStatus().SMState; st != before+2 {
		t.Fatalf("sm_state after the failover: %d, want %d", st, before+2)
	}
}

// TestHostileLocalUserOnTheDefaultAdminAPI: the packaged nsmd.yaml as
// shipped (admin API on loopback, no TLS, no token), data in
// /var/lib/nsmd (a tmpfs in this test's mount namespace). The agent
// creates its local admin token there, mode 0640. An unprivileged local
// user can still read /v1/status, but `nsmd registrations` (lockd's
// cookies) and `nsmd import-statd` of a state at the end of the range
// are refused, also when it points --token-file at the token; root's
// `nsmd registrations` works with no flag at all. A build without the
// local token lets the user in (the negative control).
func TestHostileLocalUserOnTheDefaultAdminAPI(t *testing.T) {
	if !inNetns(t) {
		return
	}
	h := newHostile(t)
	if out, err := exec.Command("mount", "-t", "tmpfs", "nsmd-varlib", "/var/lib").CombinedOutput(); err != nil {
		t.Fatalf("tmpfs on /var/lib (this namespace only): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "/var/lib").Run() })
	if err := os.Mkdir("/var/lib/nsmd", 0o750); err != nil {
		t.Fatal(err)
	}
	// The binary, somewhere the user may run it from.
	bin := filepath.Join(filepath.Dir(h.bin), "nsmd")
	b, err := os.ReadFile(nsmdBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	p := startNsmd(t, "agent", "--config", "../deploy/etc/nsmd.yaml", "--node-id", "solo", "--rpcbind", "off", "--nfsv4-tracking", "off")
	testutil.WaitForSeen(t, 15*time.Second, "the agent to serve", func() (bool, string) {
		var s admin.Status
		if err := getJSON("127.0.0.1:8024", "/v1/status", &s); err != nil {
			return false, err.Error()
		}
		return s.SMState%2 == 1, statusLine(s)
	})
	defer p.kill(syscall.SIGTERM)

	asUser := func(args ...string) (string, error) {
		cmd := exec.Command(h.setpriv, setprivArgs(h.uid, h.gid, nil, append([]string{bin}, args...)...)...)
		cmd.Dir = os.TempDir()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := asUser("status"); err != nil {
		t.Fatalf("a local user's nsmd status (a read): %v\n%s", err, out)
	}
	for _, args := range [][]string{
		{"registrations"},
		{"registrations", "--token-file", admin.DefaultLocalTokenFile},
	} {
		out, err := asUser(args...)
		if err == nil {
			t.Fatalf("a local user's nsmd %v succeeded:\n%s", args, out)
		}
		t.Logf("local user: nsmd %v: %s", args, strings.TrimSpace(out))
	}
	statd := filepath.Join(filepath.Dir(h.bin), "statd") // readable by the user
	if err := os.Mkdir(statd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(statd, "state"), binary32(2147483640), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(statd, "sm"), 0o755)
	if out, err := asUser("import-statd", statd); err == nil || !strings.Contains(out, "needs the local admin token") {
		t.Fatalf("a local user's import-statd: %v\n%s", err, out)
	}
	var s admin.Status
	if err := getJSON("127.0.0.1:8024", "/v1/status", &s); err != nil || s.SMState > 100 {
		t.Fatalf("sm_state %d after the refused import (%v)", s.SMState, err)
	}
	st, err := os.Stat(admin.DefaultLocalTokenFile)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("local token %s: %v (mode %v), want mode 0640", admin.DefaultLocalTokenFile, err, st)
	}
	// Root, no flags: the local token is read.
	if out, err := exec.Command(bin, "registrations").CombinedOutput(); err != nil {
		t.Fatalf("root's nsmd registrations: %v\n%s", err, out)
	}
}

// binary32 is statd's state file: the state as a native-endian int32.
func binary32(v int32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, uint32(v))
	return b
}

// TestHostileIdleConnectionsDoNotLockOutLockd: an unprivileged local user
// holds 100 idle TCP connections to the NSM port from 127.0.0.1 (more than
// the per-host cap of 64); lockd's SM_MON, from a privileged port, is
// still answered stat_succ. A build without the reservation refuses
// lockd's connection (the negative control).
func TestHostileIdleConnectionsDoNotLockOutLockd(t *testing.T) {
	if !inNetns(t) {
		return
	}
	h := newHostile(t)
	port := freePort(t, "127.0.0.1")
	nsmAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	adm := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	startNsmd(t, agentArgs(t, t.TempDir(), nsmAddr, adm, freePort(t, "127.0.0.1"), 111)...)
	waitLeader(t, adm, 0)

	spec, _ := json.Marshal(nsmCall{Addr: nsmAddr, Op: "hold", Count: 100})
	argv := setprivArgs(h.uid, h.gid, nil, h.bin, "-test.run", "^TestNSMCallHelper$", "-test.count=1", "-test.v")
	hold := exec.Command(h.setpriv, argv...)
	hold.Env = append(os.Environ(), nsmCallEnv+"="+string(spec))
	hold.Dir = os.TempDir()
	out, err := hold.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Process.Kill(); hold.Wait() })
	sc := bufio.NewScanner(out)
	held := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "HOLDING ") {
			held = true
			t.Logf("local user: %s idle connections to %s", strings.TrimPrefix(sc.Text(), "HOLDING "), nsmAddr)
			break
		}
	}
	if !held {
		t.Fatalf("the local user's helper did not open its connections")
	}
	go io.Copy(io.Discard, out)
	testutil.WaitForSeen(t, 5*time.Second, "the node to count the local user's connections", func() (bool, string) {
		var m string
		if err := getText(adm, "/metrics", &m); err != nil {
			return false, err.Error()
		}
		return strings.Contains(m, `nsmd_nsm_tcp_connections_total{event="refused_per_host"}`), ""
	})
	if res := doLockd(t, nsmAddr); nsm.Res(res) != nsm.StatSucc {
		t.Fatalf("lockd's SM_MON with the local user's connections open: res %d", res)
	}
}

// doLockd makes one SM_MON as lockd (root, privileged port) from this
// namespace and returns its res.
func doLockd(t *testing.T, addr string) int32 {
	t.Helper()
	var out nsmCallResult
	if err := doNSMCall(nsmCall{Addr: addr, Op: "mon", MyName: "nfs-server", MonNames: []string{"10.77.9.1"}, Privileged: true}, &out); err != nil {
		t.Fatalf("lockd's SM_MON: %v", err)
	}
	return out.Res[0]
}

// getText GETs path from the plaintext admin API at adm as text.
func getText(adm, path string, out *string) error {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + adm + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	*out = string(b)
	return err
}

// TestHostileNotifyFloodIsLimitedBeforeRaft: client host c1 is monitored;
// another client host sends 40 SM_NOTIFYs naming c1 with alternating
// states (each new, so statd's rule accepts every one). At most the
// per-name burst (4) reaches raft, the rest are held back unanswered, and
// the cluster still answers SM_STAT. A build without the limiter commits
// all of them (the negative control). Then c1 itself reboots: its
// SM_NOTIFY, from its own address, is committed at once — the forgeries
// used up only the budget of notifications from elsewhere (a build with
// one budget per name holds it back).
func TestHostileNotifyFloodIsLimitedBeforeRaft(t *testing.T) {
	h := newHostile(t)
	c := startClusterWith(t, clusterSpec{clients: 2, fakeClients: true})
	v := c.settle(t, 60*time.Second, 1)
	// A cluster with a VIP takes SM_NOTIFY on the VIP alone (what clients
	// notify): the flood goes there.
	c.probeVIP(t, v.leader)
	if !c.vipOK && c.vipMode != "none" {
		t.Skipf("needs the VIP, where SM_NOTIFY is taken: %s", c.vipWhy)
	}
	c.monAll(t, v.leader, "flood")
	victim := c.clients[0].host.ip.String()
	target := net.JoinHostPort(c.nsmTarget(v.leader).String(), strconv.Itoa(nsmPort))
	before := metricSum(t, v.leader, "nsmd_notify_received_total", `result="accepted"`)
	out := h.run(t, c.clients[1].host.ns, false, nsmCall{Addr: target, Op: "notify", MonNames: []string{victim}, Count: 40})
	answered := 0
	for _, r := range out.Res {
		answered += int(r)
	}
	accepted := metricSum(t, v.leader, "nsmd_notify_received_total", `result="accepted"`) - before
	limited := metricSum(t, v.leader, "nsmd_notify_received_total", `result="rate_limited"`)
	t.Logf("40 forged SM_NOTIFYs for %s: %d answered, %v committed, %v held back", victim, answered, accepted, limited)
	// Once held back, every other one repeats the state last committed
	// and is ignored as before; the new ones are held back.
	if accepted > 4 || limited < 15 {
		t.Fatalf("%v committed and %v held back of 40 forged SM_NOTIFYs, want at most 4 and at least 15", accepted, limited)
	}
	if err := inNetnsThread(c.top.hosts[0].ns, func() error { _, err := smStat(target); return err }); err != nil {
		t.Fatalf("SM_STAT after the flood: %v", err)
	}
	real := h.run(t, c.clients[0].host.ns, false, nsmCall{Addr: target, Op: "notify", MonNames: []string{victim}, Count: 1, State: 101})
	if real.Res[0] != 1 {
		t.Fatalf("the monitored host's own SM_NOTIFY after the flood got no reply (held back with the forgeries)")
	}
	if got := metricSum(t, v.leader, "nsmd_notify_received_total", `result="accepted"`) - before; got != accepted+1 {
		t.Fatalf("accepted %v after the host's own SM_NOTIFY, want %v", got, accepted+1)
	}
}

// metricSum is the sum of the samples of metric name on n whose labels
// contain match.
func metricSum(t *testing.T, n *nsmNode, name, match string) float64 {
	t.Helper()
	resp, err := n.http.Get("https://" + n.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, name+"{") || !strings.Contains(l, match) {
			continue
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}
