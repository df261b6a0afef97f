package fsm

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// recs parses "a:p1 b" into records sorted by name (princ after ':').
func recs(s string) []V4Client {
	out := []V4Client{}
	for _, f := range strings.Fields(s) {
		name, princ, _ := strings.Cut(f, ":")
		out = append(out, V4Client{Name: name, PrincHash: princ})
	}
	slices.SortFunc(out, func(a, b V4Client) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func fmtRecs(l []V4Client) string {
	var parts []string
	for _, c := range l {
		if c.PrincHash == "" {
			parts = append(parts, c.Name)
		} else {
			parts = append(parts, c.Name+":"+c.PrincHash)
		}
	}
	return strings.Join(parts, " ")
}

// nfsdcld (nfs-utils utils/nfsdcld): Create/Remove change the current
// epoch's table; GraceStart outside grace makes the current epoch the
// recovery epoch and opens a new, empty current one, and during grace only
// empties the current one; Check (old kernels) starts grace if needed and
// succeeds iff the recovery epoch holds the client, copying it forward;
// GraceDone starts grace if needed, then drops the recovery epoch.
func TestV4CommandsFollowNfsdcld(t *testing.T) {
	type step struct {
		cmd      Command
		removed  int
		accepted bool
		current  uint64
		recovery uint64
		cur, rec string // records after the step
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"create, replace, remove outside grace", []step{
			{ClientCreate{Name: "a", PrincHash: "p1"}, 0, false, 1, 0, "a:p1", ""},
			{ClientCreate{Name: "b"}, 0, false, 1, 0, "a:p1 b", ""},
			{ClientCreate{Name: "a", PrincHash: "p2"}, 0, false, 1, 0, "a:p2 b", ""},
			{ClientCreate{Name: "a"}, 0, false, 1, 0, "a b", ""},
			{ClientRemove{Name: "a"}, 1, false, 1, 0, "b", ""},
			{ClientRemove{Name: "a"}, 0, false, 1, 0, "b", ""},
			{ClientRemove{Name: "zz"}, 0, false, 1, 0, "b", ""},
		}},
		{"restart: unreclaimed clients are gone after grace", []step{
			{ClientCreate{Name: "a", PrincHash: "p"}, 0, false, 1, 0, "a:p", ""},
			{ClientCreate{Name: "b"}, 0, false, 1, 0, "a:p b", ""},
			{GraceStart{}, 0, false, 2, 1, "", "a:p b"},
			{ClientCreate{Name: "a", PrincHash: "q"}, 0, false, 2, 1, "a:q", "a:p b"},
			{ClientCreate{Name: "n"}, 0, false, 2, 1, "a:q n", "a:p b"},
			{GraceDone{}, 0, false, 2, 0, "a:q n", ""},
			{GraceStart{}, 0, false, 3, 2, "", "a:q n"},
			{GraceDone{}, 0, false, 3, 0, "", ""},
		}},
		{"old kernel: check starts grace and copies the record forward", []step{
			{ClientCreate{Name: "a", PrincHash: "p"}, 0, false, 1, 0, "a:p", ""},
			{ClientCreate{Name: "b"}, 0, false, 1, 0, "a:p b", ""},
			{ClientCheck{Name: "a"}, 0, true, 2, 1, "a:p", "a:p b"},
			{ClientCheck{Name: "c"}, 0, false, 2, 1, "a:p", "a:p b"},
			{ClientCheck{Name: "a"}, 0, true, 2, 1, "a:p", "a:p b"},
			{ClientCheck{Name: "b"}, 0, true, 2, 1, "a:p b", "a:p b"},
			{GraceDone{}, 0, false, 2, 0, "a:p b", ""},
		}},
		{"old kernel: a refused check still starts grace", []step{
			{ClientCreate{Name: "a"}, 0, false, 1, 0, "a", ""},
			{ClientCheck{Name: "x"}, 0, false, 2, 1, "", "a"},
		}},
		{"check takes the recovery record's principal", []step{
			{ClientCreate{Name: "a", PrincHash: "old"}, 0, false, 1, 0, "a:old", ""},
			{GraceStart{}, 0, false, 2, 1, "", "a:old"},
			{ClientCreate{Name: "a", PrincHash: "new"}, 0, false, 2, 1, "a:new", "a:old"},
			{ClientCheck{Name: "a"}, 0, true, 2, 1, "a:old", "a:old"},
		}},
		{"restart during grace keeps the recovery set", []step{
			{ClientCreate{Name: "a"}, 0, false, 1, 0, "a", ""},
			{ClientCreate{Name: "b"}, 0, false, 1, 0, "a b", ""},
			{GraceStart{}, 0, false, 2, 1, "", "a b"},
			{ClientCreate{Name: "a"}, 0, false, 2, 1, "a", "a b"},
			{ClientCreate{Name: "n"}, 0, false, 2, 1, "a n", "a b"},
			{GraceStart{}, 2, false, 2, 1, "", "a b"},
			{GraceStart{}, 0, false, 2, 1, "", "a b"},
			{ClientCreate{Name: "b"}, 0, false, 2, 1, "b", "a b"},
			{GraceDone{}, 0, false, 2, 0, "b", ""},
		}},
		{"remove during grace leaves the recovery record", []step{
			{ClientCreate{Name: "a"}, 0, false, 1, 0, "a", ""},
			{GraceStart{}, 0, false, 2, 1, "", "a"},
			{ClientRemove{Name: "a"}, 0, false, 2, 1, "", "a"},
			{ClientCheck{Name: "a"}, 0, true, 2, 1, "a", "a"},
			{ClientRemove{Name: "a"}, 1, false, 2, 1, "", "a"},
			{GraceDone{}, 0, false, 2, 0, "", ""},
		}},
		{"old kernel: grace done without grace start forgets everyone", []step{
			{ClientCreate{Name: "a"}, 0, false, 1, 0, "a", ""},
			{GraceDone{}, 0, false, 2, 0, "", ""},
			{GraceDone{}, 0, false, 3, 0, "", ""},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := New(Options{})
			applyOK(t, f, 1, Takeover{MinState: 7}, Register{Reg: mkReg("h", lockd, "n1")})
			nsm := f.Registrations(MonID{}, 0, "")
			for i, s := range tc.steps {
				res := applyOK(t, f, uint64(i+2), s.cmd)[0]
				if res.Removed != s.removed || res.Accepted != s.accepted || res.State != 7 || res.Matched != nil {
					t.Fatalf("step %d %T%+v: result %+v, want Removed=%d Accepted=%v State=7", i, s.cmd, s.cmd, res, s.removed, s.accepted)
				}
				cur, rec := f.Epochs()
				gotCur, gotRec := fmtRecs(f.V4Clients(false)), fmtRecs(f.V4Clients(true))
				if cur != s.current || rec != s.recovery || gotCur != s.cur || gotRec != s.rec {
					t.Fatalf("step %d %T%+v: epochs %d/%d, current [%s], recovery [%s]; want %d/%d, [%s], [%s]",
						i, s.cmd, s.cmd, cur, rec, gotCur, gotRec, s.current, s.recovery, s.cur, s.rec)
				}
				checkV4Invariants(t, f)
			}
			if f.State() != 7 || !slices.EqualFunc(f.Registrations(MonID{}, 0, ""), nsm, func(a, b Registration) bool { return a.ID == b.ID }) {
				t.Fatal("NFSv4 commands changed the NSM state")
			}
		})
	}
}

// v4Model is nfsdcld's database as plain maps, written from the command
// contract alone.
type v4Model struct {
	current, recovery uint64
	cur, rec          map[string]string
}

func newV4Model() *v4Model {
	return &v4Model{current: 1, cur: map[string]string{}, rec: map[string]string{}}
}

func (m *v4Model) graceStart() (discarded int) {
	if m.recovery == 0 {
		m.recovery, m.current = m.current, m.current+1
		m.rec, m.cur = m.cur, map[string]string{}
		return 0
	}
	n := len(m.cur)
	m.cur = map[string]string{}
	return n
}

// apply returns the Removed and Accepted a command should yield.
func (m *v4Model) apply(c Command) (removed int, accepted bool) {
	switch c := c.(type) {
	case ClientCreate:
		m.cur[c.Name] = c.PrincHash
	case ClientRemove:
		if _, ok := m.cur[c.Name]; ok {
			delete(m.cur, c.Name)
			return 1, false
		}
	case ClientCheck:
		if m.recovery == 0 {
			m.graceStart()
		}
		p, ok := m.rec[c.Name]
		if ok {
			m.cur[c.Name] = p
		}
		return 0, ok
	case GraceStart:
		return m.graceStart(), false
	case GraceDone:
		if m.recovery == 0 {
			m.graceStart()
		}
		m.rec, m.recovery = map[string]string{}, 0
	}
	return 0, false
}

func (m *v4Model) list(recovery bool) []V4Client {
	src := m.cur
	if recovery {
		src = m.rec
	}
	out := []V4Client{}
	for _, k := range slices.Sorted(maps.Keys(src)) {
		out = append(out, V4Client{Name: k, PrincHash: src[k]})
	}
	return out
}

// v4Command draws an NFSv4 command over a small name pool, so that names
// collide, reclaim and get dropped often.
func v4Command(r *rand.Rand) Command {
	name := fmt.Sprintf("client-%d", r.IntN(12))
	switch n := r.IntN(100); {
	case n < 40:
		return ClientCreate{Name: name, PrincHash: []string{"", "p1", "p2"}[r.IntN(3)]}
	case n < 55:
		return ClientRemove{Name: name}
	case n < 75:
		return ClientCheck{Name: name}
	case n < 88:
		return GraceStart{}
	default:
		return GraceDone{}
	}
}

// TestV4MatchesModel runs random streams of NFSv4 commands (batched, mixed
// with NSM commands) against v4Model and compares every result and the
// whole client-tracking state after each entry. After each GraceDone, a
// client that was in the recovery epoch but not reclaimed is gone.
func TestV4MatchesModel(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		r := rand.New(rand.NewPCG(seed, 77))
		g := newGen(seed)
		f, m := New(Options{}), newV4Model()
		var accepted, refused, discarded, forgotten, graceDones int
		for i := 0; i < 1500; i++ {
			cmds := make([]Command, 1+r.IntN(4))
			for j := range cmds {
				if r.IntN(5) == 0 {
					cmds[j] = g.command() // NSM commands interleaved
				} else {
					cmds[j] = v4Command(r)
				}
			}
			// Who must be gone after this entry: at a GraceDone in grace,
			// the names of the recovery epoch missing from the current
			// one, unless created again later in the entry.
			doomed := map[string]bool{}
			res := applyOK(t, f, uint64(i+1), cmds...)
			for j, c := range cmds {
				switch c := c.(type) {
				case GraceDone:
					if m.recovery != 0 {
						for n := range m.rec {
							if _, ok := m.cur[n]; !ok {
								doomed[n] = true
							}
						}
					}
				case ClientCreate:
					delete(doomed, c.Name)
				}
				removed, acc := m.apply(c)
				if !isV4(c) {
					continue
				}
				if res[j].Removed != removed || res[j].Accepted != acc {
					t.Fatalf("seed %d entry %d command %d %T%+v: result %+v, model Removed=%d Accepted=%v", seed, i, j, c, c, res[j], removed, acc)
				}
				switch c.(type) {
				case ClientCheck:
					if acc {
						accepted++
					} else {
						refused++
					}
				case GraceStart:
					discarded += removed
				case GraceDone:
					graceDones++
				}
			}
			cur, rec := f.Epochs()
			if cur != m.current || rec != m.recovery {
				t.Fatalf("seed %d entry %d: epochs %d/%d, model %d/%d", seed, i, cur, rec, m.current, m.recovery)
			}
			if got, want := f.V4Clients(false), m.list(false); !slices.Equal(got, want) {
				t.Fatalf("seed %d entry %d: current [%s], model [%s]", seed, i, fmtRecs(got), fmtRecs(want))
			}
			if got, want := f.V4Clients(true), m.list(true); !slices.Equal(got, want) {
				t.Fatalf("seed %d entry %d: recovery [%s], model [%s]", seed, i, fmtRecs(got), fmtRecs(want))
			}
			checkV4Invariants(t, f)
			for n := range doomed {
				if inCur, inRec := f.HasV4Client(n); inCur || inRec {
					t.Fatalf("seed %d entry %d: unreclaimed client %q survived GraceDone (current %v, recovery %v)", seed, i, n, inCur, inRec)
				}
				forgotten++
			}
		}
		if accepted == 0 || refused == 0 || discarded == 0 || forgotten == 0 || graceDones == 0 {
			t.Fatalf("seed %d: stream too weak: %d checks accepted, %d refused, %d discarded by restarts in grace, %d forgotten, %d grace ends",
				seed, accepted, refused, discarded, forgotten, graceDones)
		}
	}
}

