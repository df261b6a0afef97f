package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/service"
)

// servingDev starts a dev cluster of three servers that serve two
// services for real (vip_mode loopback: each service's NSM listens on its
// own loopback address), with hooks that succeed, no fencing (nothing is
// mounted) and a short settle.
func servingDev(t *testing.T) *agent.Dev {
	t.Helper()
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var specs []service.Spec
	for i, id := range []string{"home", "proj"} {
		specs = append(specs, service.Spec{ID: id, Address: netip.MustParsePrefix(fmt.Sprintf("127.0.0.%d/32", 61+i)), Interface: "lo"})
	}
	o := agenttest.DevOptions(t, "127.0.0.60", 3)
	o.Tune = func(c *config.Config) {
		c.VIP = ""
		c.Services = specs
		c.ServiceSettle = 5 * time.Second
		c.OnLeader, c.OnFollower = hook, hook
		c.FenceWatchdog = config.FenceOff
	}
	return agenttest.StartDev(t, o, agent.Options{})
}

// serviceOf is service id as a reports it.
func serviceOf(a *agent.Agent, id string) admin.ServiceStatus {
	for _, s := range a.Services() {
		if s.ID == id {
			return s
		}
	}
	return admin.ServiceStatus{}
}

// agentByID is d's agent with node id.
func agentByID(d *agent.Dev, id string) *agent.Agent {
	for _, a := range d.Agents() {
		if a.Config().NodeID == id {
			return a
		}
	}
	return nil
}

// serviceMetrics is the nsmd_service_* series of every node of d: node id
// → series (with labels) → value.
func serviceMetrics(t *testing.T, d *agent.Dev) map[string]map[string]float64 {
	t.Helper()
	out := map[string]map[string]float64{}
	for _, a := range d.Agents() {
		m := map[string]float64{}
		for series, v := range scrapeSeriesNames(t, http.DefaultClient, a) {
			if strings.HasPrefix(series, "nsmd_service_") {
				m[series] = v
			}
		}
		out[a.Config().NodeID] = m
	}
	return out
}

