package fsm

import (
	"cmp"
	"encoding/binary"
	"maps"
	"slices"
	"strings"

	"github.com/google/btree"
)

// The services' scopes in a version-5 snapshot: section 10, one entry per
// item, strictly ascending by (service, item kind, key):
//
//	 10 scopes   (str(service) item:u8 body)*
//	   item 0 epochs  v4_current:uvarint v4_recovery:uvarint   (only when not 1 and 0)
//	   item 1 seen    str(mon_name) state:varint               by mon_name
//	   item 2 reg     registration                             by MonID
//	   item 3 v4cur   str(name) str(princ_hash)                by name
//	   item 4 v4rec   str(name) str(princ_hash)                by name
//	trailer      … epoch_floor:u64 scope_items:u64 crc32c:u32
//
// An empty scope writes nothing, and reads back as absent, which reads as
// empty: equal state gives equal bytes. A scope belongs to a service with
// a placement record (Scoped), so Restore refuses one that has none.
const (
	tagScopes = 10

	scopeEpochs = 0
	scopeSeen   = 1
	scopeReg    = 2
	scopeV4Cur  = 3
	scopeV4Rec  = 4
)

// scopesSection writes section 10 and returns how many items it wrote.
func (w *snapWriter) scopesSection(st *state) (uint64, error) {
	w.begin(tagScopes)
	e := &w.frame
	var n uint64
	item := func(id string, kind byte) error {
		if err := e.serviceID(id); err != nil {
			return err
		}
		e.b = append(e.b, kind)
		n++
		return nil
	}
	for _, id := range slices.Sorted(maps.Keys(st.scopes)) {
		sc := st.scopes[id]
		if sc.v4Current != 1 || sc.v4Recovery != 0 {
			if err := item(id, scopeEpochs); err != nil {
				return 0, err
			}
			e.b = binary.AppendUvarint(e.b, sc.v4Current)
			e.b = binary.AppendUvarint(e.b, sc.v4Recovery)
			w.maybeFlush(tagScopes)
		}
		var err error
		sc.seen.Ascend(func(s seenRec) bool {
			if err = item(id, scopeSeen); err != nil {
				return false
			}
			e.b = binary.AppendUvarint(e.b, uint64(len(s.name)))
			e.b = append(e.b, s.name...)
			e.b = binary.AppendVarint(e.b, int64(s.state))
			w.maybeFlush(tagScopes)
			return w.err == nil
		})
		sc.regs.Ascend(func(r rec) bool {
			if err = item(id, scopeReg); err != nil {
				return false
			}
			e.rec(&r)
			w.maybeFlush(tagScopes)
			return w.err == nil
		})
		for _, kt := range []struct {
			kind byte
			t    *btree.BTreeG[v4Rec]
		}{{scopeV4Cur, sc.v4cur}, {scopeV4Rec, sc.v4rec}} {
			kt.t.Ascend(func(r v4Rec) bool {
				if err = item(id, kt.kind); err != nil {
					return false
				}
				e.b = binary.AppendUvarint(e.b, uint64(len(r.name)))
				e.b = append(e.b, r.name...)
				e.b = binary.AppendUvarint(e.b, uint64(len(r.princ)))
				e.b = append(e.b, r.princ...)
				w.maybeFlush(tagScopes)
				return w.err == nil
			})
		}
		if err != nil {
			return 0, err
		}
	}
	w.flush()
	return n, w.err
}

// scopesReader reads section 10, checking the order across its frames.
type scopesReader struct {
	n        uint64
	prevID   string
	prevKind byte
	prevSeen seenRec
	prevReg  rec
	prevV4   string
}

func (v *scopesReader) read(d *decoder, st *state, names *strTable) {
	for len(d.b) > 0 && d.err == nil {
		id := d.serviceID()
		kind := d.u8()
		if d.err != nil {
			return
		}
		if kind > scopeV4Rec {
			d.fail("scope item kind %d", kind)
			return
		}
		first := v.n == 0 || id != v.prevID
		if !first && kind < v.prevKind || v.n > 0 && id < v.prevID {
			d.fail("scope items out of order at %q", id)
			return
		}
		if _, ok := st.placed[id]; !ok {
			d.fail("scope of service %q, which has no placement record", id)
			return
		}
		sc := st.scopes[id]
		if sc == nil {
			s := newScope()
			sc = &s
			if st.scopes == nil {
				st.scopes = map[string]*scope{}
			}
			st.scopes[id] = sc
		}
		again := !first && kind == v.prevKind // not the item kind's first entry
		switch kind {
		case scopeEpochs:
			if again {
				d.fail("scope %q: two epochs items", id)
				return
			}
			sc.v4Current, sc.v4Recovery = d.uvarint(), d.uvarint()
			if d.err == nil && (sc.v4Current == 0 || sc.v4Recovery != 0 && sc.v4Recovery != sc.v4Current-1 ||
				sc.v4Current == 1 && sc.v4Recovery == 0) {
				d.fail("scope %q: v4 epochs current %d, recovery %d", id, sc.v4Current, sc.v4Recovery)
			}
		case scopeSeen:
			s := seenRec{name: d.str(MaxNameLen, "mon_name"), state: d.i32()}
			if d.err == nil && again && !lessSeen(v.prevSeen, s) {
				d.fail("scope %q: last-seen entries out of order at %q", id, s.name)
			}
			sc.seen.ReplaceOrInsert(s)
			v.prevSeen = s
		case scopeReg:
			r := d.rec(names)
			if d.err == nil && again && !lessRec(v.prevReg, r) {
				d.fail("scope %q: registrations out of order at %q", id, r.monName)
			}
			if d.err == nil {
				sc.store(r)
			}
			v.prevReg = r
		default:
			r := v4Rec{name: d.clientName(), princ: d.str(MaxPrincHashLen, "principal hash")}
			if d.err == nil && again && strings.Compare(r.name, v.prevV4) <= 0 {
				d.fail("scope %q: client records out of order at %q", id, r.name)
			}
			if d.err == nil && kind == scopeV4Rec && sc.v4Recovery == 0 {
				d.fail("scope %q: recovery-epoch client records while not in grace", id)
			}
			if kind == scopeV4Cur {
				sc.v4cur.ReplaceOrInsert(r)
			} else {
				sc.v4rec.ReplaceOrInsert(r)
			}
			v.prevV4 = r.name
		}
		v.prevID, v.prevKind = id, kind
		v.n++
	}
}

// finish checks what only the whole section shows and derives the
// counts; it returns a problem's text, or "".
func (v *scopesReader) finish(st *state) string {
	for _, id := range slices.SortedFunc(maps.Keys(st.scopes), cmp.Compare[string]) {
		sc := st.scopes[id]
		bad := ""
		sc.seen.Ascend(func(s seenRec) bool {
			if _, ok := sc.firstOf(s.name); !ok {
				bad = "scope " + id + ": last-seen state for unmonitored host " + s.name
			}
			return bad == ""
		})
		if bad != "" {
			return bad
		}
		sc.v4Both = countBoth(sc.v4cur, sc.v4rec)
	}
	return ""
}
