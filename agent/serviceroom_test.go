package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/service"
	"github.com/nsmd/nsmd/vip"
)

// roomHarness is a serviceRoom of a validated configuration with real
// hook scripts, as an agent builds it.
type roomHarness struct {
	room  *serviceRoom
	cfg   config.Config
	reg   *prometheus.Registry
	hooks *hookRunner // the node's runner: the template of each service's
	dir   string
	log   *testutil.LockedBuffer
}

// roomScript is a hook that appends "<service> <event> begin|end" to the
// harness's log and writes the NSMD_ environment of its run to
// <service>.<event>.env; body runs between begin and end.
func roomScript(t *testing.T, dir, event, body string) string {
	return writeScript(t, dir, event+".sh", fmt.Sprintf(`log=%[1]s/log
echo "$NSMD_SERVICE %[2]s begin" >> "$log"
env | grep '^NSMD_' | sort > "%[1]s/$NSMD_SERVICE.%[2]s.env"
%[3]s
echo "$NSMD_SERVICE %[2]s end" >> "$log"
`, dir, event, body))
}

func newRoomHarness(t *testing.T, specs []service.Spec, tune func(c *config.Config, dir string)) *roomHarness {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.NodeID = "node7"
	cfg.VIPMode = config.VIPLoopback
	cfg.HookTimeout = 10 * time.Second
	cfg.Services = specs
	cfg.OnLeader = roomScript(t, dir, "leader", "")
	cfg.OnFollower = roomScript(t, dir, "follower", "")
	cfg.OnFault = roomScript(t, dir, "fault", "")
	if tune != nil {
		tune(&cfg, dir)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the harness runs configurations a node accepts: %v", err)
	}
	rh := &roomHarness{cfg: cfg, reg: prometheus.NewRegistry(), dir: dir, log: &testutil.LockedBuffer{}}
	log := slog.New(slog.NewTextHandler(rh.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rh.hooks = newHookRunner(cfg, log, rh.reg)
	rh.hooks.start(context.Background())
	t.Cleanup(rh.hooks.stop)
	c := roomConfigOf(cfg, rh.hooks, log, rh.reg)
	c.nsmPort = testutil.FreePort(t, "127.0.0.1")
	c.serve = func(_ service.Spec, addr string) (vip.Server, error) { return listenOnly(rh.logPath(), addr) }
	rh.room = newServiceRoom(c)
	t.Cleanup(func() {
		if err := rh.room.close(); err != nil {
			t.Errorf("room close: %v", err)
		}
	})
	return rh
}

func (rh *roomHarness) logPath() string { return filepath.Join(rh.dir, "log") }

// lines is the harness's log so far.
func (rh *roomHarness) lines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(rh.logPath())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(strings.TrimSpace(string(b)), " ", "_"))
}

