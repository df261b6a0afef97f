package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/nlm"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/nsm/nsmtest"
	"github.com/nsmd/nsmd/oncrpc"
)

// TestInteropWithRealPeers runs the 3-node cluster (netlink VIP) with the
// real Debian rpcbind on every node and two client hosts running the real
// rpcbind + rpc.statd, and checks, in this order:
//
//  1. rpcinfo -p / -t / -u against the VIP (real rpcinfo → real rpcbind on
//     the leader → nsmd);
//  2. the kernel-lockd-shaped SM_MON works on every node, leader or
//     follower, through the node's rpcbind;
//  3. a real client rpc.statd monitoring us is told of a failover by our
//     SM_NOTIFY from the VIP and calls its lock manager back with the new
//     state and its cookie; a repeat of that state triggers no callback;
//  4. after a planned step-down the VIP is answered by the new leader, not
//     the old one;
//  5. the real sm-notify of a rebooted client, started while the leader is
//     being killed, is accepted and committed, and every owning node calls
//     its lock manager back (UDP, loopback, privileged port, via rpcbind) —
//     the killed one too, once restarted;
//  6. every packet of all that, captured on the bridge and on every
//     namespace's loopback, is dissected by tshark as ONC RPC (portmap,
//     NSM, NLM) with no malformed-packet mark.
func TestInteropWithRealPeers(t *testing.T) {
	if os.Getenv(clientHostEnv) != "" || os.Getenv(realStatdEnv) != "" {
		t.Skip("inside a helper process")
	}
	if why := canNetns(); why != "" {
		t.Skip("skipping interop tests: " + why)
	}
	if os.Getenv("NSMD_E2E_VIP_MODE") == "none" {
		t.Skip("the interop test needs the VIP (NSMD_E2E_VIP_MODE=none)")
	}
	rpcinfoBin := lookTool(t, "rpcinfo")
	for _, tool := range []string{"rpcbind", "rpc.statd", "sm-notify", "dumpcap", "tshark"} {
		lookTool(t, tool)
	}

	capDir := os.Getenv("NSMD_E2E_CAPTURES") // keep the pcaps there
	if capDir == "" {
		capDir = t.TempDir()
	}
	var caps []*capture
	hostsFile := filepath.Join(t.TempDir(), "hosts")
	c := startClusterWith(t, clusterSpec{clients: 2, realRpcbind: true, beforeNodes: func(top *topology) {
		caps = append(caps, startCapture(t, top.sw, "br0", "bridge", capDir, top.hosts[0].ns, top.hosts[1].ip.String()))
		lines := []string{"127.0.0.1 localhost", vipString + " " + notifyName}
		for _, h := range append(slices.Clone(top.nodes), top.hosts...) {
			caps = append(caps, startCapture(t, h.ns, "lo", h.name+"-lo", capDir, h.ns, "127.0.0.1"))
			name := h.name + ".e2e"
			if slices.Contains(top.nodes, h) {
				name = nodeHostname(h.name)
			}
			lines = append(lines, h.ip.String()+" "+name)
		}
		if err := os.WriteFile(hostsFile, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}})
	h1, h2 := c.top.hosts[0], c.top.hosts[1]
	client1 := startRealStatdHost(t, h1, hostsFile) // the client whose statd monitors us
	client2 := startRealStatdHost(t, h2, hostsFile) // the client that reboots (sm-notify)
	first := c.settle(t, 30*time.Second, 1)
	c.probeVIP(t, first.leader)
	if !c.vipOK {
		t.Fatalf("the VIP is needed here: %s", c.vipWhy)
	}
	m := c.watch.Mark()
	leader, st := c.restore(t)
	vip := c.vip.String()

	// 1. rpcinfo against the VIP.
	t.Run("rpcinfo-vip", func(t *testing.T) {
		out, err := nsCmd(h2.ns, rpcinfoBin, "-p", vip)
		if err != nil || !hasMapping(out, "100024", "1", "udp", nsmPort) || !hasMapping(out, "100024", "1", "tcp", nsmPort) {
			t.Fatalf("rpcinfo -p %s: %v\n%s", vip, err, out)
		}
		for _, proto := range []string{"-t", "-u"} {
			if out, err := nsCmd(h2.ns, rpcinfoBin, proto, vip, "100024", "1"); err != nil || !strings.Contains(out, "ready and waiting") {
				t.Errorf("rpcinfo %s %s 100024 1: %v\n%s", proto, vip, err, out)
			}
		}
	})

	// 2. Kernel-lockd-shaped SM_MON on every node for both clients.
	lms := map[string]*lockMgr{}
	privs := map[string]string{} // node id|client → cookie
	for _, n := range c.nodes {
		lms[n.id] = startLockMgr(t, n.host)
		for _, h := range []*netHost{h1, h2} {
			res, priv, err := lockdMon(n.host, h.ip.String(), nodeHostname(n.id))
			if err != nil {
				t.Fatal(err)
			}
			if res.Res != nsm.StatSucc || res.State != st.SMState {
				t.Fatalf("lockd-shaped SM_MON{%s} on %s: res %d state %d, want stat_succ and %d", h.ip, n.id, res.Res, res.State, st.SMState)
			}
			privs[n.id+"|"+h.name] = hex.EncodeToString(priv[:])
			c.mu.Lock()
			c.acked[h.ip.String()+"|"+nodeHostname(n.id)] = ackedMon{monName: h.ip.String(), myName: nodeHostname(n.id), priv: privs[n.id+"|"+h.name], state: res.State}
			c.mu.Unlock()
		}
		role := "follower"
		if n == leader {
			role = "leader"
		}
		t.Logf("kernel-lockd-shaped SM_MON through %s's rpcbind (%s): stat_succ, state %d", n.id, role, st.SMState)
	}
	c.checkRegistrations(t, leader)

	// 3. The real client statd: its lock manager monitors us by name.
	lm1 := startLockMgr(t, h1)
	res, priv1, err := lockdMon(h1, notifyName, "c1.e2e")
	if err != nil || res.Res != nsm.StatSucc {
		t.Fatalf("SM_MON{%s} on the real rpc.statd of %s: %+v %v\n%s", notifyName, h1.name, res, err, client1.log.String())
	}
	if !leader.kill(syscall.SIGKILL, 5*time.Second) {
		t.Fatalf("%s did not die of SIGKILL", leader.id)
	}
	s1, _ := c.waitNewState(t, st.SMState, 30*time.Second, c.others(leader))
	cb := lm1.next(t, 30*time.Second, "real rpc.statd after our failover")
	checkStatdCallback(t, cb, s1, priv1)
	t.Logf("failover 1 (SIGKILL %s): the real rpc.statd on %s called its lock manager back: %s state %d, cookie ok",
		leader.id, h1.name, cb.Status.MonName, cb.Status.State)
	leader.start(t)
	l2, _ := c.checkInvariants(t, m, true)

	// ... a repeat of state s1 (what a retransmission by us looks like),
	// from the VIP, must not make it call back again: the next callback
	// is the one for the planned transfer's state.
	repeatNotify(t, l2.host, c.vip, h1.ip, client1.port, s1)
	m = c.watch.Mark()
	if out, err := nsCmd(l2.host.ns, nsmdBin, append([]string{"transfer-leadership", "--admin", l2.admin, "--json"}, c.pki.cliArgs()...)...); err != nil {
		t.Fatalf("transfer-leadership: %v %s", err, out)
	}
	s2, _ := c.waitNewState(t, s1, 30*time.Second, c.others(l2))
	cb = lm1.next(t, 30*time.Second, "real rpc.statd after the transfer")
	if cb.Status.State == s1 {
		t.Fatalf("the real rpc.statd called back a second time for the repeated state %d", s1)
	}
	checkStatdCallback(t, cb, s2, priv1)
	t.Logf("repeated SM_NOTIFY{%s, %d} from the VIP: no callback; transfer → callback with state %d", notifyName, s1, s2)
	l3, _ := c.checkInvariants(t, m, true)

	// 4. After the step-down the VIP is the new leader's.
	t.Run("vip-after-step-down", func(t *testing.T) {
		if l3 == l2 {
			t.Fatalf("leadership did not move from %s", l2.id)
		}
		if h := c.watch.Holders(); !slices.Equal(h, []string{l3.id}) {
			t.Fatalf("VIP holders %v, want only %s", h, l3.id)
		}
		if out, err := nsCmd(l2.host.ns, "ip", "-br", "addr", "show", "dev", "eth0"); err != nil || strings.Contains(out, vip+"/") {
			t.Errorf("old leader %s still has the VIP: %v %s", l2.id, err, out)
		}
		for _, proto := range []string{"-t", "-u"} {
			if out, err := nsCmd(h2.ns, rpcinfoBin, proto, vip, "100024", "1"); err != nil || !strings.Contains(out, "ready and waiting") {
				t.Errorf("rpcinfo %s %s 100024 1 after the step-down: %v\n%s", proto, vip, err, out)
			}
		}
		if out, err := nsCmd(h2.ns, rpcinfoBin, "-p", vip); err != nil || !hasMapping(out, "100024", "1", "tcp", nsmPort) {
			t.Errorf("rpcinfo -p %s after the step-down: %v\n%s", vip, err, out)
		}
		mac, err := linkMAC(l3.host.ns)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := neighMAC(h2.ns, vip); err != nil || got != mac {
			t.Errorf("%s reaches the VIP at %q (%v); the new leader %s is %s", h2.name, got, err, l3.id, mac)
		} else {
			t.Logf("after the step-down %s answers rpcinfo on the VIP (MAC %s); %s no longer has it", l3.id, mac, l2.id)
		}
	})

	// 5. The real sm-notify of a rebooted client, across a failover.
	m = c.watch.Mark()
	const rebootState = 41
	var rebootPriv [nsm.PrivLen]byte
	copy(rebootPriv[:], "sm-notify-cookie")
	if !l3.kill(syscall.SIGKILL, 5*time.Second) {
		t.Fatalf("%s did not die of SIGKILL", l3.id)
	}
	snDone := client2.smNotify(t, smNotifyCmd{Server: vip, Source: h2.ip.String(), State: rebootState,
		Priv: hex.EncodeToString(rebootPriv[:]), MyName: "c2.e2e"})
	t0 := time.Now()
	var sn realStatdLine
	select {
	case sn = <-snDone:
	case <-time.After(70 * time.Second):
		t.Fatalf("sm-notify on %s did not finish within 70s", h2.name)
	}
	if sn.Err != "" {
		t.Fatalf("sm-notify: %s\n%s", sn.Err, sn.Out)
	}
	t.Logf("sm-notify started as %s was killed; it finished after %v", l3.id, time.Unix(0, sn.At).Sub(t0).Round(time.Millisecond))
	for _, n := range c.others(l3) {
		cb := lms[n.id].next(t, 30*time.Second, "sm-notify of "+h2.name)
		if cb.Status.State != rebootState || hex.EncodeToString(cb.Status.Priv[:]) != privs[n.id+"|"+h2.name] {
			t.Errorf("%s's lock manager got %+v, want state %d and cookie %s", n.id, cb.Status, rebootState, privs[n.id+"|"+h2.name])
		}
		if !cb.From.Addr().IsLoopback() || cb.From.Port() >= 1024 {
			t.Errorf("%s: callback from %s, want 127.0.0.1 and a privileged port", n.id, cb.From)
		}
		t.Logf("%s delivered the reboot of %s to its lock manager from %s: state %d, mon_name %s", n.id, h2.name, cb.From, cb.Status.State, cb.Status.MonName)
	}
	// The killed node owns a registration of c2 too and missed the
	// notification while down: it delivers it once it has caught up (the
	// entry is not in its log from before the restart, so it is no replay;
	// its lock manager kept running and still holds c2's locks).
	l3.start(t)
	cb = lms[l3.id].next(t, 30*time.Second, "sm-notify of "+h2.name+" after the restart of "+l3.id)
	if cb.Status.State != rebootState || hex.EncodeToString(cb.Status.Priv[:]) != privs[l3.id+"|"+h2.name] {
		t.Errorf("%s's lock manager got %+v after the restart, want state %d and cookie %s", l3.id, cb.Status, rebootState, privs[l3.id+"|"+h2.name])
	}
	t.Logf("%s, restarted, delivered the reboot it missed from %s", l3.id, cb.From)
	c.checkInvariants(t, m, true)

	// 6. Dissect every capture.
	for _, cp := range caps {
		cp.flush(t)
		cp.stop()
	}
	checkCaptures(t, c, caps, client1.port)
}

// checkStatdCallback checks the real rpc.statd's callback to the stand-in
// lock manager: our notify name, the new state, the lock manager's cookie,
// from loopback.
func checkStatdCallback(t *testing.T, cb nsmtest.Callback, state int32, priv [nsm.PrivLen]byte) {
	t.Helper()
	if cb.Status.MonName != notifyName || cb.Status.State != state || cb.Status.Priv != priv {
		t.Fatalf("rpc.statd called back %+v, want {%s, %d, cookie %x}", cb.Status, notifyName, state, priv)
	}
	if !cb.From.Addr().IsLoopback() {
		t.Errorf("rpc.statd's callback came from %s, want loopback", cb.From)
	}
}

// repeatNotify sends SM_NOTIFY{notify name, state} from the VIP (bound in
// the leader's namespace) to a client's statd, as a retransmission of ours
// would look, and waits for its (void) reply.
func repeatNotify(t *testing.T, leader *netHost, vip, client netip.Addr, port int, state int32) {
	t.Helper()
	err := inNetnsThread(leader.ns, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cl, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "udp", Addr: net.JoinHostPort(client.String(), strconv.Itoa(port)),
			LocalAddr: vip, Timeout: 4 * time.Second, Retransmit: 500 * time.Millisecond})
		if err != nil {
			return err
		}
		defer cl.Close()
		return cl.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcNotify, &nsm.StatChge{MonName: notifyName, State: state}, &oncrpc.Void{})
	})
	if err != nil {
		t.Fatalf("repeat SM_NOTIFY to %s: %v", client, err)
	}
}

