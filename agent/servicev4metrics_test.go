//go:build linux

package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cld/cldtest"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/grace"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/service"
)

// fakeNamespaces makes each service's namespace a fakeNetns (a FAKE: a
// real one needs root; the VM tier runs real ones): its own lockd grace
// file, reached only from "inside" (Do).
type fakeNamespaces struct {
	mu   sync.Mutex
	nss  map[string]fakeNetns
	live map[string]bool
}

func (f *fakeNamespaces) create(spec service.Spec, runDir string) (svcNamespace, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.live[spec.ID] {
		return nil, fmt.Errorf("namespace of %s exists", spec.ID)
	}
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, err
	}
	f.live[spec.ID] = true
	return fakeNSOf{f, spec.ID}, nil
}

func (f *fakeNamespaces) open(spec service.Spec, _ string) (svcNamespace, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.live[spec.ID] {
		return nil, false, nil
	}
	return fakeNSOf{f, spec.ID}, true, nil
}

type fakeNSOf struct {
	f  *fakeNamespaces
	id string
}

func (n fakeNSOf) Do(fn func() error) error { return n.f.nss[n.id].Do(fn) }
func (n fakeNSOf) Remove(context.Context) error {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	delete(n.f.live, n.id)
	return nil
}

// v4Series are the series of gatherer g whose name begins with
// nsmd_service_nfsv4_ or nsmd_service_grace_ and whose service label is
// id: "name{label=value,…}" (labels sorted, service left out) → value.
func v4Series(t *testing.T, g prometheus.Gatherer, id string) map[string]float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "nsmd_service_nfsv4_") && !strings.HasPrefix(f.GetName(), "nsmd_service_grace_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			svc := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "service" {
					svc = l.GetValue()
					continue
				}
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			if svc != id {
				continue
			}
			slices.Sort(labels)
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// wantSeries checks the series of got that want names (a missing one
// fails; others are not looked at).
func wantSeries(got map[string]float64, want map[string]float64) string {
	var bad []string
	for k, v := range want {
		if g, ok := got[k]; !ok {
			bad = append(bad, k+" missing")
		} else if g != v {
			bad = append(bad, fmt.Sprintf("%s = %v, want %v", k, g, v))
		}
	}
	slices.Sort(bad)
	return strings.Join(bad, "; ")
}

// graceStateSeries is the grace state series of a manager: 1 for state,
// 0 for the others.
func graceStateSeries(m grace.Manager, state string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range graceStates() {
		out["nsmd_service_grace_state{manager="+string(m)+",state="+s+"}"] = b2f(s == state)
	}
	return out
}

