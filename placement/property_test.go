package placement

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomInput draws a cluster of up to 6 members (some unhealthy, some
// witnesses), up to 8 services with random preferences (some naming
// servers that do not exist; a differing declaration has its own), declarations that mostly agree, a
// non-member's stale declarations, and random placements (some on
// non-members).
func randomInput(r *rand.Rand) Input {
	in := Input{Declared: map[string]map[string]Decl{}, Placements: map[string]Placement{}, EpochFloor: uint64(r.IntN(3))}
	nodes := []string{"gone"}
	for i := range 1 + r.IntN(6) {
		id := fmt.Sprintf("n%d", i)
		nodes = append(nodes, id)
		in.Servers = append(in.Servers, Server{ID: id, Healthy: r.IntN(4) > 0, Witness: r.IntN(7) == 0})
	}
	for i := range r.IntN(9) {
		id := fmt.Sprintf("s%d", i)
		var prefer []string
		if r.IntN(2) == 0 {
			for _, j := range r.Perm(len(nodes) + 1)[:r.IntN(3)] {
				prefer = append(prefer, append(nodes, "z")[j])
			}
		}
		for _, n := range nodes {
			if r.IntN(5) == 0 {
				continue
			}
			if in.Declared[n] == nil {
				in.Declared[n] = map[string]Decl{}
			}
			d := Decl{Fingerprint: "fp", Prefer: prefer}
			if r.IntN(25) == 0 {
				d = Decl{Fingerprint: "fp2"}
			}
			in.Declared[n][id] = d
		}
		if r.IntN(2) == 0 {
			owner := append(nodes, "")[r.IntN(len(nodes)+1)]
			in.Placements[id] = Placement{Owner: owner, Epoch: 1 + uint64(r.IntN(5))}
		}
	}
	if r.IntN(8) == 0 { // a service only a placement names
		in.Placements["old"] = Placement{Owner: nodes[r.IntN(len(nodes))], Epoch: 3}
	}
	in.Policy.Failback = r.IntN(2) == 0
	return in
}

// oracle recomputes who may own a service, independently of view.
type oracle struct {
	in      Input
	members map[string]Server
}

func newOracle(in Input) oracle {
	o := oracle{in: in, members: map[string]Server{}}
	for _, s := range in.Servers {
		o.members[s.ID] = s
	}
	return o
}

// fingerprints is the set of fingerprints members declare for svc.
func (o oracle) fingerprints(svc string) map[string]bool {
	fps := map[string]bool{}
	for n, ds := range o.in.Declared {
		if _, ok := o.members[n]; !ok {
			continue
		}
		if d, ok := ds[svc]; ok {
			fps[d.Fingerprint] = true
		}
	}
	return fps
}

func (o oracle) eligible(node, svc string) bool {
	s, ok := o.members[node]
	fps := o.fingerprints(svc)
	d, declared := o.in.Declared[node][svc]
	return ok && declared && s.Healthy && !s.Witness && len(fps) == 1 && fps[d.Fingerprint]
}

func (o oracle) current(svc string) Placement {
	if p, ok := o.in.Placements[svc]; ok {
		return p
	}
	return Placement{Epoch: o.in.EpochFloor}
}

func rankIn(prefer []string, node string) int {
	if i := slices.Index(prefer, node); i >= 0 {
		return i
	}
	return len(prefer)
}

// check verifies a decision against the rules: a move goes to an
// eligible server or to "", never a witness; one per service, built on
// its latest placement; none for a service in conflict; a healthy
// eligible owner keeps its service unless Failback moves it to a server
// earlier in its preferences.
func check(in Input, d Decision) error {
	o := newOracle(in)
	prefer := map[string][]string{}
	for _, ds := range in.Declared { // agreed declarations carry equal preferences
		for id, d := range ds {
			if d.Fingerprint == "fp" {
				prefer[id] = d.Prefer
			}
		}
	}
	seen := map[string]bool{}
	for _, m := range d.Moves {
		cur := o.current(m.Service)
		switch {
		case seen[m.Service]:
			return fmt.Errorf("%s moved twice", m.Service)
		case m.Epoch != cur.Epoch+1 || m.From != cur.Owner:
			return fmt.Errorf("%s: move %+v not built on its latest %+v", m.Service, m, cur)
		case m.To != "" && o.members[m.To].Witness:
			return fmt.Errorf("%s: moved to the witness %s", m.Service, m.To)
		case m.To != "" && !o.eligible(m.To, m.Service):
			return fmt.Errorf("%s: moved to %s, which may not own it", m.Service, m.To)
		case len(o.fingerprints(m.Service)) > 1:
			return fmt.Errorf("%s: moved while its declarations conflict", m.Service)
		case m.To == "" && m.From == "":
			return fmt.Errorf("%s: an unplaced service unplaced", m.Service)
		case m.From != "" && o.eligible(m.From, m.Service) &&
			!(in.Policy.Failback && m.Reason == ReasonFailback && rankIn(prefer[m.Service], m.To) < rankIn(prefer[m.Service], m.From)):
			return fmt.Errorf("%s: taken from its healthy owner %s (%+v)", m.Service, m.From, m)
		}
		seen[m.Service] = true
	}
	return nil
}

// settle decides and applies until no move remains (at most 3 rounds).
func settle(t *testing.T, in Input) {
	t.Helper()
	for range 3 {
		d := Decide(in)
		if err := check(in, d); err != nil {
			t.Fatal(err)
		}
		if len(d.Moves) == 0 {
			return
		}
		apply(in, d.Moves)
	}
	t.Fatalf("no fixed point: %s", moves(Decide(in).Moves))
}

func clone(in Input) Input {
	out := in
	out.Servers = slices.Clone(in.Servers)
	out.Placements = maps.Clone(in.Placements)
	return out
}

func TestDecideProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	lost, back, moved := 0, 0, 0
	for i := range 3000 {
		in := randomInput(r)
		d := Decide(in)
		if err := check(in, d); err != nil {
			t.Fatalf("input %d: %v\n%+v", i, err, in)
		}
		moved += len(d.Moves)
		// Idempotent: applying every move and deciding again moves nothing.
		apply(in, d.Moves)
		if again := Decide(in); len(again.Moves) != 0 {
			t.Fatalf("input %d: not idempotent: %s after %s", i, moves(again.Moves), moves(d.Moves))
		}
		// A server lost moves only its services.
		var healthy []int
		for j, s := range in.Servers {
			if s.Healthy && !s.Witness {
				healthy = append(healthy, j)
			}
		}
		if len(healthy) == 0 {
			continue
		}
		j := healthy[r.IntN(len(healthy))]
		id := in.Servers[j].ID
		in = clone(in)
		in.Servers[j].Healthy = false
		d = Decide(in)
		for _, m := range d.Moves {
			if m.From != id {
				t.Fatalf("input %d: %s lost, but %s moved from %q", i, id, m.Service, m.From)
			}
			lost++
		}
		apply(in, d.Moves)
		settle(t, in)
		// It comes back: it gets nothing but services without an owner,
		// and with Failback only what prefers it.
		in = clone(in)
		in.Servers[j].Healthy = true
		d = Decide(in)
		if err := check(in, d); err != nil {
			t.Fatalf("input %d: %v", i, err)
		}
		for _, m := range d.Moves {
			if m.To != id || !in.Policy.Failback && m.From != "" {
				t.Fatalf("input %d: %s came back (failback %v), and %s moved %q → %q", i, id, in.Policy.Failback, m.Service, m.From, m.To)
			}
			back++
		}
	}
	if moved < 3000 || lost < 300 || back < 30 {
		t.Fatalf("weak draw: %d moves, %d after a loss, %d after a return", moved, lost, back)
	}
	t.Logf("%d moves, %d after a loss, %d after a return", moved, lost, back)
}

