package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/placement"
)

// svcSpan is one node serving one service, from..until (open: until zero,
// or the node's host crashed and serves until its watchdog resets it).
type svcSpan struct {
	node        string
	epoch       uint64
	from, until time.Time
}

// svcHosts stands in for what the nodes' kernels serve per service: a
// ServiceServer per node whose spans a crashed host keeps until its
// watchdog resets it (the machine of serving_test.go), as a real kernel
// keeps nfsd and the mount after nsmd died.
type svcHosts struct {
	machines  map[string]*machine // set before the nodes start
	stopDelay time.Duration       // how long a stop takes (set before the stop)
	mu        sync.Mutex
	failStart map[string]bool       // "node/service": its start fails (a hook that cannot mount)
	starts    map[string]int        // "node/service": starts tried
	spans     map[string][]*svcSpan // by service
}

type hostServer struct {
	h    *svcHosts
	node string
}

func (s hostServer) ServeService(_ context.Context, service string, epoch uint64) error {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if s.h.crashed(s.node) {
		return nil
	}
	if s.h.starts == nil {
		s.h.starts = map[string]int{}
	}
	s.h.starts[s.node+"/"+service]++
	if s.h.failStart[s.node+"/"+service] {
		return fmt.Errorf("mount of %s failed on %s", service, s.node)
	}
	for _, sp := range s.h.spans[service] {
		if sp.node == s.node && sp.until.IsZero() {
			return nil // already up (a retried start)
		}
	}
	s.h.spans[service] = append(s.h.spans[service], &svcSpan{node: s.node, epoch: epoch, from: time.Now()})
	return nil
}

func (s hostServer) StopService(service string, _ uint64) error {
	s.h.mu.Lock()
	d := s.h.stopDelay
	s.h.mu.Unlock()
	time.Sleep(d) // the hook's work (an unmount) takes that long
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	if s.h.crashed(s.node) {
		return nil
	}
	for _, sp := range s.h.spans[service] {
		if sp.node == s.node && sp.until.IsZero() {
			sp.until = time.Now()
		}
	}
	return nil
}

func (h *svcHosts) crashed(node string) bool {
	m := h.machines[node]
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkLocked()
	return m.crashed
}

// endOf is when sp ends: its stop, or its host's reset (a zero time: it
// serves still, or forever when no watchdog resets a crashed host).
func (h *svcHosts) endOf(sp *svcSpan) time.Time {
	if !sp.until.IsZero() {
		return sp.until
	}
	m := h.machines[sp.node]
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checkLocked()
	if m.crashed && m.armed {
		return m.deadline
	}
	return time.Time{}
}

// owners is "service=node …" of the spans open now (serving).
func (h *svcHosts) owners() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	now := time.Now()
	for svc, spans := range h.spans {
		for _, sp := range spans {
			if end := h.endOf(sp); end.IsZero() || end.After(now) {
				out = append(out, svc+"="+sp.node)
			}
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// overlaps lists every time two nodes served one service at once.
func (h *svcHosts) overlaps() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	far := time.Now().Add(time.Hour)
	var out []string
	for svc, spans := range h.spans {
		for i, a := range spans {
			for _, b := range spans[i+1:] {
				if a.node == b.node {
					continue
				}
				ae, be := h.endOf(a), h.endOf(b)
				if ae.IsZero() {
					ae = far
				}
				if be.IsZero() {
					be = far
				}
				if a.from.Before(be) && b.from.Before(ae) {
					out = append(out, fmt.Sprintf("%s: %s@%d %v–%v and %s@%d %v–%v", svc,
						a.node, a.epoch, a.from.Format("15:04:05.000"), ae.Format("15:04:05.000"),
						b.node, b.epoch, b.from.Format("15:04:05.000"), be.Format("15:04:05.000")))
				}
			}
		}
	}
	return out
}

// spansOf is how many times service was started.
func (h *svcHosts) spansOf(service string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.spans[service])
}

// newServicesCluster is a fenced cluster of size servers, each declaring
// services a, b and c and serving them on svcHosts; ds says who is down
// for placement.
// killAFollowerOwner kills a server that owns a service and does not lead
// (its host keeps serving until its watchdog resets it), marked down for
// placement; it returns that server and its service.
func killAFollowerOwner(t *testing.T, fc *fencedCluster, ds *downSet, owners map[string]string) (victim, service string) {
	t.Helper()
	li, _ := fc.leader(10 * time.Second)
	for svc, node := range owners {
		if node != fc.nodes[li].id {
			victim, service = node, svc
			break
		}
	}
	ds.set(victim, true)
	fc.killNode(indexOf(fc.tcluster, victim))
	return victim, service
}

