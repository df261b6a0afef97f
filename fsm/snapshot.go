package fsm

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

	"github.com/google/btree"
	"github.com/hashicorp/raft"
)

// Snapshot format, version 3:
//
//	magic "NSMDSNP1", version:u8(=3)
//	frame*       each: length:u32 big-endian (1…maxFrame), payload; payload[0] is a section tag:
//	  1 scalars  sm_state:varint grace:time takeover applied_index:uvarint
//	             takeover_term:uvarint v4_current:uvarint v4_recovery:uvarint (exactly one, first)
//	  2 seen     (str(mon_name) state:varint)*        strictly ascending by mon_name
//	  3 regs     registration*                        strictly ascending by MonID
//	  4 v4cur    (str(name) str(princ_hash))*         strictly ascending by name
//	  5 v4rec    (str(name) str(princ_hash))*         strictly ascending by name
//	end          length 0
//	trailer      seen_count:u64 reg_count:u64 v4cur_count:u64 v4rec_count:u64
//	             crc32c:u32 (Castagnoli, over every byte before it)
//
// Tags never go backwards; a frame holds whole entries only; a section
// without entries has no frame. Field encodings are those of the log entry
// (codec.go); takeover is the Takeover command body, takeover_term the raft
// term of the entry that carried it (TakeoverTerm). v4_current/v4_recovery
// are the NFSv4 client-tracking epochs (current ≥ 1; recovery 0 or
// current-1); v4cur/v4rec the client records of those epochs (name
// 1…MaxClientNameLen bytes, princ_hash ≤ MaxPrincHashLen; no v4rec entry
// when v4_recovery is 0). The stream is canonical: equal state (and index)
// gives equal bytes, so Digest hashes it with the index set to 0.
//
// Version 4 is version 3 with two more sections and their trailer counts
// (after v4rec_count), written only when the state has an entry for one
// of them — so a cluster that never recorded a serving node keeps writing
// version 3, byte for byte, which the previous release reads:
//
//	  6 serving  servingrec*                          strictly ascending by node
//	  7 confirmed (node str(by) time(at))*            strictly ascending by node
//	trailer      … v4rec_count:u64 serving_count:u64 confirmed_count:u64 crc32c:u32
//
// (servingrec as in kind 15, codec.go). An older release refuses version 4
// (ErrVersion): it never restores a state it would not know.
//
// Version 5 is version 4 with three more sections, their trailer counts
// and the placement epoch floor, written only when the state has
// placement state (a declaration, a placement record or a non-zero
// floor); sections 6 and 7 may then be empty:
//
//	  8 declared (declaration)*                       strictly ascending by node, 1…256 services each
//	  9 placed   (placement prev)*                    strictly ascending by service
//	 10 scopes   the services' own registrations and NFSv4 records (scopesnap.go)
//	trailer      … confirmed_count:u64 declared_count:u64 placed_count:u64
//	             epoch_floor:u64 scope_items:u64 crc32c:u32
//
// (declaration and placement as in kinds 18 and 19, codec.go; prev is
// the previous holder, fsm/services.go). A release
// that reads version 4 but not 5 refuses it (ErrVersion).
//
// Version 2 is version 3 without the v4 epochs, sections 4 and 5 and their
// trailer counts; version 1 is version 2 without takeover_term. Restore
// still reads both (takeover term 0 for version 1; v4 epochs 1 and 0, no
// client records) and Persist writes version 3, 4 or 5.
const (
	snapMagic    = "NSMDSNP1"
	snapVersion  = 3 // written without serving records; 1 and 2 are still read
	snapVersion1 = 1
	snapVersion2 = 2
	snapVersion4 = 4 // written with serving records or confirmations
	snapVersion5 = 5 // written with placement state

	tagScalars  = 1
	tagSeen     = 2
	tagRegs     = 3
	tagV4Cur    = 4
	tagV4Rec    = 5
	tagServing  = 6
	tagConfirm  = 7
	tagDeclared = 8
	tagPlaced   = 9
	// tagScopes = 10: scopesnap.go

	frameTarget = 64 << 10 // flush a frame once it holds this much
	maxFrame    = 1 << 20  // the reader's cap on one frame
	bulkChunk   = 4096     // entries inserted per interleaved batch on Restore
)

