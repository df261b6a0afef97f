package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/slowfs"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// The multi-host cluster: three nsmd agents (n1..n3) and client hosts
// (c1..cK) in network namespaces on one bridge (topo_linux_test.go), a VIP
// watcher (vipwatch_linux_test.go) and the checks of the DESIGN.md
// invariants that every fault schedule ends with.

const (
	clusterNodes   = 3
	clusterClients = 3
	notifyName     = "nfs.e2e"
	nsmPort        = 662
	adminPort      = 8024
	gossipPort     = 7946
	raftPort       = 7300
	// overlapSlack is how long two nodes may both seem to hold the VIP
	// before it counts as a violation: the watcher samples every 20 ms,
	// so a clean handover can look like a short overlap. The goal is none.
	overlapSlack = 100 * time.Millisecond
	// leaderLease is the agents' raft leader lease (the default).
	leaderLease = 150 * time.Millisecond
	// releaseBound is how soon a leader cut off from its followers must
	// have dropped the VIP: raft checks the lease every lease interval, so
	// it steps down within two leases; the rest is slack for the leader
	// loop and the netlink call.
	releaseBound = 2*leaderLease + 500*time.Millisecond
)

// statusLine is the one-line form of a node's status in logs and
// failures.
func statusLine(s admin.Status) string {
	return fmt.Sprintf("%s:%s(leader=%s term=%d state=%d regs=%d vip_held=%v applied=%d)",
		s.NodeID, s.Role, s.LeaderID, s.Term, s.SMState, s.Registrations, s.VIPHeld, s.AppliedIndex)
}

// nsmNode is one nsmd agent; its data directory and log file outlive its
// processes (restarts).
type nsmNode struct {
	id      string
	host    *netHost
	admin   string
	dataDir string
	logPath string
	http    *http.Client
	c       *e2eCluster
	witness bool       // runs --witness (clusterSpec.witness)
	disk    *slowfs.FS // its data directory's slow passthrough (clusterSpec.slowDisks)

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	stopped bool // SIGSTOPped
}

// e2eCluster is the running multi-host setup.
type e2eCluster struct {
	spec    clusterSpec
	top     *topology
	nodes   []*nsmNode
	clients []*clientHost
	watch   *vipWatcher

	vipMode string     // netlink (default) or none (NSMD_E2E_VIP_MODE)
	vip     netip.Addr // the VIP
	vipOK   bool       // the leader really takes the VIP: VIP checks are on
	vipWhy  string     // why VIP checks are off in netlink mode
	slowWhy string     // why the data directories have no slow passthrough (clusterSpec.slowDisks)

	pki *clusterPKI // mutual TLS, gossip key, admin token (nsmd tls init)

	mu        sync.Mutex
	acked     map[string]ackedMon // mon_name|my_name → the SM_MON answered stat_succ
	lastState int32
	monSeq    int
}

type ackedMon struct {
	monName, myName, priv string
	state                 int32
}

// clusterSpec varies the multi-host setup.
type clusterSpec struct {
	clients int // client hosts on the bridge
	// fakeClients runs the fake client statd (TestClientHostProcess) on
	// every client host; without it the test brings its own.
	fakeClients bool
	// realRpcbind runs the Debian rpcbind in every node's namespace (with
	// its own private /run) and nsmd registers with it (--rpcbind
	// register) instead of serving the embedded portmapper.
	realRpcbind bool
	// beforeNodes runs once the topology exists, before anything starts
	// in it (packet captures).
	beforeNodes func(*topology)
	// diskMB > 0 puts every node's data directory on a tmpfs of that
	// size: a disk the test can fill (ENOSPC) and free.
	diskMB int
	// witness makes the last node (n3) a witness: two servers and a
	// witness, the HA pair's topology.
	witness bool
	// bins runs the named nodes from another nsmd binary (a rolling
	// upgrade: an older release beside this one); the others run nsmdBin.
	bins map[string]string
	// slowDisks puts every node's data directory behind a FUSE
	// passthrough (internal/slowfs) whose fsync the test can slow down.
	slowDisks bool
	// extraArgs, when set, adds agent flags per node (hooks, fencing).
	extraArgs func(n *nsmNode) []string
	// noVIP runs without a VIP: services: carry their own addresses
	// (vip_mode netlink: taken on the interface each service names).
	noVIP bool
}