// TestServicesShowWhatEachServerDoes: on a cluster whose servers serve
// their services, the owner of each says serving (the others placed) and
// adds its run (serving at the placement's epoch, a lease left) and what
// it holds (its start hook's result); every node's
// nsmd_service_serving sums to exactly one per service, on the owner,
// with its lease. A planned move shows on the new owner as a run whose
// previous server was proven stopped by its answer (clean), and on the
// old one as no run, its stop hook's result and serving 0.
func TestServicesShowWhatEachServerDoes(t *testing.T) {
	d := servingDev(t)
	owners := map[string]string{}
	testutil.WaitForSeen(t, 40*time.Second, "each service served by its owner", func() (bool, string) {
		var seen []string
		ok := true
		for _, id := range []string{"home", "proj"} {
			s := serviceOf(d.Agents()[0], id)
			owner := agentByID(d, s.Owner)
			if owner == nil {
				ok = false
				seen = append(seen, id+" unplaced")
				continue
			}
			at := serviceOf(owner, id)
			owners[id] = s.Owner
			seen = append(seen, fmt.Sprintf("%s on %s: %s", id, s.Owner, at.State))
			ok = ok && at.State == admin.ServiceServing
		}
		return ok, strings.Join(seen, "; ")
	})
	for id, node := range owners {
		for _, a := range d.Agents() {
			s := serviceOf(a, id)
			if a.Config().NodeID != node {
				if s.State != admin.ServicePlaced || s.Run != nil {
					t.Errorf("%s on %s (not its owner): state %s run %+v, want placed and no run", id, a.Config().NodeID, s.State, s.Run)
				}
				continue
			}
			r, l := s.Run, s.Local
			if r == nil || r.Node != node || r.Phase != admin.RunServing || r.Epoch != s.Epoch || r.LeaseSeconds <= 0 || r.Proof != nil {
				t.Errorf("%s on its owner %s: run %+v, want serving at epoch %d with a lease and nothing to prove", id, node, r, s.Epoch)
			}
			if l == nil || l.Node != node || l.Phase != "serving" || l.Epoch != s.Epoch || l.LastHook == nil ||
				l.LastHook.Hook != "on_leader" || l.LastHook.Reason != "start" || l.LastHook.Err != "" || l.LastFailure != nil {
				t.Errorf("%s on its owner %s: local %+v (last hook %+v)", id, node, l, l.LastHook)
			}
		}
	}
	checkServing := func(want map[string]string) {
		t.Helper()
		var got map[string]map[string]float64
		testutil.WaitForSeen(t, 10*time.Second, "nsmd_service_serving on the owners", func() (bool, string) {
			got = serviceMetrics(t, d)
			var bad []string
			for id, owner := range want {
				sum := 0.0
				for node, m := range got {
					v, ok := m[`nsmd_service_serving{service="`+id+`"}`]
					if !ok {
						bad = append(bad, node+" exports no serving of "+id)
					}
					sum += v
				}
				if sum != 1 || got[owner][`nsmd_service_serving{service="`+id+`"}`] != 1 {
					bad = append(bad, fmt.Sprintf("%s: sum %v, on %s %v", id, sum, owner, got[owner][`nsmd_service_serving{service="`+id+`"}`]))
				}
			}
			return len(bad) == 0, strings.Join(bad, "; ")
		})
		for id, owner := range want {
			m := got[owner]
			if m[`nsmd_service_lease_seconds{service="`+id+`"}`] <= 0 || m[`nsmd_service_hook_failed{service="`+id+`"}`] != 0 ||
				m[`nsmd_service_state{service="`+id+`",state="serving"}`] != 1 || m[`nsmd_service_declared_servers{service="`+id+`"}`] != 3 {
				t.Errorf("%s on its owner %s: lease %v hook_failed %v serving state %v declared_servers %v", id, owner,
					m[`nsmd_service_lease_seconds{service="`+id+`"}`], m[`nsmd_service_hook_failed{service="`+id+`"}`],
					m[`nsmd_service_state{service="`+id+`",state="serving"}`], m[`nsmd_service_declared_servers{service="`+id+`"}`])
			}
			if _, ok := m[`nsmd_service_notify_targets{service="`+id+`",state="pending"}`]; !ok {
				t.Errorf("%s on its owner %s: no nsmd_service_notify_targets", id, owner)
			}
			for node, m := range got {
				if node == owner {
					continue
				}
				if _, ok := m[`nsmd_service_lease_seconds{service="`+id+`"}`]; ok {
					t.Errorf("%s: %s, which does not run it, exports a lease", id, node)
				}
				if m[`nsmd_service_state{service="`+id+`",state="placed"}`] != 1 {
					t.Errorf("%s: %s does not say placed", id, node)
				}
			}
		}
	}
	checkServing(owners)
	// Every nsmd_service_* name the rules and the dashboard use is
	// exported by this cluster (the check of the other names runs on a
	// cluster without services: TestDashboardAndRulesUseOnlyExportedMetrics).
	exported := map[string]bool{}
	for _, m := range serviceMetrics(t, d) {
		for series := range m {
			n, _, _ := strings.Cut(series, "{")
			exported[n] = true
		}
	}
	used := serviceMetricNames(t)
	if len(used) < 4 {
		t.Errorf("the rules and dashboard use only %v of the services' metrics", used)
	}
	// A service's NFSv4 tracking and grace series exist only with service
	// namespaces (this cluster has none: loopback addresses);
	// TestServiceNFSv4SeriesFollowTheServiceRoom sees them exported.
	namespaced := agent.NamespacedServiceMetrics()
	if !namespaced["nsmd_service_grace_state"] {
		t.Errorf("the names of a service's NFSv4 and grace series are not known: %v", namespaced)
	}
	for _, n := range used {
		if namespaced[n] {
			continue
		}
		if !exported[n] {
			t.Errorf("the rules or the dashboard use %s, which no node of a cluster with services exports", n)
		}
	}

	// The planned move of home to a server that does not serve it.
	from := owners["home"]
	var to string
	for _, a := range d.Agents() {
		if id := a.Config().NodeID; id != from && id != owners["proj"] {
			to = id
		}
	}
	if to == "" {
		to = owners["proj"] // two services, three servers: one is free unless both share one
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := agentByID(d, from).MoveService(ctx, "home", to); err != nil {
		t.Fatalf("move home from %s to %s: %v", from, to, err)
	}
	testutil.WaitForSeen(t, 30*time.Second, "home served by "+to, func() (bool, string) {
		s := serviceOf(agentByID(d, to), "home")
		return s.State == admin.ServiceServing, fmt.Sprintf("%s run %+v", s.State, s.Run)
	})
	s := serviceOf(agentByID(d, to), "home")
	if p := s.Run.Proof; p == nil || p.Node != from || p.By != "clean" {
		t.Errorf("home on %s after the move: proof %+v, want %s proven stopped by its answer (clean)", to, p, from)
	}
	old := serviceOf(agentByID(d, from), "home")
	if old.Run != nil || old.State != admin.ServicePlaced || old.Local == nil || old.Local.Phase != "stopped" ||
		old.Local.LastHook == nil || old.Local.LastHook.Hook != "on_follower" || old.Local.LastHook.Reason != "stop" {
		t.Errorf("home on its old server %s: state %s run %+v local %+v", from, old.State, old.Run, old.Local)
	}
	owners["home"] = to
	checkServing(owners)
}

// TestServiceWaitingForProofIsNotServing: when a service's server dies
// and promised no fence (fence_watchdog off, no agent), its new server
// waits for an operator's confirmation: meanwhile it reports the service
// placed, not serving, with a run in phase proving and no proof, and no
// live node exports nsmd_service_serving 1 for it (what
// NsmdServiceNotServed fires on); the other service is still served.
func TestServiceWaitingForProofIsNotServing(t *testing.T) {
	killServiceOwnerUnfenced(t)
}

// TestServiceServedOnceAnOperatorConfirmsItsServerOff: after the wait
// above, an operator's confirmation that the dead server is off lets the
// new server serve the service, and it says so: proven stopped by
// confirmed.
func TestServiceServedOnceAnOperatorConfirmsItsServerOff(t *testing.T) {
	next, svc, victimID := killServiceOwnerUnfenced(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := next.Node().ConfirmOff(ctx, victimID, "test"); err != nil {
		t.Fatalf("confirm %s off: %v", victimID, err)
	}
	testutil.WaitForSeen(t, 30*time.Second, svc+" served by "+next.Config().NodeID, func() (bool, string) {
		s := serviceOf(next, svc)
		return s.State == admin.ServiceServing, fmt.Sprintf("%s run %+v (leader %v)", s.State, s.Run, next.Node().IsLeader())
	})
	if p := serviceOf(next, svc).Run.Proof; p == nil || p.Node != victimID || p.By != "confirmed" {
		t.Errorf("%s on %s: proof %+v, want %s confirmed off", svc, next.Config().NodeID, p, victimID)
	}
}

// killServiceOwnerUnfenced kills the server of one service of a
// servingDev (one that does not lead), waits until the service's new
// server waits for proof that it stopped, and checks what the live nodes
// report meanwhile. It returns the new server, the service and the dead
// server's id.
func killServiceOwnerUnfenced(t *testing.T) (*agent.Agent, string, string) {
	t.Helper()
	d := servingDev(t)
	var victim *agent.Agent
	var svc, other string
	testutil.WaitForSeen(t, 40*time.Second, "both services served, one on a follower", func() (bool, string) {
		victim, svc, other = nil, "", ""
		var seen []string
		for _, id := range []string{"home", "proj"} {
			s := serviceOf(d.Agents()[0], id)
			owner := agentByID(d, s.Owner)
			if owner == nil || serviceOf(owner, id).State != admin.ServiceServing {
				return false, id + " not served yet"
			}
			seen = append(seen, id+" on "+s.Owner)
			if victim == nil && !owner.Node().IsLeader() {
				victim, svc = owner, id
			} else {
				other = id
			}
		}
		return victim != nil && other != "", strings.Join(seen, ", ")
	})
	victimID, otherOwner := victim.Config().NodeID, serviceOf(d.Agents()[0], other).Owner
	victim.Kill()
	var live []*agent.Agent
	for _, a := range d.Agents() {
		if a != victim {
			live = append(live, a)
		}
	}
	var next *agent.Agent
	testutil.WaitForSeen(t, 40*time.Second, svc+" placed anew, its new server waiting for proof", func() (bool, string) {
		s := serviceOf(live[0], svc)
		next = agentByID(d, s.Owner)
		if next == nil || next == victim {
			return false, "owner " + s.Owner
		}
		r := serviceOf(next, svc).Run
		return r != nil && r.Phase == admin.RunProving, fmt.Sprintf("on %s: run %+v", s.Owner, r)
	})
	s := serviceOf(next, svc)
	if s.State != admin.ServicePlaced || s.Run.Proof != nil || s.Run.Epoch != s.Epoch {
		t.Errorf("%s on %s while it waits for proof: state %s run %+v, want placed, proving at epoch %d, no proof", svc, next.Config().NodeID, s.State, s.Run, s.Epoch)
	}
	sum := 0.0
	for _, a := range live {
		m := scrapeSeriesNames(t, http.DefaultClient, a)
		sum += m[`nsmd_service_serving{service="`+svc+`"}`]
		if m[`nsmd_service_state{service="`+svc+`",state="placed"}`] != 1 {
			t.Errorf("%s: nsmd_service_state placed of %s is not 1 while its new server waits", a.Config().NodeID, svc)
		}
	}
	// Nothing proves the dead server stopped: the run is still proving
	// after the scrapes (so they read a run that waits).
	if r := serviceOf(next, svc).Run; r == nil || r.Phase != admin.RunProving {
		t.Fatalf("%s's run left proving with nothing to prove the dead server stopped: %+v", svc, r)
	}
	if sum != 0 {
		t.Errorf("nsmd_service_serving of %s sums to %v on the live nodes while nobody serves it", svc, sum)
	}
	if o := agentByID(d, otherOwner); o == victim || serviceOf(o, other).State != admin.ServiceServing {
		t.Errorf("%s is no longer served by %s", other, otherOwner)
	}
	return next, svc, victimID
}
