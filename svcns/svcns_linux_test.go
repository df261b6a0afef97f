//go:build linux

package svcns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/vip"
	"github.com/prometheus/client_golang/prometheus"
)

// The tests that need root run in a child process inside a network
// namespace A the parent makes ("the node"), whose veth svta is peered with
// svtb in a second namespace B ("a client"); 10.77.30.0/24, no default
// routes. Service namespaces are made off svta. Everything is named with
// the parent's pid and deleted by those names at the end.

const (
	childEnv  = "NSMD_SVCNS_CHILD"
	peerEnv   = "NSMD_SVCNS_PEER"
	prefixEnv = "NSMD_SVCNS_PREFIX"
	nodeDev   = "svta"
	peerDev   = "svtb"
	peerAddr  = "10.77.30.2"
	svcAddr   = "10.77.30.10"
)

var nsSeq atomic.Int32

// inNodeNetns runs the calling test again in a child inside A and returns
// B's name there; in the parent it reports the child's result and
// returns "".
func inNodeNetns(t *testing.T) string {
	t.Helper()
	base := fmt.Sprintf("nsmd-svt-%d-%d", os.Getpid(), nsSeq.Add(1))
	prefix := base + "s"
	return testutil.NetnsPair{
		Base:     base,
		ChildEnv: childEnv,
		PeerEnv:  peerEnv,
		Env:      []string{prefixEnv + "=" + prefix},
		Timeout:  3 * time.Minute,
		Setup: func(t *testing.T, a, b string) [][]string {
			// Service namespaces the child made and did not remove (it
			// failed or died): by the prefix only this test uses.
			t.Cleanup(func() {
				left, _ := filepath.Glob(filepath.Join(NetnsDir, prefix+"*"))
				for _, p := range left {
					t.Errorf("service namespace %s left behind: deleting it", p)
					exec.Command("ip", "netns", "del", filepath.Base(p)).Run()
				}
			})
			return [][]string{
				{"-n", a, "link", "set", "lo", "up"},
				{"-n", b, "link", "set", "lo", "up"},
				{"-n", a, "link", "add", nodeDev, "type", "veth", "peer", "name", peerDev, "netns", b},
				{"-n", b, "addr", "add", peerAddr + "/24", "dev", peerDev},
				{"-n", a, "link", "set", nodeDev, "up"},
				{"-n", b, "link", "set", peerDev, "up"},
			}
		},
	}.Run(t)
}

var svcSeq atomic.Int32