// Snapshot implements raft.FSM. It takes an O(1) copy-on-write clone of
// the state; the returned snapshot's Persist writes it without any lock,
// so Apply proceeds while a large snapshot is written.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	st, idx := f.view()
	return &snapshot{st: st, index: idx}, nil
}

type snapshot struct {
	st    state
	index uint64
}

// Persist implements raft.FSMSnapshot.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := writeSnapshot(sink, &s.st, s.index); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("fsm: persist snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("fsm: persist snapshot: close sink: %w", err)
	}
	return nil
}

// Release implements raft.FSMSnapshot. The clone needs no cleanup.
func (s *snapshot) Release() {}

// Digest is a hash of the whole replicated state (registrations, sm_state,
// last-seen states, grace, last takeover and its term, the NFSv4
// client-tracking epochs and records), equal on nodes that applied the
// same entries; AppliedIndex is not part of it.
func (f *FSM) Digest() [32]byte {
	st, _ := f.view()
	h := sha256.New()
	// Cannot fail: hash writes never fail, and every time in the state
	// came through Decode or Restore, so it is encodable.
	_ = writeSnapshot(h, &st, 0)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// snapWriter frames and checksums the snapshot stream.
type snapWriter struct {
	w     *bufio.Writer
	tab   *crc32.Table
	crc   uint32
	err   error
	frame encoder
}

func (w *snapWriter) write(b []byte) {
	if w.err != nil {
		return
	}
	w.crc = crc32.Update(w.crc, w.tab, b)
	_, w.err = w.w.Write(b)
}

// begin starts a frame: room for its length, then the section tag.
func (w *snapWriter) begin(tag byte) {
	w.frame.b = append(w.frame.b[:0], 0, 0, 0, 0, tag)
}

// maybeFlush ends the frame if it is full enough; tag starts the next.
func (w *snapWriter) maybeFlush(tag byte) {
	if len(w.frame.b) >= 4+frameTarget {
		w.flush()
		w.begin(tag)
	}
}

// flush writes the current frame unless it holds only its tag.
func (w *snapWriter) flush() {
	if len(w.frame.b) <= 5 {
		return
	}
	binary.BigEndian.PutUint32(w.frame.b, uint32(len(w.frame.b)-4))
	w.write(w.frame.b)
	w.frame.b = w.frame.b[:0]
}

func writeSnapshot(out io.Writer, st *state, index uint64) error {
	w := &snapWriter{
		w:     bufio.NewWriterSize(out, 16<<10), // whole frames bypass it
		tab:   crc32.MakeTable(crc32.Castagnoli),
		frame: encoder{b: make([]byte, 0, 4<<10)},
	}
	version := byte(snapVersion)
	switch {
	case st.hasServices():
		version = snapVersion5
	case len(st.serving) > 0 || len(st.confirmed) > 0:
		version = snapVersion4
	}
	w.write(append([]byte(snapMagic), version))

	w.begin(tagScalars)
	e := &w.frame
	e.b = binary.AppendVarint(e.b, int64(st.sm))
	if err := e.time(st.grace, "grace_until"); err != nil {
		return err
	}
	if err := e.takeover(&st.last); err != nil {
		return fmt.Errorf("last takeover: %w", err)
	}
	e.b = binary.AppendUvarint(e.b, index)
	e.b = binary.AppendUvarint(e.b, st.lastTerm)
	e.b = binary.AppendUvarint(e.b, st.v4Current)
	e.b = binary.AppendUvarint(e.b, st.v4Recovery)
	w.flush()

	w.begin(tagSeen)
	st.seen.Ascend(func(s seenRec) bool {
		e.b = binary.AppendUvarint(e.b, uint64(len(s.name)))
		e.b = append(e.b, s.name...)
		e.b = binary.AppendVarint(e.b, int64(s.state))
		w.maybeFlush(tagSeen)
		return w.err == nil
	})
	w.flush()

	w.begin(tagRegs)
	st.regs.Ascend(func(r rec) bool {
		e.rec(&r)
		w.maybeFlush(tagRegs)
		return w.err == nil
	})
	w.flush()

	w.v4Section(tagV4Cur, st.v4cur)
	w.v4Section(tagV4Rec, st.v4rec)

	tr := make([]byte, 4, 76)
	tr = binary.BigEndian.AppendUint64(tr, uint64(st.seen.Len()))
	tr = binary.BigEndian.AppendUint64(tr, uint64(st.regs.Len()))
	tr = binary.BigEndian.AppendUint64(tr, uint64(st.v4cur.Len()))
	tr = binary.BigEndian.AppendUint64(tr, uint64(st.v4rec.Len()))
	if version >= snapVersion4 {
		if err := w.servingSections(st); err != nil {
			return err
		}
		tr = binary.BigEndian.AppendUint64(tr, uint64(len(st.serving)))
		tr = binary.BigEndian.AppendUint64(tr, uint64(len(st.confirmed)))
	}
	if version == snapVersion5 {
		if err := w.servicesSections(st); err != nil {
			return err
		}
		tr = binary.BigEndian.AppendUint64(tr, uint64(len(st.declared)))
		tr = binary.BigEndian.AppendUint64(tr, uint64(len(st.placed)))
		tr = binary.BigEndian.AppendUint64(tr, st.epochFloor)
		items, err := w.scopesSection(st)
		if err != nil {
			return err
		}
		tr = binary.BigEndian.AppendUint64(tr, items)
	}
	w.write(tr) // end frame (length 0) and counts
	crc := binary.BigEndian.AppendUint32(nil, w.crc)
	if w.err == nil {
		_, w.err = w.w.Write(crc)
	}
	if w.err != nil {
		return w.err
	}
	return w.w.Flush()
}

// v4Section writes the client records of t as section tag.
func (w *snapWriter) v4Section(tag byte, t *btree.BTreeG[v4Rec]) {
	w.begin(tag)
	e := &w.frame
	t.Ascend(func(r v4Rec) bool {
		e.b = binary.AppendUvarint(e.b, uint64(len(r.name)))
		e.b = append(e.b, r.name...)
		e.b = binary.AppendUvarint(e.b, uint64(len(r.princ)))
		e.b = append(e.b, r.princ...)
		w.maybeFlush(tag)
		return w.err == nil
	})
	w.flush()
}

// Restore implements raft.FSM. It reads the whole snapshot into fresh
// structures and swaps them in only if the stream is complete, its
// checksum and counts match and its content is sorted and consistent;
// otherwise it returns an error wrapping ErrCorruptSnapshot (or
// ErrVersion) and the FSM is unchanged.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	names := newStrTable()
	st, idx, err := readSnapshot(rc, names)
	if err != nil {
		return fmt.Errorf("fsm: restore: %w", err)
	}
	f.mu.Lock()
	f.st, f.applied, f.names = st, idx, names
	f.mu.Unlock()
	return nil
}