func merge(ms ...map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// A served service's NFSv4 tracking and grace are visible per service,
// and only while it is served here: two services started by a real
// service room, each in its own (FAKE) namespace with its own (FAKE)
// nfsd files and cld/cldtest's fake of nfsd's side of its tracking pipe,
// over the real state machine. Once each nfsd started, every series of
// each service carries that service's clients (a: one lockd host, two
// NFSv4 clients; b: one of each), in grace; as a's clients come back a's
// series follow — reclaimed, back, the Create upcall, then its grace
// ended (all_reclaimed) with its duration — while b's do not move (the
// two services' series never mix); GET /v1/services's local status says
// the same. a's stop takes every series of a away and leaves b's; the
// control: a second server that opens a's NFSv4 side while the first
// still has it shows a's grace on two servers, which the count catches.
func TestServiceNFSv4SeriesFollowTheServiceRoom(t *testing.T) {
	a, b := loopbackSpec("a", "127.77.1.1/32"), loopbackSpec("b", "127.77.1.2/32")
	rh := newRoomHarness(t, []service.Spec{a, b}, nil)
	runDir := func(id string) string { return filepath.Join(rh.dir, "run", id) }
	proc := filepath.Join(rh.dir, "proc")
	hostLockd := filepath.Join(rh.dir, "host-lockd")
	writeFileAll(t, filepath.Join(hostLockd, "nlm_end_grace"), "N\n")
	writeFileAll(t, filepath.Join(proc, "fs", "nfsd", "v4_end_grace"), "N\n")
	writeFileAll(t, filepath.Join(proc, "locks"), "")
	if err := os.Symlink(hostLockd, filepath.Join(proc, "fs", "lockd")); err != nil {
		t.Fatal(err)
	}
	var nsMu sync.Mutex
	nss := &fakeNamespaces{nss: map[string]fakeNetns{}, live: map[string]bool{}}
	kernels := map[string]*cldtest.Kernel{}
	for _, id := range []string{"a", "b"} {
		writeFileAll(t, filepath.Join(rh.dir, "ns-"+id, "lockd", "nlm_end_grace"), "N\n")
		writeFileAll(t, filepath.Join(runDir(id), "nfsd", "v4_end_grace"), "N\n")
		k, err := cldtest.New(filepath.Join(runDir(id), "rpc_pipefs"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		kernels[id] = k
		nss.nss[id] = fakeNetns{mu: &nsMu, link: filepath.Join(proc, "fs", "lockd"), host: hostLockd,
			lockd: filepath.Join(rh.dir, "ns-"+id, "lockd"), inside: new(int)}
	}

	// Both placed on this node (node7); a's clients: lockd host client-a,
	// NFSv4 v4-a1 and v4-a2; b's: client-b and v4-b.
	sc := newFSMScopes(t)
	sc.apply(fsm.ServicesDeclared{Node: "node7", Services: []fsm.ServiceDecl{{ID: "a", Fingerprint: "fa"}, {ID: "b", Fingerprint: "fb"}}},
		fsm.ServicePlaced{Service: "a", Node: "node7", Epoch: 1, Reason: "placed"},
		fsm.ServicePlaced{Service: "b", Node: "node7", Epoch: 1, Reason: "placed"})
	lockd := fsm.MyID{MyName: "node7", Prog: 100021, Vers: 4, Proc: 16}
	mon := func(host string) fsm.Command {
		return fsm.Register{Guarded: true, Reg: fsm.Registration{ID: fsm.MonID{MonName: host, My: lockd}, Node: "node7",
			Callback: netip.MustParseAddr("127.0.0.1"), Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.9")}, Added: time.Now()}}
	}
	clients := map[string][]string{"a": {"v4-a1", "v4-a2"}, "b": {"v4-b"}}
	for _, id := range []string{"a", "b"} {
		fsmScope{sc, id}.do(mon("client-" + id))
		for _, c := range clients[id] {
			fsmScope{sc, id}.do(fsm.ClientCreate{Name: c, PrincHash: "p"})
		}
	}

	newV4 := func(node string, tracking bool) (*serviceV4s, *prometheus.Registry) {
		v := &serviceV4s{node: node, log: slog.New(slog.DiscardHandler), tracking: tracking, whyNot: "nfsv4_tracking is off", auto: true,
			settle: 50 * time.Millisecond, poll: 10 * time.Millisecond, proc: proc,
			scope: func(id string) serviceScope { return fsmScope{sc, id} },
			tune:  func(id string, c *cld.Config) { c.OpenPipe, c.IsPipefs = kernels[id].OpenPipe, kernels[id].IsPipefs },
			byID:  map[string]*serviceV4{}}
		reg := prometheus.NewRegistry()
		reg.MustRegister(serviceV4Collector{v})
		t.Cleanup(v.closeAll)
		return v, reg
	}
	v4, reg := newV4("node7", true)
	sc.v4 = v4
	rh.room.cfg.v4 = v4
	rh.room.cfg.ns, rh.room.cfg.runRoot = nss, filepath.Join(rh.dir, "run")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, id := range []string{"a", "b"} {
		if got := v4Series(t, reg, id); len(got) != 0 {
			t.Fatalf("service %s not started, yet series: %v", id, got)
		}
	}
	for _, id := range []string{"a", "b"} {
		if err := rh.room.ServeService(ctx, id, 1); err != nil {
			t.Fatalf("ServeService %s: %v", id, err)
		}
		if _, err := kernels[id].Start(ctx); err != nil { // its nfsd, started by on_leader
			t.Fatalf("%s's nfsd start: %v", id, err)
		}
	}
	inGrace := func(id string, nlmBack, v4Back, reclaimed, creates float64) map[string]float64 {
		n := float64(len(clients[id]))
		return merge(graceStateSeries(grace.NLM, graceStateIn), graceStateSeries(grace.NFSv4, graceStateIn), map[string]float64{
			"nsmd_service_nfsv4_client_records{epoch=current}":                reclaimed,
			"nsmd_service_nfsv4_client_records{epoch=recovery}":               n,
			"nsmd_service_nfsv4_reclaimed_clients{}":                          reclaimed,
			"nsmd_service_nfsv4_pipe_open{}":                                  1,
			"nsmd_service_nfsv4_upcalls_total{command=grace_start,result=ok}": 1,
			"nsmd_service_nfsv4_upcalls_total{command=create,result=ok}":      creates,
			"nsmd_service_grace_expected_clients{manager=nlm}":                1,
			"nsmd_service_grace_expected_clients{manager=nfsv4}":              n,
			"nsmd_service_grace_back_clients{manager=nlm}":                    nlmBack,
			"nsmd_service_grace_back_clients{manager=nfsv4}":                  v4Back,
		})
	}
	for _, id := range []string{"a", "b"} {
		got := v4Series(t, reg, id)
		if bad := wantSeries(got, inGrace(id, 0, 0, 0, 0)); bad != "" {
			t.Errorf("service %s serving, in grace: %s\n(all: %v)", id, bad, got)
		}
		if _, ok := got["nsmd_service_grace_started_timestamp_seconds{}"]; !ok {
			t.Errorf("service %s: no grace start time", id)
		}
		if _, ok := got["nsmd_service_grace_duration_seconds{manager=nfsv4}"]; ok {
			t.Errorf("service %s: a duration of a grace still on", id)
		}
	}
	bBefore := v4Series(t, reg, "b")

	// One of a's NFSv4 clients reclaims (RECLAIM_COMPLETE: a Create on
	// a's pipe): a's series follow, b's do not move.
	if err := kernels["a"].Create(ctx, []byte("v4-a1"), []byte("p")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForSeen(t, 10*time.Second, "a's series show one NFSv4 client back", func() (bool, string) {
		bad := wantSeries(v4Series(t, reg, "a"), inGrace("a", 0, 1, 1, 1))
		return bad == "", bad
	})
	if got := v4Series(t, reg, "b"); wantSeries(got, bBefore) != "" {
		t.Errorf("a's client moved b's series: %s", wantSeries(got, bBefore))
	}
	nfs, g := v4.status("a")
	if nfs == nil || g == nil || !nfs.Tracking || nfs.Pipe == nil || nfs.Pipe.State != cld.StateOpen || nfs.Reclaimable != 2 || nfs.Reclaimed != 1 ||
		nfs.GraceStartSMState != 3 || nfs.GraceStartAt == nil || g.NFSv4.Expected != 2 || g.NFSv4.Back != 1 || !slices.Equal(g.NFSv4.Missing, []string{"v4-a2"}) || g.NFSv4.Ended != nil {
		t.Errorf("a's local status in grace: nfsv4 %+v grace %+v", nfs, g)
	}

	// The rest of a's clients come back: its grace ends, in both lock
	// managers, and says how and after how long.
	fsmScope{sc, "a"}.do(mon("client-a"))
	if err := kernels["a"].Create(ctx, []byte("v4-a2"), []byte("p")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForSeen(t, 10*time.Second, "a's series show its grace ended, all reclaimed", func() (bool, string) {
		got := v4Series(t, reg, "a")
		bad := wantSeries(got, merge(graceStateSeries(grace.NLM, grace.ReasonAllReclaimed), graceStateSeries(grace.NFSv4, grace.ReasonAllReclaimed)))
		for _, m := range []string{"nlm", "nfsv4"} {
			if d, ok := got["nsmd_service_grace_duration_seconds{manager="+m+"}"]; !ok || d <= 0 {
				bad += " no duration of " + m + "'s grace"
			}
		}
		return bad == "", bad
	})
	// Every name the collector describes is exported (the rules' check
	// on a cluster without namespaces trusts these names).
	seen := map[string]bool{}
	for k := range v4Series(t, reg, "a") {
		n, _, _ := strings.Cut(k, "{")
		seen[n] = true
	}
	for n := range NamespacedServiceMetrics() {
		if !seen[n] {
			t.Errorf("%s is described but not exported by a served service", n)
		}
	}
	if readTrim(t, filepath.Join(runDir("b"), "nfsd", "v4_end_grace")) != "N" {
		t.Fatal("b's grace ended with a's")
	}
	if got := v4Series(t, reg, "b"); wantSeries(got, bBefore) != "" {
		t.Errorf("a's grace end moved b's series: %s", wantSeries(got, bBefore))
	}
	if _, g := v4.status("a"); g == nil || g.NLM.Ended == nil || g.NLM.Ended.Reason != grace.ReasonAllReclaimed || g.NFSv4.Ended == nil || g.NFSv4.Seconds <= 0 {
		t.Errorf("a's local status after its grace: %+v", g)
	}
	if _, g := v4.status("b"); g == nil || g.NFSv4.Ended != nil || g.NFSv4.Back != 0 || !slices.Equal(g.NFSv4.Missing, []string{"v4-b"}) {
		t.Errorf("b's local status: %+v", g)
	}

	// The control: a's NFSv4 side open on a second server while this one
	// still has it — what never happens (the next server starts a only
	// once this one's stop returned) — is seen as two servers showing
	// a's grace.
	other, otherReg := newV4("node8", false)
	showing := func() int {
		n := 0
		for _, g := range []prometheus.Gatherer{reg, otherReg} {
			if _, ok := v4Series(t, g, "a")["nsmd_service_grace_state{manager=nlm,state="+graceStateIn+"}"]; ok {
				n++
			}
		}
		return n
	}
	if err := other.open(a, nss.nss["a"], runDir("a")); err != nil {
		t.Fatal(err)
	}
	if n := showing(); n != 2 {
		t.Fatalf("control: a open on two servers, %d show its grace (the count cannot catch two)", n)
	}
	if err := other.close("a"); err != nil {
		t.Fatal(err)
	}

	// a stops here: every series of a goes, b's stay.
	if err := rh.room.StopService("a", 1); err != nil {
		t.Fatalf("StopService a: %v", err)
	}
	if got := v4Series(t, reg, "a"); len(got) != 0 {
		t.Errorf("a stopped here, yet series of it: %v", got)
	}
	if nfs, g := v4.status("a"); nfs != nil || g != nil {
		t.Errorf("a stopped here, yet local status %+v %+v", nfs, g)
	}
	if got := v4Series(t, reg, "b"); wantSeries(got, bBefore) != "" {
		t.Errorf("a's stop moved b's series: %s", wantSeries(got, bBefore))
	}
	if n := showing(); n != 0 {
		t.Errorf("a stopped everywhere, %d servers show its grace", n)
	}
	// Its next server (here without tracking): one server shows it.
	if err := other.open(a, nss.nss["a"], runDir("a")); err != nil {
		t.Fatal(err)
	}
	if n := showing(); n != 1 {
		t.Errorf("a moved to node8: %d servers show its grace", n)
	}
	got := v4Series(t, otherReg, "a")
	if _, ok := got["nsmd_service_nfsv4_pipe_open{}"]; ok {
		t.Errorf("no tracking served on node8, yet a pipe series: %v", got)
	}
	if nfs, _ := other.status("a"); nfs == nil || nfs.Tracking || nfs.TrackingWhy != "nfsv4_tracking is off" || nfs.Pipe != nil {
		t.Errorf("a on node8 without tracking: %+v", nfs)
	}
	if err := rh.room.StopService("b", 1); err != nil {
		t.Fatalf("StopService b: %v", err)
	}
	if got := v4Series(t, reg, "b"); len(got) != 0 {
		t.Errorf("b stopped, yet series of it: %v", got)
	}
}
