package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// servicesCommand draws a kind 18–21 command over three nodes and three
// services, with small epochs so that some placements apply, for the
// replica and restore determinism tests.
func servicesCommand(r *rand.Rand) Command {
	node := fmt.Sprintf("s%d", r.IntN(3))
	svc := fmt.Sprintf("svc%d", r.IntN(3))
	switch r.IntN(7) {
	case 0, 1:
		var ds []ServiceDecl
		for i := range 3 {
			if r.IntN(3) > 0 {
				d := ServiceDecl{ID: fmt.Sprintf("svc%d", i), Fingerprint: fmt.Sprintf("f%d", r.IntN(2))}
				if r.IntN(3) == 0 {
					d.Prefer = []string{fmt.Sprintf("s%d", r.IntN(3))}
				}
				ds = append(ds, d)
			}
		}
		return ServicesDeclared{Node: node, Services: ds}
	case 5:
		return ServiceForgotten{Service: svc, Epoch: uint64(1 + r.IntN(3))}
	case 6:
		return ServiceReleased{Service: svc, Node: node, Epoch: uint64(1 + r.IntN(3))}
	}
	from := fmt.Sprintf("s%d", r.IntN(4))
	if from == "s3" {
		from = ""
	}
	if r.IntN(5) == 0 {
		node = ""
	}
	return ServicePlaced{Service: svc, Node: node, Epoch: uint64(1 + r.IntN(3)), From: from, Reason: "test", At: time.Unix(1_800_000_000+int64(r.IntN(1000)), 0).UTC()}
}

func decl(node string, idfp ...string) ServicesDeclared {
	c := ServicesDeclared{Node: node}
	for i := 0; i+1 < len(idfp); i += 2 {
		c.Services = append(c.Services, ServiceDecl{ID: idfp[i], Fingerprint: idfp[i+1]})
	}
	return c
}

// placeResult applies one ServicePlaced and returns its result.
func placeResult(t *testing.T, f *FSM, index uint64, c Command) Result {
	t.Helper()
	return applyOK(t, f, index, c)[0]
}

// An owner's right to serve is "the latest committed placement names me
// with epoch E": a placement applies only on top of the one it was
// decided from (epoch + 1, the same previous owner), so of two decided
// on the same view only the first applies, and a repeat changes nothing.
func TestPlacementAppliesOnlyOnTheLatestEpoch(t *testing.T) {
	at := time.Unix(1_800_000_000, 0).UTC()
	f := New(Options{})
	applyOK(t, f, 1, decl("a", "home", "fp"), decl("b", "home", "fp", "data", "fq"))
	if r := placeResult(t, f, 2, ServicePlaced{Service: "home", Node: "a", Epoch: 1, Reason: "placed", At: at}); r.Refused {
		t.Fatalf("first placement refused: %v", r.Refusal)
	}
	// Two leaders (or one leader twice) decided on the view "home on a at 1".
	if r := placeResult(t, f, 3, ServicePlaced{Service: "home", Node: "b", Epoch: 2, From: "a", Reason: "owner_lost"}); r.Refused {
		t.Fatalf("move refused: %v", r.Refusal)
	}
	want := f.Digest()
	refused := []struct {
		name string
		cmd  ServicePlaced
		err  error
	}{
		{"the same move again", ServicePlaced{Service: "home", Node: "b", Epoch: 2, From: "a"}, ErrStaleEpoch},
		{"the other decision on the old view", ServicePlaced{Service: "home", Node: "a", Epoch: 2, From: "a"}, ErrStaleEpoch},
		{"an epoch skipped", ServicePlaced{Service: "home", Node: "a", Epoch: 4, From: "b"}, ErrStaleEpoch},
		{"the right epoch, the wrong previous owner", ServicePlaced{Service: "home", Node: "a", Epoch: 3, From: "c"}, ErrStaleEpoch},
		{"a node that does not declare it", ServicePlaced{Service: "home", Node: "c", Epoch: 3, From: "b"}, ErrNotDeclared},
		{"a node that declares other services", ServicePlaced{Service: "data", Node: "a", Epoch: 1}, ErrNotDeclared},
		{"a service nobody declares", ServicePlaced{Service: "gone", Epoch: 1}, ErrNotDeclared},
		{"a service nobody declares, to a node", ServicePlaced{Service: "gone", Node: "a", Epoch: 1}, ErrNotDeclared},
	}
	for i, tc := range refused {
		r := placeResult(t, f, uint64(10+i), tc.cmd)
		if !r.Refused || !errors.Is(r.Refusal, tc.err) {
			t.Errorf("%s: result %+v, want refused with %v", tc.name, r, tc.err)
		}
		if f.Digest() != want {
			t.Fatalf("%s: a refused placement changed the state", tc.name)
		}
	}
	p, ok := f.PlacementOf("home")
	if !ok || p != (Placement{Service: "home", Node: "b", Epoch: 2, From: "a", Reason: "owner_lost", Prev: "a", PrevEpoch: 1}) {
		t.Fatalf("placement %+v %v", p, ok)
	}
	// Taken away (Node ""), and placed again from there.
	for i, c := range []ServicePlaced{
		{Service: "home", Epoch: 3, From: "b", Reason: "conflict"},
		{Service: "home", Node: "a", Epoch: 4, Reason: "placed"},
	} {
		if r := placeResult(t, f, uint64(30+i), c); r.Refused {
			t.Fatalf("%+v refused: %v", c, r.Refusal)
		}
	}
	// The owner's declaration goes: the record stays (the leader moves it).
	applyOK(t, f, 40, decl("a"))
	if p, _ := f.PlacementOf("home"); p.Node != "a" || p.Epoch != 4 {
		t.Fatalf("placement %+v after its owner's declaration went", p)
	}
	if r := placeResult(t, f, 41, ServicePlaced{Service: "home", Node: "a", Epoch: 5, From: "a"}); !errors.Is(r.Refusal, ErrNotDeclared) {
		t.Fatalf("placement on a node that no longer declares it: %+v", r)
	}
}