// env is the NSMD_ environment the last <event> hook of svc ran with.
func (rh *roomHarness) env(t *testing.T, svc, event string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, l := range strings.Split(readFile(t, filepath.Join(rh.dir, svc+"."+event+".env")), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

func (rh *roomHarness) statusOf(t *testing.T, svc string) serviceRoomStatus {
	t.Helper()
	for _, st := range rh.room.status() {
		if st.Service == svc {
			return st
		}
	}
	t.Fatalf("no status of service %s", svc)
	return serviceRoomStatus{}
}

// listenOnly holds a loopback service address for the tests: a TCP
// listener on it (what the agent serves there is its NSM programs), and
// "<addr> address up|down" in the harness's log.
func listenOnly(logPath, addr string) (vip.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(addr)
	appendLine(logPath, host+" address up")
	return listenerServer{ln: ln, log: logPath, host: host}, nil
}

type listenerServer struct {
	ln        net.Listener
	log, host string
}

func (s listenerServer) Shutdown(context.Context) error {
	err := s.ln.Close()
	appendLine(s.log, s.host+" address down")
	return err
}

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}

// answers reports whether something listens on the service's address.
func (rh *roomHarness) answers(spec service.Spec) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(spec.Address.Addr().String(), strconv.Itoa(rh.room.cfg.nsmPort)), 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// nsmRecorder stands in for the services' NSM side (servicensm.go,
// which needs a running cluster node: the e2e services drill runs it):
// it logs each step to the harness's log, in order with the hooks and
// the address; open fails for the service failOpen.
type nsmRecorder struct {
	log      string
	failOpen string
}

func (n nsmRecorder) open(spec service.Spec, ns svcNamespace) error {
	if ns != nil {
		appendLine(n.log, spec.ID+" nsm open in its namespace")
	} else {
		appendLine(n.log, spec.ID+" nsm open")
	}
	if spec.ID == n.failOpen {
		return fmt.Errorf("service %s: listen for NSM on its address: address in use", spec.ID)
	}
	return nil
}
func (n nsmRecorder) announce(_ context.Context, id string, epoch uint64) {
	appendLine(n.log, fmt.Sprintf("%s nsm announce %d", id, epoch))
}
func (n nsmRecorder) ready(_ context.Context, id string) error {
	appendLine(n.log, id+" nsm ready")
	return nil
}
func (n nsmRecorder) stopping(id string, _ uint64) { appendLine(n.log, id+" nsm stopping") }
func (n nsmRecorder) close(id string) error        { appendLine(n.log, id+" nsm close"); return nil }

func loopbackSpec(id, addr string) service.Spec {
	return service.Spec{ID: id, Address: netip.MustParsePrefix(addr), Interface: "lo", Mount: "/srv/" + id, ExportClients: []string{"10.0.0.0/24"}}
}

func TestServiceStateIsOddAndNewAtEveryEpoch(t *testing.T) {
	for _, c := range []struct {
		epoch uint64
		want  int32
	}{{0, 1}, {1, 3}, {3, 7}, {1<<30 - 2, math.MaxInt32 - 2}, {1<<30 - 1, math.MaxInt32}, {1 << 40, math.MaxInt32}, {math.MaxUint64, math.MaxInt32}} {
		if got := serviceState(c.epoch); got != c.want {
			t.Errorf("serviceState(%d) = %d, want %d", c.epoch, got, c.want)
		}
	}
}

// A service's start takes its address, then runs on_leader; its stop runs
// on_follower, then drops the address; each hook is told the service, its
// epoch and its state; the stop at start (epoch 0) says so.
func TestServiceRoomStartAndStopEnvironmentAndOrder(t *testing.T) {
	home := loopbackSpec("home", "127.77.0.1/32")
	rh := newRoomHarness(t, []service.Spec{home, loopbackSpec("scratch", "127.77.0.2/32")}, nil)
	rh.room.cfg.nsm = nsmRecorder{log: rh.logPath()}
	if st := rh.statusOf(t, "home"); st.Phase != roomStopped || st.AddressHeld || st.LastHook != nil {
		t.Fatalf("status before anything ran: %+v", st)
	}
	if err := rh.room.StopService("home", 0); err != nil {
		t.Fatalf("stop at start: %v", err)
	}
	env := rh.env(t, "home", "follower")
	for k, want := range map[string]string{"NSMD_EVENT": "follower", "NSMD_ROLE": "service", "NSMD_REASON": "start-of-process",
		"NSMD_SERVICE_EPOCH": "0", "NSMD_SM_STATE": "1", "NSMD_SERVICE": "home"} {
		if env[k] != want {
			t.Errorf("stop at start: %s=%q, want %q", k, env[k], want)
		}
	}

	if err := rh.room.ServeService(context.Background(), "home", 3); err != nil {
		t.Fatalf("ServeService: %v", err)
	}
	if !rh.answers(home) {
		t.Fatal("the service's address does not answer once ServeService returned")
	}
	env = rh.env(t, "home", "leader")
	want := map[string]string{
		"NSMD_EVENT": "leader", "NSMD_NODE_ID": "node7", "NSMD_ROLE": "service", "NSMD_REASON": "start",
		"NSMD_VIP": "127.77.0.1/32", "NSMD_SM_STATE": "7", "NSMD_SERVICE_EPOCH": "3",
		"NSMD_SERVICE": "home", "NSMD_SERVICE_ADDRESS": "127.77.0.1", "NSMD_SERVICE_PREFIX": "32",
		"NSMD_SERVICE_INTERFACE": "lo", "NSMD_SERVICE_MOUNT": "/srv/home", "NSMD_SERVICE_EXPORT_CLIENTS": "10.0.0.0/24",
		"NSMD_SERVICE_NAMESPACE": "nsmd-home", "NSMD_SERVICE_NAMESPACES": "off", "NSMD_GRACE_SECONDS": strconv.Itoa(int(rh.cfg.GracePeriod / time.Second)),
	}
	for k, w := range want {
		if env[k] != w {
			t.Errorf("on_leader: %s=%q, want %q", k, env[k], w)
		}
	}
	if _, ok := rh.env(t, "home", "leader")["NSMD_SERVICE_DEVICE"]; !ok {
		t.Error("on_leader: NSMD_SERVICE_DEVICE not set (empty: the hook's default)")
	}
	st := rh.statusOf(t, "home")
	if st.Phase != roomServing || st.Epoch != 3 || !st.AddressHeld || st.LastHook == nil || st.LastHook.Hook != "on_leader" ||
		st.LastHook.Epoch != 3 || st.LastHook.Err != "" || st.LastFailure != nil {
		t.Fatalf("status while serving: %+v (last hook %+v)", st, st.LastHook)
	}
	if st := rh.statusOf(t, "scratch"); st.Phase != roomStopped || st.AddressHeld {
		t.Fatalf("the other service: %+v", st)
	}

	if err := rh.room.StopService("home", 3); err != nil {
		t.Fatalf("StopService: %v", err)
	}
	if rh.answers(home) {
		t.Fatal("the service's address still answers after StopService returned")
	}
	env = rh.env(t, "home", "follower")
	if env["NSMD_REASON"] != "stop" || env["NSMD_SERVICE_EPOCH"] != "3" || env["NSMD_SM_STATE"] != "7" || env["NSMD_ROLE"] != "service" {
		t.Errorf("on_follower environment: %v", env)
	}
	wantLog := []string{
		"home_nsm_stopping", "home_follower_begin", "home_follower_end", "home_nsm_close", // the stop at start
		"127.77.0.1_address_up", "home_nsm_open", "home_leader_begin", "home_leader_end", "home_nsm_ready", "home_nsm_announce_3",
		"home_nsm_stopping", "home_follower_begin", "home_follower_end", "127.77.0.1_address_down", "home_nsm_close",
	}
	if got := rh.lines(t); strings.Join(got, " ") != strings.Join(wantLog, " ") {
		t.Errorf("order:\n got %v\nwant %v", got, wantLog)
	}
	if st := rh.statusOf(t, "home"); st.Phase != roomStopped || st.AddressHeld || st.LastHook.Hook != "on_follower" {
		t.Errorf("status after the stop: %+v", st)
	}
	if n := testutil.GatheredValue(t, rh.reg, "nsmd_hook_runs_total", "hook", "on_leader", "result", hookOK); n != 1 {
		t.Errorf("nsmd_hook_runs_total{on_leader,ok} = %v, want 1", n)
	}
	if n := testutil.GatheredValue(t, rh.reg, "nsmd_hook_runs_total", "hook", "on_follower", "result", hookOK); n != 2 {
		t.Errorf("nsmd_hook_runs_total{on_follower,ok} = %v, want 2", n)
	}

	if err := rh.room.ServeService(context.Background(), "nosuch", 1); err == nil || !strings.Contains(err.Error(), "not in this node's configuration") {
		t.Errorf("ServeService of an unknown service: %v", err)
	}
	if err := rh.room.StopService("nosuch", 1); err == nil {
		t.Error("StopService of an unknown service: no error")
	}
	if _, err := os.Stat(filepath.Join(rh.dir, "nosuch.leader.env")); err == nil {
		t.Error("a hook ran for an unknown service")
	}
}

// openFifo makes a fifo; Cleanup opens it read-write once, so that a
// script or a test blocked on its other end never stays blocked.
func openFifo(t *testing.T, path string) string {
	t.Helper()
	if err := syscallMkfifo(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_RDWR, 0); err == nil {
			f.Close()
		}
	})
	return path
}

