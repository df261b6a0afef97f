package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// TestNotify1000 measures notify completion after a leader crash at scale:
// 1,000 monitored hosts spread over four client namespaces (250 addresses
// each, 10.77.11-14.1–250/32 on the client's eth0, routed by the nodes via
// the client's 10.77.0.3k address), SIGKILL of the leader, then the time
// until every host has received SM_NOTIFY with the new state from the VIP.
// Each client namespace runs one process (TestManyHostsProcess) with one
// statd and one portmapper on 0.0.0.0 that answer for all its addresses and
// record the destination address of each SM_NOTIFY (IP_PKTINFO).
//
// It is a measurement, not a regular test: it runs only with
// NSMD_E2E_NOTIFY1000=1 (and as root with ip netns).

const (
	notify1000Env   = "NSMD_E2E_NOTIFY1000"
	manyHostsEnv    = "NSMD_E2E_MANY_HOSTS" // JSON manyHostsConfig
	manyLinePrefix  = "E2E-MANY "
	manyNamespaces  = 4
	manyPerNS       = 250
	manyNotifyLimit = 60 * time.Second
	// agentGrace is the agents' --grace-period (the default; agentArgs
	// does not set it): the takeover instant is grace_until - agentGrace.
	agentGrace = 90 * time.Second
	// vipWaitMsg is the new leader's log line while it waits out the
	// crashed holder's VIP lifetime (cluster/handover.go).
	vipWaitMsg = "waiting for a previous holder's VIP lifetime to run out"
)

type manyHostsConfig struct {
	Primary string `json:"primary"` // the namespace's 10.77.0.x: SM_MON leaves from it
	Name    string `json:"name"`    // my_name
	Subnet  string `json:"subnet"`  // "10.77.11": the hosts are Subnet.1 .. Subnet.Count
	Count   int    `json:"count"`
}

// manyLine is one event from a TestManyHostsProcess.
type manyLine struct {
	Ev      string `json:"ev"` // ready | notify | ack | monned
	To      string `json:"to,omitempty"`
	From    string `json:"from,omitempty"`
	MonName string `json:"mon_name,omitempty"`
	State   int32  `json:"state"`
	Res     int32  `json:"res"`
	Priv    string `json:"priv,omitempty"`
	OK      int    `json:"ok,omitempty"`
	Err     string `json:"err,omitempty"`
	At      int64  `json:"at"`
}

func (c manyHostsConfig) addrs() []string {
	out := make([]string, c.Count)
	for i := range c.Count {
		out[i] = fmt.Sprintf("%s.%d", c.Subnet, i+1)
	}
	return out
}

