package placement

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
)

// cluster builds an Input: servers "a", "b", "c" healthy, every one
// declaring every service of svcs with fingerprint "fp".
func cluster(svcs ...string) Input {
	in := Input{Declared: map[string]map[string]Decl{}, Placements: map[string]Placement{}}
	for _, id := range []string{"a", "b", "c"} {
		in.Servers = append(in.Servers, Server{ID: id, Healthy: true})
		in.Declared[id] = map[string]Decl{}
		for _, s := range svcs {
			in.Declared[id][s] = Decl{Fingerprint: "fp"}
		}
	}
	return in
}

func (in Input) server(id string) *Server {
	for i := range in.Servers {
		if in.Servers[i].ID == id {
			return &in.Servers[i]
		}
	}
	panic("no server " + id)
}

// prefer sets svc's preferences in every declaration of it.
func (in Input) prefer(svc string, nodes ...string) Input {
	for _, ds := range in.Declared {
		if d, ok := ds[svc]; ok {
			d.Prefer = nodes
			ds[svc] = d
		}
	}
	return in
}

// moves renders moves as "svc:from>to@epoch(reason)".
func moves(ms []Move) string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%s:%s>%s@%d(%s)", m.Service, m.From, m.To, m.Epoch, m.Reason))
	}
	return strings.Join(out, " ")
}

