package fsm

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// scopedFSM has two placed services, "a" on n1 (epoch 1) and "b" on n2
// (epoch 1), and nothing in any scope.
func scopedFSM(t testing.TB) *FSM {
	t.Helper()
	f := New(Options{})
	applyOK(t, f, 1,
		decl("n1", "a", "fa", "b", "fb"), decl("n2", "a", "fa", "b", "fb"),
		ServicePlaced{Service: "a", Node: "n1", Epoch: 1, Reason: "placed"},
		ServicePlaced{Service: "b", Node: "n2", Epoch: 1, Reason: "placed"},
		Takeover{Node: "n1", Reason: "leader"})
	return f
}

// in is c in service svc's scope, sent by the run scopedFSM places it at
// (a on n1, b on n2, any other service on n1; epoch 1).
func in(svc string, c Command) Scoped {
	node := "n1"
	if svc == "b" {
		node = "n2"
	}
	return Scoped{Service: svc, Node: node, Epoch: 1, Cmd: c}
}

// A service's registrations, last-seen states and NFSv4 records are its
// own: a scoped command changes that service's scope only, never the
// node-level one nor another service's, and answers with the service's
// sm_state.
func TestScopedCommandsTouchOnlyTheirService(t *testing.T) {
	f := scopedFSM(t)
	r1 := mkReg("client1", lockd, "n1", "10.0.0.1")
	res := applyOK(t, f, 2,
		in("a", Register{Reg: r1, Guarded: true}),
		in("a", ClientCreate{Name: "v4-a"}),
		in("b", Register{Reg: mkReg("client2", lockd, "n2", "10.0.0.2"), Guarded: true}),
		Register{Reg: mkReg("client3", lockd, "n1", "10.0.0.3")})
	for i, want := range []int32{3, 3, 3, f.State()} {
		if res[i].State != want || res[i].Refused {
			t.Fatalf("result %d: %+v, want state %d", i, res[i], want)
		}
	}
	a, b, node := f.Scope("a"), f.Scope("b"), f.Scope("")
	if a.Len() != 1 || b.Len() != 1 || node.Len() != 1 || f.Len() != 1 {
		t.Fatalf("lens a=%d b=%d node=%d", a.Len(), b.Len(), node.Len())
	}
	if _, ok := a.Get(r1.ID); !ok {
		t.Fatal("a lost its registration")
	}
	if _, ok := b.Get(r1.ID); ok {
		t.Fatal("b holds a's registration")
	}
	if tg := a.Targets(); len(tg) != 1 || tg[0].MonName != "client1" {
		t.Fatalf("a's targets %+v", tg)
	}
	if c, _, _ := a.V4Counts(); c != 1 {
		t.Fatalf("a's v4 records %d", c)
	}
	if c, _, _ := f.V4Counts(); c != 0 {
		t.Fatalf("node-level v4 records %d", c)
	}
	// A reboot of client1 heard by b matches nothing there; by a it does.
	res = applyOK(t, f, 3, in("b", PeerRebooted{MonName: "client1", State: 5}), in("a", PeerRebooted{MonName: "client1", State: 5}))
	if res[0].Accepted || !res[1].Accepted || len(res[1].Matched) != 1 {
		t.Fatalf("reboot results %+v", res)
	}
	if st, ok := a.LastSeen("client1"); !ok || st != 5 {
		t.Fatal("a did not record client1's state")
	}
	// An SM_UNMON_ALL of n1's lockd in a leaves the node-level one.
	res = applyOK(t, f, 4, in("a", UnregisterAll{My: lockd, Owner: Owner{Node: "n1", Callback: netip.MustParseAddr("127.0.0.1")}}))
	if res[0].Removed != 1 || a.Len() != 0 || f.Len() != 1 {
		t.Fatalf("unmon all: removed %d, a %d, node %d", res[0].Removed, a.Len(), f.Len())
	}
	if got := f.Scopes(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("scopes %v", got)
	}
}