func TestServicesDeclaredReplacesClearsAndCopiesOut(t *testing.T) {
	f := New(Options{})
	applyOK(t, f, 1, ServicesDeclared{Node: "b", Services: []ServiceDecl{{"y", "2", nil}, {"x", "1", []string{"b", "a"}}}}, decl("a", "x", "1"))
	st := f.Services()
	if len(st.Declarations) != 2 || st.Declarations[0].Node != "a" ||
		!reflect.DeepEqual(st.Declarations[1].Services, []ServiceDecl{{"x", "1", []string{"b", "a"}}, {"y", "2", nil}}) {
		t.Fatalf("declarations %+v (want by node, each by id, preferences in their order)", st.Declarations)
	}
	st.Declarations[1].Services[0].Fingerprint = "mutated"
	st.Declarations[1].Services[0].Prefer[0] = "mutated"
	if d := f.Services().Declarations[1].Services[0]; d.Fingerprint != "1" || d.Prefer[0] != "b" {
		t.Fatal("Services shares its slices with the state")
	}
	applyOK(t, f, 2, decl("b", "z", "3"))
	if d := f.Services().Declarations[1]; len(d.Services) != 1 || d.Services[0].ID != "z" {
		t.Fatalf("b's declarations %+v, want replaced by z", d)
	}
	applyOK(t, f, 3, decl("a"), decl("b"))
	if st := f.Services(); len(st.Declarations) != 0 || st.Declarations != nil {
		t.Fatalf("declarations %+v after both cleared", st.Declarations)
	}
	if f.Digest() != New(Options{}).Digest() {
		t.Fatal("a cleared declaration left state behind")
	}
}