// TestManyHostsProcess is not a test of its own: it is the client process
// of TestNotify1000, run inside one client namespace.
func TestManyHostsProcess(t *testing.T) {
	raw := os.Getenv(manyHostsEnv)
	if raw == "" {
		t.Skip("helper process of TestNotify1000 (runs inside a client namespace)")
	}
	var cfg manyHostsConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("%s: %v", manyHostsEnv, err)
	}
	var outMu sync.Mutex
	out := bufio.NewWriterSize(os.Stdout, 64<<10)
	emit := func(l manyLine) {
		b, _ := json.Marshal(l)
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, "%s%s\n", manyLinePrefix, b)
		out.Flush()
	}

	// One statd for every address: replies leave from the address each
	// call came to (the server uses IP_PKTINFO), as 250 real hosts would.
	statd := oncrpc.HandlerFunc(func(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
		switch c.Proc {
		case nsm.ProcNull:
			return nil
		case nsm.ProcNotify:
			at := time.Now().UnixNano()
			var a nsm.StatChge
			if err := a.UnmarshalXDR(c.Args); err != nil {
				return fmt.Errorf("%w: %v", oncrpc.ErrGarbageArgs, err)
			}
			emit(manyLine{Ev: "notify", To: c.Local.Addr().String(), From: c.Remote.String(), MonName: a.MonName, State: a.State, At: at})
			return nil
		}
		return oncrpc.ErrProcUnavail
	})
	listen := func(port int) *net.UDPConn {
		pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4zero, Port: port})
		if err != nil {
			t.Fatalf("listen udp 0.0.0.0:%d: %v", port, err)
		}
		pc.SetReadBuffer(4 << 20) // one socket stands in for 250 hosts' sockets
		return pc
	}
	statdConn := listen(0)
	statdSrv := oncrpc.NewServer(oncrpc.Programs{nsm.Program: statd}, oncrpc.ServerConfig{MaxInFlight: 256})
	go statdSrv.ServeUDP(statdConn)
	pm := oncrpc.NewPortmapper()
	pm.Register(oncrpc.Mapping{Prog: nsm.Program.Prog, Vers: nsm.Program.Vers, Prot: oncrpc.IPProtoUDP, Port: uint32(statdConn.LocalAddr().(*net.UDPAddr).Port)})
	pmSrv := oncrpc.NewServer(oncrpc.Programs{{Prog: oncrpc.PmapProg, Vers: oncrpc.PmapVers}: pm}, oncrpc.ServerConfig{MaxInFlight: 256})
	go pmSrv.ServeUDP(listen(oncrpc.PmapPort))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		statdSrv.Shutdown(ctx)
		pmSrv.Shutdown(ctx)
	}()
	emit(manyLine{Ev: "ready", At: time.Now().UnixNano()})

	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() { // EOF: the parent is done with us
		target := strings.TrimSpace(sc.Text())
		if target == "" {
			continue
		}
		ok, err := manyMon(cfg, target, emit)
		l := manyLine{Ev: "monned", OK: ok, At: time.Now().UnixNano()}
		if err != nil {
			l.Err = err.Error()
		}
		emit(l)
	}
}

// manyMon sends SM_MON{mon_name: address, my_name: cfg.Name, 100021/3/16}
// for each of the namespace's addresses to target (the VIP), all pipelined
// on one TCP connection from the primary address (a trusted caller), the
// port found through target's portmapper. One "ack" line per answer.
func manyMon(cfg manyHostsConfig, target string, emit func(manyLine)) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	local := netip.MustParseAddr(cfg.Primary)
	port, err := oncrpc.NewPmapClient(target, oncrpc.ClientConfig{Timeout: 3 * time.Second, Retransmit: 200 * time.Millisecond, LocalAddr: local}).
		GetPort(ctx, nsm.Program.Prog, nsm.Program.Vers, oncrpc.IPProtoTCP)
	if err != nil || port == 0 {
		return 0, fmt.Errorf("portmapper GETPORT 100024/1/tcp at %s: port %d, %v", target, port, err)
	}
	cl, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "tcp", Addr: net.JoinHostPort(target, strconv.Itoa(int(port))), Timeout: 30 * time.Second, LocalAddr: local})
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	var errs []string
	for _, a := range cfg.addrs() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var priv [16]byte
			rand.Read(priv[:])
			mon := nsm.Mon{ID: nsm.MonID{MonName: a, My: nsm.MyID{MyName: cfg.Name, Prog: 100021, Vers: 3, Proc: 16}}, Priv: priv}
			var res nsm.SMStatRes
			if err := cl.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("SM_MON %s: %v", a, err))
				mu.Unlock()
				return
			}
			emit(manyLine{Ev: "ack", MonName: a, Res: int32(res.Res), State: res.State, Priv: hex.EncodeToString(priv[:]), At: time.Now().UnixNano()})
			if nsm.Res(res.Res) == nsm.StatSucc {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return ok, fmt.Errorf("%d errors, first: %s", len(errs), errs[0])
	}
	return ok, nil
}

// ---- parent side -------------------------------------------------------------

// manyNotice is one SM_NOTIFY datagram a host address received.
type manyNotice struct {
	to      string
	from    netip.AddrPort
	monName string
	state   int32
	at      time.Time
}

