package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"
)

func populated(t testing.TB, seed uint64, entries int) *FSM {
	f := New(Options{})
	g := newGen(seed)
	applyOK(t, f, 1, Takeover{MinState: 3})
	for i := 0; i < entries; i++ {
		applyOK(t, f, uint64(i+2), g.batch()...)
	}
	return f
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	src := populated(t, 1, 400)
	if src.Len() == 0 {
		t.Fatal("generator produced no registrations")
	}
	b := persist(t, src)
	dst := New(Options{})
	applyOK(t, dst, 1, Register{Reg: mkReg("old", lockd, "n")}) // discarded by Restore
	if err := restoreFrom(dst, b); err != nil {
		t.Fatal(err)
	}
	if dst.Digest() != src.Digest() {
		t.Fatal("digest differs after restore")
	}
	if dst.AppliedIndex() != src.AppliedIndex() || dst.State() != src.State() || dst.Len() != src.Len() || dst.Hosts() != src.Hosts() {
		t.Fatalf("restored index/state/len/hosts %d/%d/%d/%d, want %d/%d/%d/%d", dst.AppliedIndex(), dst.State(), dst.Len(), dst.Hosts(),
			src.AppliedIndex(), src.State(), src.Len(), src.Hosts())
	}
	if !slices.EqualFunc(dst.Targets(), src.Targets(), func(a, b Target) bool { return a.MonName == b.MonName && slices.Equal(a.Addrs, b.Addrs) }) {
		t.Fatal("targets differ")
	}
	// The derived address index was rebuilt: matching agrees.
	g := newGen(99)
	for i := 0; i < 200; i++ {
		a, st := g.addr(), int32(g.r.IntN(4))
		if src.WouldAccept("n/a", a, st) != dst.WouldAccept("n/a", a, st) {
			t.Fatalf("WouldAccept(%v, %d) differs", a, st)
		}
	}
	if !bytes.Equal(persist(t, dst), b) {
		t.Fatal("persisting the restored FSM gives different bytes")
	}
	if err := restoreFrom(dst, persist(t, New(Options{}))); err != nil || dst.Len() != 0 || dst.Digest() != New(Options{}).Digest() {
		t.Fatalf("restoring an empty snapshot: %v", err)
	}
}

func TestRestoreRejectsCorruptSnapshotAndKeepsState(t *testing.T) {
	b := persist(t, populated(t, 2, 300))
	f := populated(t, 3, 50)
	before, beforeIdx := f.Digest(), f.AppliedIndex()

	flip := func(i int) []byte { c := slices.Clone(b); c[i] ^= 0x40; return c }
	tests := map[string][]byte{
		"empty":           {},
		"bad magic":       flip(0),
		"header only":     b[:9],
		"truncated":       b[:len(b)/2],
		"no checksum":     b[:len(b)-4],
		"no trailer":      b[:len(b)-36],
		"flipped middle":  flip(len(b) / 2),
		"flipped counts":  flip(len(b) - 6),
		"flipped crc":     flip(len(b) - 1),
		"trailing byte":   append(slices.Clone(b), 0),
		"huge frame":      append(append(slices.Clone(b[:9]), 0xff, 0xff, 0xff, 0xff), b[13:]...),
		"no scalars":      binary.BigEndian.AppendUint32(slices.Clone(b[:9]), 0),
		"version too new": func() []byte { c := slices.Clone(b); c[8] = snapVersion5 + 1; return c }(),
		"version 0":       func() []byte { c := slices.Clone(b); c[8] = 0; return c }(),
		// A version-3 stream labelled version 1 or 2 (checksum recomputed):
		// its scalars frame has trailing bytes (takeover term, v4 epochs).
		"v3 body as v1": fixCRC(func() []byte { c := slices.Clone(b); c[8] = 1; return c }()),
		"v3 body as v2": fixCRC(func() []byte { c := slices.Clone(b); c[8] = 2; return c }()),
		// Apply never makes a negative sm_state; a snapshot with one is forged.
		"negative sm_state": func() []byte {
			g := populated(t, 4, 10)
			g.st.sm = -3
			return persist(t, g)
		}(),
	}
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			err := restoreFrom(f, data)
			if err == nil {
				t.Fatal("corrupt snapshot accepted")
			}
			if !errors.Is(err, ErrCorruptSnapshot) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps neither ErrCorruptSnapshot nor ErrVersion", err)
			}
			if f.Digest() != before || f.AppliedIndex() != beforeIdx {
				t.Fatal("failed restore changed the FSM")
			}
		})
	}
}