// A scope exists only for a service the cluster knows: a scoped command
// for a service without a placement record is refused and changes
// nothing, and forgetting a service drops its scope.
func TestScopedCommandNeedsAPlacementAndForgettingDropsIt(t *testing.T) {
	f := scopedFSM(t)
	before := f.Digest()
	res := applyOK(t, f, 2, in("nope", Register{Reg: mkReg("c", lockd, "n1")}))
	if !res[0].Refused || !errors.Is(res[0].Refusal, ErrNotPlaced) {
		t.Fatalf("result %+v, want ErrNotPlaced", res[0])
	}
	if f.Digest() != before || f.Scopes() != nil {
		t.Fatal("a refused scoped command changed the state")
	}
	applyOK(t, f, 3, in("b", Register{Reg: mkReg("c", lockd, "n2")}))
	applyOK(t, f, 4,
		ServicePlaced{Service: "b", Epoch: 2, From: "n2", Reason: "removed"},
		ServiceReleased{Service: "b", Node: "n2", Epoch: 1},
		decl("n1", "a", "fa"), decl("n2", "a", "fa"))
	if f.Scope("b").Len() != 1 {
		t.Fatal("b's registrations went before b was forgotten")
	}
	if r := applyOK(t, f, 5, ServiceForgotten{Service: "b", Epoch: 2}); r[0].Refused {
		t.Fatalf("forget refused: %v", r[0].Refusal)
	}
	if f.Scope("b").Len() != 0 || len(f.Scopes()) != 0 {
		t.Fatalf("b forgotten, its scope kept: %v", f.Scopes())
	}
}

// In a service's scope the node that serves is the service's owner: its
// lockd may take over a registration another node's lockd made (the
// re-monitor after a move); a node that does not own the service may
// not. The control shows the node-level rule (the node of the last
// Takeover) would have refused the owner.
func TestScopedGuardFollowsTheServicesOwner(t *testing.T) {
	f := scopedFSM(t) // b on n2; the last Takeover is n1's
	old := mkReg("client", lockd, "n3")
	applyOK(t, f, 2, in("b", Register{Reg: old}), Register{Reg: old})
	byOwner := mkReg("client", lockd, "n2")
	byOther := mkReg("client", lockd, "n1")
	res := applyOK(t, f, 3, in("b", Register{Reg: byOther, Guarded: true}), in("b", Register{Reg: byOwner, Guarded: true}),
		Register{Reg: byOwner, Guarded: true})
	if !res[0].Refused {
		t.Fatal("a node that does not own b took over b's registration")
	}
	if res[1].Refused {
		t.Fatal("b's owner could not take over the registration an earlier owner made")
	}
	if !res[2].Refused {
		t.Fatal("control: the node-level scope let n2 (not the serving node) take it over")
	}
	if g, _ := f.Scope("b").Get(old.ID); g.Node != "n2" {
		t.Fatalf("b's registration is n%q's", g.Node)
	}
	if !f.Scope("b").MayRegister(byOwner) || f.Scope("b").MayRegister(byOther) {
		t.Fatal("MayRegister disagrees with Apply")
	}
}

func TestServiceSMState(t *testing.T) {
	for epoch, want := range map[uint64]int32{0: 1, 1: 3, 2: 5, 1 << 29: 1<<30 + 1, math.MaxInt32 / 2: math.MaxInt32, math.MaxUint64: math.MaxInt32} {
		if got := ServiceSMState(epoch); got != want {
			t.Errorf("ServiceSMState(%d) = %d, want %d", epoch, got, want)
		}
	}
	f := scopedFSM(t)
	applyOK(t, f, 2, ServicePlaced{Service: "a", Node: "n2", Epoch: 2, From: "n1", Reason: "lost"})
	if f.Scope("a").State() != 5 || f.Scope("b").State() != 3 || f.Scope("").State() != f.State() {
		t.Fatalf("states a=%d b=%d", f.Scope("a").State(), f.Scope("b").State())
	}
}