// testConfig is a fresh service namespace's config off svta (in the child).
func testConfig(t *testing.T) Config {
	t.Helper()
	return Config{
		Name:   fmt.Sprintf("%s%d", os.Getenv(prefixEnv), svcSeq.Add(1)),
		RunDir: filepath.Join(t.TempDir(), "svc"),
		Parent: nodeDev,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// create is Create, removed at the end whatever happens.
func create(t *testing.T, cfg Config) *NS {
	t.Helper()
	n, err := Create(cfg)
	if err != nil {
		t.Fatalf("Create(%s): %v", cfg.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Remove(ctx); err != nil {
			t.Errorf("cleanup Remove: %v", err)
		}
	})
	return n
}

// peerNS is namespace B opened to run the client there (never removed).
func peerNS(t *testing.T, b string) *NS {
	t.Helper()
	p, found, err := Open(Config{Name: b, RunDir: "/nonexistent-svcns-peer", Parent: peerDev})
	if err != nil || !found {
		t.Fatalf("open peer namespace %s: found %v, %v", b, found, err)
	}
	return p
}

func ipOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// startSleep starts `sleep 300` (through `ip netns exec ns`, which execs
// it: same pid), reaped at the end; shell wraps it when set.
func startSleep(t *testing.T, ns string, shell string) *exec.Cmd {
	t.Helper()
	args := []string{"netns", "exec", ns, "sleep", "300"}
	if shell != "" {
		args = []string{"netns", "exec", ns, "sh", "-c", shell + "; exec sleep 300"}
	}
	cmd := exec.Command("ip", args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sleep in %s: %v", ns, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	// Through the shell: ready once it exec'd sleep (its trap is set).
	testutil.WaitFor(t, 10*time.Second, "sleep started in "+ns, func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		return err == nil && strings.TrimSpace(string(b)) == "sleep"
	})
	return cmd
}

func exited(cmd *exec.Cmd) bool {
	// Signal 0 reaches a zombie too: its state says it exited.
	return syscall.Kill(cmd.Process.Pid, 0) != nil || procState(cmd.Process.Pid) == "Z"
}

func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
}

func threadNS(t *testing.T) nsID {
	t.Helper()
	id, err := pathID("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestServiceNamespace: a service namespace off svta serves a client in B
// on its own address, is what `ip netns exec` sees, and Remove stops its
// processes (and no other) and leaves nothing.
func TestServiceNamespace(t *testing.T) {
	b := inNodeNetns(t)
	if b == "" {
		return
	}
	cfg := testConfig(t)
	start := time.Now()
	n := create(t, cfg)
	t.Logf("Create took %v", time.Since(start))
	if n.Link() != nodeDev {
		t.Fatalf("Link() = %q, want the parent's name %q", n.Link(), nodeDev)
	}
	// Inside Do the thread is in the namespace; after it, back.
	outside := threadNS(t)
	var inside nsID
	if err := n.Do(func() error { inside = threadNS(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != n.id || inside == outside {
		t.Fatalf("Do ran in %v, want the namespace %v (outside %v)", inside, n.id, outside)
	}
	// The service's address on the macvlan, by a vip.Netlink made inside.
	var v *vip.Netlink
	if err := n.Do(func() (err error) {
		v, err = vip.NewNetlink(vip.NetlinkConfig{Prefix: netip.MustParsePrefix(svcAddr + "/24"),
			Interface: n.Link(), Bind: vip.BindInterface, Lifetime: 30 * time.Second,
			Registerer: prometheus.NewRegistry()})
		return err
	}); err != nil {
		t.Fatalf("vip inside: %v", err)
	}
	defer v.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := v.Acquire(ctx); err != nil {
		t.Fatalf("Acquire inside: %v", err)
	}
	// A prefix route, so the reply finds its way: the VIP has none.
	if out, err := exec.Command("ip", "-n", cfg.Name, "route", "add", "10.77.30.0/24", "dev", n.Link()).CombinedOutput(); err != nil {
		t.Fatalf("route inside: %v: %s", err, out)
	}
	// iproute2 sees the namespace, the macvlan and the address.
	if list := ipOut(t, "netns", "list"); !strings.Contains(list, cfg.Name) {
		t.Errorf("ip netns list does not show %s:\n%s", cfg.Name, list)
	}
	addr := ipOut(t, "netns", "exec", cfg.Name, "ip", "-d", "addr", "show", "dev", n.Link())
	for _, want := range []string{"macvlan mode bridge", svcAddr + "/24", "state UP"} {
		if !strings.Contains(addr, want) {
			t.Errorf("ip netns exec %s ip addr: no %q in\n%s", cfg.Name, want, addr)
		}
	}
	if lo := ipOut(t, "netns", "exec", cfg.Name, "ip", "link", "show", "lo"); !strings.Contains(lo, "UP") {
		t.Errorf("lo is not up inside:\n%s", lo)
	}
	// A listener inside answers a client in B on the service's address...
	l, err := n.Listen("tcp", svcAddr+":0")
	if err != nil {
		t.Fatalf("Listen inside: %v", err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(c, "hello from %s\n", c.LocalAddr())
	}()
	c, err := peerNS(t, b).DialContext(ctx, nil, "tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("dial %s from %s: %v", l.Addr(), b, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil || !strings.Contains(line, svcAddr) {
		t.Fatalf("answer from the service: %q, %v", line, err)
	}
	// The same over UDP (NSM's other transport), both ends in namespaces.
	pc, err := n.ListenPacket("udp", svcAddr+":0")
	if err != nil {
		t.Fatalf("ListenPacket inside: %v", err)
	}
	defer pc.Close()
	client, err := peerNS(t, b).ListenPacket("udp", peerAddr+":0")
	if err != nil {
		t.Fatalf("ListenPacket in %s: %v", b, err)
	}
	defer client.Close()
	if _, err := client.WriteTo([]byte("ping"), pc.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 16)
	k, from, err := pc.ReadFrom(buf)
	if err != nil || string(buf[:k]) != "ping" || !strings.HasPrefix(from.String(), peerAddr+":") {
		t.Fatalf("UDP inside got %q from %v, %v", buf[:k], from, err)
	}
	// ...and a listener on that address outside (here, in A) cannot exist:
	// the address is the namespace's.
	if l2, err := net.Listen("tcp", svcAddr+":0"); err == nil {
		l2.Close()
		t.Fatalf("the service's address is bindable outside its namespace")
	}

	inside1 := startSleep(t, cfg.Name, "")
	stubborn := startSleep(t, cfg.Name, `trap "" TERM`) // needs SIGKILL
	other := startSleep(t, b, "")                       // the control: another namespace
	testutil.WaitFor(t, 10*time.Second, "the sleeps inside are listed", func() bool {
		pids, err := n.Processes()
		return err == nil && slices.Contains(pids, inside1.Process.Pid) && slices.Contains(pids, stubborn.Process.Pid)
	})
	pids, _ := n.Processes()
	if slices.Contains(pids, other.Process.Pid) || slices.Contains(pids, os.Getpid()) {
		t.Fatalf("Processes() = %v lists the sleep in %s (%d) or this test (%d)", pids, b, other.Process.Pid, os.Getpid())
	}
	v.Close()

	start = time.Now()
	if err := n.Remove(ctx); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	t.Logf("Remove took %v (one process ignored SIGTERM)", time.Since(start))
	for _, c := range []*exec.Cmd{inside1, stubborn} {
		if !exited(c) {
			t.Errorf("pid %d inside survived Remove", c.Process.Pid)
		}
	}
	if exited(other) {
		t.Errorf("the control: pid %d in %s was killed by Remove of %s", other.Process.Pid, b, cfg.Name)
	}
	assertGone(t, cfg)
	if err := n.Remove(ctx); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if _, err := n.Listen("tcp", ":0"); err == nil {
		t.Errorf("Listen after Remove succeeded")
	}
}

// assertGone: no name, no run directory, no macvlan in this namespace,
// nothing in `ip netns list`.
func assertGone(t *testing.T, cfg Config) {
	t.Helper()
	for _, p := range []string{filepath.Join(NetnsDir, cfg.Name), cfg.RunDir} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there after Remove (%v)", p, err)
		}
	}
	if list := ipOut(t, "netns", "list"); strings.Contains(list, cfg.Name) {
		t.Errorf("ip netns list still shows %s:\n%s", cfg.Name, list)
	}
	if mv := ipOut(t, "-o", "link", "show", "type", "macvlan"); strings.TrimSpace(mv) != "" {
		t.Errorf("a macvlan is left:\n%s", mv)
	}
}

// TestCreateRefusals: an existing name, an existing run directory, a
// missing parent and the missing NFS filesystems are refused before
// anything changes.
func TestCreateRefusals(t *testing.T) {
	if inNodeNetns(t) == "" {
		return
	}
	cfg := testConfig(t)
	n := create(t, cfg)
	before, err := pathID(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	again := cfg
	again.RunDir = filepath.Join(t.TempDir(), "other")
	if _, err := Create(again); !errors.Is(err, ErrExists) {
		t.Fatalf("Create of an existing name: %v, want ErrExists", err)
	}
	if _, err := os.Lstat(again.RunDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused Create made its run directory (%v)", err)
	}
	// The first one is untouched: same namespace, its link, its run dir.
	if after, err := pathID(n.Path()); err != nil || after != before {
		t.Errorf("the name now names %v (%v), was %v", after, err, before)
	}
	if err := n.Do(func() error { _, err := net.InterfaceByName(n.Link()); return err }); err != nil {
		t.Errorf("the first namespace lost its link: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.RunDir, "state")); err != nil {
		t.Errorf("the first namespace lost its run directory: %v", err)
	}

	for _, c := range []struct {
		what string
		mod  func(*Config)
		want string
	}{
		{"existing run directory", func(c *Config) { c.RunDir = cfg.RunDir }, "already exists"},
		{"missing parent", func(c *Config) { c.Parent = "svt-none" }, `parent interface "svt-none"`},
		{"bad name", func(c *Config) { c.Name = "bad/name" }, "namespace name"},
		{"empty name", func(c *Config) { c.Name = "" }, "namespace name"},
		// Fails half-way (a macvlan cannot sit on a loopback): undone.
		{"loopback parent", func(c *Config) { c.Parent, c.Link = "lo", "svtmv" }, "create macvlan"},
	} {
		bad := testConfig(t)
		c.mod(&bad)
		_, err := Create(bad)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Create = %v, want an error about %q", c.what, err, c.want)
		}
		if bad.Name != "" && !strings.Contains(bad.Name, "/") {
			if _, err := os.Lstat(filepath.Join(NetnsDir, bad.Name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: the refused Create left %s (%v)", c.what, bad.Name, err)
			}
		}
		if bad.RunDir != cfg.RunDir {
			if _, err := os.Lstat(bad.RunDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: the refused Create left its run directory (%v)", c.what, err)
			}
		}
	}

	mounts := testConfig(t)
	mounts.Mounts = true
	missing := haveFilesystems("nfsd", "rpc_pipefs")
	m, err := Create(mounts)
	if missing != nil {
		if err == nil || !strings.Contains(err.Error(), "nfsd") && !strings.Contains(err.Error(), "rpc_pipefs") {
			t.Fatalf("Create with Mounts on a kernel without %v: %v", missing, err)
		}
		t.Logf("refused as wanted: %v", err)
		if _, serr := os.Lstat(filepath.Join(NetnsDir, mounts.Name)); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("the refused Create left its name (%v)", serr)
		}
		return
	}
	// A kernel with NFS: the filesystems are the namespace's, nfsd idle.
	if err != nil {
		t.Fatalf("Create with Mounts: %v", err)
	}
	if th, err := m.NfsdThreads(); err != nil || th != 0 {
		t.Errorf("NfsdThreads() = %d, %v; want 0", th, err)
	}
	if err := m.Remove(context.Background()); err != nil {
		t.Fatalf("Remove with mounts: %v", err)
	}
	assertGone(t, mounts)
}

// TestOpen: a predecessor's namespace is found and removed; an absent one
// is not found; a half-made one (an empty name file) is cleared; the
// process's own namespace is refused.
func TestOpen(t *testing.T) {
	if inNodeNetns(t) == "" {
		return
	}
	cfg := testConfig(t)
	if _, found, err := Open(cfg); found || err != nil {
		t.Fatalf("Open of an absent namespace: found %v, %v", found, err)
	}
	first := create(t, cfg)
	sleep := startSleep(t, cfg.Name, "")
	testutil.WaitFor(t, 10*time.Second, "the sleep is listed", func() bool {
		pids, _ := first.Processes()
		return slices.Contains(pids, sleep.Process.Pid)
	})
	// As a restarted nsmd would: a new handle by the name.
	n, found, err := Open(cfg)
	if err != nil || !found {
		t.Fatalf("Open of a predecessor's: found %v, %v", found, err)
	}
	if pids, err := n.Processes(); err != nil || !slices.Contains(pids, sleep.Process.Pid) {
		t.Errorf("the opened namespace's processes: %v, %v", pids, err)
	}
	if err := n.Remove(context.Background()); err != nil {
		t.Fatalf("Remove of the opened one: %v", err)
	}
	testutil.WaitFor(t, 5*time.Second, "the sleep is gone", func() bool { return exited(sleep) })
	assertGone(t, cfg)
	if err := first.Remove(context.Background()); err != nil {
		t.Errorf("Remove by the first handle after the second removed it: %v", err)
	}
	assertGone(t, cfg)

	half := testConfig(t)
	if err := os.WriteFile(filepath.Join(NetnsDir, half.Name), nil, 0); err != nil {
		t.Fatal(err)
	}
	h, found, err := Open(half)
	if err != nil || !found {
		t.Fatalf("Open of a half-made namespace: found %v, %v", found, err)
	}
	if err := h.Do(func() error { return nil }); err == nil {
		t.Errorf("Do in a half-made namespace succeeded")
	}
	if err := h.Remove(context.Background()); err != nil {
		t.Fatalf("Remove of a half-made namespace: %v", err)
	}
	assertGone(t, half)

	// The guard: a name bound to this process's own namespace is refused,
	// Remove would otherwise stop everything here.
	own := testConfig(t)
	ipOut(t, "netns", "attach", own.Name, fmt.Sprint(os.Getpid()))
	defer exec.Command("ip", "netns", "del", own.Name).Run()
	if _, _, err := Open(own); err == nil || !strings.Contains(err.Error(), "not a service namespace") {
		t.Fatalf("Open of this process's own namespace: %v, want a refusal", err)
	}
}

// TestDoReturnsToItsNamespace: after many Do calls every thread Go hands
// out is in the namespace it started in, and a panic inside reaches the
// caller.
func TestDoReturnsToItsNamespace(t *testing.T) {
	if inNodeNetns(t) == "" {
		return
	}
	n := create(t, testConfig(t))
	home := threadNS(t)
	for range 50 {
		if err := n.Do(func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan nsID, 64)
	for range cap(done) {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			id, _ := pathID("/proc/thread-self/ns/net")
			done <- id
		}()
	}
	for range cap(done) {
		if id := <-done; id != home {
			t.Fatalf("a thread is in %v, not in its own namespace %v", id, home)
		}
	}
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the panic raised inside", p)
			}
		}()
		_ = n.Do(func() error { panic("boom") })
	}()
	if _, err := n.DialContext(context.Background(), nil, "tcp", "example.com:80"); err == nil || !strings.Contains(err.Error(), "IP literal") {
		t.Errorf("DialContext by name: %v, want a refusal", err)
	}
}

// TestRemoveLeavesWhatIsNotItsOwn: Remove refuses to delete a name that
// now names another namespace, or a run directory with a filesystem
// mounted below it (whose files it would otherwise delete); once those
// are gone it finishes.
func TestRemoveLeavesWhatIsNotItsOwn(t *testing.T) {
	b := inNodeNetns(t)
	if b == "" {
		return
	}
	cfg := testConfig(t)
	n := create(t, cfg)
	// The name rebound to B, as if someone made another namespace by it.
	if err := syscall.Unmount(n.Path(), syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(filepath.Join(NetnsDir, b), n.Path(), "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	err := n.Remove(context.Background())
	if err == nil || !strings.Contains(err.Error(), "names another namespace") {
		t.Fatalf("Remove with the name rebound: %v, want a refusal", err)
	}
	if _, err := os.Stat(n.Path()); err != nil {
		t.Fatalf("the other namespace's name was deleted: %v", err)
	}
	if err := syscall.Unmount(n.Path(), syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	// A filesystem mounted below the run directory, with a file in it.
	state := filepath.Join(cfg.RunDir, "state")
	if err := syscall.Mount("tmpfs", state, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(state, "etab")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = n.Remove(context.Background())
	if err == nil || !strings.Contains(err.Error(), "mounted below it") {
		t.Fatalf("Remove with a mount below the run directory: %v, want a refusal", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("Remove deleted a file in a filesystem mounted below the run directory: %v", err)
	}
	if err := syscall.Unmount(state, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.Remove(context.Background()); err != nil {
		t.Fatalf("Remove once they are gone: %v", err)
	}
	assertGone(t, cfg)
}

// TestRemoveIsBoundedAndStopsAtAFailure: a process that ignores SIGTERM
// outlives a Remove whose ctx ends before the SIGKILL; that Remove says so
// and removes nothing more (the name, the link and the run directory stay).
// A Remove with time enough then finishes.
func TestRemoveIsBoundedAndStopsAtAFailure(t *testing.T) {
	if inNodeNetns(t) == "" {
		return
	}
	cfg := testConfig(t)
	n := create(t, cfg)
	stubborn := startSleep(t, cfg.Name, `trap "" TERM`)
	testutil.WaitFor(t, 10*time.Second, "the sleep is listed", func() bool {
		pids, _ := n.Processes()
		return slices.Contains(pids, stubborn.Process.Pid)
	})
	ctx, cancel := context.WithTimeout(context.Background(), termWait/4)
	defer cancel()
	start := time.Now()
	err := n.Remove(ctx)
	took := time.Since(start)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Remove with a short ctx: %v, want the deadline", err)
	}
	if took > termWait {
		t.Errorf("Remove took %v, beyond its ctx (%v)", took, termWait/4)
	}
	t.Logf("refused as wanted after %v: %v", took, err)
	if exited(stubborn) {
		t.Fatalf("the process got SIGKILL within the short ctx")
	}
	for _, p := range []string{n.Path(), cfg.RunDir} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s removed by a Remove that failed at its first step: %v", p, err)
		}
	}
	if err := n.Do(func() error { _, err := net.InterfaceByName(n.Link()); return err }); err != nil {
		t.Errorf("the link went with a Remove that failed at its first step: %v", err)
	}
	if err := n.Remove(context.Background()); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if !exited(stubborn) {
		t.Errorf("the process survived Remove")
	}
	assertGone(t, cfg)
}
