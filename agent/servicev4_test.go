//go:build linux

package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cld/cldtest"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/grace"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/service"
)

// fsmScopes is the real state machine, applying each command at once as
// a lone node's leader does, with every service's scope as a
// serviceScope; its observer hands each applied scoped command to the
// services' NFSv4 side, as the agent's subscriber does.
type fsmScopes struct {
	t  *testing.T
	f  *fsm.FSM
	v4 *serviceV4s

	mu    sync.Mutex
	index uint64
}

func newFSMScopes(t *testing.T) *fsmScopes {
	s := &fsmScopes{t: t}
	s.f = fsm.New(fsm.Options{Observer: func(index uint64, cmd fsm.Command, res fsm.Result) {
		if sc, ok := cmd.(fsm.Scoped); ok && s.v4 != nil {
			s.v4.applied(sc, cluster.Applied{Index: index, Cmd: cmd, Result: res})
		}
	}})
	return s
}

func (s *fsmScopes) apply(cmds ...fsm.Command) []fsm.Result {
	s.t.Helper()
	b, err := fsm.Encode(cmds...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.index++
	i := s.index
	s.mu.Unlock()
	out := s.f.Apply(&raft.Log{Index: i, Type: raft.LogCommand, Data: b})
	res, ok := out.([]fsm.Result)
	if !ok {
		s.t.Fatalf("apply %T: %v", cmds[0], out)
	}
	return res
}

type fsmScope struct {
	s  *fsmScopes
	id string
}

func (c fsmScope) sc() fsm.Scope                     { return c.s.f.Scope(c.id) }
func (c fsmScope) State() int32                      { return c.sc().State() }
func (c fsmScope) AppliedIndex() uint64              { return c.s.f.AppliedIndex() }
func (c fsmScope) Epochs() (uint64, uint64)          { return c.sc().Epochs() }
func (c fsmScope) V4Clients(rec bool) []fsm.V4Client { return c.sc().V4Clients(rec) }
func (c fsmScope) V4Counts() (int, int, int)         { return c.sc().V4Counts() }
func (c fsmScope) HasV4Client(n string) (bool, bool) { return c.sc().HasV4Client(n) }
func (c fsmScope) MonitoredHosts() []string {
	var out []string
	for _, tg := range c.sc().Targets() {
		out = append(out, tg.MonName)
	}
	return out
}
func (c fsmScope) do(cmd fsm.Command) fsm.Result {
	p, _ := c.s.f.PlacementOf(c.id) // sent by the service's current run
	return c.s.apply(fsm.Scoped{Service: c.id, Node: p.Node, Epoch: p.Epoch, Cmd: cmd})[0]
}
func (c fsmScope) TrackCreate(_ context.Context, name, princ string) error {
	c.do(fsm.ClientCreate{Name: name, PrincHash: princ})
	return nil
}
func (c fsmScope) TrackRemove(_ context.Context, name string) error {
	c.do(fsm.ClientRemove{Name: name})
	return nil
}
func (c fsmScope) TrackCheck(_ context.Context, name string) (bool, error) {
	return c.do(fsm.ClientCheck{Name: name}).Accepted, nil
}
func (c fsmScope) TrackGraceStart(context.Context) ([]fsm.V4Client, error) {
	c.do(fsm.GraceStart{})
	return c.sc().V4Clients(true), nil
}
func (c fsmScope) TrackGraceDone(context.Context) error { c.do(fsm.GraceDone{}); return nil }

// fakeNetns is a FAKE of a network namespace as far as lockd's grace file
// goes (a real one needs root; the VM tier runs real ones): the file is
// <proc>/fs/lockd/nlm_end_grace and acts on the namespace of the thread
// that touches it, so here <proc>/fs/lockd is a symbolic link to the
// host's lockd directory, pointed at the namespace's own one while a
// function runs "inside" (Do). A read or write made outside Do reaches
// the host's file.
type fakeNetns struct {
	mu     *sync.Mutex // one thread "inside" at a time
	link   string      // <proc>/fs/lockd
	host   string      // the host's lockd directory
	lockd  string      // this namespace's
	inside *int
}

func (n fakeNetns) Do(fn func() error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := os.Remove(n.link); err != nil {
		return err
	}
	if err := os.Symlink(n.lockd, n.link); err != nil {
		return err
	}
	*n.inside++
	defer func() {
		os.Remove(n.link)
		os.Symlink(n.host, n.link)
	}()
	return fn()
}

func (fakeNetns) Remove(context.Context) error { return nil }

func writeFileAll(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readTrim(t *testing.T, path string) string { return strings.TrimSpace(readFile(t, path)) }

// Two services served here, each in its own namespace with its own nfsd
// and lockd (FAKE kernel files: plain files in a temporary directory, and
// cld/cldtest's fake of nfsd's side of the tracking pipe). Service a's
// nfsd finds its pipe in a's run directory, is handed a's records at
// GraceStart; once a's clients are back (its monitored host re-monitors
// through this node's lockd, its NFSv4 client reclaims), a's grace ends
// early: a's nfsd file and a's lockd file (written from inside a's
// namespace) say so. Service b, whose clients have not come back, stays
// in grace (the negative control), and so do the host's lockd and nfsd;
// the node-level table and b's scope are untouched. Last, the fake is
// shown to tell the namespaces apart: a write of lockd's file outside a
// namespace lands in the host's.
func TestServiceGraceEndsInItsOwnNamespaceOnly(t *testing.T) {
	dir := t.TempDir()
	proc := filepath.Join(dir, "proc")
	hostLockd := filepath.Join(dir, "host-lockd")
	writeFileAll(t, filepath.Join(hostLockd, "nlm_end_grace"), "N\n")
	writeFileAll(t, filepath.Join(proc, "fs", "nfsd", "v4_end_grace"), "N\n")
	writeFileAll(t, filepath.Join(proc, "locks"), "")
	if err := os.Symlink(hostLockd, filepath.Join(proc, "fs", "lockd")); err != nil {
		t.Fatal(err)
	}
	var nsMu sync.Mutex
	inside := map[string]*int{}
	runDir := func(id string) string { return filepath.Join(dir, "run", id) }
	kernels := map[string]*cldtest.Kernel{}
	nss := map[string]fakeNetns{}
	for _, id := range []string{"a", "b"} {
		writeFileAll(t, filepath.Join(dir, "ns-"+id, "lockd", "nlm_end_grace"), "N\n")
		writeFileAll(t, filepath.Join(runDir(id), "nfsd", "v4_end_grace"), "N\n")
		k, err := cldtest.New(filepath.Join(runDir(id), "rpc_pipefs"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		kernels[id] = k
		inside[id] = new(int)
		nss[id] = fakeNetns{mu: &nsMu, link: filepath.Join(proc, "fs", "lockd"), host: hostLockd,
			lockd: filepath.Join(dir, "ns-"+id, "lockd"), inside: inside[id]}
	}

	// Both services placed here; each has a client of NLM (a registration
	// of this node's lockd) and one of NFSv4 (a record) from before.
	sc := newFSMScopes(t)
	sc.apply(fsm.ServicesDeclared{Node: "n1", Services: []fsm.ServiceDecl{{ID: "a", Fingerprint: "fa"}, {ID: "b", Fingerprint: "fb"}}},
		fsm.ServicePlaced{Service: "a", Node: "n1", Epoch: 1, Reason: "placed"},
		fsm.ServicePlaced{Service: "b", Node: "n1", Epoch: 1, Reason: "placed"})
	lockd := fsm.MyID{MyName: "n1", Prog: 100021, Vers: 4, Proc: 16}
	mon := func(host string) fsm.Registration {
		return fsm.Registration{ID: fsm.MonID{MonName: host, My: lockd}, Node: "n1",
			Callback: netip.MustParseAddr("127.0.0.1"), Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.9")}, Added: time.Now()}
	}
	for _, id := range []string{"a", "b"} {
		fsmScope{sc, id}.do(fsm.Register{Reg: mon("client-" + id), Guarded: true})
		fsmScope{sc, id}.do(fsm.ClientCreate{Name: "v4-" + id, PrincHash: "p"})
	}

	v4 := &serviceV4s{node: "n1", log: slog.New(slog.DiscardHandler), tracking: true, auto: true,
		settle: 50 * time.Millisecond, poll: 10 * time.Millisecond, proc: proc,
		scope: func(id string) serviceScope { return fsmScope{sc, id} },
		tune: func(id string, c *cld.Config) {
			if c.PipefsDir != kernels[id].Dir() {
				t.Errorf("service %s's tracking pipe looked for in %s, want its namespace's %s", id, c.PipefsDir, kernels[id].Dir())
			}
			if c.MountPipefs {
				t.Errorf("service %s: mounting rpc_pipefs (the namespace has its own)", id)
			}
			c.OpenPipe, c.IsPipefs = kernels[id].OpenPipe, kernels[id].IsPipefs
		},
		byID: map[string]*serviceV4{}}
	sc.v4 = v4
	defer v4.closeAll()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range []string{"a", "b"} {
		if err := v4.open(service.Spec{ID: id}, nss[id], runDir(id)); err != nil {
			t.Fatalf("open %s: %v", id, err)
		}
		// The hook, run next, reads that the pipe's reader waits for nfsd.
		if st := readTrim(t, serviceV4StatusPath(runDir(id))); !strings.Contains(st, "state=waiting") {
			t.Errorf("%s's status file right after open: %q", id, st)
		}
		// nfsd starts in the namespace (on_leader): GraceStart hands it
		// the service's records, and only them.
		recs, err := kernels[id].Start(ctx)
		if err != nil {
			t.Fatalf("%s's nfsd start: %v", id, err)
		}
		if len(recs) != 1 || string(recs[0].Name) != "v4-"+id {
			t.Fatalf("%s's nfsd was handed %q", id, recs)
		}
		v4.serving(ctx, id)
	}
	status := readTrim(t, serviceV4StatusPath(runDir("a")))
	if !strings.Contains(status, "state=open") || !strings.Contains(status, "grace_start_sm_state=3") {
		t.Errorf("a's status file: %q", status)
	}

	// a's clients come back: its host re-monitors through this node's
	// lockd, its NFSv4 client reclaims and sends RECLAIM_COMPLETE (a
	// Create on a's pipe).
	fsmScope{sc, "a"}.do(fsm.Register{Reg: mon("client-a"), Guarded: true})
	if err := kernels["a"].Create(ctx, []byte("v4-a"), []byte("p")); err != nil {
		t.Fatalf("a's Create: %v", err)
	}
	aLockd := filepath.Join(dir, "ns-a", "lockd", "nlm_end_grace")
	aNFSd := filepath.Join(runDir("a"), "nfsd", "v4_end_grace")
	testutil.WaitForSeen(t, 10*time.Second, "a's grace ended in a's namespace", func() (bool, string) {
		l, n := readTrim(t, aLockd), readTrim(t, aNFSd)
		return l == "Y" && n == "Y", "lockd " + l + ", nfsd " + n
	})
	if st := v4.get("a").grace.Status(); st.NLM.Ended == nil || st.NFSv4.Ended == nil {
		t.Errorf("a's grace status: %+v", st)
	}
	// The negative control: b waits for its own clients; the host's
	// lock managers are not a's to end.
	for path, want := range map[string]string{
		filepath.Join(dir, "ns-b", "lockd", "nlm_end_grace"): "N",
		filepath.Join(runDir("b"), "nfsd", "v4_end_grace"):   "N",
		filepath.Join(hostLockd, "nlm_end_grace"):            "N",
		filepath.Join(proc, "fs", "nfsd", "v4_end_grace"):    "N",
	} {
		if got := readTrim(t, path); got != want {
			t.Errorf("%s: %q, want %q (untouched)", path, got, want)
		}
	}
	if *inside["a"] == 0 {
		t.Error("a's lockd file was never touched from inside a's namespace")
	}
	if cur, rec := sc.f.Epochs(); cur != 1 || rec != 0 {
		t.Errorf("the node-level table moved to epochs %d/%d", cur, rec)
	}
	if cur, rec := sc.f.Scope("b").Epochs(); cur != 2 || rec != 1 {
		t.Errorf("b's scope: epochs %d/%d, want its own grace (2/1)", cur, rec)
	}
	if names := v4.get("b").grace.Status().NFSv4.Missing; !slices.Equal(names, []string{"v4-b"}) {
		t.Errorf("b still waits for %q, want v4-b", names)
	}

	// b's clients come back too: its own grace ends, in its own files.
	fsmScope{sc, "b"}.do(fsm.Register{Reg: mon("client-b"), Guarded: true})
	if err := kernels["b"].Create(ctx, []byte("v4-b"), []byte("p")); err != nil {
		t.Fatalf("b's Create: %v", err)
	}
	testutil.WaitForSeen(t, 10*time.Second, "b's grace ended in b's namespace", func() (bool, string) {
		l, n := readTrim(t, filepath.Join(dir, "ns-b", "lockd", "nlm_end_grace")), readTrim(t, filepath.Join(runDir("b"), "nfsd", "v4_end_grace"))
		return l == "Y" && n == "Y", "lockd " + l + ", nfsd " + n
	})
	if got := readTrim(t, filepath.Join(hostLockd, "nlm_end_grace")); got != "N" {
		t.Errorf("the host's lockd file: %q", got)
	}

	// The fake tells namespaces apart: lockd's file written from outside
	// any namespace is the host's.
	if err := (grace.KernelGrace{Proc: proc}).End(grace.NLM); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(hostLockd, "nlm_end_grace")); got != "Y" {
		t.Fatalf("a write outside the namespaces did not reach the host's lockd file (%q): the fake cannot catch a service's write landing there", got)
	}

	// The stop: the pipe closes (nfsd's next upcall finds no reader).
	if err := v4.close("a"); err != nil {
		t.Fatal(err)
	}
	if v4.get("a") != nil {
		t.Fatal("a's NFSv4 side still open after close")
	}
}

// v4Recorder logs each step of a service's NFSv4 side to the room
// harness's log.
type v4Recorder struct{ log string }

func (v v4Recorder) open(spec service.Spec, ns svcNamespace, runDir string) error {
	if ns == nil || runDir == "" {
		appendLine(v.log, spec.ID+" v4 open without a namespace")
		return nil
	}
	appendLine(v.log, spec.ID+" v4 open")
	return nil
}
func (v v4Recorder) serving(_ context.Context, id string) { appendLine(v.log, id+" v4 serving") }
func (v v4Recorder) close(id string) error                { appendLine(v.log, id+" v4 close"); return nil }

// With service namespaces, the room opens a service's NFSv4 side after its
// NSM and before on_leader (nfsd looks for the pipe's reader as it
// starts), lets its grace end early only once on_leader returned, and
// closes it after the stop's hook and NSM, before the namespace goes (its
// pipe holds the namespace's rpc_pipefs); the hooks are told the
// service's own tracking status file. Without namespaces (the control)
// nothing of it runs and the hooks are not told of one.
func TestServiceRoomOpensTheServicesNFSv4SideInItsNamespace(t *testing.T) {
	home := loopbackSpec("home", "127.77.0.2/32")
	rh := newRoomHarness(t, []service.Spec{home}, nil)
	rh.room.cfg.nsm = nsmRecorder{log: rh.logPath()}
	rh.room.cfg.v4 = v4Recorder{log: rh.logPath()}
	if err := rh.room.ServeService(context.Background(), "home", 2); err != nil {
		t.Fatalf("ServeService without namespaces: %v", err)
	}
	if err := rh.room.StopService("home", 2); err != nil {
		t.Fatalf("StopService without namespaces: %v", err)
	}
	for _, l := range rh.lines(t) {
		if strings.Contains(l, "_v4_") {
			t.Errorf("without namespaces the NFSv4 side ran: %v", rh.lines(t))
			break
		}
	}
	if v, ok := rh.env(t, "home", "leader")["NSMD_SERVICE_NFSV4_TRACKING_STATUS"]; ok {
		t.Errorf("without namespaces the hook is told of a service's tracking status file %q", v)
	}
	if err := os.Remove(rh.logPath()); err != nil {
		t.Fatal(err)
	}

	ns := &nsRecorder{log: rh.logPath(), live: map[string]bool{}, dirs: map[string]string{}}
	rh.room.cfg.ns, rh.room.cfg.runRoot = ns, filepath.Join(rh.dir, "run")
	if err := rh.room.ServeService(context.Background(), "home", 3); err != nil {
		t.Fatalf("ServeService: %v", err)
	}
	if err := rh.room.StopService("home", 3); err != nil {
		t.Fatalf("StopService: %v", err)
	}
	want := []string{
		"home_ns_created", "127.77.0.2_address_up", "home_nsm_open_in_its_namespace", "home_v4_open", "home_leader_begin", "home_leader_end",
		"home_nsm_ready", "home_nsm_announce_3", "home_v4_serving",
		"home_nsm_stopping", "home_follower_begin", "home_follower_end", "127.77.0.2_address_down", "home_nsm_close", "home_v4_close", "home_ns_removed",
	}
	if got := rh.lines(t); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("order:\n got %v\nwant %v", got, want)
	}
	wantFile := filepath.Join(rh.dir, "run", "home", serviceV4StatusFile)
	for _, event := range []string{"leader", "follower"} {
		if got := rh.env(t, "home", event)["NSMD_SERVICE_NFSV4_TRACKING_STATUS"]; got != wantFile {
			t.Errorf("%s hook told NSMD_SERVICE_NFSV4_TRACKING_STATUS=%q, want %q", event, got, wantFile)
		}
	}
}
