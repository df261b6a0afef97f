package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
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

func threeServices() []service.Spec {
	var out []service.Spec
	for i, id := range []string{"home", "proj", "scratch"} {
		out = append(out, service.Spec{ID: id, Address: netip.MustParsePrefix(fmt.Sprintf("10.77.9.%d/24", i+1)), Interface: "eth0",
			Device: "/dev/disk/by-label/" + id, Mount: "/srv/" + id, ExportClients: []string{"10.77.0.0/16"}})
	}
	return out
}

// placed is "service=owner@epoch/state …" as agent a reports it.
func placed(a *agent.Agent) string {
	var parts []string
	for _, s := range a.Services() {
		parts = append(parts, fmt.Sprintf("%s=%s@%d/%s", s.ID, s.Owner, s.Epoch, s.State))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// A dev cluster of three nodes with the same three services: each node
// gets one, every node reports the same placement (GET /v1/services), a
// kill of one node moves its service alone, and an operator's move takes
// it back; a move to a node that is down, or of a service no node
// declares, is refused and changes nothing.
func TestServicesSpreadOverTheServersAndMoveOneAtATime(t *testing.T) {
	o := agenttest.DevOptions(t, "127.0.0.100", 3)
	o.Tune = func(c *config.Config) {
		c.VIP, c.VIPMode = "", config.VIPNone
		c.Services = threeServices()
		c.ServiceSettle = 20 * time.Second
	}
	d := agenttest.StartDev(t, o, agent.Options{})
	as := d.Agents()
	owners := func(a *agent.Agent) map[string]string {
		m := map[string]string{}
		for _, s := range a.Services() {
			if s.State == admin.ServicePlaced || s.State == admin.ServiceServing {
				m[s.ID] = s.Owner
			}
		}
		return m
	}
	testutil.WaitForSeen(t, 30*time.Second, "one service on each node, the same on every node", func() (bool, string) {
		want := placed(as[0])
		for _, a := range as[1:] {
			if placed(a) != want {
				return false, placed(a) + " vs " + want
			}
		}
		seen := map[string]bool{}
		for _, n := range owners(as[0]) {
			seen[n] = true
		}
		return len(seen) == 3, want
	})
	before := owners(as[0])
	for _, s := range as[0].Services() {
		if s.Conflict != "" || len(s.DeclaredBy) != 3 || s.Address == "" || s.LastMove == nil || s.LastMove.Reason != "placed" {
			t.Errorf("service %s: %+v", s.ID, s)
		}
	}

	// Kill the node that owns "proj" (unless it leads: then "home"'s… any
	// non-leading owner will do).
	var victim *agent.Agent
	var lostSvc string
	for svc, n := range before {
		for _, a := range as {
			if a.Config().NodeID == n && !a.Node().IsLeader() && victim == nil {
				victim, lostSvc = a, svc
			}
		}
	}
	if victim == nil {
		t.Fatalf("no service on a follower: %v", before)
	}
	victimID := victim.Config().NodeID
	victim.Kill()
	var live *agent.Agent
	for _, a := range as {
		if a != victim {
			live = a
		}
	}
	testutil.WaitForSeen(t, 30*time.Second, lostSvc+" to leave the killed "+victimID, func() (bool, string) {
		o := owners(live)
		return o[lostSvc] != "" && o[lostSvc] != victimID, placed(live)
	})
	after := owners(live)
	for svc, n := range before {
		if svc != lostSvc && after[svc] != n {
			t.Errorf("%s moved from %s to %s though only %s was killed", svc, n, after[svc], victimID)
		}
	}

	// A move is checked first on the receiving node's view: wait until
	// its gossip, too, no longer sees the killed node alive.
	testutil.WaitForSeen(t, 30*time.Second, live.Config().NodeID+" to see "+victimID+" down", func() (bool, string) {
		for _, m := range live.Node().Members() {
			if m.ID == victimID {
				return m.State != "alive", m.State
			}
		}
		return false, "not listed"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := live.MoveService(ctx, lostSvc, victimID); !errors.Is(err, admin.ErrBadRequest) {
		t.Errorf("a move to the killed node: %v, want a refusal (ErrBadRequest)", err)
	}
	if err := live.MoveService(ctx, "nosuch", live.Config().NodeID); !errors.Is(err, admin.ErrUnknownService) {
		t.Errorf("a move of an unknown service: %v, want ErrUnknownService", err)
	}
	if got := owners(live); got[lostSvc] != after[lostSvc] {
		t.Errorf("a refused move changed the placement: %v", got)
	}
	// The operator moves it to the other live node.
	var to string
	for _, a := range as {
		if a != victim && a.Config().NodeID != after[lostSvc] {
			to = a.Config().NodeID
		}
	}
	if err := live.MoveService(ctx, lostSvc, to); err != nil {
		t.Fatalf("move %s to %s: %v", lostSvc, to, err)
	}
	testutil.WaitForSeen(t, 10*time.Second, lostSvc+" on "+to, func() (bool, string) {
		return owners(live)[lostSvc] == to, placed(live)
	})
	for _, s := range live.Services() {
		if s.ID == lostSvc && (s.LastMove == nil || s.LastMove.Reason != "operator" || s.Epoch != 3) {
			t.Errorf("after the operator's move: %+v (last move %+v)", s, s.LastMove)
		}
	}
}