// snapReader reads exact byte counts and checksums them.
type snapReader struct {
	r   *bufio.Reader
	tab *crc32.Table
	crc uint32
	buf []byte
}

func (r *snapReader) read(n int) ([]byte, error) {
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	if _, err := io.ReadFull(r.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: truncated", ErrCorruptSnapshot)
		}
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	r.crc = crc32.Update(r.crc, r.tab, b)
	return b, nil
}

// bulk inserts strictly ascending items into a B-tree chunk by chunk,
// even positions first, then odd ones: plain ascending inserts would
// leave every node half full (splits happen in the middle); this way
// nodes end up nearly full, which saves about a third of the memory.
type bulk[T any] struct {
	t   *btree.BTreeG[T]
	buf []T
}

func (b *bulk[T]) add(x T) {
	b.buf = append(b.buf, x)
	if len(b.buf) == bulkChunk {
		b.flush()
	}
}

func (b *bulk[T]) flush() {
	insertInterleaved(b.t, b.buf)
	clear(b.buf)
	b.buf = b.buf[:0]
}

func insertInterleaved[T any](t *btree.BTreeG[T], xs []T) {
	for i := 0; i < len(xs); i += 2 {
		t.ReplaceOrInsert(xs[i])
	}
	for i := 1; i < len(xs); i += 2 {
		t.ReplaceOrInsert(xs[i])
	}
}