// startCluster is the default setup: three fake client hosts, nsmd's
// embedded portmapper.
func startCluster(t *testing.T) *e2eCluster {
	return startClusterWith(t, clusterSpec{clients: clusterClients, fakeClients: true})
}

// startClusterWith builds the topology and starts the nodes, the client
// hosts and the VIP watcher; everything is stopped and removed when t ends.
func startClusterWith(t *testing.T, spec clusterSpec) *e2eCluster {
	t.Helper()
	c := &e2eCluster{spec: spec, vipMode: "netlink", vip: netip.MustParseAddr(vipString), acked: make(map[string]ackedMon)}
	if m := os.Getenv("NSMD_E2E_VIP_MODE"); m != "" {
		c.vipMode = m
	}
	if spec.noVIP {
		c.vipMode = "none" // no VIP checks
	}
	c.top = newTopology(t, clusterNodes, spec.clients)
	logDir := t.TempDir()
	ips := map[string]string{}
	for _, h := range c.top.nodes {
		ips[h.name] = h.ip.String()
	}
	c.pki = newClusterPKI(t, ips)
	for i, h := range c.top.nodes {
		n := &nsmNode{
			id: h.name, host: h, c: c,
			admin:   net.JoinHostPort(h.ip.String(), strconv.Itoa(adminPort)),
			dataDir: dataDir(t, spec.diskMB),
			logPath: filepath.Join(logDir, h.name+".log"),
			http:    httpIn(h.ns, c.pki.clientTLS(t)),
			witness: spec.witness && i == len(c.top.nodes)-1,
		}
		if spec.slowDisks && c.slowWhy == "" {
			if n.disk, c.slowWhy = slowDisk(t, n.dataDir); n.disk != nil {
				n.dataDir = n.disk.Dir
			} else {
				t.Logf("slow-disk faults off: %s", c.slowWhy)
			}
		}
		c.nodes = append(c.nodes, n)
	}
	c.watch = startVIPWatcher(c.vip, c.top.nodes)
	// Registered after the topology's cleanup, so it runs before it.
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.kill(syscall.SIGKILL, 10*time.Second)
		}
		c.watch.Stop()
		over, valid, errs := c.watch.Summary()
		t.Logf("VIP watcher: max overlap %v, largest valid_lft seen %ds, errors %v", over, valid, errs)
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("---- %s log (tail) ----\n%s", n.id, tailFile(n.logPath, 150))
				if d := os.Getenv("NSMD_E2E_OUT"); d != "" { // the whole log, for a failure the tail does not explain
					if b, err := os.ReadFile(n.logPath); err == nil && os.MkdirAll(d, 0o755) == nil {
						os.WriteFile(filepath.Join(d, strings.ReplaceAll(t.Name(), "/", "_")+"-"+n.id+".log"), b, 0o644)
					}
				}
			}
		}
	})
	if spec.beforeNodes != nil {
		spec.beforeNodes(c.top)
	}
	if spec.realRpcbind {
		for _, n := range c.nodes {
			startRealRpcbind(t, n.host)
		}
	}
	for _, n := range c.nodes {
		n.start(t)
	}
	if spec.fakeClients {
		for _, h := range c.top.hosts {
			c.clients = append(c.clients, startClientHost(t, h))
		}
	}
	return c
}