// A record is forgotten only when nobody owns or declares the service,
// and its epochs are never handed out again: a later placement of the
// same id starts above every forgotten epoch.
func TestServiceForgottenNeverReusesAnEpoch(t *testing.T) {
	f := New(Options{})
	applyOK(t, f, 1, decl("a", "home", "fp"), ServicePlaced{Service: "home", Node: "a", Epoch: 1},
		ServicePlaced{Service: "home", Node: "a", Epoch: 2, From: "a"})
	for i, tc := range []struct {
		cmd ServiceForgotten
		err error
	}{
		{ServiceForgotten{Service: "home", Epoch: 2}, ErrServiceInUse}, // placed on a
		{ServiceForgotten{Service: "home", Epoch: 1}, ErrStaleEpoch},
		{ServiceForgotten{Service: "none", Epoch: 1}, ErrStaleEpoch},
	} {
		if r := applyOK(t, f, uint64(2+i), tc.cmd)[0]; !errors.Is(r.Refusal, tc.err) {
			t.Fatalf("%+v: %+v, want %v", tc.cmd, r, tc.err)
		}
	}
	applyOK(t, f, 5, ServicePlaced{Service: "home", Epoch: 3, From: "a"})
	if r := applyOK(t, f, 6, ServiceForgotten{Service: "home", Epoch: 3})[0]; !errors.Is(r.Refusal, ErrServiceInUse) {
		t.Fatalf("forgotten while a declares it: %+v", r)
	}
	applyOK(t, f, 7, decl("a"))
	// a held it: forgotten only once a recorded its release.
	if r := applyOK(t, f, 8, ServiceForgotten{Service: "home", Epoch: 3})[0]; !errors.Is(r.Refusal, ErrServiceInUse) {
		t.Fatalf("forgotten before its last server's release: %+v", r)
	}
	for _, c := range []ServiceReleased{{Service: "home", Node: "b", Epoch: 2}, {Service: "home", Node: "a", Epoch: 1}, {Service: "none", Node: "a", Epoch: 2}} {
		if r := applyOK(t, f, 8, c)[0]; !errors.Is(r.Refusal, ErrStaleEpoch) {
			t.Fatalf("%+v: %+v, want refused (not the holder, below its epoch, no record)", c, r)
		}
	}
	if r := applyOK(t, f, 8, ServiceReleased{Service: "home", Node: "a", Epoch: 2})[0]; r.Refused {
		t.Fatalf("release refused: %v", r.Refusal)
	}
	if p, _ := f.PlacementOf("home"); p.Prev != "" || p.PrevEpoch != 0 {
		t.Fatalf("after the release: %+v", p)
	}
	if r := applyOK(t, f, 8, ServiceForgotten{Service: "home", Epoch: 3})[0]; r.Refused {
		t.Fatalf("forget refused: %v", r.Refusal)
	}
	if p, ok := f.PlacementOf("home"); ok || p.Epoch != 3 || f.Services().EpochFloor != 3 {
		t.Fatalf("after forgetting: %+v %v, floor %d", p, ok, f.Services().EpochFloor)
	}
	applyOK(t, f, 9, decl("b", "home", "fp2"))
	if r := applyOK(t, f, 10, ServicePlaced{Service: "home", Node: "b", Epoch: 1})[0]; !errors.Is(r.Refusal, ErrStaleEpoch) {
		t.Fatalf("epoch 1 handed out again: %+v", r)
	}
	if r := applyOK(t, f, 11, ServicePlaced{Service: "home", Node: "b", Epoch: 4})[0]; r.Refused {
		t.Fatalf("placement above the floor refused: %v", r.Refusal)
	}
	if st := f.Services(); st.Current("home").Epoch != 4 || st.Current("other").Epoch != 3 {
		t.Fatalf("Current: %+v, %+v", st.Current("home"), st.Current("other"))
	}
}