// apply commits moves into in's placements (what the FSM would hold).
func apply(in Input, ms []Move) {
	for _, m := range ms {
		in.Placements[m.Service] = Placement{Owner: m.To, Epoch: m.Epoch}
	}
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name  string
		in    func() Input
		want  string
		holds string // "svc:reason substring" of each hold, by service, separated by " | "
	}{
		{"N services on N healthy servers: one each", func() Input { return cluster("s1", "s2", "s3") },
			"s1:>a@1(placed) s2:>b@1(placed) s3:>c@1(placed)", ""},
		{"more services than servers spread evenly", func() Input { return cluster("s1", "s2", "s3", "s4", "s5") },
			"s1:>a@1(placed) s2:>b@1(placed) s3:>c@1(placed) s4:>a@1(placed) s5:>b@1(placed)", ""},
		{"preference wins over load, and the rest spread around it", func() Input {
			in := cluster("s1", "s2", "s3").prefer("s3", "a").prefer("s2", "a")
			in.Placements["x"] = Placement{Owner: "a", Epoch: 4} // a is loaded already
			in.Declared["a"]["x"] = Decl{Fingerprint: "fp"}
			return in
		}, "s2:>a@1(placed) s3:>a@1(placed) s1:>b@1(placed)", ""},
		{"the first healthy preferred server", func() Input {
			in := cluster("s1").prefer("s1", "c", "b")
			in.server("c").Healthy = false
			return in
		}, "s1:>b@1(placed)", ""},
		{"never a witness", func() Input {
			in := cluster("s1", "s2")
			in.server("a").Witness = true
			return in.prefer("s1", "a")
		}, "s1:>b@1(placed) s2:>c@1(placed)", ""},
		{"only a server that declares it", func() Input {
			in := cluster("s1")
			delete(in.Declared["a"], "s1")
			delete(in.Declared["b"], "s1")
			return in
		}, "s1:>c@1(placed)", ""},
		{"a first placement starts above the epoch floor", func() Input {
			in := cluster("s1")
			in.EpochFloor = 7
			return in
		}, "s1:>a@8(placed)", ""},
		{"conflict: not placed, reported", func() Input {
			in := cluster("s1", "s2")
			in.Declared["c"]["s1"] = Decl{Fingerprint: "other"}
			return in
		}, "s2:>a@1(placed)", "s1:differ (fp on a, b; other on c)"},
		{"conflict: its owner keeps it even when down", func() Input {
			in := cluster("s1")
			in.Declared["c"]["s1"] = Decl{Fingerprint: "other"}
			in.Placements["s1"] = Placement{Owner: "a", Epoch: 3}
			in.server("a").Healthy = false
			return in
		}, "", "s1:stays on a"},
		{"a declaration of a non-member does not count", func() Input {
			in := cluster("s1")
			in.Declared["gone"] = map[string]Decl{"s1": {Fingerprint: "other"}, "s9": {Fingerprint: "fp"}}
			return in
		}, "s1:>a@1(placed)", ""},
		{"no flapping: a healthy owner keeps it", func() Input {
			in := cluster("s1", "s2").prefer("s1", "b")
			in.Placements["s1"] = Placement{Owner: "a", Epoch: 2}
			in.Placements["s2"] = Placement{Owner: "a", Epoch: 5}
			return in
		}, "", ""},
		{"failback to a more preferred server", func() Input {
			in := cluster("s1", "s2").prefer("s1", "c", "b")
			in.Policy.Failback = true
			in.Placements["s1"] = Placement{Owner: "b", Epoch: 2}
			in.Placements["s2"] = Placement{Owner: "a", Epoch: 5} // no preference: never failed back
			return in
		}, "s1:b>c@3(failback)", ""},
		{"owner unhealthy: to the best other", func() Input {
			in := cluster("s1", "s2", "s3")
			in.Placements["s1"] = Placement{Owner: "a", Epoch: 2}
			in.Placements["s2"] = Placement{Owner: "b", Epoch: 1}
			in.Placements["s3"] = Placement{Owner: "c", Epoch: 9}
			in.server("a").Healthy = false
			return in
		}, "s1:a>b@3(owner_lost)", ""},
		{"owner gone from the cluster", func() Input {
			in := cluster("s1").prefer("s1", "z", "c")
			in.Placements["s1"] = Placement{Owner: "z", Epoch: 2}
			return in
		}, "s1:z>c@3(owner_lost)", ""},
		{"owner unhealthy, nobody else: it stays", func() Input {
			in := cluster("s1")
			in.Placements["s1"] = Placement{Owner: "a", Epoch: 2}
			delete(in.Declared["b"], "s1")
			delete(in.Declared["c"], "s1")
			in.server("a").Healthy = false
			return in
		}, "", "s1:owner a is not healthy"},
		{"owner no longer declares it: moved", func() Input {
			in := cluster("s1")
			in.Placements["s1"] = Placement{Owner: "a", Epoch: 2}
			delete(in.Declared["a"], "s1")
			return in
		}, "s1:a>b@3(owner_cannot_serve)", ""},
		{"owner became a witness, nobody else: taken away", func() Input {
			in := cluster("s1")
			in.Placements["s1"] = Placement{Owner: "a", Epoch: 2}
			in.server("a").Witness = true
			in.server("b").Healthy = false
			in.server("c").Healthy = false
			return in
		}, "s1:a>@3(owner_cannot_serve)", ""},
		{"nobody declares it: taken away", func() Input {
			in := cluster()
			in.Placements["old"] = Placement{Owner: "b", Epoch: 4}
			in.Placements["gone"] = Placement{Epoch: 6}
			return in
		}, "old:b>@5(undeclared)", "gone:no server declares"},
		{"settling: new services wait, a lost owner's move does not", func() Input {
			in := cluster("s1", "s2")
			in.Policy.Settling = true
			in.Placements["s1"] = Placement{Owner: "a", Epoch: 1}
			in.server("a").Healthy = false
			return in
		}, "s1:a>b@2(owner_lost)", "s2:settling"},
		{"the move bound: restoring first", func() Input {
			in := cluster("s1", "s2", "s3").prefer("s3", "c")
			in.Policy.MaxMoves = 1
			in.Policy.Failback = true
			in.Placements["s3"] = Placement{Owner: "a", Epoch: 1} // failback to c
			in.Placements["s2"] = Placement{Owner: "z", Epoch: 1} // owner lost
			return in
		}, "s2:z>b@2(owner_lost)", "s1:at most 1 moves | s3:at most 1 moves"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in()
			d := Decide(in)
			if got := moves(d.Moves); got != tc.want {
				t.Fatalf("moves\n got %s\nwant %s", got, tc.want)
			}
			var holds []string
			for _, h := range d.Holds {
				holds = append(holds, h.Service)
			}
			wantHolds := []string{}
			for _, w := range strings.Split(tc.holds, " | ") {
				if w == "" {
					continue
				}
				svc, sub, _ := strings.Cut(w, ":")
				wantHolds = append(wantHolds, svc)
				for _, h := range d.Holds {
					if h.Service == svc && !strings.Contains(h.Reason, sub) {
						t.Errorf("hold of %s: %q, want it to say %q", svc, h.Reason, sub)
					}
					if h.Service == svc && h.Conflict != strings.Contains(sub, "differ") && h.Conflict != strings.Contains(sub, "stays on") {
						t.Errorf("hold of %s: Conflict %v", svc, h.Conflict)
					}
				}
			}
			if strings.Join(holds, ",") != strings.Join(wantHolds, ",") {
				t.Fatalf("holds %+v, want services %v", d.Holds, wantHolds)
			}
			if tc.in().Policy.MaxMoves == 0 {
				apply(in, d.Moves)
				if again := Decide(in); len(again.Moves) != 0 {
					t.Fatalf("not idempotent: after applying, %s", moves(again.Moves))
				}
			}
		})
	}
}

