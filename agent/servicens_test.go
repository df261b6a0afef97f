package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/service"
	"github.com/nsmd/nsmd/vip"
)

// nsRecorder stands in for the services' namespaces (svcns needs root and
// a kernel with nfsd: the agent's root test and the VM tier run the real
// ones): it logs each step to the room harness's log, in order with the
// hooks, the address and the NSM; a namespace "left by an earlier run"
// exists for the ids in stale; Remove fails for failRemove.
type nsRecorder struct {
	log        string
	mu         sync.Mutex
	live       map[string]bool // ids with a namespace
	dirs       map[string]string
	failRemove string
}

type nsFake struct {
	r  *nsRecorder
	id string
}

func (f nsFake) Do(fn func() error) error { return fn() }
func (f nsFake) Remove(context.Context) error {
	if f.id == f.r.failRemove {
		appendLine(f.r.log, f.id+" ns remove failed")
		return errors.New("nfsd still has 8 threads in it")
	}
	f.r.mu.Lock()
	delete(f.r.live, f.id)
	f.r.mu.Unlock()
	appendLine(f.r.log, f.id+" ns removed")
	return nil
}

func (r *nsRecorder) create(spec service.Spec, runDir string) (svcNamespace, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live[spec.ID] {
		return nil, errors.New("exists")
	}
	r.live[spec.ID], r.dirs[spec.ID] = true, runDir
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, err
	}
	appendLine(r.log, spec.ID+" ns created")
	return nsFake{r, spec.ID}, nil
}

func (r *nsRecorder) open(spec service.Spec, _ string) (svcNamespace, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.live[spec.ID] {
		return nil, false, nil
	}
	return nsFake{r, spec.ID}, true, nil
}

// With service_namespaces, a service's start makes its namespace before
// its address, NSM and hook, and waits for its NSM's registration before
// its SM_NOTIFY; its stop removes the namespace after the hook, the
// address and the NSM; the stop at start removes one an earlier run
// left, after the hook's stop ran in it; a removal that fails fails the
// stop (the server may still serve the service: its watchdog covers it)
// and runs on_fault.
func TestServiceRoomMakesAndRemovesTheServicesNamespace(t *testing.T) {
	home := loopbackSpec("home", "127.77.0.1/32")
	rh := newRoomHarness(t, []service.Spec{home}, nil)
	rh.room.cfg.nsm = nsmRecorder{log: rh.logPath()}
	ns := &nsRecorder{log: rh.logPath(), live: map[string]bool{"home": true}, dirs: map[string]string{}}
	rh.room.cfg.ns, rh.room.cfg.runRoot = ns, filepath.Join(rh.dir, "run")

	if err := rh.room.StopService("home", 0); err != nil {
		t.Fatalf("stop at start: %v", err)
	}
	env := rh.env(t, "home", "follower")
	if env["NSMD_SERVICE_NAMESPACES"] != "on" || env["NSMD_SERVICE_RUN_DIR"] != filepath.Join(rh.dir, "run", "home") || env["NSMD_SERVICE_NAMESPACE"] != "nsmd-home" {
		t.Errorf("stop at start: the namespace's environment: %v", env)
	}
	if err := rh.room.ServeService(context.Background(), "home", 3); err != nil {
		t.Fatalf("ServeService: %v", err)
	}
	if got := ns.dirs["home"]; got != filepath.Join(rh.dir, "run", "home") {
		t.Errorf("run directory %q", got)
	}
	if err := rh.room.StopService("home", 3); err != nil {
		t.Fatalf("StopService: %v", err)
	}
	want := []string{
		"home_nsm_stopping", "home_follower_begin", "home_follower_end", "home_nsm_close", "home_ns_removed", // the earlier run's
		"home_ns_created", "127.77.0.1_address_up", "home_nsm_open_in_its_namespace", "home_leader_begin", "home_leader_end",
		"home_nsm_ready", "home_nsm_announce_3",
		"home_nsm_stopping", "home_follower_begin", "home_follower_end", "127.77.0.1_address_down", "home_nsm_close", "home_ns_removed",
	}
	if got := rh.lines(t); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("order:\n got %v\nwant %v", got, want)
	}

	// A removal that fails: the stop fails, on_fault runs, and the next
	// start removes the namespace before it makes one (never adopts it).
	if err := rh.room.ServeService(context.Background(), "home", 4); err != nil {
		t.Fatalf("ServeService: %v", err)
	}
	ns.failRemove = "home"
	err := rh.room.StopService("home", 4)
	if err == nil || !strings.Contains(err.Error(), "remove its network namespace nsmd-home") || !strings.Contains(err.Error(), "8 threads") {
		t.Fatalf("StopService with a failing removal: %v", err)
	}
	if env := rh.env(t, "home", "fault"); !strings.Contains(env["NSMD_REASON"], "nsmd-home") {
		t.Errorf("on_fault not told of the failed removal: %v", env)
	}
	if st := rh.statusOf(t, "home"); st.Phase != roomFailed {
		t.Errorf("phase after a failed removal: %s", st.Phase)
	}
	ns.failRemove = ""
	if err := rh.room.ServeService(context.Background(), "home", 5); err != nil {
		t.Fatalf("ServeService after a failed removal: %v", err)
	}
	lines := rh.lines(t)
	tail := strings.Join(lines[len(lines)-8:], " ")
	if !strings.HasPrefix(tail, "home_ns_removed home_ns_created") {
		t.Errorf("the start after a failed removal did not remove the namespace first: %v", lines[len(lines)-8:])
	}
}