// TestSnapshotIsCopyOnWrite: what Persist writes is the state at
// Snapshot(), whatever Apply does in between.
func TestSnapshotIsCopyOnWrite(t *testing.T) {
	f := populated(t, 4, 200)
	want := persist(t, f)
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	g := newGen(5)
	for i := 0; i < 300; i++ {
		applyOK(t, f, uint64(1000+i), g.batch()...)
	}
	applyOK(t, f, 2000, UnregisterAll{My: MyID{MyName: "lockd0", Prog: 100021, Vers: 1, Proc: 16}}, Takeover{})
	var s memSink
	if err := snap.Persist(&s); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	if !bytes.Equal(s.Bytes(), want) {
		t.Fatal("snapshot content changed after later Applies")
	}
	if bytes.Equal(persist(t, f), want) {
		t.Fatal("later Applies changed nothing; the test proves nothing")
	}
}

// TestDeterminismAcrossReplicasAndRestore: replicas fed the same entries
// (NSM and NFSv4 client-tracking commands) agree at every step (DESIGN.md
// invariant 1), and so does one restored from a mid-way snapshot.
func TestDeterminismAcrossReplicasAndRestore(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		g := newGen(seed)
		var entries [][]Command
		for i := 0; i < 600; i++ {
			entries = append(entries, g.batch())
		}
		a, b := New(Options{}), New(Options{})
		var c *FSM
		v4Records := 0 // entries after which a holds client records
		placed := 0    // placements applied
		for i, cmds := range entries {
			idx, term := uint64(i+1), uint64(1+i/37) // a new raft term now and then
			ra := applyTermOK(t, a, idx, term, cmds...)
			applyTermOK(t, b, idx, term, cmds...)
			if c != nil {
				rc := applyTermOK(t, c, idx, term, cmds...)
				for j := range ra {
					if ra[j].State != rc[j].State || ra[j].Accepted != rc[j].Accepted || ra[j].Removed != rc[j].Removed || len(ra[j].Matched) != len(rc[j].Matched) {
						t.Fatalf("seed %d entry %d: results differ after restore", seed, i)
					}
				}
			}
			for j, c := range cmds {
				if _, ok := c.(ServicePlaced); ok && !ra[j].Refused {
					placed++
				}
			}
			if n, m, _ := a.V4Counts(); n+m > 0 {
				v4Records++
			}
			da := a.Digest()
			if da != b.Digest() {
				t.Fatalf("seed %d entry %d: replicas diverge", seed, i)
			}
			if c != nil && da != c.Digest() {
				t.Fatalf("seed %d entry %d: restored replica diverges", seed, i)
			}
			if i == len(entries)/2 {
				c = New(Options{})
				if err := restoreFrom(c, persist(t, a)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if a.Len() == 0 || a.State() < 3 || a.TakeoverTerm() < 2 {
			t.Fatalf("seed %d: stream too weak (len %d, state %d, takeover term %d)", seed, a.Len(), a.State(), a.TakeoverTerm())
		}
		if cur, _ := a.Epochs(); cur < 5 || v4Records == 0 {
			t.Fatalf("seed %d: stream too weak for NFSv4 tracking (epoch %d, %d records seen)", seed, cur, v4Records)
		}
		if placed < 3 || len(a.Services().Declarations) == 0 {
			t.Fatalf("seed %d: stream too weak for placements (%d applied)", seed, placed)
		}
		if c.TakeoverTerm() != a.TakeoverTerm() {
			t.Fatalf("seed %d: restored replica's takeover term %d, want %d", seed, c.TakeoverTerm(), a.TakeoverTerm())
		}
		checkV4Invariants(t, c)
	}
}

// TestWouldAcceptMirrorsApply checks WouldAccept against PeerRebooted's
// result over a random stream.
func TestWouldAcceptMirrorsApply(t *testing.T) {
	f := New(Options{})
	g := newGen(11)
	accepted := 0
	for i := 0; i < 3000; i++ {
		c := g.command()
		if ev, ok := c.(PeerRebooted); ok {
			want := f.WouldAccept(ev.MonName, ev.From, ev.State)
			if res := applyOK(t, f, uint64(i+1), c)[0]; res.Accepted != want {
				t.Fatalf("step %d: WouldAccept=%v, Apply accepted=%v", i, want, res.Accepted)
			} else if res.Accepted {
				accepted++
				if !slices.IsSortedFunc(res.Matched, func(a, b Registration) int { return a.ID.Compare(b.ID) }) {
					t.Fatal("Matched not sorted by MonID")
				}
			}
			continue
		}
		applyOK(t, f, uint64(i+1), c)
	}
	if accepted == 0 {
		t.Fatal("no notify accepted; the stream proves nothing")
	}
}

// tinyFSM has a little of everything (kept small: the fuzzer minimises
// new inputs in time quadratic in their size).
func tinyFSM(t testing.TB) *FSM {
	f := New(Options{})
	applyOK(t, f, 3,
		Takeover{Node: "n1", MinState: 5, GraceUntil: time.Unix(1_800_000_090, 0), Reason: "r", At: time.Unix(1_800_000_000, 0)},
		Register{Reg: Registration{ID: MonID{MonName: "a", My: MyID{"m", 1, 2, 3}}, Node: "n", Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}},
		Register{Reg: Registration{ID: MonID{MonName: "b", My: MyID{"m", 1, 2, 3}}, Callback: netip.MustParseAddr("::1")}},
		PeerRebooted{MonName: "a", State: 7},
	)
	return f
}

// termFSM has a takeover carried by an entry of a term that needs a
// multi-byte varint.
func termFSM(t testing.TB) *FSM {
	f := New(Options{})
	applyTermOK(t, f, 9, 300, Takeover{Node: "n2", GraceUntil: time.Unix(1_800_000_090, 0), Reason: "leader_elected"})
	applyTermOK(t, f, 10, 301, Register{Reg: Registration{ID: MonID{MonName: "c", My: MyID{"m", 1, 2, 3}}, Node: "n2"}})
	return f
}

// tinyV2FSM is tinyFSM followed by a takeover and a registration in
// entries of raft terms that need multi-byte varints (the state of the
// version-2 fixture).
func tinyV2FSM(t testing.TB) *FSM {
	f := tinyFSM(t)
	applyTermOK(t, f, 9, 300, Takeover{Node: "n2", GraceUntil: time.Unix(1_800_000_190, 0), Reason: "leader_elected", At: time.Unix(1_800_000_100, 0)})
	applyTermOK(t, f, 10, 301, Register{Reg: Registration{ID: MonID{MonName: "c", My: MyID{"m", 1, 2, 3}}, Node: "n2", Addrs: []netip.Addr{netip.MustParseAddr("2001:db8::c")}}})
	return f
}

// v1Fixture is tinyFSM as the version-1 writer persisted it (generated
// before the format moved to version 2; never regenerate it).
const v1Fixture = "testdata/snapshot-v1-tiny.bin"

func readV1Fixture(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(v1Fixture)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVersion1SnapshotIsStillRead: a snapshot written by the version-1
// writer restores to the state it was taken from, with takeover term 0
// and v4 epochs 1, 0; persisting it again writes version 3, byte for byte
// what the same state built by Apply persists to.
func TestVersion1SnapshotIsStillRead(t *testing.T) {
	v1 := readV1Fixture(t)
	if v1[len(snapMagic)] != 1 {
		t.Fatalf("fixture is version %d, want 1", v1[len(snapMagic)])
	}
	want := tinyFSM(t)
	got := New(Options{})
	applyTermOK(t, got, 1, 4, Takeover{MinState: 99}) // replaced by Restore
	if err := restoreFrom(got, v1); err != nil {
		t.Fatal(err)
	}
	if got.TakeoverTerm() != 0 {
		t.Errorf("takeover term after a v1 snapshot: %d, want 0", got.TakeoverTerm())
	}
	if got.Digest() != want.Digest() || got.AppliedIndex() != want.AppliedIndex() || got.State() != want.State() ||
		got.Len() != want.Len() || got.Hosts() != want.Hosts() || got.LastTakeover() != want.LastTakeover() {
		t.Fatalf("v1 snapshot restored to index/state/len/hosts %d/%d/%d/%d, takeover %+v; want %d/%d/%d/%d, %+v",
			got.AppliedIndex(), got.State(), got.Len(), got.Hosts(), got.LastTakeover(),
			want.AppliedIndex(), want.State(), want.Len(), want.Hosts(), want.LastTakeover())
	}
	if s, ok := got.LastSeen("a"); !ok || s != 7 {
		t.Errorf("last seen of a: %d %v, want 7", s, ok)
	}
	again := persist(t, got)
	if again[len(snapMagic)] != snapVersion {
		t.Fatalf("persisted version %d, want %d", again[len(snapMagic)], snapVersion)
	}
	if cur, rec := got.Epochs(); cur != 1 || rec != 0 {
		t.Errorf("v4 epochs after a v1 snapshot: %d, %d; want 1, 0", cur, rec)
	}
	if !bytes.Equal(again, persist(t, want)) {
		t.Fatal("a v1 snapshot re-persisted differs from the same state built by Apply")
	}
}

// v2Fixture is tinyV2FSM as the version-2 writer persisted it (generated
// before the format moved to version 3; never regenerate it).
const v2Fixture = "testdata/snapshot-v2-tiny.bin"

func readV2Fixture(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(v2Fixture)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVersion2SnapshotIsStillRead: a snapshot written by the version-2
// writer restores to the state it was taken from, takeover term included,
// with the NFSv4 epochs of a new FSM (1, 0) and no client records;
// persisting it again (version 3) gives what the same state built by
// Apply persists to.
func TestVersion2SnapshotIsStillRead(t *testing.T) {
	v2 := readV2Fixture(t)
	if v2[len(snapMagic)] != 2 {
		t.Fatalf("fixture is version %d, want 2", v2[len(snapMagic)])
	}
	want := tinyV2FSM(t)
	got := New(Options{})
	applyTermOK(t, got, 1, 4, Takeover{MinState: 99}, Register{Reg: mkReg("old", lockd, "n")}) // replaced by Restore
	if err := restoreFrom(got, v2); err != nil {
		t.Fatal(err)
	}
	if got.Digest() != want.Digest() || got.AppliedIndex() != 10 || got.State() != 7 || got.TakeoverTerm() != 300 ||
		got.Len() != 3 || got.Hosts() != 3 || got.LastTakeover() != want.LastTakeover() {
		t.Fatalf("v2 snapshot restored to index/state/term/len/hosts %d/%d/%d/%d/%d, takeover %+v; want 10/7/300/3/3, %+v",
			got.AppliedIndex(), got.State(), got.TakeoverTerm(), got.Len(), got.Hosts(), got.LastTakeover(), want.LastTakeover())
	}
	if s, ok := got.LastSeen("a"); !ok || s != 7 {
		t.Errorf("last seen of a: %d %v, want 7", s, ok)
	}
	if tg := got.Targets(); len(tg) != 3 || len(tg[2].Addrs) != 1 || tg[2].Addrs[0] != netip.MustParseAddr("2001:db8::c") {
		t.Errorf("targets %v", tg)
	}
	if cur, rec := got.Epochs(); cur != 1 || rec != 0 {
		t.Errorf("v4 epochs after a v2 snapshot: %d, %d; want 1, 0", cur, rec)
	}
	if c, r, b := got.V4Counts(); c != 0 || r != 0 || b != 0 {
		t.Errorf("v4 counts after a v2 snapshot: %d %d %d", c, r, b)
	}
	again := persist(t, got)
	if again[len(snapMagic)] != snapVersion {
		t.Fatalf("persisted version %d, want %d", again[len(snapMagic)], snapVersion)
	}
	if !bytes.Equal(again, persist(t, want)) {
		t.Fatal("a v2 snapshot re-persisted differs from the same state built by Apply")
	}
}

// TestTakeoverTermIsTheTermOfItsEntry: TakeoverTerm is the raft term of
// the entry that carried the last Takeover (not of later entries), it is
// part of the replicated state (Digest) and a snapshot keeps it.
func TestTakeoverTermIsTheTermOfItsEntry(t *testing.T) {
	f := New(Options{})
	if f.TakeoverTerm() != 0 {
		t.Fatalf("new FSM: takeover term %d", f.TakeoverTerm())
	}
	applyTermOK(t, f, 1, 2, Register{Reg: mkReg("h", lockd, "n1")})
	if f.TakeoverTerm() != 0 {
		t.Fatalf("a Register set the takeover term to %d", f.TakeoverTerm())
	}
	applyTermOK(t, f, 2, 3, Takeover{Node: "n1"})
	applyTermOK(t, f, 3, 5, Register{Reg: mkReg("i", lockd, "n1")}, Unregister{ID: MonID{MonName: "h", My: lockd}})
	if st, term := f.Incarnation(); st != 1 || term != 3 || f.TakeoverTerm() != 3 {
		t.Fatalf("after a takeover in term 3 and writes in term 5: state %d, takeover term %d/%d; want 1, 3", st, term, f.TakeoverTerm())
	}
	applyTermOK(t, f, 4, 1<<40, Register{Reg: mkReg("j", lockd, "n1")}, Takeover{Node: "n2"}, Register{Reg: mkReg("k", lockd, "n2")})
	if st, term := f.Incarnation(); st != 3 || term != 1<<40 {
		t.Fatalf("after a takeover in a batch of term 2^40: state %d, takeover term %d", st, term)
	}

	g := New(Options{})
	if err := restoreFrom(g, persist(t, f)); err != nil {
		t.Fatal(err)
	}
	if g.TakeoverTerm() != 1<<40 || g.Digest() != f.Digest() {
		t.Fatalf("restored takeover term %d (digest equal: %v), want %d", g.TakeoverTerm(), g.Digest() == f.Digest(), uint64(1<<40))
	}

	// The same commands in another term are another replicated state.
	h := New(Options{})
	applyTermOK(t, h, 1, 2, Takeover{Node: "n1"})
	k := New(Options{})
	applyTermOK(t, k, 1, 3, Takeover{Node: "n1"})
	if h.Digest() == k.Digest() {
		t.Fatal("Digest ignores the takeover term")
	}
}

// v4FSM is tinyFSM during an NFSv4 grace period, with client records in
// both epochs (one reclaimed), one with a principal hash.
func v4FSM(t testing.TB) *FSM {
	f := tinyFSM(t)
	setV4(f, 3, 2, []V4Client{{Name: "c1", PrincHash: "\x01\x02"}, {Name: "c3"}}, []V4Client{{Name: "c1"}, {Name: "c2"}})
	return f
}

// fixCRC returns b with its trailing checksum recomputed, so that the
// fuzzer's mutations reach the parser instead of stopping at the CRC.
func fixCRC(b []byte) []byte {
	if len(b) < 4 {
		return b
	}
	c := slices.Clone(b)
	binary.BigEndian.PutUint32(c[len(c)-4:], crc32.Checksum(c[:len(c)-4], crc32.MakeTable(crc32.Castagnoli)))
	return c
}

// FuzzRestore: Restore never panics, also when the checksum is made to
// match; what it accepts persists to a snapshot that restores to the same
// state (frame boundaries may differ).
func FuzzRestore(f *testing.F) {
	f.Add(persist(f, New(Options{})))
	f.Add(persist(f, tinyFSM(f)))
	f.Add(persist(f, termFSM(f)))
	f.Add(readV1Fixture(f))
	f.Add(readV2Fixture(f))
	f.Add(persist(f, v4FSM(f)))
	f.Add(persist(f, servicesFSM(f)))
	for _, golden := range []string{"testdata/snapshot-v3-tiny.bin", "testdata/snapshot-v4-tiny.bin"} {
		b, err := os.ReadFile(golden)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("NSMDSNP1\x01"))
	f.Add([]byte("NSMDSNP1\x02"))
	f.Add([]byte("NSMDSNP1\x03"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, fixCRC(b)} {
			x := New(Options{})
			if err := restoreFrom(x, in); err != nil {
				if !errors.Is(err, ErrCorruptSnapshot) && !errors.Is(err, ErrVersion) {
					t.Fatalf("error %v wraps neither sentinel", err)
				}
				continue
			}
			y := New(Options{})
			if err := restoreFrom(y, persist(t, x)); err != nil {
				t.Fatalf("re-persisted snapshot rejected: %v", err)
			}
			if x.Digest() != y.Digest() || x.AppliedIndex() != y.AppliedIndex() || x.Len() != y.Len() || x.Hosts() != y.Hosts() ||
				x.TakeoverTerm() != y.TakeoverTerm() {
				t.Fatal("accepted snapshot does not round-trip")
			}
			xc, xr := x.Epochs()
			yc, yr := y.Epochs()
			xn, xm, xb := x.V4Counts()
			yn, ym, yb := y.V4Counts()
			if xc != yc || xr != yr || xn != yn || xm != ym || xb != yb {
				t.Fatalf("v4 state does not round-trip: epochs %d,%d → %d,%d; counts %d,%d,%d → %d,%d,%d", xc, xr, yc, yr, xn, xm, xb, yn, ym, yb)
			}
			checkV4Invariants(t, x)
		}
	})
}
