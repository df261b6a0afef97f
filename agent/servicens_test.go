package agent

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nsmd/nsmd/service"
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