func isV4(c Command) bool {
	switch c.(type) {
	case ClientCreate, ClientRemove, ClientCheck, GraceStart, GraceDone:
		return true
	}
	return false
}

// TestV4EpochSaturates: at the top of the uint64 range a grace start keeps
// current at the maximum and recovery at current-1, and the state still
// persists and restores.
func TestV4EpochSaturates(t *testing.T) {
	f := New(Options{})
	setV4(f, math.MaxUint64, 0, recs("a b"), nil)
	for i, c := range []Command{GraceStart{}, ClientCheck{Name: "a"}, GraceDone{}, ClientCheck{Name: "a"}} {
		applyOK(t, f, uint64(i+1), c)
		cur, rec := f.Epochs()
		if cur != math.MaxUint64 || rec != 0 && rec != math.MaxUint64-1 {
			t.Fatalf("after %T: epochs %d/%d", c, cur, rec)
		}
		checkV4Invariants(t, f)
	}
	if cur, rec := f.Epochs(); rec != math.MaxUint64-1 || fmtRecs(f.V4Clients(false)) != "a" || fmtRecs(f.V4Clients(true)) != "a" {
		t.Fatalf("epochs %d/%d, current [%s], recovery [%s]", cur, rec, fmtRecs(f.V4Clients(false)), fmtRecs(f.V4Clients(true)))
	}
	g := New(Options{})
	if err := restoreFrom(g, persist(t, f)); err != nil || g.Digest() != f.Digest() {
		t.Fatalf("saturated state does not round-trip: %v", err)
	}
}