func TestScopedEncodingRoundTripsAndRefusesBadInput(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	var cmds []Command
	for range 200 {
		var c Command
		if r.IntN(2) == 0 {
			c = v4Command(r)
		} else {
			c = newGen(uint64(r.IntN(1000))).command()
		}
		if scopable(c) {
			cmds = append(cmds, in("svc-1", c))
		}
	}
	b, err := Encode(cmds...)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := Encode(got...)
	if !bytes.Equal(b, b2) {
		t.Fatal("scoped commands do not round-trip")
	}
	for name, c := range map[string]Scoped{
		"no service":      in("", GraceStart{}),
		"long service id": in(string(make([]byte, MaxServiceIDLen+1)), GraceStart{}),
		"a takeover":      in("a", Takeover{Node: "n1"}),
		"a placement":     in("a", ServicePlaced{Service: "a", Node: "n1", Epoch: 1}),
		"nested":          in("a", in("a", GraceStart{})),
		"nil":             in("a", nil),
		"no sender":       {Service: "a", Epoch: 1, Cmd: GraceStart{}},
		"long sender":     {Service: "a", Node: string(make([]byte, MaxNameLen+1)), Epoch: 1, Cmd: GraceStart{}},
		"epoch 0":         {Service: "a", Node: "n1", Cmd: GraceStart{}},
	} {
		if _, err := Encode(c); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%s: Encode %v, want ErrBadCommand", name, err)
		}
	}
	// Hand-made entries: a scoped takeover, a nested scoped command, no
	// sender, epoch 0; the control is the well-formed one.
	tk, _ := Encode(Takeover{Node: "n1"})
	gs, _ := Encode(GraceStart{})
	head := []byte{kindScoped, 1, 'a', 2, 'n', '1', 7} // service a, n1's run at epoch 7
	good := append(bytes.Clone(head), gs[2:]...)
	if got, err := Decode(append([]byte{entryVersion, 1}, good...)); err != nil || got[0] != (Scoped{Service: "a", Node: "n1", Epoch: 7, Cmd: GraceStart{}}) {
		t.Fatalf("control: a well-formed scoped command decodes as %+v, %v", got, err)
	}
	for name, body := range map[string][]byte{
		"takeover inside": append(bytes.Clone(head), tk[2:]...),
		"nested":          append(append(bytes.Clone(head), head...), gs[2:]...),
		"nothing inside":  head,
		"no sender":       append([]byte{kindScoped, 1, 'a', 0, 7}, gs[2:]...),
		"epoch 0":         append([]byte{kindScoped, 1, 'a', 2, 'n', '1', 0}, gs[2:]...),
		"no epoch":        {kindScoped, 1, 'a', 2, 'n', '1'},
		"sender beyond":   {kindScoped, 1, 'a', 9, 'n', '1'},
	} {
		entry := append([]byte{entryVersion, 1}, body...)
		if _, err := Decode(entry); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%s: Decode %v, want ErrBadCommand", name, err)
		}
		if _, _, _, err := decodeApply(entry, newStrTable()); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%s: decodeApply %v, want ErrBadCommand", name, err)
		}
	}
}