// inserter fills a registration B-tree from ascending chunks on its own
// goroutine, so that decoding and indexing overlap with it on Restore.
type inserter struct {
	t      *btree.BTreeG[rec]
	buf    []rec
	chunks chan []rec
	free   chan []rec
	done   chan struct{}
}

func startInserter(t *btree.BTreeG[rec]) *inserter {
	in := &inserter{t: t, chunks: make(chan []rec, 4), free: make(chan []rec, 6), done: make(chan struct{})}
	chunks := in.chunks
	go func() {
		defer close(in.done)
		for c := range chunks {
			insertInterleaved(in.t, c)
			clear(c)
			select {
			case in.free <- c[:0]:
			default:
			}
		}
	}()
	return in
}

func (in *inserter) add(r rec) {
	in.buf = append(in.buf, r)
	if len(in.buf) == bulkChunk {
		in.chunks <- in.buf
		select {
		case in.buf = <-in.free:
		default:
			in.buf = make([]rec, 0, bulkChunk)
		}
	}
}

// finish hands over the last chunk and waits until the tree is complete.
func (in *inserter) finish() {
	if in.chunks == nil {
		return
	}
	if len(in.buf) > 0 {
		in.chunks <- in.buf
		in.buf = nil
	}
	close(in.chunks)
	in.chunks = nil
	<-in.done
}