// manyHosts is the parent's handle on one TestManyHostsProcess.
type manyHosts struct {
	host  *netHost
	cfg   manyHostsConfig
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	ready chan struct{}
	monCh chan manyLine

	mu      sync.Mutex
	acks    []manyLine
	notices []manyNotice
	log     childLog
}

func (m *manyHosts) read(r io.Reader) {
	scanChild(r, manyLinePrefix, &m.log, func(l manyLine) {
		switch l.Ev {
		case "ready":
			close(m.ready)
		case "ack":
			m.mu.Lock()
			m.acks = append(m.acks, l)
			m.mu.Unlock()
		case "monned":
			m.monCh <- l
		case "notify":
			from, _ := netip.ParseAddrPort(l.From)
			m.mu.Lock()
			m.notices = append(m.notices, manyNotice{to: l.To, from: from, monName: l.MonName, state: l.State, at: time.Unix(0, l.At)})
			m.mu.Unlock()
		}
	})
}

func (m *manyHosts) Notices() []manyNotice {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.notices)
}

// addManyNamespace adds client namespace name (on the bridge, eth0 = ip/24)
// carrying count extra addresses subnet.1..count/32 on its eth0, and routes
// subnet.0/24 via ip in every node namespace. Everything lives in
// namespaces of this process (the topology's prefix), removed with it.
func addManyNamespace(t *testing.T, c *e2eCluster, name string, ip netip.Addr, subnet string, count int) *netHost {
	t.Helper()
	tp := c.top
	h := &netHost{name: name, ns: tp.prefix + name, ip: ip, swPort: "v-" + name}
	for _, args := range [][]string{
		{"netns", "add", h.ns},
		{"-n", h.ns, "link", "set", "lo", "up"},
		{"-n", tp.sw, "link", "add", h.swPort, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
		{"-n", tp.sw, "link", "set", h.swPort, "master", "br0", "up"},
		{"-n", h.ns, "addr", "add", fmt.Sprintf("%s/%d", ip, topoBits), "dev", "eth0"},
		{"-n", h.ns, "link", "set", "eth0", "up"},
	} {
		if _, err := ipCmd(args...); err != nil {
			t.Fatalf("adding client namespace %s: %v", name, err)
		}
	}
	var batch strings.Builder
	for i := 1; i <= count; i++ {
		fmt.Fprintf(&batch, "addr add %s.%d/32 dev eth0\n", subnet, i)
	}
	cmd := exec.Command("ip", "-n", h.ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("adding %d addresses in %s: %v: %s", count, h.ns, err, out)
	}
	for _, n := range c.nodes {
		if _, err := ipCmd("-n", n.host.ns, "route", "add", subnet+".0/24", "via", ip.String(), "dev", "eth0"); err != nil {
			t.Fatalf("route in %s: %v", n.host.ns, err)
		}
	}
	return h
}

// startManyHosts runs TestManyHostsProcess in h's namespace; it is stopped
// (stdin closed, then SIGKILL by pid) when the test ends.
func startManyHosts(t *testing.T, h *netHost, subnet string, count int) *manyHosts {
	t.Helper()
	m := &manyHosts{host: h, done: make(chan struct{}), ready: make(chan struct{}), monCh: make(chan manyLine, 1),
		cfg: manyHostsConfig{Primary: h.ip.String(), Name: "many-" + h.name, Subnet: subnet, Count: count}}
	raw, _ := json.Marshal(m.cfg)
	m.cmd, m.stdin = spawnChild(t, h, "hosts process "+h.name, "TestManyHostsProcess", manyHostsEnv, raw,
		&m.log, m.read, m.log.String, m.ready, m.done)
	return m
}

// percentile is the nearest-rank p-quantile of sorted ds.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func distribution(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %v  p50 %v  p90 %v  p99 %v  max %v  (n=%d)",
		r(percentile(s, 0)), r(percentile(s, 0.5)), r(percentile(s, 0.9)), r(percentile(s, 0.99)), r(percentile(s, 1)), len(s))
}