// proofOf is how the node that serves service now proved its last holder
// stopped.
func proofOf(fc *fencedCluster, service string) FencedPeer {
	for _, tn := range fc.nodes {
		if !tn.alive {
			continue
		}
		for _, r := range tn.n.Services().Runs() {
			if r.Service == service && r.Phase == "serving" {
				return r.Proof
			}
		}
	}
	return FencedPeer{}
}

func newServicesCluster(t *testing.T, size int, fenceTimeout time.Duration, tune func(*Config)) (*fencedCluster, *svcHosts, *downSet) {
	decl := []fsm.ServiceDecl{{ID: "a", Fingerprint: "fa"}, {ID: "b", Fingerprint: "fb"}, {ID: "c", Fingerprint: "fc"}}
	ds := &downSet{down: map[string]bool{}}
	h := &svcHosts{spans: map[string][]*svcSpan{}, machines: map[string]*machine{}}
	fc := newFencedCluster(t, size, fenceTimeout, func(cfg *Config) {
		cfg.Services = ServiceConfig{Declared: decl, Settle: 10 * time.Second}
		cfg.memberHealthy = ds.healthy
		cfg.ServiceServer = hostServer{h: h, node: cfg.NodeID}
		h.mu.Lock() // the nodes started before read it
		h.machines[cfg.NodeID] = cfg.Watchdog.(*machine)
		h.mu.Unlock()
		if tune != nil {
			tune(cfg)
		}
	})
	return fc, h, ds
}

// waitOnePerServer waits until each service runs on exactly one server,
// a different one each, and returns service → node.
func waitOnePerServer(t *testing.T, h *svcHosts) map[string]string {
	t.Helper()
	var owners map[string]string
	testutil.WaitForSeen(t, 20*time.Second, "each service served by one server, one per server", func() (bool, string) {
		o := h.owners()
		owners = map[string]string{}
		nodes := map[string]bool{}
		for _, kv := range strings.Fields(o) {
			svc, node, _ := strings.Cut(kv, "=")
			if _, twice := owners[svc]; twice {
				return false, o
			}
			owners[svc] = node
			nodes[node] = true
		}
		return len(owners) == 3 && len(nodes) == 3, o
	})
	return owners
}

// Three servers, three services: each is served by the server it is
// placed on. A follower that owns one is killed (its host keeps serving
// until its watchdog resets it): its service alone moves, and the new
// owner starts it only after the dead one's watchdog must have reset it;
// the other two are never stopped; never two servers serve one service.
func TestServicesServedByTheirOwnersAndAKilledOwnersMovesAfterItsWatchdog(t *testing.T) {
	fc, h, ds := newServicesCluster(t, 3, 2*time.Second, nil)
	owners := waitOnePerServer(t, h)
	victim, moved := killAFollowerOwner(t, fc, ds, owners)
	reset := fc.machines[victim]
	waitServedElsewhere(t, h, moved, victim)
	if o := h.overlaps(); len(o) > 0 {
		t.Fatalf("two servers served one service at once: %v", o)
	}
	if p := proofOf(fc, moved); p.By != "watchdog" || p.Node != victim {
		t.Errorf("the killed owner proven stopped by %+v, want its watchdog bound", p)
	}
	reset.mu.Lock()
	armed := reset.armed
	reset.mu.Unlock()
	if !armed {
		t.Fatal("the killed owner's watchdog was not armed: nothing fenced it")
	}
	for svc := range owners {
		if svc != moved && h.spansOf(svc) != 1 {
			t.Errorf("%s was restarted (%d starts) when %s's owner died", svc, h.spansOf(svc), moved)
		}
	}
}

// The negative control: a successor that does not prove the last holder
// stopped (noServiceProof) starts the killed owner's service while that
// host still serves it. The check above sees it.
func TestServicesWithoutTheHoldersProofOverlap(t *testing.T) {
	fc, h, ds := newServicesCluster(t, 3, 4*time.Second, func(cfg *Config) { cfg.noServiceProof = true })
	owners := waitOnePerServer(t, h)
	victim, moved := killAFollowerOwner(t, fc, ds, owners)
	testutil.WaitForSeen(t, 30*time.Second, moved+" served beside "+victim+", which still serves it", func() (bool, string) {
		return len(h.overlaps()) > 0, h.owners()
	})
}