// A namespace an earlier process made for a service the configuration no
// longer has is removed before the node serves anything; a run directory
// that names no namespace stops the start (what runs there is unknown).
func TestOrphanNamespacesAreRemovedBeforeServing(t *testing.T) {
	rh := newRoomHarness(t, []service.Spec{loopbackSpec("home", "127.77.0.1/32")}, nil)
	ns := &nsRecorder{log: rh.logPath(), live: map[string]bool{"gone": true, "home": true}, dirs: map[string]string{}}
	root := filepath.Join(rh.dir, "run")
	rh.room.cfg.ns, rh.room.cfg.runRoot = ns, root
	for id, marker := range map[string]string{"gone": "nsmd-gone eth0\n", "home": "nsmd-home lo\n"} {
		if err := os.MkdirAll(filepath.Join(root, id), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, id, nsMarker), []byte(marker), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := rh.room.removeOrphanNamespaces(context.Background()); err != nil {
		t.Fatalf("removeOrphanNamespaces: %v", err)
	}
	if ns.live["gone"] || !ns.live["home"] {
		t.Fatalf("after the scan: %v (want gone removed, home left to its stop at start)", ns.live)
	}
	if err := os.MkdirAll(filepath.Join(root, "unknown"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := rh.room.removeOrphanNamespaces(context.Background()); err == nil || !strings.Contains(err.Error(), "names no namespace") {
		t.Fatalf("a run directory without its marker: %v", err)
	}
}

// With service_namespaces, the real thing (svcns, root): a service's
// address is on the macvlan inside its namespace, not on the server's
// interface, while on_leader and on_follower run; its NSM answers inside
// the namespace; after the stop the namespace, its run directory and the
// address are gone, and a process the hook left in it is stopped — one in
// the server's own namespace is not (the control).
func TestServiceRoomNamespaceOnARealKernel(t *testing.T) {
	if !inRoomNetns(t) {
		return
	}
	addr := netip.MustParseAddr("10.78.0.60")
	nsName := fmt.Sprintf("nsmd-room-svc-%d", os.Getpid())
	var dir string
	seen := func(d, event string) string {
		return fmt.Sprintf(`ip netns exec "$NSMD_SERVICE_NAMESPACE" ip -o -4 addr show > %[1]s/%[2]s.inside; ip -o -4 addr show > %[1]s/%[2]s.outside
if [ %[2]s = leader ]; then ip netns exec "$NSMD_SERVICE_NAMESPACE" sleep 300 >/dev/null 2>&1 & echo $! > %[1]s/inside.pid; fi`, d, event)
	}
	spec := service.Spec{ID: "home", Address: netip.PrefixFrom(addr, 24), Interface: roomDev, Namespace: nsName}
	rh := newRoomHarness(t, []service.Spec{spec}, func(c *config.Config, d string) {
		dir = d
		c.VIPMode, c.VIPBind = config.VIPNetlink, vip.BindInterface
		c.OnLeader = roomScript(t, d, "leader", seen(d, "leader"))
		c.OnFollower = roomScript(t, d, "follower", seen(d, "follower"))
	})
	rh.room.cfg.ns, rh.room.cfg.runRoot = svcnsMaker{log: slog.Default()}, filepath.Join(dir, "run")
	outside := exec.Command("sleep", "300")
	if err := outside.Start(); err != nil {
		t.Fatal(err)
	}
	defer outside.Process.Kill()

	if err := rh.room.StopService("home", 0); err != nil {
		t.Fatalf("stop at start: %v", err)
	}
	if err := rh.room.ServeService(context.Background(), "home", 1); err != nil {
		t.Fatalf("ServeService: %v", err)
	}
	if in, out := readFile(t, filepath.Join(dir, "leader.inside")), readFile(t, filepath.Join(dir, "leader.outside")); !strings.Contains(in, " "+addr.String()+"/24") || strings.Contains(out, " "+addr.String()+"/") {
		t.Fatalf("on_leader saw inside the namespace:\n%s\nand in the server's own:\n%s", in, out)
	}
	if roomAddrOnDev(t, roomDev, addr) {
		t.Fatal("the service's address is on the server's own interface")
	}
	if _, err := os.Stat(filepath.Join(dir, "run", "home", nsMarker)); err != nil {
		t.Errorf("the run directory has no marker: %v", err)
	}
	if err := rh.room.StopService("home", 1); err != nil {
		t.Fatalf("StopService: %v", err)
	}
	if in := readFile(t, filepath.Join(dir, "follower.inside")); !strings.Contains(in, " "+addr.String()+"/24") {
		t.Errorf("on_follower did not see the address inside: %s", in)
	}
	for _, p := range []string{filepath.Join("/run/netns", nsName), filepath.Join(dir, "run", "home")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the stop: %v", p, err)
		}
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(dir, "inside.pid"))))
	if pid <= 0 || alive(pid) {
		t.Errorf("the process the hook left inside (pid %d) still runs after the stop", pid)
	}
	if err := outside.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("control: a process outside the namespace was stopped too: %v", err)
	}
}

// alive reports whether pid runs (a zombie waiting for its parent does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}