// dataDir is a node's data directory: a fresh directory, or with mb > 0 a
// tmpfs of mb MiB mounted on it (unmounted when the test ends).
func dataDir(t *testing.T, mb int) string {
	t.Helper()
	dir := t.TempDir()
	if mb <= 0 {
		return dir
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", mb), "nsmd-e2e-disk", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a %d MiB tmpfs on %s: %v %s", mb, dir, err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// slowDisk mounts a slow passthrough of backing (internal/slowfs, served
// by this test process) and returns it, or nil and why not; it is
// unmounted when the test ends, after the nodes (whose cleanup is
// registered later) are gone.
func slowDisk(t *testing.T, backing string) (*slowfs.FS, string) {
	t.Helper()
	if why := slowfs.Usable(); why != "" {
		return nil, why
	}
	f, err := slowfs.Mount(backing, t.TempDir())
	if err != nil {
		return nil, fmt.Sprintf("cannot mount a FUSE passthrough here: %v", err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return f, ""
}

// servers are the nodes that may lead (all but a witness).
func (c *e2eCluster) servers() []*nsmNode {
	var out []*nsmNode
	for _, n := range c.nodes {
		if !n.witness {
			out = append(out, n)
		}
	}
	return out
}

// agentArgs are the node's flags (the same at every start).
func (n *nsmNode) agentArgs() []string {
	var join []string
	for _, h := range n.c.top.nodes {
		join = append(join, net.JoinHostPort(h.ip.String(), strconv.Itoa(gossipPort)))
	}
	rpcbindMode := "embedded"
	if n.c.spec.realRpcbind {
		rpcbindMode = "register"
	}
	args := []string{"agent",
		"--node-id", n.id,
		"--bind", n.host.ip.String(),
		"--data-dir", n.dataDir,
		"--nsm-addr", "0.0.0.0:" + strconv.Itoa(nsmPort),
		"--admin-addr", n.admin,
		"--gossip-port", strconv.Itoa(gossipPort),
		"--raft-port", strconv.Itoa(raftPort),
		"--bootstrap-expect", strconv.Itoa(clusterNodes),
		"--join", strings.Join(join, ","),
		"--notify-name", notifyName,
		"--trusted-callers", topoNet + ".0/24",
		"--rpcbind", rpcbindMode,
		"--drill-crash",
		"--log-level", "debug",
	}
	args = append(args, n.c.pki.nodeArgs(n.id)...)
	if n.witness {
		// The servers' flags, VIP included: the witness ignores what it
		// never uses (as one configuration file for all three would).
		args = append(args, "--witness")
	}
	if n.c.spec.extraArgs != nil {
		args = append(args, n.c.spec.extraArgs(n)...)
	}
	if n.c.spec.noVIP {
		return append(args, "--vip-mode", "netlink")
	}
	if n.c.vipMode == "none" {
		return append(args, "--vip-mode", "none")
	}
	return append(args, "--vip", fmt.Sprintf("%s/%d", vipString, topoBits), "--vip-interface", "eth0", "--vip-mode", n.c.vipMode)
}

// start runs the agent in its namespace with a private /run and its own
// UTS namespace whose hostname is the node's (hostname(n.id): what a
// kernel lockd on that node would send as my_name). ip, unshare and sh
// all exec, so the pid we hold is nsmd's own.
func (n *nsmNode) start(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		select {
		case <-n.done:
		default:
			t.Fatalf("%s: start while pid %d still runs", n.id, n.cmd.Process.Pid)
		}
	}
	f, err := os.OpenFile(n.logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "==== e2e: start at %s\n", time.Now().Format(time.RFC3339Nano))
	bin := nsmdBin
	if b := n.c.spec.bins[n.id]; b != "" {
		bin = b
	}
	args := append([]string{"netns", "exec", n.host.ns, "unshare", "--mount", "--uts", "--propagation", "private",
		"sh", "-c", `hostname "` + nodeHostname(n.id) + `" && mount -t tmpfs nsmd-run /run && exec "$0" "$@"`, bin}, n.agentArgs()...)
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startPinned(cmd); err != nil {
		t.Fatalf("start %s: %v", n.id, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	n.cmd, n.done, n.stopped = cmd, done, false
}

// nodeHostname is node id's hostname (its UTS namespace).
func nodeHostname(id string) string { return "nsmd-" + id + ".e2e" }

// running reports whether a process is up (possibly SIGSTOPped).
func (n *nsmNode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// serving reports whether the node runs and is not stopped.
func (n *nsmNode) serving() bool {
	n.mu.Lock()
	stopped := n.stopped
	n.mu.Unlock()
	return !stopped && n.running()
}

// signal sends sig to the node's process (by the pid we started).
func (n *nsmNode) signal(sig syscall.Signal) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return fmt.Errorf("%s: not started", n.id)
	}
	switch sig {
	case syscall.SIGSTOP:
		n.stopped = true
	case syscall.SIGCONT:
		n.stopped = false
	}
	if err := n.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: signal %v to pid %d: %w", n.id, sig, n.cmd.Process.Pid, err)
	}
	return nil
}

// kill sends sig (after SIGCONT, in case it is stopped) and waits for the
// process to end; false if it did not within timeout.
func (n *nsmNode) kill(sig syscall.Signal, timeout time.Duration) bool {
	if !n.running() {
		return true
	}
	n.signal(syscall.SIGCONT)
	n.signal(sig)
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

func (n *nsmNode) get(path string, out any) error {
	resp, err := n.http.Get("https://" + n.admin + path)
	if err != nil {
		return fmt.Errorf("%s GET %s: %w", n.id, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s GET %s: %s: %s", n.id, path, resp.Status, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s GET %s: %w", n.id, path, err)
	}
	return nil
}

func (n *nsmNode) status() (admin.Status, error) {
	var s admin.Status
	err := n.get("/v1/status", &s)
	return s, err
}

func (c *e2eCluster) others(n *nsmNode) []*nsmNode {
	var out []*nsmNode
	for _, o := range c.nodes {
		if o != n {
			out = append(out, o)
		}
	}
	return out
}

// view is one look at a set of nodes.
type view struct {
	leader *nsmNode
	st     map[*nsmNode]admin.Status
}

func (v view) leaderStatus() admin.Status { return v.st[v.leader] }

// agreed says whether the nodes agree on one settled leader: exactly one
// leader, named by every node, one term and one sm_state (odd, at least
// minState: a raft leader shows the old state until its Takeover
// commits), and —
// when the VIP works — the leader alone holds the VIP, by its own word and
// by the kernel's.
func (c *e2eCluster) agreed(nodes []*nsmNode, minState int32) (view, bool, string) {
	v := view{st: make(map[*nsmNode]admin.Status)}
	var seen []string
	for _, n := range nodes {
		s, err := n.status()
		if err != nil {
			return v, false, err.Error()
		}
		v.st[n] = s
		seen = append(seen, statusLine(s))
		if s.Role == "leader" {
			if v.leader != nil {
				return v, false, "two leaders: " + strings.Join(seen, "; ")
			}
			v.leader = n
		}
	}
	desc := strings.Join(seen, "; ")
	if v.leader == nil {
		return v, false, "no leader: " + desc
	}
	ls := v.st[v.leader]
	for _, n := range nodes {
		s := v.st[n]
		if s.LeaderID != v.leader.id || s.Term != ls.Term || s.SMState != ls.SMState {
			return v, false, "not agreed: " + desc
		}
	}
	if ls.SMState%2 != 1 || ls.SMState < minState {
		return v, false, fmt.Sprintf("takeover not committed (want an odd sm_state of at least %d): %s", minState, desc)
	}
	if c.vipOK {
		if h := c.watch.Holders(); !ls.VIPHeld || !slices.Equal(h, []string{v.leader.id}) {
			return v, false, fmt.Sprintf("VIP held by %v (leader says vip_held=%v): %s", h, ls.VIPHeld, desc)
		}
	}
	return v, true, desc
}

// settle waits until the serving nodes, except skip, agree on a settled
// leader whose sm_state is at least minState, and returns it. Which nodes
// serve is looked at again at every poll: a fence agent's stand-in may
// power one off (kill its nsmd) while the others settle.
func (c *e2eCluster) settle(t *testing.T, timeout time.Duration, minState int32, skip ...*nsmNode) view {
	t.Helper()
	serving := func() []*nsmNode {
		var nodes []*nsmNode
		for _, n := range c.nodes {
			if n.serving() && !slices.Contains(skip, n) {
				nodes = append(nodes, n)
			}
		}
		return nodes
	}
	var v view
	testutil.WaitForSeen(t, timeout, "one settled leader among the serving nodes", func() (bool, string) {
		nodes := serving()
		var ok bool
		var desc string
		v, ok, desc = c.agreed(nodes, minState)
		return ok, nodeIDs(nodes) + ": " + desc
	})
	return v
}

func nodeIDs(ns []*nsmNode) string {
	var ids []string
	for _, n := range ns {
		ids = append(ids, n.id)
	}
	return strings.Join(ids, ",")
}

// nsmTarget is where clients send SM_MON and SM_STAT: the VIP, or without
// a working VIP the leader's own address.
func (c *e2eCluster) nsmTarget(leader *nsmNode) netip.Addr {
	if c.vipOK {
		return c.vip
	}
	return leader.host.ip
}

// monAll has every client host SM_MON itself at the cluster (mon_name: its
// IP, my_name: client-cK-<tag>) and records each stat_succ answer: those
// must never be lost (invariant 1).
func (c *e2eCluster) monAll(t *testing.T, leader *nsmNode, tag string) {
	t.Helper()
	target := c.nsmTarget(leader).String()
	var wg sync.WaitGroup
	errs := make([]error, len(c.clients))
	for i, cl := range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			myName := cl.myName + "-" + tag
			l, err := cl.do(clientCmd{Op: "mon", Addr: target, MyName: myName}, 15*time.Second)
			if err != nil {
				errs[i] = err
				return
			}
			if nsm.Res(l.Res) != nsm.StatSucc || l.State%2 != 1 {
				errs[i] = fmt.Errorf("%s: SM_MON answered res=%d state=%d, want stat_succ with an odd state", cl.host.name, l.Res, l.State)
				return
			}
			c.mu.Lock()
			c.acked[cl.host.ip.String()+"|"+myName] = ackedMon{monName: cl.host.ip.String(), myName: myName, priv: l.Priv, state: l.State}
			c.mu.Unlock()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// waitNewState polls SM_STAT from the first client host's namespace at the
// VIP (without a working VIP: at the nodes in from) until an answer
// carries an odd state above old; it returns that state and when it came.
func (c *e2eCluster) waitNewState(t *testing.T, old int32, timeout time.Duration, from []*nsmNode) (int32, time.Time) {
	t.Helper()
	var addrs []string
	if c.vipOK {
		addrs = []string{c.vip.String()}
	} else {
		for _, n := range from {
			addrs = append(addrs, n.host.ip.String())
		}
	}
	var got int32
	var at time.Time
	var last string
	err := inNetnsThread(c.top.hosts[0].ns, func() error {
		deadline := time.Now().Add(timeout)
		for time.Now().Before(deadline) {
			for _, a := range addrs {
				s, err := smStat(net.JoinHostPort(a, strconv.Itoa(nsmPort)))
				if err != nil {
					last = err.Error()
					continue
				}
				last = fmt.Sprintf("%s answers sm_state %d", a, s)
				if s > old && s%2 == 1 {
					got, at = s, time.Now()
					return nil
				}
			}
			time.Sleep(vipWatchEvery)
		}
		return fmt.Errorf("no SM_STAT answer with a state above %d from %v within %v; last: %s", old, addrs, timeout, last)
	})
	if err != nil {
		t.Fatal(err)
	}
	return got, at
}

// smStat asks addr (UDP) for sm_state, quickly; the socket is made on the
// calling thread (see inNetnsThread).
func smStat(addr string) (int32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	cl, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "udp", Addr: addr, Timeout: 200 * time.Millisecond, Retransmit: 50 * time.Millisecond})
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	var res nsm.SMStatRes
	if err := cl.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: "e2e"}, &res); err != nil {
		return 0, fmt.Errorf("SM_STAT %s: %w", addr, err)
	}
	return res.State, nil
}

// checkNotified waits until every client host has received SM_NOTIFY
// {notify name, state} from src (invariant 4).
func (c *e2eCluster) checkNotified(t *testing.T, state int32, src netip.Addr, timeout time.Duration) {
	t.Helper()
	testutil.WaitForSeen(t, timeout, fmt.Sprintf("every client host to get SM_NOTIFY{%s, %d} from %s", notifyName, state, src), func() (bool, string) {
		var missing []string
		for _, cl := range c.clients {
			ok := false
			var got []string
			for _, n := range cl.Notices() {
				got = append(got, fmt.Sprintf("%s{%s,%d}", n.from, n.monName, n.state))
				if n.state == state && n.monName == notifyName && n.from.Addr() == src {
					ok = true
				}
			}
			if !ok {
				missing = append(missing, fmt.Sprintf("%s got %v", cl.host.name, got))
			}
		}
		return len(missing) == 0, strings.Join(missing, "; ")
	})
}

// checkRegistrations: every acknowledged SM_MON is registered on the
// leader, with its cookie (invariant 1).
func (c *e2eCluster) checkRegistrations(t *testing.T, leader *nsmNode) {
	t.Helper()
	var page admin.RegistrationPage
	if err := leader.get("/v1/registrations?limit=10000", &page); err != nil {
		t.Fatal(err)
	}
	have := make(map[string]string)
	for _, r := range page.Registrations {
		if r.MyProg == 100021 && r.MyVers == 3 && r.MyProc == 16 {
			have[r.MonName+"|"+r.MyName] = r.Priv
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	missing := 0
	for k, a := range c.acked {
		priv, ok := have[k]
		switch {
		case !ok:
			missing++
			t.Errorf("invariant 1: SM_MON{%s, %s} was answered stat_succ (state %d) but %s has no such registration", a.monName, a.myName, a.state, leader.id)
		case priv != a.priv:
			t.Errorf("invariant 1: registration {%s, %s} has priv %s, the acknowledged SM_MON sent %s", a.monName, a.myName, priv, a.priv)
		}
	}
	if missing == 0 {
		t.Logf("all %d acknowledged SM_MONs are registered on leader %s (%d registrations)", len(c.acked), leader.id, len(page.Registrations))
	}
}

// checkOverlaps fails for every VIP overlap since m longer than the slack
// (invariant 3) and logs the largest.
func (c *e2eCluster) checkOverlaps(t *testing.T, m vipMark) {
	t.Helper()
	var worst time.Duration
	for _, o := range c.watch.OverlapsSince(m) {
		worst = max(worst, o.dur)
		if o.dur > overlapSlack {
			t.Errorf("invariant 3: %v held the VIP at once for %v (from %s)", o.nodes, o.dur.Round(time.Millisecond), o.from.Format("15:04:05.000"))
		}
	}
	if c.vipOK {
		t.Logf("largest VIP overlap in this schedule: %v", worst)
	}
}

// checkInvariants settles the cluster and checks the invariants after a
// schedule: one leader, the VIP on it alone, sm_state odd and above the
// last one (newState) or unchanged, every acknowledged SM_MON registered,
// every node's FSM at the same point, every client host notified of the
// new state from the VIP, no VIP overlap. It returns the leader.
func (c *e2eCluster) checkInvariants(t *testing.T, m vipMark, newState bool) (*nsmNode, admin.Status) {
	t.Helper()
	c.mu.Lock()
	last := c.lastState
	c.mu.Unlock()
	minState := last
	if newState {
		minState = last + 1
	}
	v := c.settle(t, 30*time.Second, minState)
	ls := v.leaderStatus()
	c.mu.Lock()
	if ls.SMState > c.lastState {
		c.lastState = ls.SMState
	}
	c.mu.Unlock()
	switch {
	case ls.SMState%2 != 1:
		t.Errorf("invariant 2: sm_state %d is even while serving", ls.SMState)
	case newState && ls.SMState <= last:
		t.Errorf("invariant 2: sm_state %d after a takeover, was %d: it must rise", ls.SMState, last)
	case !newState && ls.SMState != last:
		t.Errorf("sm_state %d, was %d: no takeover expected", ls.SMState, last)
	}
	c.checkRegistrations(t, v.leader)
	// Invariant 6 (as far as the status shows it): every node has applied
	// the same index and holds as many registrations.
	c.checkSameApplied(t)
	if newState {
		if src, ok := c.notifySource(v.leader); ok {
			c.checkNotified(t, ls.SMState, src, 20*time.Second)
		}
	}
	c.checkOverlaps(t, m)
	return v.leader, ls
}

// notifySource is the address SM_NOTIFY must come from: the VIP; with
// --vip-mode none the leader's own address; false when the VIP should
// work but does not (the notifier cannot send from it).
func (c *e2eCluster) notifySource(leader *nsmNode) (netip.Addr, bool) {
	switch {
	case c.vipOK:
		return c.vip, true
	case c.vipMode == "none":
		return leader.host.ip, true
	}
	return netip.Addr{}, false
}

// probeVIP decides whether the VIP checks run: the settled leader must
// have the VIP configured within a bound.
func (c *e2eCluster) probeVIP(t *testing.T, leader *nsmNode) {
	t.Helper()
	if c.vipMode == "none" {
		t.Logf("NSMD_E2E_VIP_MODE=none: VIP checks off; SM_NOTIFY expected from the leader's own address")
		return
	}
	const probe = 20 * time.Second
	deadline := time.Now().Add(probe)
	var s admin.Status
	for time.Now().Before(deadline) {
		var err error
		s, err = leader.status()
		if err == nil && s.VIPHeld && slices.Equal(c.watch.Holders(), []string{leader.id}) {
			c.vipOK = true
			_, valid, _ := c.watch.Summary()
			t.Logf("VIP %s is on leader %s (valid_lft %ds): VIP checks on", c.vip, leader.id, valid)
			return
		}
		time.Sleep(vipWatchEvery)
	}
	c.vipWhy = fmt.Sprintf("--vip-mode %s: leader %s did not configure %s within %v (vip_held=%v, holders %v)",
		c.vipMode, leader.id, c.vip, probe, s.VIPHeld, c.watch.Holders())
	t.Logf("VIP checks OFF: %s", c.vipWhy)
}

// skipIfVIPMissing ends a schedule whose non-VIP checks passed as skipped
// when the VIP checks could not run.
func (c *e2eCluster) skipIfVIPMissing(t *testing.T) {
	t.Helper()
	if !c.vipOK && c.vipMode != "none" && !t.Failed() {
		t.Skipf("waiting for: a working --vip-mode netlink (%s); the checks that need no VIP passed", c.vipWhy)
	}
}

// restore brings the cluster back to health before a schedule: every node
// running (resumed, restarted), then settled.
func (c *e2eCluster) restore(t *testing.T) (*nsmNode, admin.Status) {
	t.Helper()
	for _, n := range c.nodes {
		if n.running() {
			n.signal(syscall.SIGCONT)
		} else {
			n.start(t)
		}
	}
	c.mu.Lock()
	last := c.lastState
	c.mu.Unlock()
	v := c.settle(t, 30*time.Second, last)
	ls := v.leaderStatus()
	c.mu.Lock()
	if ls.SMState > c.lastState {
		c.lastState = ls.SMState
	}
	c.mu.Unlock()
	return v.leader, ls
}

func (c *e2eCluster) nextTag(prefix string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.monSeq++
	return fmt.Sprintf("%s%d", prefix, c.monSeq)
}

// tailFile returns the last n lines of a file.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 4*n {
			lines = append(lines[:0], lines[len(lines)-n:]...)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