func readSnapshot(rc io.Reader, names *strTable) (state, uint64, error) {
	r := &snapReader{r: bufio.NewReaderSize(rc, 64<<10), tab: crc32.MakeTable(crc32.Castagnoli)}
	hdr, err := r.read(len(snapMagic) + 1)
	if err != nil {
		return state{}, 0, err
	}
	if string(hdr[:len(snapMagic)]) != snapMagic {
		return state{}, 0, corruptf("bad magic %q", hdr[:len(snapMagic)])
	}
	version := hdr[len(snapMagic)]
	lastTag := tagV4Rec
	switch version {
	case snapVersion5:
		lastTag = tagScopes
	case snapVersion4:
		lastTag = tagConfirm
	case snapVersion:
	case snapVersion1, snapVersion2:
		lastTag = tagRegs
	default:
		return state{}, 0, fmt.Errorf("%w: snapshot version %d", ErrVersion, version)
	}

	st := newState()
	var index uint64
	base := baseReader{seen: bulk[seenRec]{t: st.seen}, regs: startInserter(st.regs)}
	defer base.regs.finish() // on error paths; a no-op after the explicit call
	v4 := [2]v4Reader{{t: bulk[v4Rec]{t: st.v4cur}}, {t: bulk[v4Rec]{t: st.v4rec}}}
	var sv servingReader
	var sr servicesReader
	var scr scopesReader
	section := 0
	for {
		lb, err := r.read(4)
		if err != nil {
			return state{}, 0, err
		}
		n := binary.BigEndian.Uint32(lb)
		if n == 0 {
			break
		}
		if n > maxFrame {
			return state{}, 0, corruptf("frame of %d bytes (max %d)", n, maxFrame)
		}
		p, err := r.read(int(n))
		if err != nil {
			return state{}, 0, err
		}
		tag := int(p[0])
		if tag < section || (section == 0) != (tag == tagScalars) || tag > lastTag {
			return state{}, 0, corruptf("frame tag %d after section %d", tag, section)
		}
		section = tag
		d := decoder{b: p[1:]}
		switch tag {
		case tagScalars:
			index = d.scalars(&st, version)
		case tagSeen:
			base.readSeen(&d)
		case tagRegs:
			base.readRegs(&d, names, &st)
		case tagV4Cur, tagV4Rec:
			if tag == tagV4Rec && st.v4Recovery == 0 && len(d.b) > 0 {
				d.fail("recovery-epoch client records while not in grace")
			}
			v4[tag-tagV4Cur].read(&d)
		case tagServing, tagConfirm:
			sv.read(&d, tag, &st)
		case tagDeclared, tagPlaced:
			sr.read(&d, tag, &st)
		case tagScopes:
			scr.read(&d, &st, names)
		}
		if d.err != nil {
			return state{}, 0, corruptf("section %d: %v", tag, d.err)
		}
	}
	if section == 0 {
		return state{}, 0, corruptf("no scalars section")
	}
	base.seen.flush()
	v4[0].t.flush()
	v4[1].t.flush()

	if err := r.trailer(version, &st, []int{base.nSeen, base.nRegs, v4[0].n, v4[1].n}, &scr); err != nil {
		return state{}, 0, err
	}
	want := r.crc
	cb, err := r.read(4)
	if err != nil {
		return state{}, 0, err
	}
	if got := binary.BigEndian.Uint32(cb); got != want {
		return state{}, 0, corruptf("checksum %08x, computed %08x", got, want)
	}
	if _, err := r.r.ReadByte(); err == nil {
		return state{}, 0, corruptf("trailing bytes after the trailer")
	} else if !errors.Is(err, io.EOF) {
		return state{}, 0, fmt.Errorf("read snapshot: %w", err)
	}

	st.byAddr = buildAddrIndex(base.refs) // while the inserter catches up
	base.refs = nil
	base.regs.finish()

	var bad error
	st.seen.Ascend(func(s seenRec) bool {
		if _, ok := st.firstOf(s.name); !ok {
			bad = corruptf("last-seen state for unmonitored host %q", s.name)
		}
		return bad == nil
	})
	if bad != nil {
		return state{}, 0, bad
	}
	st.v4Both = countBoth(st.v4cur, st.v4rec)
	return st, index, nil
}

// trailer reads the counts of a snapshot of version after its end frame
// (base: the last-seen entries, registrations and the two epochs' client
// records read; the others are st's) and, in version 5, the epoch floor
// and the scope items, and checks them against what was read.
func (r *snapReader) trailer(version byte, st *state, counts4 []int, scr *scopesReader) error {
	type count struct {
		what string
		n    int
	}
	counts := []count{{"last-seen entries", counts4[0]}, {"registrations", counts4[1]}}
	if version >= snapVersion {
		counts = append(counts, count{"current-epoch client records", counts4[2]}, count{"recovery-epoch client records", counts4[3]})
	}
	if version == snapVersion4 {
		if len(st.serving) == 0 && len(st.confirmed) == 0 {
			return corruptf("version %d without serving records or confirmations", version)
		}
	}
	if version >= snapVersion4 {
		counts = append(counts, count{"serving records", len(st.serving)}, count{"confirmations", len(st.confirmed)})
	}
	if version == snapVersion5 {
		counts = append(counts, count{"declarations", len(st.declared)}, count{"placements", len(st.placed)})
	}
	tr, err := r.read(8 * len(counts))
	if err != nil {
		return err
	}
	for i, c := range counts {
		if n := binary.BigEndian.Uint64(tr[8*i:]); n != uint64(c.n) {
			return corruptf("trailer counts %d %s, read %d", n, c.what, c.n)
		}
	}
	if version == snapVersion5 {
		fl, err := r.read(8)
		if err != nil {
			return err
		}
		st.epochFloor = binary.BigEndian.Uint64(fl)
		if !st.hasServices() {
			return corruptf("version %d without placement state", version)
		}
		ni, err := r.read(8)
		if err != nil {
			return err
		}
		if n := binary.BigEndian.Uint64(ni); n != scr.n {
			return corruptf("trailer counts %d scope items, read %d", n, scr.n)
		}
		if bad := scr.finish(st); bad != "" {
			return corruptf("%s", bad)
		}
	}
	return nil
}

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorruptSnapshot, fmt.Sprintf(format, args...))
}

