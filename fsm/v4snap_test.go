package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// setV4 replaces f's NFSv4 client-tracking state directly, for snapshot
// tests that need states commands reach only after many steps (or never).
// cur and rec must be sorted by name without duplicates.
func setV4(f *FSM, current, recovery uint64, cur, rec []V4Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &f.st
	s.v4Current, s.v4Recovery = current, recovery
	s.v4cur, s.v4rec = newV4Tree(), newV4Tree()
	for _, c := range cur {
		s.v4cur.ReplaceOrInsert(v4Rec{name: c.Name, princ: c.PrincHash})
	}
	for _, c := range rec {
		s.v4rec.ReplaceOrInsert(v4Rec{name: c.Name, princ: c.PrincHash})
	}
	s.v4Both = countBoth(s.v4cur, s.v4rec)
}

// stream builds a snapshot stream frame by frame, for content Persist
// never writes (unsorted, inconsistent, mislabelled).
type stream struct{ b []byte }

func newStream(version byte) *stream { return &stream{b: append([]byte(snapMagic), version)} }

func (s *stream) frame(tag byte, payload []byte) *stream {
	s.b = binary.BigEndian.AppendUint32(s.b, uint32(1+len(payload)))
	s.b = append(s.b, tag)
	s.b = append(s.b, payload...)
	return s
}