// linkMAC is eth0's hardware address in namespace ns.
func linkMAC(ns string) (string, error) {
	out, err := nsCmd(ns, "ip", "-j", "link", "show", "dev", "eth0")
	if err != nil {
		return "", err
	}
	var links []struct {
		Address string `json:"address"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		return "", fmt.Errorf("ip -j link in %s: %v %q", ns, err, out)
	}
	return links[0].Address, nil
}

// neighMAC is the hardware address namespace ns resolves ip to.
func neighMAC(ns, ip string) (string, error) {
	out, err := nsCmd(ns, "ip", "-j", "neigh", "show", ip)
	if err != nil {
		return "", err
	}
	var ns_ []struct {
		LLAddr string `json:"lladdr"`
	}
	if err := json.Unmarshal([]byte(out), &ns_); err != nil || len(ns_) == 0 {
		return "", fmt.Errorf("ip -j neigh show %s: %v %q", ip, err, out)
	}
	return ns_[0].LLAddr, nil
}

// checkCaptures: nothing malformed; every UDP datagram and TCP payload
// dissected as ONC RPC (nsmd's forwarding program between nodes too, as an
// RPC program Wireshark does not know); and the traffic the test is about
// is there, dissected by the portmap, NSM and NLM dissectors.
func checkCaptures(t *testing.T, c *e2eCluster, caps []*capture, statdPort int) {
	t.Helper()
	var all []rpcMsg
	for _, cp := range caps {
		d := dissect(t, cp)
		if len(d.malformed) > 0 {
			t.Errorf("%s: %d malformed frame(s):\n%s", cp.name, len(d.malformed), strings.Join(d.malformed, "\n"))
		}
		for _, u := range d.undissected {
			t.Errorf("%s: frame not dissected as ONC RPC: %s", cp.name, u)
		}
		t.Logf("capture %s: %d frames, %d RPC messages, %d malformed, %d not RPC", cp.name, d.frames, len(d.msgs), len(d.malformed), len(d.undissected))
		all = append(all, d.msgs...)
	}
	count := func(what string, ok func(rpcMsg) bool) []rpcMsg {
		var out []rpcMsg
		for _, m := range all {
			if ok(m) {
				out = append(out, m)
			}
		}
		if len(out) == 0 {
			t.Errorf("no %s in the captures", what)
		} else {
			t.Logf("dissected %d × %s, e.g. %s", len(out), what, out[0])
		}
		return out
	}
	call := func(prog, vers, proc uint32) func(rpcMsg) bool {
		return func(m rpcMsg) bool { return !m.reply && m.prog == prog && m.vers == vers && m.proc == proc }
	}
	vip := c.vip.String()
	if mons := count("SM_MON calls (lockd shape, node loopback)", func(m rpcMsg) bool {
		return call(100024, 1, nsm.ProcMon)(m) && strings.HasPrefix(m.capture, "n") && strings.HasPrefix(m.src, "127.0.0.1:")
	}); len(mons) != 2*len(c.nodes) {
		t.Errorf("%d lockd-shaped SM_MON calls in the captures, want %d", len(mons), 2*len(c.nodes))
	}
	count("SM_MON replies", func(m rpcMsg) bool { return m.reply && m.prog == 100024 && m.proc == nsm.ProcMon })
	notifies := count("SM_NOTIFY calls from the cluster to client statds (bridge)", func(m rpcMsg) bool {
		return call(100024, 1, nsm.ProcNotify)(m) && m.capture == "bridge" && strings.HasSuffix(m.dst, ":"+strconv.Itoa(statdPort)) && strings.Contains(m.names, notifyName)
	})
	for _, n := range notifies {
		if !strings.HasPrefix(n.src, vip+":") {
			t.Errorf("SM_NOTIFY not from the VIP: %s", n)
		}
	}
	count("SM_NOTIFY from the real sm-notify to the VIP", func(m rpcMsg) bool {
		return call(100024, 1, nsm.ProcNotify)(m) && m.capture == "bridge" && strings.HasPrefix(m.dst, vip+":")
	})
	count("SM_NOTIFY replies from the VIP", func(m rpcMsg) bool {
		return m.reply && m.prog == 100024 && m.proc == nsm.ProcNotify && strings.HasPrefix(m.src, vip+":")
	})
	count("portmapper GETPORT calls to the VIP", func(m rpcMsg) bool {
		return call(oncrpc.PmapProg, oncrpc.PmapVers, 3)(m) && strings.HasPrefix(m.dst, vip+":111")
	})
	if cbs := count("NLM callbacks (proc 16) from nsmd to node lock managers", func(m rpcMsg) bool {
		return call(nlm.Program, 3, nlm.ProcSMNotify)(m) && strings.HasPrefix(m.capture, "n")
	}); len(cbs) < len(c.nodes) {
		t.Errorf("%d NLM callbacks from nsmd in the captures, want one per node (%d)", len(cbs), len(c.nodes))
	}
	count("NLM callbacks (proc 16) from the real rpc.statd to its lock manager", func(m rpcMsg) bool {
		return call(nlm.Program, 3, nlm.ProcSMNotify)(m) && m.capture == "c1-lo"
	})
}