// leaderLogEvents returns, from a node's log, the first time after since
// of each of msgs, and the whole line of each.
func leaderLogEvents(path string, since time.Time, msgs ...string) (map[string]time.Time, map[string]string) {
	at, lines := make(map[string]time.Time), make(map[string]string)
	b, err := os.ReadFile(path)
	if err != nil {
		return at, lines
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "time=")
		if !ok {
			continue
		}
		ts, _, _ := strings.Cut(rest, " ")
		tm, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || tm.Before(since) {
			continue
		}
		for _, msg := range msgs {
			if _, seen := at[msg]; !seen && strings.Contains(line, `msg="`+msg+`"`) {
				at[msg], lines[msg] = tm, line
			}
		}
	}
	return at, lines
}

func TestNotify1000(t *testing.T) {
	if os.Getenv(clientHostEnv) != "" || os.Getenv(manyHostsEnv) != "" {
		t.Skip("inside a helper process")
	}
	if os.Getenv(notify1000Env) != "1" {
		t.Skipf("measurement: set %s=1 to run it (1,000 monitored hosts in %d client namespaces; SIGKILL the leader; time until every host has SM_NOTIFY from the VIP)", notify1000Env, manyNamespaces)
	}
	if why := canNetns(); why != "" {
		t.Skip("skipping multi-host measurement: " + why)
	}
	c := startCluster(t)
	first := c.settle(t, 30*time.Second, 1)
	c.probeVIP(t, first.leader)
	if !c.vipOK {
		t.Skipf("the measurement needs the VIP: %s", c.vipWhy)
	}
	leader, st := c.restore(t)
	t.Logf("formed: leader %s, sm_state %d", leader.id, st.SMState)

	// The client namespaces and their 1,000 addresses.
	tBuild := time.Now()
	var hosts []*manyHosts
	want := make(map[string]bool) // every monitored address
	for k := range manyNamespaces {
		subnet := fmt.Sprintf("10.77.%d", 11+k)
		h := addManyNamespace(t, c, fmt.Sprintf("m%d", k+1), netip.MustParseAddr(fmt.Sprintf("%s.%d", topoNet, 31+k)), subnet, manyPerNS)
		m := startManyHosts(t, h, subnet, manyPerNS)
		hosts = append(hosts, m)
		for _, a := range m.cfg.addrs() {
			want[a] = true
		}
	}
	t.Logf("%d client namespaces × %d addresses up in %v", manyNamespaces, manyPerNS, time.Since(tBuild).Round(time.Millisecond))

	// Registration: each process SM_MONs its 250 addresses at the VIP over
	// one pipelined TCP connection.
	tMon := time.Now()
	for _, m := range hosts {
		if _, err := io.WriteString(m.stdin, c.vip.String()+"\n"); err != nil {
			t.Fatalf("%s: %v", m.host.name, err)
		}
	}
	for _, m := range hosts {
		select {
		case l := <-m.monCh:
			if l.Err != "" || l.OK != manyPerNS {
				t.Fatalf("%s: %d of %d SM_MON answered stat_succ: %s", m.host.name, l.OK, manyPerNS, l.Err)
			}
		case <-m.done:
			t.Fatalf("hosts process %s exited:\n%s", m.host.name, m.log.String())
		case <-time.After(90 * time.Second):
			t.Fatalf("%s: SM_MONs not all answered within 90s", m.host.name)
		}
	}
	monTook := time.Since(tMon)
	c.mu.Lock()
	for _, m := range hosts {
		m.mu.Lock()
		for _, a := range m.acks {
			if nsm.Res(a.Res) != nsm.StatSucc || a.State != st.SMState {
				t.Errorf("SM_MON %s answered res=%d state=%d; want stat_succ, %d", a.MonName, a.Res, a.State, st.SMState)
			}
			c.acked[a.MonName+"|"+m.cfg.Name] = ackedMon{monName: a.MonName, myName: m.cfg.Name, priv: a.Priv, state: a.State}
		}
		m.mu.Unlock()
	}
	nAcked := len(c.acked)
	c.mu.Unlock()
	if nAcked != len(want) {
		t.Fatalf("%d SM_MON acknowledged, want %d", nAcked, len(want))
	}
	t.Logf("%d SM_MON acknowledged in %v (4 TCP connections, 250 pipelined calls each)", nAcked, monTook.Round(time.Millisecond))
	testutil.WaitForSeen(t, 20*time.Second, "every node to hold the 1,000 registrations", func() (bool, string) {
		var seen []string
		all := true
		for _, n := range c.nodes {
			s, err := n.status()
			if err != nil {
				return false, err.Error()
			}
			seen = append(seen, statusLine(s))
			all = all && s.Registrations == len(want)
		}
		return all, strings.Join(seen, "; ")
	})
	for _, m := range hosts {
		if ns := m.Notices(); len(ns) > 0 {
			t.Fatalf("%s got SM_NOTIFY before any failover: %+v", m.host.name, ns[0])
		}
	}

	// The fault.
	mark := c.watch.Mark()
	t0 := time.Now()
	if !leader.kill(syscall.SIGKILL, 5*time.Second) {
		t.Fatalf("%s did not die of SIGKILL", leader.id)
	}
	t.Logf("SIGKILL %s (sm_state %d); waiting up to %v for %d hosts", leader.id, st.SMState, manyNotifyLimit, len(want))

	// got[addr] is the first SM_NOTIFY from the VIP carrying a state
	// above the old one; bad lists those from anywhere else.
	got := make(map[string]manyNotice)
	var bad []string
	datagrams := 0
	collect := func() {
		clear(got)
		bad, datagrams = bad[:0], 0
		for _, m := range hosts {
			for _, n := range m.Notices() {
				datagrams++
				switch {
				case !want[n.to]:
					bad = append(bad, fmt.Sprintf("%s got SM_NOTIFY at %s, not a monitored address", m.host.name, n.to))
				case n.from.Addr() != c.vip:
					bad = append(bad, fmt.Sprintf("%s: SM_NOTIFY{%s,%d} from %s, not the VIP", n.to, n.monName, n.state, n.from))
				case n.monName != notifyName:
					bad = append(bad, fmt.Sprintf("%s: SM_NOTIFY mon_name %q, want %q", n.to, n.monName, notifyName))
				case n.state > st.SMState:
					if f, ok := got[n.to]; !ok || n.at.Before(f.at) {
						got[n.to] = n
					}
				}
			}
		}
	}
	deadline := t0.Add(manyNotifyLimit)
	for {
		collect()
		if len(got) == len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	observedDone := time.Now()

	// The new leader, its takeover instant, its VIP and notifier times.
	v := c.settle(t, 30*time.Second, st.SMState+1, leader)
	nl, ns := v.leader, v.leaderStatus()
	var gs admin.Status
	var takeoverAt time.Time
	if err := nl.get("/v1/status", &gs); err == nil && gs.GraceUntil != nil {
		takeoverAt = gs.GraceUntil.Add(-agentGrace)
	}
	logAt, logLine := leaderLogEvents(nl.logPath, t0.Add(-time.Second), "gained leadership", "takeover committed", vipWaitMsg, "notifying monitored hosts", "notify finished")
	vipAt, vipOK := firstChange(c.watch.EventsSince(mark), nl.id, true)

	var fromKill, fromTakeover []time.Duration
	var firstAt, last time.Time
	states := make(map[int32]int)
	for _, n := range got {
		fromKill = append(fromKill, n.at.Sub(t0))
		if !takeoverAt.IsZero() {
			fromTakeover = append(fromTakeover, n.at.Sub(takeoverAt))
		}
		if n.at.After(last) {
			last = n.at
		}
		if firstAt.IsZero() || n.at.Before(firstAt) {
			firstAt = n.at
		}
		states[n.state]++
	}
	rel := func(tm time.Time, ok bool) string {
		if !ok || tm.IsZero() {
			return "n/a"
		}
		return "+" + tm.Sub(t0).Round(time.Millisecond).String()
	}
	_, okGained := logAt["gained leadership"]
	_, okCommitted := logAt["takeover committed"]
	_, okNotifying := logAt["notifying monitored hosts"]
	_, okFinished := logAt["notify finished"]
	var report strings.Builder
	fmt.Fprintf(&report, "notify completion, %d monitored hosts in %d client namespaces, SIGKILL of leader %s → new leader %s (sm_state %d → %d)\n",
		len(want), manyNamespaces, leader.id, nl.id, st.SMState, ns.SMState)
	fmt.Fprintf(&report, "  timeline from the kill: %s gained leadership %s, takeover (grace_until-%v) %s, takeover committed %s, VIP configured (watcher) %s, notifier started %s, first host %s, last host %s, notifier finished %s\n",
		nl.id, rel(logAt["gained leadership"], okGained), agentGrace, rel(takeoverAt, true), rel(logAt["takeover committed"], okCommitted),
		rel(vipAt.at, vipOK), rel(logAt["notifying monitored hosts"], okNotifying),
		rel(firstAt, true), rel(last, true), rel(logAt["notify finished"], okFinished))
	fmt.Fprintf(&report, "  per-host arrival from the kill:     %s\n", distribution(fromKill))
	if len(fromTakeover) > 0 {
		fmt.Fprintf(&report, "  per-host arrival from the takeover: %s\n", distribution(fromTakeover))
	}
	if okNotifying {
		var fromStart []time.Duration
		for _, n := range got {
			fromStart = append(fromStart, n.at.Sub(logAt["notifying monitored hosts"]))
		}
		fmt.Fprintf(&report, "  per-host arrival from notifier start: %s\n", distribution(fromStart))
	}
	if !last.IsZero() {
		fmt.Fprintf(&report, "  total completion: %v after the kill", last.Sub(t0).Round(time.Millisecond))
		if !takeoverAt.IsZero() {
			fmt.Fprintf(&report, ", %v after the takeover", last.Sub(takeoverAt).Round(time.Millisecond))
		}
		fmt.Fprintln(&report)
	}
	fmt.Fprintf(&report, "  hosts notified %d/%d; SM_NOTIFY datagrams received %d (retransmits/duplicates %d); states seen %v\n",
		len(got), len(want), datagrams, datagrams-len(got), states)
	if l, ok := logLine[vipWaitMsg]; ok {
		fmt.Fprintf(&report, "  leader log: %s\n", l)
	}
	if okFinished {
		fmt.Fprintf(&report, "  leader log: %s\n", logLine["notify finished"])
	}
	t.Log(report.String())

	if len(got) != len(want) {
		var missing []string
		for a := range want {
			if _, ok := got[a]; !ok {
				missing = append(missing, a)
			}
		}
		slices.Sort(missing)
		t.Errorf("%d of %d hosts got no SM_NOTIFY with a new state from the VIP within %v (checked until %s): %v",
			len(missing), len(want), manyNotifyLimit, observedDone.Sub(t0).Round(time.Millisecond), missing[:min(len(missing), 20)])
	}
	if len(bad) > 0 {
		t.Errorf("%d wrong SM_NOTIFY datagrams, first: %v", len(bad), bad[:min(len(bad), 10)])
	}
	for s, n := range states {
		if s != ns.SMState {
			t.Errorf("%d hosts were first notified of state %d; the new leader's sm_state is %d", n, s, ns.SMState)
		}
	}
	c.checkRegistrations(t, nl)
	c.checkOverlaps(t, mark)
}