func TestServiceCommandsRefuseBadInput(t *testing.T) {
	many := make([]ServiceDecl, MaxServices+1)
	for i := range many {
		many[i] = ServiceDecl{ID: fmt.Sprintf("s%d", i), Fingerprint: "f"}
	}
	for name, c := range map[string]Command{
		"declared: empty node":       ServicesDeclared{Services: []ServiceDecl{{"a", "f", nil}}},
		"declared: empty id":         decl("n", "", "f"),
		"declared: long id":          decl("n", strings.Repeat("i", MaxServiceIDLen+1), "f"),
		"declared: empty fp":         decl("n", "a", ""),
		"declared: long fp":          decl("n", "a", strings.Repeat("f", MaxFingerprintLen+1)),
		"declared: twice":            decl("n", "b", "f", "a", "f", "b", "g"),
		"declared: too many":         ServicesDeclared{Node: "n", Services: many},
		"declared: prefer twice":     ServicesDeclared{Node: "n", Services: []ServiceDecl{{"a", "f", []string{"x", "y", "x"}}}},
		"declared: prefer empty":     ServicesDeclared{Node: "n", Services: []ServiceDecl{{"a", "f", []string{""}}}},
		"declared: prefer too many":  ServicesDeclared{Node: "n", Services: []ServiceDecl{{"a", "f", make([]string, MaxPrefer+1)}}},
		"placed: epoch 0":            ServicePlaced{Service: "a", Node: "n"},
		"placed: empty service":      ServicePlaced{Node: "n", Epoch: 1},
		"placed: long reason":        ServicePlaced{Service: "a", Epoch: 1, Reason: strings.Repeat("r", MaxReasonLen+1)},
		"placed: long from":          ServicePlaced{Service: "a", Epoch: 1, From: strings.Repeat("r", MaxNameLen+1)},
		"placed: time out of range":  ServicePlaced{Service: "a", Epoch: 1, At: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"forgotten: epoch 0":         ServiceForgotten{Service: "a"},
		"forgotten: empty service":   ServiceForgotten{Epoch: 1},
		"forgotten: long service id": ServiceForgotten{Service: strings.Repeat("i", MaxServiceIDLen+1), Epoch: 1},
	} {
		if _, err := Encode(c); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%s: Encode error %v, want ErrBadCommand", name, err)
		}
	}
	// The decoder refuses the same on the wire, and unsorted declarations
	// (the encoder sorts: whatever decodes re-encodes to the same bytes).
	good, _ := Encode(ServicesDeclared{Node: "n", Services: []ServiceDecl{{"b", "g", nil}, {"a", "f", []string{"p"}}}})
	// version, count, kind, len 1, 'n', count 2, (len 1, 'a', len 1, 'f', 1 preferred, len 1, 'p'), (len 1, 'b', len 1, 'g', 0)
	if !bytes.Equal(good, []byte{1, 1, kindServicesDeclared, 1, 'n', 2, 1, 'a', 1, 'f', 1, 1, 'p', 1, 'b', 1, 'g', 0}) {
		t.Fatalf("layout moved: %x", good)
	}
	for name, b := range map[string][]byte{
		"unsorted":           {1, 1, kindServicesDeclared, 1, 'n', 2, 1, 'b', 1, 'f', 0, 1, 'a', 1, 'g', 0},
		"duplicate":          {1, 1, kindServicesDeclared, 1, 'n', 2, 1, 'a', 1, 'f', 0, 1, 'a', 1, 'g', 0},
		"empty fp":           {1, 1, kindServicesDeclared, 1, 'n', 1, 1, 'a', 0, 0},
		"count beyond":       {1, 1, kindServicesDeclared, 1, 'n', 3, 1, 'a', 1, 'f', 0, 1, 'b', 1, 'g', 0},
		"preferred twice":    {1, 1, kindServicesDeclared, 1, 'n', 1, 1, 'a', 1, 'f', 2, 1, 'p', 1, 'p'},
		"preferred empty":    {1, 1, kindServicesDeclared, 1, 'n', 1, 1, 'a', 1, 'f', 1, 0},
		"preferred beyond":   {1, 1, kindServicesDeclared, 1, 'n', 1, 1, 'a', 1, 'f', 2, 1, 'p'},
		"preferred too many": {1, 1, kindServicesDeclared, 1, 'n', 1, 1, 'a', 1, 'f', MaxPrefer + 1},
		"empty node":         {1, 1, kindServicesDeclared, 0, 0},
		"placed epoch 0":     append([]byte{1, 1, kindServicePlaced, 1, 'a', 0, 0, 0}, make([]byte, 9)...),
		"forgotten ep 0":     {1, 1, kindServiceForgotten, 1, 'a', 0},
		"trailing":           append(bytes.Clone(good), 0),
	} {
		if _, err := Decode(b); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%s: Decode error %v, want ErrBadCommand", name, err)
		}
	}
}

// A release that predates kinds 18–21 decodes them as an unknown kind
// and refuses the whole entry, applying nothing of it; so does this one
// with the next kind nobody has assigned yet. That is why the cluster
// proposes them only once every member advertises CommandLevel 2: an
// older member would diverge, never misapply.
func TestUnknownKindRefusesTheWholeEntry(t *testing.T) {
	for _, k := range []byte{kindServicesDeclared, kindServicePlaced, kindServiceForgotten, kindServiceReleased} {
		if k <= kindFenceConfirm || k > 21 {
			t.Fatalf("kind %d is not beyond the earlier releases' (≤ 17) and within the reserved 18–21", k)
		}
	}
	reg, _ := Encode(Register{Reg: mkReg("h", lockd, "n")})
	placed, _ := Encode(decl("a", "home", "fp"))
	for name, kind := range map[string]byte{"the next unassigned kind": 21, "control: kind 18": kindServicesDeclared} {
		b := append([]byte{1, 2}, reg[2:]...)
		b = append(b, kind)
		b = append(b, placed[3:]...) // the body of a ServicesDeclared
		f := New(Options{})
		out := f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: b})
		err, isErr := out.(error)
		if kind == 21 {
			if !isErr || !errors.Is(err, ErrBadCommand) || f.Len() != 0 || f.AppliedIndex() != 1 {
				t.Fatalf("%s: Apply = %v, %d registrations; want ErrBadCommand and nothing applied", name, out, f.Len())
			}
			continue
		}
		if isErr || f.Len() != 1 || len(f.Services().Declarations) != 1 {
			t.Fatalf("%s: Apply = %v (the same entry with a known kind must apply)", name, out)
		}
	}
	if _, _, err := readSnapshot(bytes.NewReader(append([]byte(snapMagic), snapVersion5+1)), newStrTable()); !errors.Is(err, ErrVersion) {
		t.Fatalf("snapshot version 6: %v, want ErrVersion", err)
	}
}