// TestV4MalformedEntryChangesNothing: an entry whose last NFSv4 command is
// malformed applies none of the commands before it.
func TestV4MalformedEntryChangesNothing(t *testing.T) {
	f := New(Options{})
	applyOK(t, f, 1, ClientCreate{Name: "a"}, ClientCreate{Name: "b"})
	before := f.Digest()
	good, err := Encode(GraceStart{}, ClientCheck{Name: "a"}, ClientRemove{Name: "b"}, GraceDone{})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"truncated name":  good[:len(good)-3],
		"empty name":      {1, 4, kindGraceStart, kindClientCheck, 1, 'a', kindClientCreate, 1, 'b', 0, kindClientRemove, 0},
		"trailing byte":   append(slices.Clone(good), 0),
		"long princ hash": append([]byte{1, 2, kindGraceStart, kindClientCreate, 1, 'a', MaxPrincHashLen + 1}, make([]byte, MaxPrincHashLen+1)...),
	} {
		t.Run(name, func(t *testing.T) {
			out := f.Apply(&raft.Log{Index: 9, Type: raft.LogCommand, Data: data})
			if err, ok := out.(error); !ok || !errors.Is(err, ErrBadCommand) {
				t.Fatalf("Apply = %v, want an error wrapping ErrBadCommand", out)
			}
			if c, r := f.Epochs(); c != 1 || r != 0 || f.Digest() != before {
				t.Fatalf("malformed entry changed the state (epochs %d/%d)", c, r)
			}
		})
	}
}