// An operator's move of one service waits only for that service's stop:
// the leader asks the owner to release it first, the owner stops it (1 s
// here) while its lease still holds — its watchdog is never starved for
// it — and the new owner, asking, is answered at once, well before the
// old owner's watchdog bound (30 s here); nothing else moves.
func TestPlannedServiceMoveWaitsOnlyForThatServicesStop(t *testing.T) {
	fc, h, _ := newServicesCluster(t, 3, 30*time.Second, nil)
	owners := waitOnePerServer(t, h)
	h.mu.Lock()
	h.stopDelay = time.Second
	h.mu.Unlock()
	_, ld := fc.leader(10 * time.Second)
	svc := "a"
	from := owners[svc]
	to := ""
	for _, tn := range fc.nodes {
		if tn.id != from {
			to = tn.id
			break
		}
	}
	m := fc.machines[from]
	m.mu.Lock()
	starves := m.starves
	m.mu.Unlock()
	if err := ld.n.Services().Move(context.Background(), svc, to); err != nil {
		t.Fatalf("move %s to %s: %v", svc, to, err)
	}
	testutil.WaitForSeen(t, 10*time.Second, svc+" served on "+to, func() (bool, string) {
		o := h.owners()
		return strings.Contains(o, svc+"="+to) && !strings.Contains(o, svc+"="+from), o
	})
	if o := h.overlaps(); len(o) > 0 {
		t.Fatalf("two servers served one service at once: %v", o)
	}
	for s := range owners {
		if s != svc && h.spansOf(s) != 1 {
			t.Errorf("%s was restarted (%d starts) by the move of %s", s, h.spansOf(s), svc)
		}
	}
	if p := proofOf(fc, svc); p.By != "clean" || p.Node != from {
		t.Errorf("the old owner proven stopped by %+v, want its own answer", p)
	}
	m.mu.Lock()
	starved := m.starves - starves
	m.mu.Unlock()
	if starved > 0 {
		t.Errorf("the old owner's watchdog was starved %d times while it stopped the service for a planned move", starved)
	}
	// The old owner released the epoch: its record no longer waits for it.
	testutil.WaitForSeen(t, 10*time.Second, "the release recorded", func() (bool, string) {
		p, _ := ld.n.fsm.PlacementOf(svc)
		return p.Prev == "", fmt.Sprintf("%+v", p)
	})
}

// A service owner cut off from the cluster (the leader, partitioned: its
// lease on its own services lapses) keeps them through a short lapse, then
// stops them itself before its watchdog would reset it; its service is
// served again elsewhere once it is proven stopped, never beside it.
func TestCutOffOwnerStopsItsServicesAndIsNeverServedBeside(t *testing.T) {
	fc, h, ds := newServicesCluster(t, 3, 4*time.Second, nil)
	owners := waitOnePerServer(t, h)
	li, ld, moved := leadersService(fc, owners)
	ds.set(ld.id, true)
	fc.partition(li)
	waitServedElsewhere(t, h, moved, ld.id)
	if o := h.overlaps(); len(o) > 0 {
		t.Fatalf("two servers served one service at once: %v", o)
	}
	t.Logf("the cut-off owner proven stopped by %+v", proofOf(fc, moved))
	m := fc.machines[ld.id]
	m.mu.Lock()
	crashed := m.crashed
	m.mu.Unlock()
	if crashed {
		t.Log("the cut-off owner was reset by its watchdog (its stop did not finish in time)")
	}
}