// servicesFSM is tinyFSM with placement state: two nodes' declarations, a
// placement, an unplaced service and a forgotten one.
func servicesFSM(t testing.TB) *FSM {
	f := tinyFSM(t)
	applyOK(t, f, 20,
		decl("n1", "home", "fp1", "old", "fp0"), decl("n2", "home", "fp1", "scratch", "fp2"),
		ServicePlaced{Service: "home", Node: "n1", Epoch: 1, Reason: "placed", At: time.Unix(1_800_000_300, 0)},
		ServicePlaced{Service: "scratch", Node: "n2", Epoch: 1, Reason: "placed"},
		ServicePlaced{Service: "scratch", Epoch: 2, From: "n2", Reason: "conflict"},
		ServicePlaced{Service: "old", Node: "n1", Epoch: 1},
		ServicePlaced{Service: "old", Epoch: 2, From: "n1"},
		ServiceReleased{Service: "old", Node: "n1", Epoch: 1},
		decl("n1", "home", "fp1"),
		ServiceForgotten{Service: "old", Epoch: 2},
	)
	return f
}

// Without placement state a snapshot is version 3 or 4 byte for byte as
// before (the goldens, written by the writer before placements existed,
// restore and persist again to the same bytes); with it, version 5, which
// round-trips and which a release that reads only up to 4 refuses.
func TestSnapshotVersion5OnlyWithPlacementState(t *testing.T) {
	for _, tc := range []struct {
		file    string
		version byte
	}{{"testdata/snapshot-v3-tiny.bin", snapVersion}, {"testdata/snapshot-v4-tiny.bin", snapVersion4}} {
		golden, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		f := New(Options{})
		if err := restoreFrom(f, golden); err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if got := persist(t, f); golden[len(snapMagic)] != tc.version || !bytes.Equal(got, golden) {
			t.Fatalf("%s persisted again differs (version %d)", tc.file, got[len(snapMagic)])
		}
		if st := f.Services(); st.Placements != nil || st.Declarations != nil || st.EpochFloor != 0 {
			t.Fatalf("%s restored with placement state %+v", tc.file, st)
		}
	}
	f := servicesFSM(t)
	b := persist(t, f)
	if b[len(snapMagic)] != snapVersion5 {
		t.Fatalf("version %d with placement state, want %d", b[len(snapMagic)], snapVersion5)
	}
	g := New(Options{})
	if err := restoreFrom(g, b); err != nil {
		t.Fatal(err)
	}
	if g.Digest() != f.Digest() || !bytes.Equal(persist(t, g), b) {
		t.Fatal("version 5 does not round-trip")
	}
	st := g.Services()
	if len(st.Placements) != 2 || st.Placements[0].Node != "n1" || st.Placements[1] != (Placement{Service: "scratch", Epoch: 2, From: "n2", Reason: "conflict", Prev: "n2", PrevEpoch: 1}) ||
		st.EpochFloor != 2 || len(st.Declarations) != 2 || len(st.Declarations[1].Services) != 2 {
		t.Fatalf("restored %+v", st)
	}
	if !st.Placements[0].At.Equal(time.Unix(1_800_000_300, 0)) {
		t.Fatalf("placement time %v", st.Placements[0].At)
	}
	// The floor alone is placement state: a snapshot keeps it.
	h := New(Options{})
	h.mu.Lock()
	h.st.epochFloor = 9
	h.mu.Unlock()
	hb := persist(t, h)
	k := New(Options{})
	if err := restoreFrom(k, hb); err != nil || k.Services().EpochFloor != 9 || hb[len(snapMagic)] != snapVersion5 {
		t.Fatalf("floor-only snapshot: %v, floor %d, version %d", err, k.Services().EpochFloor, hb[len(snapMagic)])
	}
}