// scalars reads the scalars section of a snapshot of version into st
// and returns the applied index it names.
func (d *decoder) scalars(st *state, version byte) (index uint64) {
	st.sm = d.i32()
	if d.err == nil && st.sm < 0 {
		d.fail("sm_state %d (Apply never makes one below 0)", st.sm)
	}
	st.grace = d.time()
	st.last = d.takeover()
	index = d.uvarint()
	if version >= snapVersion2 {
		st.lastTerm = d.uvarint()
	}
	if version >= snapVersion {
		st.v4Current, st.v4Recovery = d.uvarint(), d.uvarint()
		if d.err == nil && (st.v4Current == 0 || st.v4Recovery != 0 && st.v4Recovery != st.v4Current-1) {
			d.fail("v4 epochs current %d, recovery %d (want current ≥ 1, recovery 0 or current-1)", st.v4Current, st.v4Recovery)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return index
}

// baseReader reads the last-seen and registration sections of a
// snapshot, checking the order across their frames.
type baseReader struct {
	seen         bulk[seenRec]
	regs         *inserter
	refs         []addrRef
	prevSeen     seenRec
	prevReg      rec
	nSeen, nRegs int
}

func (b *baseReader) readSeen(d *decoder) {
	for len(d.b) > 0 && d.err == nil {
		s := seenRec{name: d.str(MaxNameLen, "mon_name"), state: d.i32()}
		if d.err == nil && b.nSeen > 0 && !lessSeen(b.prevSeen, s) {
			d.fail("last-seen entries out of order at %q", s.name)
		}
		if d.err == nil {
			b.seen.add(s)
			b.prevSeen = s
			b.nSeen++
		}
	}
}

func (b *baseReader) readRegs(d *decoder, names *strTable, st *state) {
	for len(d.b) > 0 && d.err == nil {
		x := d.rec(names)
		if d.err == nil && b.nRegs > 0 && !lessRec(b.prevReg, x) {
			d.fail("registrations out of order at %q", x.monName)
		}
		if d.err == nil {
			b.regs.add(x)
			eachAddr(x.addrs, func(p ip) bool {
				b.refs = append(b.refs, addrRef{a: p, name: x.monName, refs: 1})
				return true
			})
			if b.nRegs == 0 || x.monName != b.prevReg.monName {
				st.hosts++
			}
			b.prevReg = x
			b.nRegs++
		}
	}
}

// v4Reader reads one section of client records into a B-tree, checking
// the order across the section's frames.
type v4Reader struct {
	t    bulk[v4Rec]
	prev string
	n    int
}

func (v *v4Reader) read(d *decoder) {
	for len(d.b) > 0 && d.err == nil {
		r := v4Rec{name: d.clientName(), princ: d.str(MaxPrincHashLen, "principal hash")}
		if d.err != nil {
			return
		}
		if v.n > 0 && r.name <= v.prev {
			d.fail("client records out of order at %q", r.name)
			return
		}
		v.t.add(r)
		v.prev = r.name
		v.n++
	}
}

// buildAddrIndex builds the address index from one (address, host) pair
// per address of every registration, in one sorted pass (faster, and
// about a third smaller, than inserting in MonID order).
func buildAddrIndex(refs []addrRef) *btree.BTreeG[addrRef] {
	slices.SortFunc(refs, cmpAddrRef)
	t := btree.NewG(btreeDegree, lessAddrRef)
	b := bulk[addrRef]{t: t}
	for i := 0; i < len(refs); {
		k := refs[i]
		j := i + 1
		for ; j < len(refs) && cmpAddrRef(refs[j], k) == 0; j++ {
			k.refs++
		}
		b.add(k)
		i = j
	}
	b.flush()
	return t
}