// An owner whose process restarts (its host still serves what the dead
// process started) stops its services at start and serves each again only
// at a new epoch it asks the leader for (placement.ReasonRestarted), so
// what its clients see is a new state, never the old one again.
func TestARestartedOwnerServesItsServiceAgainAtANewEpoch(t *testing.T) {
	fc, h, _ := newServicesCluster(t, 3, 2*time.Second, nil)
	owners := waitOnePerServer(t, h)
	li, _ := fc.leader(10 * time.Second)
	var owner, svc string
	for s, node := range owners {
		if node != fc.nodes[li].id {
			owner, svc = node, s
			break
		}
	}
	i := indexOf(fc.tcluster, owner)
	before, _ := fc.nodes[li].n.fsm.PlacementOf(svc)
	fc.kill(i) // the process only: its host keeps serving
	fc.start(i)
	testutil.WaitForSeen(t, 20*time.Second, svc+" served again on "+owner+" at a new epoch", func() (bool, string) {
		p, _ := fc.nodes[i].n.fsm.PlacementOf(svc)
		for _, r := range fc.nodes[i].n.Services().Runs() {
			if r.Service == svc && r.Phase == "serving" {
				return r.Epoch > before.Epoch && p.Node == owner && p.Reason == placement.ReasonRestarted, fmt.Sprintf("run %+v, placement %+v", r, p)
			}
		}
		return false, fmt.Sprintf("placement %+v, runs %+v", p, fc.nodes[i].n.Services().Runs())
	})
	h.mu.Lock()
	spans := h.spans[svc]
	h.mu.Unlock()
	if len(spans) != 2 || spans[0].until.IsZero() || spans[1].epoch <= spans[0].epoch {
		t.Fatalf("spans of %s: %+v %+v, want the first stopped at start and a second at a higher epoch", svc, spans[0], spans[len(spans)-1])
	}
	if o := h.overlaps(); len(o) > 0 {
		t.Fatalf("two servers served one service at once: %v", o)
	}
}

// A failback takes a service from a live owner, as an operator's move
// does, so it releases first too: the owner stops the service while its
// lease holds (its watchdog is never starved for it) and the preferred
// server, asking, is answered at once — long before the owner's 30 s
// watchdog bound. The placer's loop does not wait for the stop meanwhile.
func TestFailbackReleasesFirst(t *testing.T) {
	fc, h, ds := newServicesCluster(t, 3, 30*time.Second, func(cfg *Config) {
		cfg.Services.Declared = []fsm.ServiceDecl{
			{ID: "a", Fingerprint: "fa", Prefer: []string{"n1"}},
			{ID: "b", Fingerprint: "fb", Prefer: []string{"n2"}},
			{ID: "c", Fingerprint: "fc", Prefer: []string{"n3"}},
		}
		cfg.Services.Failback = true
	})
	testutil.WaitForSeen(t, 20*time.Second, "a on n1, b on n2, c on n3", func() (bool, string) {
		o := h.owners()
		return o == "a=n1 b=n2 c=n3", o
	})
	// n1 looks unhealthy to the leader (another node: a leader judges
	// its own health by its disk): a moves away as from a lost server (no
	// release: its owner is not asked).
	if _, ld := fc.leader(10 * time.Second); ld.id == "n1" {
		if err := ld.n.TransferLeadership("n2"); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "n2 leads", func() bool { _, l := fc.leader(10 * time.Second); return l.id == "n2" })
	}
	ds.set("n1", true)
	testutil.WaitForSeen(t, 60*time.Second, "a served elsewhere", func() (bool, string) {
		o := h.owners()
		return strings.Contains(o, "a=") && !strings.Contains(o, "a=n1"), o
	})
	var holder string
	for _, kv := range strings.Fields(h.owners()) {
		if svc, node, _ := strings.Cut(kv, "="); svc == "a" {
			holder = node
		}
	}
	h.mu.Lock()
	h.stopDelay = time.Second
	h.mu.Unlock()
	m := fc.machines[holder]
	m.mu.Lock()
	starves := m.starves
	m.mu.Unlock()
	// n1 is healthy again: a fails back to it, released first by holder.
	ds.set("n1", false)
	testutil.WaitForSeen(t, 20*time.Second, "a back on n1", func() (bool, string) {
		o := h.owners()
		return strings.Contains(o, "a=n1") && !strings.Contains(o, "a="+holder), o
	})
	if o := h.overlaps(); len(o) > 0 {
		t.Fatalf("two servers served one service at once: %v", o)
	}
	if p := proofOf(fc, "a"); p.By != "clean" || p.Node != holder {
		t.Errorf("the failback's old owner proven stopped by %+v, want its own answer", p)
	}
	m.mu.Lock()
	starved := m.starves - starves
	m.mu.Unlock()
	if starved > 0 {
		t.Errorf("%s's watchdog was starved %d times while it stopped a for a failback", holder, starved)
	}
}