func TestRestoreRejectsInconsistentVersion5Streams(t *testing.T) {
	sc := scalars(3, 1, 0)
	d1, _ := Encode(decl("a", "x", "f"))
	d2, _ := Encode(decl("b", "x", "f"))
	body := func(b []byte) []byte { return b[3:] } // drop version, count, kind
	dEmpty := []byte{1, 'c', 0}                    // a node declaring no service
	p1 := encoder{}
	_ = p1.placement(&Placement{Service: "x", Node: "a", Epoch: 1})
	_ = p1.prev(&Placement{})
	p2 := encoder{} // a previous holder without its epoch
	_ = p2.placement(&Placement{Service: "x", Node: "a", Epoch: 2})
	p2.b = append(p2.b, 1, 'b', 0)
	good := newStream(5).frame(tagScalars, sc).frame(tagDeclared, body(d1)).frame(tagPlaced, p1.b).end(0, 0, 0, 0, 0, 0, 1, 1, 0, 0)
	f := New(Options{})
	if err := restoreFrom(f, good); err != nil {
		t.Fatalf("control: the well-formed stream: %v", err)
	}
	for name, b := range map[string][]byte{
		"no placement state":            newStream(5).frame(tagScalars, sc).end(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		"nodes out of order":            newStream(5).frame(tagScalars, sc).frame(tagDeclared, append(body(d2), body(d1)...)).end(0, 0, 0, 0, 0, 0, 2, 0, 0, 0),
		"nodes out of order (2 frames)": newStream(5).frame(tagScalars, sc).frame(tagDeclared, body(d2)).frame(tagDeclared, body(d1)).end(0, 0, 0, 0, 0, 0, 2, 0, 0, 0),
		"a node declaring nothing":      newStream(5).frame(tagScalars, sc).frame(tagDeclared, dEmpty).end(0, 0, 0, 0, 0, 0, 1, 0, 0, 0),
		"placement twice":               newStream(5).frame(tagScalars, sc).frame(tagPlaced, append(bytes.Clone(p1.b), p1.b...)).end(0, 0, 0, 0, 0, 0, 0, 2, 0, 0),
		"prev without its epoch":        newStream(5).frame(tagScalars, sc).frame(tagPlaced, p2.b).end(0, 0, 0, 0, 0, 0, 0, 1, 0, 0),
		"count mismatch":                newStream(5).frame(tagScalars, sc).frame(tagDeclared, body(d1)).end(0, 0, 0, 0, 0, 0, 2, 0, 0, 0),
		"no floor":                      newStream(5).frame(tagScalars, sc).frame(tagDeclared, body(d1)).end(0, 0, 0, 0, 0, 0, 1, 0, 0),
		"sections in version 4":         newStream(4).frame(tagScalars, sc).frame(tagDeclared, body(d1)).end(0, 0, 0, 0, 0, 0, 1, 0, 0),
	} {
		g := New(Options{})
		applyOK(t, g, 1, decl("keep", "k", "f"))
		before := g.Digest()
		if err := restoreFrom(g, b); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v, want ErrCorruptSnapshot", name, err)
		}
		if g.Digest() != before {
			t.Errorf("%s: a refused restore changed the state", name)
		}
	}
}

// svcModel is the placement state as a plain model of kinds 18–21, to
// check Apply against and to draw commands that apply.
type svcModel struct {
	decl   map[string]map[string]bool // node → services it declares
	placed map[string]Placement
	floor  uint64
}

func newSvcModel() *svcModel {
	return &svcModel{decl: map[string]map[string]bool{}, placed: map[string]Placement{}}
}

func (m *svcModel) declaredAnywhere(svc string) bool {
	for _, ds := range m.decl {
		if ds[svc] {
			return true
		}
	}
	return false
}