// awaitFifo waits until a writer opened and closed the fifo (a script
// said it got there).
func awaitFifo(t *testing.T, path string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := os.ReadFile(path)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no script reached %s within 10 s", path)
	}
}

// One service's slow stop does not delay another's start: each service
// has its own hook queue. The control runs the same two hooks through
// one queue (the node's runner), where the start waits for the stop.
func TestServiceRoomHooksOfTwoServicesDoNotWaitForEachOther(t *testing.T) {
	specs := []service.Spec{loopbackSpec("a", "127.77.0.11/32"), loopbackSpec("b", "127.77.0.12/32")}
	var started, release string
	tune := func(c *config.Config, dir string) {
		started, release = openFifo(t, filepath.Join(dir, "started")), openFifo(t, filepath.Join(dir, "release"))
		c.OnFollower = roomScript(t, dir, "follower", fmt.Sprintf(`if [ "$NSMD_SERVICE" = a ]; then echo x > %s; read x < %s; fi`, started, release))
	}

	t.Run("room", func(t *testing.T) {
		rh := newRoomHarness(t, specs, tune)
		if err := rh.room.ServeService(context.Background(), "a", 1); err != nil {
			t.Fatal(err)
		}
		stopA := make(chan error, 1)
		go func() { stopA <- rh.room.StopService("a", 1) }()
		awaitFifo(t, started)
		if st := rh.statusOf(t, "a"); st.Phase != roomStopping {
			t.Errorf("a's phase while its stop hook runs: %s", st.Phase)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rh.room.ServeService(ctx, "b", 1); err != nil {
			t.Fatalf("b's start while a's stop hook blocks: %v", err)
		}
		select {
		case err := <-stopA:
			t.Fatalf("a's stop returned while its hook still blocks: %v", err)
		default:
		}
		if err := os.WriteFile(release, []byte("go\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := <-stopA; err != nil {
			t.Fatalf("a's stop: %v", err)
		}
		got := strings.Join(rh.lines(t), " ")
		if !strings.Contains(got, "b_leader_end a_follower_end") {
			t.Errorf("b's start did not complete before a's stop ended: %s", got)
		}
	})

	t.Run("control: one queue", func(t *testing.T) {
		rh := newRoomHarness(t, specs, tune)
		env := func(id string) hookEnv { return rh.room.env(&svcRoom{spec: rh.room.specs[id]}, 1, "x") }
		stopA := rh.hooks.run(context.Background(), hookEventFollower, env("a"))
		startB := rh.hooks.run(context.Background(), hookEventLeader, env("b"))
		awaitFifo(t, started)
		if err := os.WriteFile(release, []byte("go\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, c := range []<-chan error{stopA, startB} {
			if err := <-c; err != nil {
				t.Fatal(err)
			}
		}
		got := strings.Join(rh.lines(t), " ")
		if !strings.Contains(got, "a_follower_end b_leader_begin") {
			t.Errorf("in one queue b's start should wait for a's stop: %s", got)
		}
	})
}

// A failed start hook fails the start, after on_fault ran with the
// service's environment; the address stays until the stop, which still
// runs on_follower and drops it. A failed stop hook fails the stop, and
// the address is dropped all the same.
func TestServiceRoomFailedHooks(t *testing.T) {
	home := loopbackSpec("home", "127.77.0.21/32")
	rh := newRoomHarness(t, []service.Spec{home}, func(c *config.Config, dir string) {
		c.OnLeader = roomScript(t, dir, "leader", `echo "mount failed" >&2; exit 3`)
	})
	err := rh.room.ServeService(context.Background(), "home", 4)
	if err == nil || !strings.Contains(err.Error(), "on_leader") {
		t.Fatalf("ServeService with a failing on_leader: %v", err)
	}
	fault := rh.env(t, "home", "fault") // written before ServeService returned
	for k, want := range map[string]string{"NSMD_EVENT": "fault", "NSMD_ROLE": "service", "NSMD_SERVICE": "home",
		"NSMD_SERVICE_EPOCH": "4", "NSMD_SM_STATE": "9", "NSMD_VIP": "127.77.0.21/32"} {
		if fault[k] != want {
			t.Errorf("on_fault: %s=%q, want %q", k, fault[k], want)
		}
	}
	if !strings.Contains(fault["NSMD_REASON"], "on_leader failed") {
		t.Errorf("on_fault reason: %q", fault["NSMD_REASON"])
	}
	st := rh.statusOf(t, "home")
	if st.Phase != roomFailed || !st.AddressHeld || st.LastHook == nil || st.LastHook.Err == "" ||
		st.LastFailure == nil || !strings.Contains(st.LastFailure.Output, "mount failed") {
		t.Fatalf("status after a failed start: %+v (last hook %+v, failure %+v)", st, st.LastHook, st.LastFailure)
	}
	if n := testutil.GatheredValue(t, rh.reg, "nsmd_hook_runs_total", "hook", "on_leader", "result", hookFailed); n != 1 {
		t.Errorf("nsmd_hook_runs_total{on_leader,failed} = %v, want 1", n)
	}

	if err := rh.room.StopService("home", 4); err != nil {
		t.Fatalf("StopService after a failed start: %v", err)
	}
	if env := rh.env(t, "home", "follower"); env["NSMD_SERVICE_EPOCH"] != "4" || env["NSMD_REASON"] != "stop" {
		t.Errorf("on_follower after a failed start: %v", env)
	}
	if rh.answers(home) || rh.statusOf(t, "home").AddressHeld {
		t.Fatal("the address is still held after the stop of a failed start")
	}

	t.Run("NSM not opened", func(t *testing.T) {
		rh := newRoomHarness(t, []service.Spec{home}, nil)
		rh.room.cfg.nsm = nsmRecorder{log: rh.logPath(), failOpen: "home"}
		if err := rh.room.ServeService(context.Background(), "home", 6); err == nil || !strings.Contains(err.Error(), "address in use") {
			t.Fatalf("ServeService whose NSM cannot open: %v", err)
		}
		if _, err := os.Stat(filepath.Join(rh.dir, "home.leader.env")); err == nil {
			t.Error("on_leader ran although the service's NSM did not open")
		}
		if f := rh.env(t, "home", "fault"); f["NSMD_SERVICE"] != "home" || !strings.Contains(f["NSMD_REASON"], "address in use") {
			t.Errorf("on_fault: %v", f)
		}
		if err := rh.room.StopService("home", 6); err != nil {
			t.Fatal(err)
		}
		got := strings.Join(rh.lines(t), " ")
		if want := "127.77.0.21_address_up home_nsm_open home_fault_begin home_fault_end home_nsm_stopping home_follower_begin home_follower_end 127.77.0.21_address_down home_nsm_close"; got != want {
			t.Errorf("order:\n got %s\nwant %s", got, want)
		}
	})

	t.Run("failed stop", func(t *testing.T) {
		rh := newRoomHarness(t, []service.Spec{home}, func(c *config.Config, dir string) {
			c.OnFollower = roomScript(t, dir, "follower", `exit 5`)
		})
		if err := rh.room.ServeService(context.Background(), "home", 2); err != nil {
			t.Fatal(err)
		}
		if err := rh.room.StopService("home", 2); err == nil || !strings.Contains(err.Error(), "on_follower") {
			t.Fatalf("StopService with a failing on_follower: %v", err)
		}
		if rh.answers(home) || rh.statusOf(t, "home").AddressHeld {
			t.Fatal("the address is still held after a failed stop")
		}
		if st := rh.statusOf(t, "home"); st.Phase != roomFailed {
			t.Errorf("phase after a failed stop: %s", st.Phase)
		}
		if rh.env(t, "home", "fault")["NSMD_SERVICE"] != "home" {
			t.Error("on_fault did not run with the service's environment")
		}
	})
}

// A start whose run must stop returns without waiting for on_leader; the
// stop that follows runs after it (one queue per service).
func TestServiceRoomStartCancelled(t *testing.T) {
	home := loopbackSpec("home", "127.77.0.31/32")
	var started, release string
	rh := newRoomHarness(t, []service.Spec{home}, func(c *config.Config, dir string) {
		started, release = openFifo(t, filepath.Join(dir, "started")), openFifo(t, filepath.Join(dir, "release"))
		c.OnLeader = roomScript(t, dir, "leader", fmt.Sprintf("echo x > %s; read x < %s", started, release))
	})
	ctx, cancel := context.WithCancel(context.Background())
	serve := make(chan error, 1)
	go func() { serve <- rh.room.ServeService(ctx, "home", 1) }()
	awaitFifo(t, started)
	cancel()
	if err := <-serve; !errors.Is(err, context.Canceled) {
		t.Fatalf("ServeService after its context ended: %v", err)
	}
	stop := make(chan error, 1)
	go func() { stop <- rh.room.StopService("home", 1) }()
	if err := os.WriteFile(release, []byte("go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-stop; err != nil {
		t.Fatal(err)
	}
	got := strings.Join(rh.lines(t), " ")
	if !strings.Contains(got, "home_leader_end home_follower_begin home_follower_end 127.77.0.31_address_down") {
		t.Errorf("order: %s", got)
	}
}

// --- the netlink address, inside a network namespace -------------------

const (
	roomNetnsEnv = "NSMD_ROOM_NETNS_CHILD"
	roomDev      = "svc0"
)

// inRoomNetns runs the calling test again in a child process inside a
// fresh network namespace with a veth pair, svc0 (10.78.0.1/24) and svc0p; in
// the child it returns true and the test goes on. The namespace is
// deleted by name at the end. It skips, saying why, without root or ip.
func inRoomNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(roomNetnsEnv) != "" {
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: ip (iproute2) not installed")
	}
	ns := fmt.Sprintf("nsmd-room-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("skipping: ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	for _, c := range [][]string{
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", roomDev, "type", "veth", "peer", "name", roomDev + "p"},
		{"-n", ns, "addr", "add", "10.78.0.1/24", "dev", roomDev},
		{"-n", ns, "link", "set", roomDev, "up"},
		{"-n", ns, "link", "set", roomDev + "p", "up"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), roomNetnsEnv+"=1", "GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	text := string(out)
	if strings.Contains(text, "--- SKIP: "+t.Name()) {
		t.Skipf("child skipped:\n%s", text)
	}
	if err != nil || !strings.Contains(text, "--- PASS: "+t.Name()) {
		t.Fatalf("in netns %s: %v\n%s", ns, err, text)
	}
	t.Logf("passed inside netns %s:\n%s", ns, text)
	return false
}

// roomAddrOnDev reports whether addr is on dev (ip -j addr show).
func roomAddrOnDev(t *testing.T, dev string, addr netip.Addr) bool {
	t.Helper()
	out, err := exec.Command("ip", "-j", "addr", "show", "dev", dev).Output()
	if err != nil {
		t.Fatalf("ip addr show dev %s: %v", dev, err)
	}
	var links []struct {
		AddrInfo []struct {
			Local string `json:"local"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if a.Local == addr.String() {
				return true
			}
		}
	}
	return false
}

// In vip_mode netlink each service's address is a vip.Netlink of its
// own on its interface: there while on_leader and on_follower run, gone
// after the stop. A copy a previous process left is removed by the stop
// at start (epoch 0) — both when the room meets the service first and
// when its address exists already — while an ordinary stop leaves a copy
// it did not hold (the control).
func TestServiceRoomNetlinkAddress(t *testing.T) {
	if !inRoomNetns(t) {
		return
	}
	addr := netip.MustParseAddr("10.78.0.50")
	seen := func(dir, event string) string { // the hook's view of the address
		return fmt.Sprintf(`if ip -o addr show dev %s | grep -q ' %s/'; then echo present; else echo absent; fi > %s/%s.addr`, roomDev, addr, dir, event)
	}
	var dir string
	rh := newRoomHarness(t, []service.Spec{{ID: "home", Address: netip.PrefixFrom(addr, 24), Interface: roomDev}}, func(c *config.Config, d string) {
		dir = d
		c.VIPMode, c.VIPBind = config.VIPNetlink, vip.BindInterface
		c.OnLeader = roomScript(t, d, "leader", seen(d, "leader"))
		c.OnFollower = roomScript(t, d, "follower", seen(d, "follower"))
	})
	runIP := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}

	runIP("addr", "add", addr.String()+"/32", "dev", roomDev) // a previous process's copy
	if err := rh.room.StopService("home", 0); err != nil {
		t.Fatalf("stop at start: %v", err)
	}
	if roomAddrOnDev(t, roomDev, addr) {
		t.Fatal("a previous process's copy is still there after the stop at start")
	}

	if err := rh.room.ServeService(context.Background(), "home", 1); err != nil {
		t.Fatalf("ServeService: %v", err)
	}
	if !roomAddrOnDev(t, roomDev, addr) || !rh.statusOf(t, "home").AddressHeld {
		t.Fatal("the address is not on the interface once ServeService returned")
	}
	if got := strings.TrimSpace(readFile(t, filepath.Join(dir, "leader.addr"))); got != "present" {
		t.Errorf("on_leader saw the address %s", got)
	}
	if n := testutil.GatheredValue(t, rh.reg, "nsmd_vip_acquired_total", "service", "home"); n != 1 {
		t.Errorf(`nsmd_vip_acquired_total{service="home"} = %v, want 1`, n)
	}
	if err := rh.room.StopService("home", 1); err != nil {
		t.Fatalf("StopService: %v", err)
	}
	if got := strings.TrimSpace(readFile(t, filepath.Join(dir, "follower.addr"))); got != "present" {
		t.Errorf("on_follower saw the address %s (it goes after the hook)", got)
	}
	if roomAddrOnDev(t, roomDev, addr) || rh.statusOf(t, "home").AddressHeld {
		t.Fatal("the address is still there after StopService returned")
	}

	runIP("addr", "add", addr.String()+"/24", "dev", roomDev)
	if err := rh.room.StopService("home", 1); err != nil {
		t.Fatalf("a second ordinary stop: %v", err)
	}
	if !roomAddrOnDev(t, roomDev, addr) {
		t.Fatal("control: an ordinary stop removed a copy it did not hold; the check below no longer shows what epoch 0 adds")
	}
	if err := rh.room.StopService("home", 0); err != nil {
		t.Fatalf("stop at start with the address made already: %v", err)
	}
	if roomAddrOnDev(t, roomDev, addr) {
		t.Fatal("the copy is still there after the stop at start")
	}
	if !roomAddrOnDev(t, roomDev, netip.MustParseAddr("10.78.0.1")) {
		t.Fatal("the interface's own address went too")
	}
	done := make(chan struct{}) // status read while a start runs (the race detector watches)
	go func() {
		defer close(done)
		for range 20 {
			rh.room.status()
		}
	}()
	if err := rh.room.ServeService(context.Background(), "home", 2); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := rh.room.close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if roomAddrOnDev(t, roomDev, addr) {
		t.Fatal("the address is still there after the room closed")
	}
}