// The scopes are in the snapshot (version 5): a state with scopes
// persists and restores to the same digest and the same bytes; an empty
// scope writes nothing; a scope of an unplaced service, items out of
// order and a wrong count are refused.
func TestScopesSnapshotRoundTripAndRejects(t *testing.T) {
	f := scopedFSM(t)
	at := time.Unix(1_800_000_000, 0)
	applyOK(t, f, 2,
		in("a", Register{Reg: mkReg("c1", lockd, "n1", "10.0.0.1", "10.0.0.9")}),
		in("a", Register{Reg: mkReg("c2", lockd, "n1", "10.0.0.2")}),
		in("a", PeerRebooted{MonName: "c1", State: 7, At: at}),
		in("a", ClientCreate{Name: "x", PrincHash: "h"}), in("a", GraceStart{}), in("a", ClientCreate{Name: "y"}),
		in("b", ClientCreate{Name: "z"}),
		in("b", Register{Reg: mkReg("gone", lockd, "n2")}), in("b", Unregister{ID: MonID{MonName: "gone", My: lockd}}))
	b := persist(t, f)
	g := New(Options{})
	if err := restoreFrom(g, b); err != nil {
		t.Fatal(err)
	}
	if g.Digest() != f.Digest() || !bytes.Equal(persist(t, g), b) {
		t.Fatal("scopes do not round-trip")
	}
	a := g.Scope("a")
	if a.Len() != 2 || a.Hosts() != 2 || !a.SenderIsHost("c1", netip.MustParseAddr("10.0.0.9")) {
		t.Fatalf("restored a: %d registrations, %d hosts", a.Len(), a.Hosts())
	}
	if cur, rec := a.Epochs(); cur != 2 || rec != 1 {
		t.Fatalf("restored a's epochs %d %d", cur, rec)
	}
	if c, r, both := a.V4Counts(); c != 1 || r != 1 || both != 0 {
		t.Fatalf("restored a's v4 counts %d %d %d", c, r, both)
	}
	if st, _ := a.LastSeen("c1"); st != 7 {
		t.Fatal("restored a lost c1's last-seen state")
	}

	// An empty scope is not written: the same bytes as one never made
	// (the control: a scope that holds something changes them).
	e1, e2 := scopedFSM(t), scopedFSM(t)
	applyOK(t, e1, 2, in("a", Register{Reg: mkReg("c", lockd, "n1")}), in("a", Unregister{ID: MonID{MonName: "c", My: lockd}}))
	if e1.Digest() != e2.Digest() { // the digest is the snapshot's bytes, index aside
		t.Fatal("an emptied scope changes the snapshot")
	}
	applyOK(t, e2, 2, in("a", GraceStart{}))
	if e1.Digest() == e2.Digest() {
		t.Fatal("control: a scope's epochs do not change the snapshot")
	}

	sc := scalars(3, 1, 0)
	d1, _ := Encode(decl("n1", "a", "f"))
	p1 := encoder{}
	_ = p1.placement(&Placement{Service: "a", Node: "n1", Epoch: 1})
	_ = p1.prev(&Placement{})
	item := func(id string, kind byte, body ...byte) []byte {
		return append(append([]byte{byte(len(id))}, id...), append([]byte{kind}, body...)...)
	}
	seen := func(name string) []byte { return append([]byte{byte(len(name))}, append([]byte(name), 2)...) }
	reg := func(mon string) []byte {
		e := encoder{}
		r := recOf(ptr(mkReg(mon, lockd, "n1")))
		e.rec(&r)
		return e.b
	}
	stream := func(items []byte, n uint64) []byte {
		s := newStream(5).frame(tagScalars, sc).frame(tagDeclared, d1[3:]).frame(tagPlaced, p1.b)
		if items != nil {
			s = s.frame(tagScopes, items)
		}
		return s.end(0, 0, 0, 0, 0, 0, 1, 1, 0, n)
	}
	good := item("a", scopeReg, reg("c1")...)
	if err := restoreFrom(New(Options{}), stream(good, 1)); err != nil {
		t.Fatalf("control: a well-formed scope: %v", err)
	}
	for name, s := range map[string][]byte{
		"unplaced service":      stream(item("b", scopeReg, reg("c1")...), 1),
		"count mismatch":        stream(good, 2),
		"registrations reorder": stream(append(item("a", scopeReg, reg("c2")...), item("a", scopeReg, reg("c1")...)...), 2),
		"kinds out of order":    stream(append(bytes.Clone(good), item("a", scopeSeen, seen("c1")...)...), 2),
		"seen unmonitored":      stream(item("a", scopeSeen, seen("zz")...), 1),
		"default epochs":        stream(item("a", scopeEpochs, 1, 0), 1),
		"recovery not in grace": stream(item("a", scopeV4Rec, 1, 'x', 0), 1),
		"unknown item kind":     stream(item("a", 9), 1),
	} {
		if err := restoreFrom(New(Options{}), s); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: restore %v, want ErrCorruptSnapshot", name, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// A write of a service's run never lands in a later run: every scoped
// command sent by n1's run of a at epoch 1 and applied after a moved to
// n2 (epoch 2), after a's restart on n2 (epoch 3), or sent by a node that
// does not hold a at the current epoch, or after a was taken away, is
// refused (ErrStaleRun) and changes nothing — the client n2's clients
// reclaim by stays, no client n2 never saw appears. The negative control:
// the same commands sent by the current run land.
func TestScopedWriteOfAnEndedRunIsRefused(t *testing.T) {
	f := scopedFSM(t) // a on n1 at epoch 1
	owner := Owner{Node: "n1", Callback: netip.MustParseAddr("127.0.0.1")}
	r1 := mkReg("client1", lockd, "n1", "10.0.0.1")
	applyOK(t, f, 2, in("a", Register{Reg: r1, Guarded: true}), in("a", ClientCreate{Name: "keep", PrincHash: "p"}))
	writes := func() []Command { // every kind a scope takes
		return []Command{
			ClientRemove{Name: "keep"}, ClientCreate{Name: "ghost"}, ClientCheck{Name: "keep"},
			GraceStart{}, GraceDone{},
			Unregister{ID: r1.ID, Owner: owner}, UnregisterAll{My: lockd, Owner: owner},
			Register{Reg: mkReg("client9", lockd, "n1"), Guarded: true}, Register{Reg: mkReg("client8", lockd, "n1")},
			PeerRebooted{MonName: "client1", State: 9},
		}
	}
	sent := func(node string, epoch uint64) []Command {
		var out []Command
		for _, c := range writes() {
			out = append(out, Scoped{Service: "a", Node: node, Epoch: epoch, Cmd: c})
		}
		return out
	}
	index := uint64(3)
	refused := func(what string, cmds []Command, state int32) {
		t.Helper()
		before := f.Digest()
		res := applyOK(t, f, index, cmds...)
		index++
		for i, r := range res {
			if !r.Refused || !errors.Is(r.Refusal, ErrStaleRun) || r.State != state {
				t.Fatalf("%s: command %d (%T): %+v, want ErrStaleRun at state %d", what, i, cmds[i].(Scoped).Cmd, r, state)
			}
		}
		if f.Digest() != before {
			t.Fatalf("%s: a refused write changed the state", what)
		}
		if cur, _ := f.Scope("a").HasV4Client("keep"); !cur || f.Scope("a").Len() != 1 {
			t.Fatalf("%s: a's records changed", what)
		}
	}
	stale := sent("n1", 1) // built by n1's run while it served
	applyOK(t, f, index, ServicePlaced{Service: "a", Node: "n2", Epoch: 2, From: "n1", Reason: "moved"})
	index++
	refused("after the move", stale, 5)
	refused("a node that does not hold a, at a's epoch", sent("n1", 2), 5)
	refused("a future epoch", sent("n2", 3), 5)
	applyOK(t, f, index, ServicePlaced{Service: "a", Node: "n2", Epoch: 3, From: "n2", Reason: "restarted"})
	index++
	refused("the run before a restart on the same node", sent("n2", 2), 7)
	applyOK(t, f, index, ServicePlaced{Service: "a", Epoch: 4, From: "n2", Reason: "removed"})
	index++
	refused("after a was taken away", sent("n2", 3), 9)
	refused("by nobody's run", []Command{Scoped{Service: "a", Node: "n2", Epoch: 4, Cmd: GraceStart{}}}, 9)

	// Negative control: the current run's same writes land.
	applyOK(t, f, index, ServicePlaced{Service: "a", Node: "n2", Epoch: 5, Reason: "placed"})
	index++
	before := f.Digest()
	res := applyOK(t, f, index, sent("n2", 5)...)
	for i, r := range res {
		if r.Refusal != nil {
			t.Fatalf("control: command %d refused: %v", i, r.Refusal)
		}
	}
	if res[0].Removed != 1 || f.Digest() == before {
		t.Fatalf("control: the current run's ClientRemove removed %d", res[0].Removed)
	}
	if cur, _ := f.Scope("a").HasV4Client("keep"); cur {
		t.Fatal("control: the current run's ClientRemove left the record")
	}
	if hosts := f.Scope("a").Targets(); len(hosts) != 2 || hosts[0].MonName != "client8" || hosts[1].MonName != "client9" {
		t.Fatalf("control: a's registrations after the current run's writes: %+v", hosts)
	}
}