// end appends the end frame, the trailer counts and the checksum.
func (s *stream) end(counts ...uint64) []byte {
	b := binary.BigEndian.AppendUint32(s.b, 0)
	for _, c := range counts {
		b = binary.BigEndian.AppendUint64(b, c)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// scalars is the scalars payload of a new FSM's state at index 0 with the
// given v4 epochs (version 3) or without them (version 2).
func scalars(version int, current, recovery uint64) []byte {
	e := encoder{}
	e.b = binary.AppendVarint(e.b, 0) // sm_state
	_ = e.time(time.Time{}, "grace")
	_ = e.takeover(&Takeover{})
	e.b = binary.AppendUvarint(e.b, 0) // applied index
	e.b = binary.AppendUvarint(e.b, 0) // takeover term
	if version >= 3 {
		e.b = binary.AppendUvarint(e.b, current)
		e.b = binary.AppendUvarint(e.b, recovery)
	}
	return e.b
}

// clients is a v4 section payload: (str(name) str(princ_hash))*, in the
// order given.
func clients(cs ...V4Client) []byte {
	var b []byte
	for _, c := range cs {
		b = binary.AppendUvarint(b, uint64(len(c.Name)))
		b = append(b, c.Name...)
		b = binary.AppendUvarint(b, uint64(len(c.PrincHash)))
		b = append(b, c.PrincHash...)
	}
	return b
}

func cl(name, princ string) V4Client { return V4Client{Name: name, PrincHash: princ} }

// checkV4Invariants checks the NFSv4 client-tracking invariants of f:
// current ≥ 1, recovery 0 or current-1, no recovery records outside
// grace, records sorted by name within limits, V4Counts and HasV4Client
// agreeing with V4Clients.
func checkV4Invariants(t testing.TB, f *FSM) {
	t.Helper()
	cur, rec := f.Epochs()
	if cur == 0 || rec != 0 && rec != cur-1 {
		t.Fatalf("epochs current %d, recovery %d", cur, rec)
	}
	c, r := f.V4Clients(false), f.V4Clients(true)
	if rec == 0 && len(r) != 0 {
		t.Fatalf("%d recovery records while not in grace", len(r))
	}
	both := 0
	for i, l := range [][]V4Client{c, r} {
		for j, x := range l {
			if len(x.Name) == 0 || len(x.Name) > MaxClientNameLen || len(x.PrincHash) > MaxPrincHashLen {
				t.Fatalf("record %q/%q beyond the limits", x.Name, x.PrincHash)
			}
			if j > 0 && l[j-1].Name >= x.Name {
				t.Fatalf("records not strictly sorted at %q", x.Name)
			}
			inCur, inRec := f.HasV4Client(x.Name)
			if !inCur && i == 0 || !inRec && i == 1 {
				t.Fatalf("HasV4Client(%q) = %v, %v for a listed record", x.Name, inCur, inRec)
			}
			if i == 0 && inRec {
				both++
			}
		}
	}
	if n, m, b := f.V4Counts(); n != len(c) || m != len(r) || b != both {
		t.Fatalf("V4Counts() = %d, %d, %d; records say %d, %d, %d", n, m, b, len(c), len(r), both)
	}
}

// TestSnapshotV3Layout pins the version-3 stream byte for byte: the v4
// epochs at the end of the scalars frame, sections 4 and 5 with
// str(name) str(princ_hash) entries, four trailer counts.
func TestSnapshotV3Layout(t *testing.T) {
	f := New(Options{})
	cur := []V4Client{cl("a", ""), cl("b\x00\xff", strings.Repeat("p", MaxPrincHashLen))}
	rec := []V4Client{cl("a", "h"), cl("c", "")}
	setV4(f, 8, 7, cur, rec)
	want := newStream(3).frame(tagScalars, scalars(3, 8, 7)).frame(tagV4Cur, clients(cur...)).frame(tagV4Rec, clients(rec...)).end(0, 0, 2, 2)
	if got := persist(t, f); !bytes.Equal(got, want) {
		t.Fatalf("persisted\n %x\nwant\n %x", got, want)
	}
	// And the empty state: no v4 section frames, zero counts.
	want = newStream(3).frame(tagScalars, scalars(3, 1, 0)).end(0, 0, 0, 0)
	if got := persist(t, New(Options{})); !bytes.Equal(got, want) {
		t.Fatalf("empty FSM persisted\n %x\nwant\n %x", got, want)
	}
}

func TestNewFSMHasEpochOneAndNoClientRecords(t *testing.T) {
	f := New(Options{})
	if c, r := f.Epochs(); c != 1 || r != 0 {
		t.Fatalf("Epochs() = %d, %d; want 1, 0", c, r)
	}
	if c, r, b := f.V4Counts(); c != 0 || r != 0 || b != 0 {
		t.Fatalf("V4Counts() = %d %d %d", c, r, b)
	}
	if l := f.V4Clients(false); len(l) != 0 {
		t.Fatalf("V4Clients(false) = %v", l)
	}
	if c, r := f.HasV4Client("x"); c || r {
		t.Fatal("HasV4Client on an empty FSM")
	}
}

// manyClients returns n records with long names (so that a section spans
// several frames), every third with a principal hash.
func manyClients(n int, tag string) []V4Client {
	out := make([]V4Client, n)
	for i := range out {
		out[i].Name = fmt.Sprintf("%06d-%s-", i, tag) + strings.Repeat("x", MaxClientNameLen-20)
		if i%3 == 0 {
			out[i].PrincHash = strings.Repeat(string(rune('a'+i%26)), 1+i%MaxPrincHashLen)
		}
	}
	return out
}

func TestSnapshotKeepsV4State(t *testing.T) {
	src := tinyV2FSM(t)
	cur := manyClients(300, "c")                                   // ~300 KiB: five frames
	rec := append(manyClients(150, "c"), manyClients(150, "r")...) // 150 names in both
	slices.SortFunc(rec, func(a, b V4Client) int { return strings.Compare(a.Name, b.Name) })
	setV4(src, 1<<40, 1<<40-1, cur, rec)
	b := persist(t, src)
	dst := New(Options{})
	if err := restoreFrom(dst, b); err != nil {
		t.Fatal(err)
	}
	if c, r := dst.Epochs(); c != 1<<40 || r != 1<<40-1 {
		t.Fatalf("epochs %d, %d", c, r)
	}
	if c, r, both := dst.V4Counts(); c != 300 || r != 300 || both != 150 {
		t.Fatalf("V4Counts = %d %d %d; want 300 300 150", c, r, both)
	}
	if !slices.Equal(dst.V4Clients(false), cur) || !slices.Equal(dst.V4Clients(true), rec) {
		t.Fatal("restored client records differ")
	}
	if c, r := dst.HasV4Client(cur[0].Name); !c || !r {
		t.Fatalf("HasV4Client(reclaimed) = %v %v", c, r)
	}
	if c, r := dst.HasV4Client(cur[299].Name); !c || r {
		t.Fatalf("HasV4Client(current only) = %v %v", c, r)
	}
	if dst.Digest() != src.Digest() || dst.Len() != src.Len() || dst.State() != src.State() {
		t.Fatal("restored state differs")
	}
	if !bytes.Equal(persist(t, dst), b) {
		t.Fatal("re-persisted snapshot differs")
	}
	checkV4Invariants(t, dst)
}

// TestDigestCoversV4State: states that differ only in their NFSv4 client
// tracking have different digests.
func TestDigestCoversV4State(t *testing.T) {
	variants := []struct {
		name     string
		cur, rec uint64
		c, r     []V4Client
	}{
		{"new", 1, 0, nil, nil},
		{"later epoch", 2, 0, nil, nil},
		{"in grace", 2, 1, nil, nil},
		{"current record", 2, 1, []V4Client{cl("a", "")}, nil},
		{"recovery record", 2, 1, nil, []V4Client{cl("a", "")}},
		{"other principal", 2, 1, []V4Client{cl("a", "p")}, nil},
		{"other name", 2, 1, []V4Client{cl("b", "")}, nil},
	}
	seen := map[[32]byte]string{}
	for _, v := range variants {
		f := tinyFSM(t)
		setV4(f, v.cur, v.rec, v.c, v.r)
		d := f.Digest()
		if other, ok := seen[d]; ok {
			t.Fatalf("%q and %q have the same digest", v.name, other)
		}
		seen[d] = v.name
	}
}

// TestRestoreRejectsInconsistentV3Streams: every stream here is framed
// and checksummed correctly; Restore must still refuse it, with
// ErrCorruptSnapshot, and leave the FSM as it was.
func TestRestoreRejectsInconsistentV3Streams(t *testing.T) {
	sc := scalars(3, 5, 4)
	a, b, c := cl("a", ""), cl("b", "p"), cl("c", "")
	long := cl(strings.Repeat("n", MaxClientNameLen+1), "")
	control := newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(a, b)).frame(tagV4Rec, clients(a, c)).end(0, 0, 2, 2)
	if err := restoreFrom(New(Options{}), control); err != nil {
		t.Fatalf("control stream rejected: %v", err)
	}
	// A section may span frames; order is checked across them.
	split := newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(a)).frame(tagV4Cur, clients(b, c)).end(0, 0, 3, 0)
	if err := restoreFrom(New(Options{}), split); err != nil {
		t.Fatalf("section split over two frames rejected: %v", err)
	}

	tests := map[string][]byte{
		"current epoch 0":               newStream(3).frame(tagScalars, scalars(3, 0, 0)).end(0, 0, 0, 0),
		"recovery not current-1":        newStream(3).frame(tagScalars, scalars(3, 5, 3)).end(0, 0, 0, 0),
		"recovery equals current":       newStream(3).frame(tagScalars, scalars(3, 5, 5)).end(0, 0, 0, 0),
		"recovery above current":        newStream(3).frame(tagScalars, scalars(3, 5, 6)).end(0, 0, 0, 0),
		"recovery max, current 0":       newStream(3).frame(tagScalars, scalars(3, 0, math.MaxUint64)).end(0, 0, 0, 0),
		"recovery records not in grace": newStream(3).frame(tagScalars, scalars(3, 5, 0)).frame(tagV4Rec, clients(a)).end(0, 0, 0, 1),
		"current out of order":          newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(b, a)).end(0, 0, 2, 0),
		"recovery out of order":         newStream(3).frame(tagScalars, sc).frame(tagV4Rec, clients(b, a)).end(0, 0, 0, 2),
		"out of order across frames":    newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(b)).frame(tagV4Cur, clients(a)).end(0, 0, 2, 0),
		"duplicate name":                newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(a, cl("a", "p"))).end(0, 0, 2, 0),
		"empty name":                    newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(cl("", "p"))).end(0, 0, 1, 0),
		"name too long":                 newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(long)).end(0, 0, 1, 0),
		"principal hash too long":       newStream(3).frame(tagScalars, sc).frame(tagV4Rec, clients(cl("a", strings.Repeat("h", MaxPrincHashLen+1)))).end(0, 0, 0, 1),
		"truncated entry":               newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(b)[:3]).end(0, 0, 1, 0),
		"current count high":            newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(a, b)).end(0, 0, 3, 0),
		"current count low":             newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(a, b)).end(0, 0, 1, 0),
		"recovery count high":           newStream(3).frame(tagScalars, sc).frame(tagV4Rec, clients(a)).end(0, 0, 0, 2),
		"recovery count low":            newStream(3).frame(tagScalars, sc).frame(tagV4Rec, clients(a, c)).end(0, 0, 0, 1),
		"counts swapped":                newStream(3).frame(tagScalars, sc).frame(tagV4Cur, clients(a)).frame(tagV4Rec, clients(a, c)).end(0, 0, 2, 1),
		"version-2 trailer":             newStream(3).frame(tagScalars, sc).end(0, 0),
		"recovery before current":       newStream(3).frame(tagScalars, sc).frame(tagV4Rec, clients(a)).frame(tagV4Cur, clients(a)).end(0, 0, 1, 1),
		"unknown tag 6":                 newStream(3).frame(tagScalars, sc).frame(6, clients(a)).end(0, 0, 0, 0),
		"scalars without v4 epochs":     newStream(3).frame(tagScalars, scalars(2, 0, 0)).end(0, 0, 0, 0),
		"scalars with one v4 epoch":     newStream(3).frame(tagScalars, scalars(3, 5, 4)[:len(sc)-1]).end(0, 0, 0, 0),
		"v4 section in a version 2":     newStream(2).frame(tagScalars, scalars(2, 0, 0)).frame(tagV4Cur, clients(a)).end(0, 0),
		"v3 trailer in a version 2":     newStream(2).frame(tagScalars, scalars(2, 0, 0)).end(0, 0, 0, 0),
		"v3 scalars in a version 2":     newStream(2).frame(tagScalars, sc).end(0, 0),
		"v4 section in a version 1":     newStream(1).frame(tagScalars, scalars(2, 0, 0)[:len(scalars(2, 0, 0))-1]).frame(tagV4Cur, clients(a)).end(0, 0),
	}
	f := tinyV2FSM(t)
	setV4(f, 3, 2, []V4Client{cl("x", "")}, []V4Client{cl("y", "")})
	before, idx := f.Digest(), f.AppliedIndex()
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			err := restoreFrom(f, data)
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("Restore error %v, want ErrCorruptSnapshot", err)
			}
			if f.Digest() != before || f.AppliedIndex() != idx {
				t.Fatal("rejected snapshot changed the FSM")
			}
			if c, r := f.Epochs(); c != 3 || r != 2 {
				t.Fatalf("epochs %d, %d after a rejected snapshot", c, r)
			}
		})
	}
}

// TestRestoreAcceptsExtremeEpochs: any current ≥ 1 is valid, up to the
// top of the range.
func TestRestoreAcceptsExtremeEpochs(t *testing.T) {
	for _, e := range [][2]uint64{{1, 0}, {math.MaxUint64, 0}, {math.MaxUint64, math.MaxUint64 - 1}, {2, 1}} {
		f := New(Options{})
		if err := restoreFrom(f, newStream(3).frame(tagScalars, scalars(3, e[0], e[1])).end(0, 0, 0, 0)); err != nil {
			t.Fatalf("epochs %v: %v", e, err)
		}
		if c, r := f.Epochs(); c != e[0] || r != e[1] {
			t.Fatalf("epochs %v restored as %d, %d", e, c, r)
		}
	}
}