// apply applies c to the model and says whether the FSM must refuse it.
func (m *svcModel) apply(c Command) (refused bool) {
	switch c := c.(type) {
	case ServicesDeclared:
		delete(m.decl, c.Node)
		for _, d := range c.Services {
			if m.decl[c.Node] == nil {
				m.decl[c.Node] = map[string]bool{}
			}
			m.decl[c.Node][d.ID] = true
		}
	case ServicePlaced:
		cur, ok := m.placed[c.Service]
		if !ok {
			cur = Placement{Epoch: m.floor}
		}
		if c.Epoch != cur.Epoch+1 || c.From != cur.Node || c.Node != "" && !m.decl[c.Node][c.Service] || !ok && !m.declaredAnywhere(c.Service) {
			return true
		}
		p := Placement{Service: c.Service, Node: c.Node, Epoch: c.Epoch, From: c.From, Reason: c.Reason, At: c.At, Prev: cur.Prev, PrevEpoch: cur.PrevEpoch}
		if cur.Node != "" {
			p.Prev, p.PrevEpoch = cur.Node, cur.Epoch
		}
		if p.Prev == p.Node {
			p.Prev, p.PrevEpoch = "", 0
		}
		m.placed[c.Service] = p
	case ServiceReleased:
		cur, ok := m.placed[c.Service]
		if !ok || cur.Prev == "" || cur.Prev != c.Node || cur.PrevEpoch > c.Epoch {
			return true
		}
		cur.Prev, cur.PrevEpoch = "", 0
		m.placed[c.Service] = cur
	case ServiceForgotten:
		cur, ok := m.placed[c.Service]
		if !ok || cur.Epoch != c.Epoch || cur.Node != "" || cur.Prev != "" || m.declaredAnywhere(c.Service) {
			return true
		}
		delete(m.placed, c.Service)
		m.floor = max(m.floor, c.Epoch)
	}
	return false
}

// valid draws a placement or forget the model says applies (a random
// command when there is none).
func (m *svcModel) valid(r *rand.Rand) Command {
	svc := fmt.Sprintf("svc%d", r.IntN(3))
	cur, ok := m.placed[svc]
	if !ok {
		cur = Placement{Epoch: m.floor}
	}
	if ok && cur.Prev != "" && r.IntN(2) == 0 {
		return ServiceReleased{Service: svc, Node: cur.Prev, Epoch: cur.PrevEpoch}
	}
	if ok && cur.Node == "" && cur.Prev == "" && !m.declaredAnywhere(svc) {
		return ServiceForgotten{Service: svc, Epoch: cur.Epoch}
	}
	var to []string
	for n, ds := range m.decl {
		if ds[svc] {
			to = append(to, n)
		}
	}
	slices.Sort(to)
	if len(to) == 0 {
		if !ok || cur.Node == "" {
			return servicesCommand(r)
		}
		to = []string{""}
	}
	return ServicePlaced{Service: svc, Node: to[r.IntN(len(to))], Epoch: cur.Epoch + 1, From: cur.Node, Reason: "model"}
}

// The FSM applies kinds 18–21 as the model says, refusing exactly what
// the model refuses, and ends in the model's state.
func TestServicesMatchModel(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		r := rand.New(rand.NewPCG(seed, 7))
		m := newSvcModel()
		f := New(Options{})
		applied, refused := 0, 0
		for i := range 3000 {
			c := servicesCommand(r)
			if r.IntN(2) == 0 {
				c = m.valid(r)
			}
			want := m.apply(c)
			res := applyOK(t, f, uint64(i+1), c)[0]
			if res.Refused != want || (res.Refusal != nil) != want {
				t.Fatalf("seed %d step %d: %+v: result %+v, model refuses: %v", seed, i, c, res, want)
			}
			if _, ok := c.(ServicesDeclared); !ok {
				if want {
					refused++
				} else {
					applied++
				}
			}
		}
		st := f.Services()
		if st.EpochFloor != m.floor || len(st.Placements) != len(m.placed) {
			t.Fatalf("seed %d: state %+v, model %+v floor %d", seed, st, m.placed, m.floor)
		}
		for _, p := range st.Placements {
			if mp := m.placed[p.Service]; mp.Node != p.Node || mp.Epoch != p.Epoch || mp.From != p.From || mp.Prev != p.Prev || mp.PrevEpoch != p.PrevEpoch {
				t.Fatalf("seed %d: %+v, model %+v", seed, p, mp)
			}
		}
		if applied < 300 || refused < 300 || m.floor == 0 {
			t.Fatalf("seed %d: weak stream: %d applied, %d refused, floor %d", seed, applied, refused, m.floor)
		}
	}
}