// The checker catches what the rules forbid: a move to a witness or to a
// server that does not declare the service, and a decider that places
// every service afresh (flapping) — the negative controls of the
// property test.
func TestCheckCatchesBrokenDecisions(t *testing.T) {
	in := cluster("s1", "s2")
	in.Servers = append(in.Servers, Server{ID: "w", Healthy: true, Witness: true})
	in.Declared["w"] = map[string]Decl{"s1": {Fingerprint: "fp"}}
	delete(in.Declared["c"], "s2")
	for name, m := range map[string]Move{
		"to a witness":          {Service: "s1", To: "w", Epoch: 1},
		"to a non-declarer":     {Service: "s2", To: "c", Epoch: 1},
		"a stale epoch":         {Service: "s1", To: "a", Epoch: 2},
		"from a healthy owner":  {Service: "s1", To: "b"},
		"unhealthy destination": {Service: "s1", To: "a", Epoch: 1},
	} {
		c := clone(in)
		switch name {
		case "from a healthy owner":
			c.Placements["s1"] = Placement{Owner: "a", Epoch: 1}
			m.From, m.Epoch = "a", 2
		case "unhealthy destination":
			c.Servers[0].Healthy = false
		}
		if err := check(c, Decision{Moves: []Move{m}}); err == nil {
			t.Errorf("%s: the checker accepted %+v", name, m)
		}
	}
	// A decider without the stay rule: every service to its best server.
	r := rand.New(rand.NewPCG(3, 4))
	caught := 0
	for range 500 {
		in := randomInput(r)
		in.Policy.Failback = false
		v := newView(in)
		var d Decision
		for _, id := range v.services() {
			cur := v.current(id)
			if to := v.best(id, anyRank); to != "" && to != cur.Owner && len(v.differ[id]) == 0 {
				d.Moves = append(d.Moves, Move{Service: id, From: cur.Owner, To: to, Epoch: cur.Epoch + 1})
			}
		}
		if check(in, d) != nil {
			caught++
		}
	}
	if caught == 0 {
		t.Fatal("a flapping decider passed the check every time")
	}
}