func TestPlanMove(t *testing.T) {
	base := func() Input {
		in := cluster("s1", "s2")
		in.Servers = append(in.Servers, Server{ID: "w", Healthy: true, Witness: true}, Server{ID: "d", Healthy: false})
		in.Declared["w"] = map[string]Decl{"s1": {Fingerprint: "fp"}}
		in.Declared["d"] = map[string]Decl{"s1": {Fingerprint: "fp"}}
		delete(in.Declared["c"], "s1")
		in.Placements["s1"] = Placement{Owner: "a", Epoch: 4}
		in.Declared["c"]["s2"] = Decl{Fingerprint: "other"}
		return in
	}
	for _, tc := range []struct {
		svc, to string
		err     error
		want    string
	}{
		{"s1", "b", nil, "s1:a>b@5(operator)"},
		{"nope", "b", ErrUnknownService, ""},
		{"s2", "a", ErrConflict, ""},
		{"s1", "x", ErrUnknownServer, ""},
		{"s1", "", ErrUnknownServer, ""},
		{"s1", "w", ErrWitness, ""},
		{"s1", "c", ErrNotDeclared, ""},
		{"s1", "d", ErrUnhealthy, ""},
		{"s1", "a", ErrAlreadyThere, ""},
	} {
		m, err := PlanMove(base(), tc.svc, tc.to)
		if !errors.Is(err, tc.err) {
			t.Errorf("move %s to %q: error %v, want %v", tc.svc, tc.to, err, tc.err)
			continue
		}
		if tc.err == nil && moves([]Move{m}) != tc.want {
			t.Errorf("move %s to %q: %s, want %s", tc.svc, tc.to, moves([]Move{m}), tc.want)
		}
		if tc.err != nil && (m != Move{} || !strings.Contains(err.Error(), tc.svc) && !strings.Contains(err.Error(), tc.to)) {
			t.Errorf("move %s to %q: %+v, %v (want no move and an error naming what)", tc.svc, tc.to, m, err)
		}
	}
	// The operator's move is not undone by the next decision.
	in := base()
	m, _ := PlanMove(in, "s1", "b")
	apply(in, []Move{m})
	if d := Decide(in); len(d.Moves) != 0 {
		t.Fatalf("the next decision undid the operator's move: %s", moves(d.Moves))
	}
}

// The same input in another order (slices shuffled, maps rebuilt) gives
// the same decision.
func TestDecideIsDeterministic(t *testing.T) {
	in := cluster("s1", "s2", "s3", "s4", "s5", "s6", "s7")
	in.Servers = append(in.Servers, Server{ID: "d", Healthy: true}, Server{ID: "e", Healthy: true})
	in.Declared["d"] = map[string]Decl{"s1": {Fingerprint: "fp"}, "s2": {Fingerprint: "fp"}, "s3": {Fingerprint: "fp"}}
	in.Declared["e"] = map[string]Decl{"s4": {Fingerprint: "fp"}, "s5": {Fingerprint: "fp"}}
	in = in.prefer("s6", "e", "d")
	want := Decide(in)
	for i := range 20 {
		rev := in
		rev.Servers = reverse(in.Servers, i)
		rev.Declared = map[string]map[string]Decl{}
		for n, ds := range in.Declared {
			rev.Declared[n] = maps.Clone(ds)
		}
		if got := Decide(rev); !reflect.DeepEqual(got, want) {
			t.Fatalf("order %d: %s, want %s", i, moves(got.Moves), moves(want.Moves))
		}
	}
}

// reverse rotates xs by i and reverses it when i is odd (a copy).
func reverse[T any](xs []T, i int) []T {
	out := make([]T, 0, len(xs))
	for j := range xs {
		out = append(out, xs[(j+i)%len(xs)])
	}
	if i%2 == 1 {
		for l, r := 0, len(out)-1; l < r; l, r = l+1, r-1 {
			out[l], out[r] = out[r], out[l]
		}
	}
	return out
}

// Without preferences, services placed from scratch spread evenly: no
// server owns two more than another (N services on N servers: one each).
func TestSpreadIsEven(t *testing.T) {
	for n := 1; n <= 6; n++ {
		for m := 0; m <= 13; m++ {
			in := Input{Declared: map[string]map[string]Decl{}, Placements: map[string]Placement{}}
			for i := range n {
				id := fmt.Sprintf("n%d", i)
				in.Servers = append(in.Servers, Server{ID: id, Healthy: true})
				in.Declared[id] = map[string]Decl{}
				for j := range m {
					in.Declared[id][fmt.Sprintf("s%02d", j)] = Decl{Fingerprint: "fp"}
				}
			}
			load := map[string]int{}
			for _, mv := range Decide(in).Moves {
				load[mv.To]++
			}
			lo, hi := m, 0
			for _, s := range in.Servers {
				lo, hi = min(lo, load[s.ID]), max(hi, load[s.ID])
			}
			if m > 0 && hi-lo > 1 {
				t.Fatalf("%d services on %d servers: loads %v", m, n, load)
			}
		}
	}
}