// A server whose start of a service keeps failing hands it on: after
// withdrawAfter failed starts it leaves the service out of its
// declaration, and the leader moves it to another server, which serves
// it. (Checked to fail when the server never withdraws: the service
// stays on the failing server, retried forever.)
func TestAServiceThatFailsToStartMovesToAnotherServer(t *testing.T) {
	fc, h, _ := newServicesCluster(t, 3, 4*time.Second, nil)
	owners := waitOnePerServer(t, h)
	// a's owner cannot start it any more: restart it there (a new epoch
	// on the same server, as after a release) by failing its next starts.
	bad := owners["a"]
	h.mu.Lock()
	h.failStart = map[string]bool{bad + "/a": true}
	h.mu.Unlock()
	_, ld := fc.leader(10 * time.Second)
	var other string
	for _, tn := range fc.nodes {
		if tn.id != bad {
			other = tn.id
			break
		}
	}
	// Move a to other and back to bad: bad's starts fail from then on.
	for _, to := range []string{other, bad} {
		if err := ld.n.Services().Move(context.Background(), "a", to); err != nil {
			t.Fatalf("move a to %s: %v", to, err)
		}
		testutil.WaitForSeen(t, 20*time.Second, "a placed on "+to, func() (bool, string) {
			p, _ := ld.n.fsm.PlacementOf("a")
			return p.Node == to, fmt.Sprintf("%+v", p)
		})
	}
	testutil.WaitForSeen(t, 60*time.Second, "a served by a server other than "+bad, func() (bool, string) {
		o := h.owners()
		return strings.Contains(o, "a=") && !strings.Contains(o, "a="+bad), o
	})
	h.mu.Lock()
	tried := h.starts[bad+"/a"]
	h.mu.Unlock()
	if tried < withdrawAfter {
		t.Errorf("%s tried a %d times before handing it on, want %d", bad, tried, withdrawAfter)
	}
	if w := nodeByID(fc, bad).Services().Withdrawn(); w["a"].IsZero() {
		t.Errorf("%s does not say it withdrew a: %v", bad, w)
	}
	if o := h.overlaps(); len(o) > 0 {
		t.Fatalf("two servers served one service at once: %v", o)
	}
}

func nodeByID(fc *fencedCluster, id string) *Node {
	for _, tn := range fc.nodes {
		if tn.id == id {
			return tn.n
		}
	}
	return nil
}

// Without a watchdog (a fence agent fences), the services of the servers
// that stay up ride out the election that follows the leader's death:
// only the dead leader's own service moves (proven stopped by the agent),
// the others are never restarted. (In-memory elections are quicker than
// the grace of the watchdog case; the checked fault schedules, e2e, are
// what show a lapse there restarting every service.)
func TestLeadersDeathRestartsNoOtherServiceWithoutAWatchdog(t *testing.T) {
	var fc *fencedCluster
	fc, h, ds := newServicesCluster(t, 3, 2*time.Second, func(cfg *Config) {
		cfg.Watchdog, cfg.FenceTimeout = nil, 0
		// Raft's timings as the default profile's: an election outlasts
		// two fence leases.
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
		cfg.FenceAgent = func(ctx context.Context, node string, _ func(int, error)) error {
			m := fc.machines[node] // the stand-in powers the machine off now
			m.mu.Lock()
			m.armed, m.deadline = true, time.Now()
			m.mu.Unlock()
			return nil
		}
	})
	owners := waitOnePerServer(t, h)
	li, ld, moved := leadersService(fc, owners)
	ds.set(ld.id, true)
	fc.killNode(li)
	waitServedElsewhere(t, h, moved, ld.id)
	if o := h.overlaps(); len(o) > 0 {
		t.Fatalf("two servers served one service at once: %v", o)
	}
	for svc := range owners {
		if svc != moved && h.spansOf(svc) != 1 {
			t.Errorf("%s was restarted (%d starts) when the leader died", svc, h.spansOf(svc))
		}
	}
}

// leadersService is the leader (its index and node) and the service it
// serves, of owners (service → node).
func leadersService(fc *fencedCluster, owners map[string]string) (int, *tnode, string) {
	li, ld := fc.leader(10 * time.Second)
	for svc, node := range owners {
		if node == ld.id {
			return li, ld, svc
		}
	}
	return li, ld, ""
}

// waitServedElsewhere waits until service runs on a server other than
// from.
func waitServedElsewhere(t *testing.T, h *svcHosts, service, from string) {
	t.Helper()
	testutil.WaitForSeen(t, 30*time.Second, service+" served again elsewhere", func() (bool, string) {
		o := h.owners()
		return strings.Contains(o, service+"=") && !strings.Contains(o, service+"="+from), o
	})
}
