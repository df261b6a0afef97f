package fsm

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/btree"
	"github.com/hashicorp/raft"
)

// Options configures an FSM.
type Options struct {
	// Observer, if set, is called synchronously from Apply after each
	// command with the log index, the command and its result. It must not
	// block (hand work to a queue). It runs after the whole entry has been
	// applied, in command order, without the FSM's lock held, so it may
	// call the FSM's read methods.
	Observer func(index uint64, cmd Command, res Result)
}

const (
	btreeDegree = 32   // ≤ 63 items per node
	maxInterned = 4096 // distinct MyName/Node strings shared between registrations
)

// FSM is safe for concurrent reads while raft applies.
//
// Writers (Apply, Restore, Snapshot's clone) take mu exclusively; readers
// take it shared. Apply, Snapshot and Restore are called by raft from one
// goroutine and never concurrently with each other.
type FSM struct {
	observer func(index uint64, cmd Command, res Result)

	mu      sync.RWMutex
	st      state
	applied uint64
	names   *strTable // shared MyName/Node strings; Apply/Restore only
}

// state is the replicated state, plus the derived address index.
type state struct {
	regs   *btree.BTreeG[rec]     // by MonID
	seen   *btree.BTreeG[seenRec] // by MonName; only monitored hosts
	byAddr *btree.BTreeG[addrRef] // (address, MonName) → refs; derived, not snapshotted
	hosts  int                    // distinct MonNames in regs
	sm     int32
	grace  time.Time
	last   Takeover
	// lastTerm is the raft term of the log entry that carried last (0
	// before the first Takeover, or after a version-1 snapshot).
	lastTerm uint64

	// NFSv4 client tracking (nfsdcld's database): the records of the
	// current epoch and of the recovery epoch, by name. v4Current ≥ 1;
	// v4Recovery is 0 (not in grace, v4rec empty) or v4Current-1.
	v4cur      *btree.BTreeG[v4Rec]
	v4rec      *btree.BTreeG[v4Rec]
	v4Current  uint64
	v4Recovery uint64
	v4Both     int // names in both v4cur and v4rec; derived, not snapshotted

	// Who may serve, and the operators' confirmations that a node is off
	// (serving.go); replaced, never changed in place; nil when empty.
	serving   map[string]ServingRecord
	confirmed map[string]Confirmation

	// Where each service runs (services.go): each node's declarations
	// (sorted by id, never empty) and each service's latest placement;
	// replaced, never changed in place; nil when empty. epochFloor is the
	// highest epoch of a forgotten placement record.
	declared   map[string][]ServiceDecl
	placed     map[string]Placement
	epochFloor uint64
}

func newState() state {
	return state{
		regs:      btree.NewG(btreeDegree, lessRec),
		seen:      btree.NewG(btreeDegree, lessSeen),
		byAddr:    btree.NewG(btreeDegree, lessAddrRef),
		v4cur:     newV4Tree(),
		v4rec:     newV4Tree(),
		v4Current: 1,
	}
}

func newV4Tree() *btree.BTreeG[v4Rec] { return btree.NewG(btreeDegree, lessV4) }

// New returns an empty FSM: no registrations, sm_state 0 (the first
// Takeover makes it 1), NFSv4 client-tracking epochs current 1 and
// recovery 0 (not in grace), no client records.
func New(opts Options) *FSM {
	return &FSM{observer: opts.Observer, st: newState(), names: newStrTable()}
}

// strTable shares strings that repeat across registrations: MyName and
// Node (few distinct values) and, while restoring, consecutive MonNames.
type strTable struct {
	names   map[string]string
	lastMon string
}

func newStrTable() *strTable { return &strTable{names: make(map[string]string)} }

func (t *strTable) intern(b []byte) string {
	if s, ok := t.names[string(b)]; ok {
		return s
	}
	return t.add(string(b))
}

func (t *strTable) internString(s string) string {
	if u, ok := t.names[s]; ok {
		return u
	}
	return t.add(s)
}

// add remembers s unless maxInterned strings are held already.
func (t *strTable) add(s string) string {
	if len(t.names) < maxInterned {
		t.names[s] = s
	}
	return s
}

// mon returns b as a string, shared with the previous call's when equal.
func (t *strTable) mon(b []byte) string {
	if string(b) != t.lastMon {
		t.lastMon = string(b)
	}
	return t.lastMon
}

// Apply implements raft.FSM: returns []Result, or an error wrapping ErrBadCommand.
//
// Entries other than raft.LogCommand return nil. The whole entry is
// decoded before anything changes, so a malformed entry changes no
// replicated state (only AppliedIndex advances past it).
func (f *FSM) Apply(l *raft.Log) interface{} {
	if l.Type != raft.LogCommand {
		f.mu.Lock()
		f.applied = l.Index
		f.mu.Unlock()
		return nil
	}
	cmds, regs, guarded, err := decodeApply(l.Data, f.names)
	if err != nil {
		f.mu.Lock()
		f.applied = l.Index
		f.mu.Unlock()
		return fmt.Errorf("fsm: apply index %d: %w", l.Index, err)
	}
	res := make([]Result, len(cmds))
	f.mu.Lock()
	k := 0
	for i, c := range cmds {
		if c == nil { // a Register, decoded in stored form
			if guarded[k] && !f.st.mayStore(&regs[k]) {
				res[i] = Result{State: f.st.sm, Refused: true}
			} else {
				f.store(regs[k])
				res[i] = Result{State: f.st.sm}
			}
			k++
			continue
		}
		res[i] = f.apply(c, l.Term)
	}
	f.applied = l.Index
	f.mu.Unlock()
	if f.observer != nil {
		k = 0
		for i, c := range cmds {
			if c == nil {
				c = Register{Reg: regs[k].registration(), Guarded: guarded[k]}
				k++
			}
			f.observer(l.Index, c, res[i])
		}
	}
	return res
}

// apply applies one decoded command of an entry of raft term term; mu is
// held exclusively.
func (f *FSM) apply(c Command, term uint64) Result {
	s := &f.st
	switch c := c.(type) {
	case Register:
		if c.Guarded && !s.mayRegister(&c.Reg) {
			return Result{State: s.sm, Refused: true}
		}
		f.register(&c.Reg)
		return Result{State: s.sm}
	case Unregister:
		n := 0
		if r, ok := s.regs.Get(keyOf(c.ID)); ok && c.Owner.owns(r.node, ip{a: r.cb, n: r.cbLen}) {
			if old, ok := s.regs.Delete(r); ok {
				s.dropped(old)
				n = 1
			}
		}
		return Result{State: s.sm, Removed: n}
	case UnregisterAll:
		var gone []rec
		s.regs.Ascend(func(r rec) bool {
			if r.myName == c.My.MyName && r.prog == c.My.Prog && r.vers == c.My.Vers && r.proc == c.My.Proc &&
				c.Owner.owns(r.node, ip{a: r.cb, n: r.cbLen}) {
				gone = append(gone, r)
			}
			return true
		})
		for _, r := range gone {
			if old, ok := s.regs.Delete(r); ok {
				s.dropped(old)
			}
		}
		return Result{State: s.sm, Removed: len(gone)}
	case Takeover:
		s.sm = nextState(s.sm, c.MinState, c.Wrap)
		s.grace = c.GraceUntil
		c.Wrap = false // a property of the command, not of the state (snapshots do not keep it)
		s.last = c
		s.lastTerm = term
		s.unconfirm(c.Node) // it may serve again: an operator's "off" no longer holds
		return Result{State: s.sm}
	case PeerRebooted:
		matched := s.match(c.MonName, ipOf(c.From))
		accepted := false
		for i, r := range matched {
			if i > 0 && matched[i-1].monName == r.monName {
				continue
			}
			if old, ok := s.seen.Get(seenRec{name: r.monName}); !ok || old.state != c.State {
				accepted = true
				s.seen.ReplaceOrInsert(seenRec{name: r.monName, state: c.State})
			}
		}
		res := Result{State: s.sm, Accepted: accepted}
		if accepted {
			res.Matched = make([]Registration, len(matched))
			for i := range matched {
				res.Matched[i] = matched[i].registration()
			}
		}
		return res
	case ClientCreate:
		s.v4Put(v4Rec{name: c.Name, princ: c.PrincHash})
		return Result{State: s.sm}
	case ClientRemove:
		n := 0
		if _, ok := s.v4cur.Delete(v4Rec{name: c.Name}); ok {
			n = 1
			if s.v4rec.Has(v4Rec{name: c.Name}) {
				s.v4Both--
			}
		}
		return Result{State: s.sm, Removed: n}
	case ClientCheck:
		if s.v4Recovery == 0 {
			s.graceStart()
		}
		r, ok := s.v4rec.Get(v4Rec{name: c.Name})
		if ok {
			s.v4Put(r)
		}
		return Result{State: s.sm, Accepted: ok}
	case GraceStart:
		return Result{State: s.sm, Removed: s.graceStart()}
	case GraceDone:
		if s.v4Recovery == 0 {
			s.graceStart()
		}
		s.v4rec = newV4Tree()
		s.v4Recovery = 0
		s.v4Both = 0
		return Result{State: s.sm}
	case ServingBegin, ServingEnd, FenceConfirm:
		s.applyServing(c)
		return Result{State: s.sm}
	case ServicesDeclared, ServicePlaced, ServiceForgotten, ServiceReleased:
		return s.applyServices(c)
	}
	return Result{State: s.sm} // unreachable: Decode yields only the types above
}

// v4Put inserts or replaces a current-epoch client record.
func (s *state) v4Put(r v4Rec) {
	if _, replaced := s.v4cur.ReplaceOrInsert(r); !replaced && s.v4rec.Has(r) {
		s.v4Both++
	}
}

// graceStart applies a GraceStart and returns the number of current-epoch
// records it discarded. At the top of the uint64 range the current epoch
// stays at math.MaxUint64 (recovery becomes math.MaxUint64-1, keeping
// recovery = current-1); only a crafted snapshot gets there.
func (s *state) graceStart() int {
	s.v4Both = 0
	if s.v4Recovery == 0 {
		if s.v4Current == math.MaxUint64 {
			s.v4Recovery = s.v4Current - 1
		} else {
			s.v4Recovery = s.v4Current
			s.v4Current++
		}
		s.v4rec, s.v4cur = s.v4cur, newV4Tree()
		return 0
	}
	n := s.v4cur.Len()
	if n > 0 {
		s.v4cur = newV4Tree()
	}
	return n
}

// nextState is the smallest odd number greater than cur and ≥ min. At the
// top of the int32 range it stays at math.MaxInt32 (odd) unless wrap is
// set; then it wraps to the smallest odd number that differs from cur
// and from minState−1 (Takeover). A cluster reaches the top only after a
// billion takeovers, or from a state imported or restored near it.
func nextState(cur, minState int32, wrap bool) int32 {
	n := int64(cur) + 1
	if int64(minState) > n {
		n = int64(minState)
	}
	if n&1 == 0 {
		n++
	}
	if n <= math.MaxInt32 {
		return int32(n)
	}
	if !wrap {
		return math.MaxInt32
	}
	w := int64(1)
	for w == int64(cur) || w == int64(minState)-1 {
		w += 2
	}
	return int32(w)
}

// register adds or replaces a registration; mu is held exclusively.
func (f *FSM) register(g *Registration) {
	r := recOf(g)
	r.myName = f.names.internString(r.myName)
	r.node = f.names.internString(r.node)
	f.store(r)
}

// store adds or replaces r, whose MyName and Node are interned; mu is held
// exclusively.
func (f *FSM) store(r rec) {
	s := &f.st
	first, known := s.firstOf(r.monName)
	if known {
		r.monName = first.monName // share the host's name string
	}
	old, replaced := s.regs.ReplaceOrInsert(r)
	if replaced {
		s.unref(&old)
	} else if !known {
		s.hosts++
	}
	s.ref(&r)
}

// firstOf returns the first registration of host name.
func (s *state) firstOf(name string) (rec, bool) {
	var out rec
	found := false
	s.regs.AscendGreaterOrEqual(rec{monName: name}, func(r rec) bool {
		found = r.monName == name
		out = r
		return false
	})
	return out, found
}

// dropped updates the indexes after r left regs: its addresses, and the
// host's last-seen state once the host is no longer monitored.
func (s *state) dropped(r rec) {
	s.unref(&r)
	if _, ok := s.firstOf(r.monName); !ok {
		s.hosts--
		s.seen.Delete(seenRec{name: r.monName})
	}
}

func (s *state) ref(r *rec) {
	eachAddr(r.addrs, func(p ip) bool {
		k := addrRef{a: p, name: r.monName, refs: 1}
		if old, ok := s.byAddr.ReplaceOrInsert(k); ok { // rare: count it
			k.refs += old.refs
			s.byAddr.ReplaceOrInsert(k)
		}
		return true
	})
}

func (s *state) unref(r *rec) {
	eachAddr(r.addrs, func(p ip) bool {
		k, ok := s.byAddr.Get(addrRef{a: p, name: r.monName})
		if !ok {
			return true // cannot happen: every ref was counted
		}
		if k.refs--; k.refs <= 0 {
			s.byAddr.Delete(k)
		} else {
			s.byAddr.ReplaceOrInsert(k)
		}
		return true
	})
}

// match returns, in MonID order, the registrations whose MonName is name
// or whose Addrs contain from (rpc.statd matches SM_NOTIFY by name or by
// the sender's address).
func (s *state) match(name string, from ip) []rec {
	hosts := []string{name}
	if from.n != 0 {
		s.byAddr.AscendGreaterOrEqual(addrRef{a: from}, func(k addrRef) bool {
			if k.a != from {
				return false
			}
			hosts = append(hosts, k.name)
			return true
		})
		slices.Sort(hosts)
		hosts = slices.Compact(hosts)
	}
	var out []rec
	for _, h := range hosts {
		s.regs.AscendGreaterOrEqual(rec{monName: h}, func(r rec) bool {
			if r.monName != h {
				return false
			}
			if h == name || (from.n != 0 && hasAddr(r.addrs, from)) {
				out = append(out, r)
			}
			return true
		})
	}
	return out
}

// wouldAccept mirrors the PeerRebooted rule without changing anything.
func (s *state) wouldAccept(name string, from ip, st int32) bool {
	matched := s.match(name, from)
	for _, r := range matched {
		if old, ok := s.seen.Get(seenRec{name: r.monName}); !ok || old.state != st {
			return true
		}
	}
	return false
}

// clone returns an immutable copy-on-write view of the replicated state;
// mu is held exclusively (BTreeG.Clone mutates the source tree).
func (s *state) clone() state {
	c := *s
	c.regs = s.regs.Clone()
	c.seen = s.seen.Clone()
	c.byAddr = nil
	c.v4cur = s.v4cur.Clone()
	c.v4rec = s.v4rec.Clone()
	return c
}

// countBoth returns the number of names held by both a and b.
func countBoth(a, b *btree.BTreeG[v4Rec]) int {
	if a.Len() > b.Len() {
		a, b = b, a
	}
	n := 0
	a.Ascend(func(r v4Rec) bool {
		if b.Has(r) {
			n++
		}
		return true
	})
	return n
}

// view takes a consistent O(1) copy-on-write view for long reads.
func (f *FSM) view() (state, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.clone(), f.applied
}

// State returns the current sm_state.
func (f *FSM) State() int32 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.sm
}

// GraceUntil returns the end of the grace window set by the last Takeover.
func (f *FSM) GraceUntil() time.Time {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.grace
}

// LastTakeover returns the last applied Takeover (zero before the first).
func (f *FSM) LastTakeover() Takeover {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.last
}

// TakeoverTerm returns the raft term of the log entry that carried the
// last applied Takeover: 0 before the first, and after restoring a
// version-1 snapshot until the next Takeover. Every node that applied the
// same entries returns the same term. With raft's current term it tells
// whether the current leader's takeover has been applied here.
func (f *FSM) TakeoverTerm() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.lastTerm
}

// Incarnation returns sm_state and TakeoverTerm, read together.
func (f *FSM) Incarnation() (state int32, takeoverTerm uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.sm, f.st.lastTerm
}

// Len returns the number of registrations.
func (f *FSM) Len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.regs.Len()
}

// Hosts returns the number of distinct monitored hosts (MonNames).
func (f *FSM) Hosts() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.hosts
}

// AppliedIndex returns the index of the last log entry applied, or of the
// snapshot last restored.
func (f *FSM) AppliedIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.applied
}

// Get returns the registration with this MonID.
func (f *FSM) Get(id MonID) (Registration, bool) {
	f.mu.RLock()
	r, ok := f.st.regs.Get(keyOf(id))
	f.mu.RUnlock()
	if !ok {
		return Registration{}, false
	}
	return r.registration(), true
}

// CommandLevel is the newest optional set of entry kinds this build
// applies: 0 is kinds 1–10; 1 adds kinds 11 and 12 (Unregister and
// UnregisterAll with an Owner) and 13 (Takeover with Wrap); 2 adds kind
// 14 (Register with Guarded), kinds 15–17 (ServingBegin, ServingEnd,
// FenceConfirm: who serves, and what it promised) and kinds 18–21
// (ServicesDeclared, ServicePlaced, ServiceForgotten, ServiceReleased: where each service
// runs). A cluster proposes a level's kinds only once every member
// advertises that level.
const CommandLevel = 2

// MayRegister reports whether a guarded Register of g would add or
// replace g's registration if applied now (Register.Guarded), on this
// node's state. A proposer that cannot use kind 14 yet checks this and
// then commits an unguarded Register (kind 1), or refuses.
func (f *FSM) MayRegister(g Registration) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.mayRegister(&g)
}

// mayRegister is the guard of Register.Guarded; mu is held.
func (s *state) mayRegister(g *Registration) bool {
	r := keyOf(g.ID)
	r.node = g.Node
	cb := ipOf(g.Callback)
	r.cb, r.cbLen = cb.a, cb.n
	return s.mayStore(&r)
}

// mayStore is mayRegister on a registration in its stored form (its key,
// node and callback); mu is held.
func (s *state) mayStore(r *rec) bool {
	old, ok := s.regs.Get(*r)
	if !ok {
		return true
	}
	oldCB, cb := ip{a: old.cb, n: old.cbLen}, ip{a: r.cb, n: r.cbLen}
	if r.node == "" && cb.n == 0 { // no lock manager named: it owns only what names none
		return old.node == "" && oldCB.n == 0
	}
	if (Owner{Node: r.node, Callback: cb.addr()}).owns(old.node, oldCB) {
		return true
	}
	// The serving node's lockd re-monitors a host that a lockd of an
	// earlier serving node registered: it holds the clients' locks now.
	return r.node != "" && r.node == s.last.Node && cb.addr().IsLoopback() && oldCB.addr().IsLoopback()
}

// Owned returns the MonIDs of the registrations that c, an Unregister or
// UnregisterAll, would remove if applied now (its MonID, or its lock
// manager's registrations, that its Owner owns), in MonID order; nil for
// other commands. A proposer that cannot use kinds 11 and 12 yet removes
// these one by one with owner-less Unregisters instead.
func (f *FSM) Owned(c Command) []MonID {
	var ids []MonID
	switch c := c.(type) {
	case Unregister:
		f.mu.RLock()
		r, ok := f.st.regs.Get(keyOf(c.ID))
		f.mu.RUnlock()
		if ok && c.Owner.owns(r.node, ip{a: r.cb, n: r.cbLen}) {
			ids = append(ids, c.ID)
		}
	case UnregisterAll:
		f.mu.Lock() // Clone mutates the source tree
		regs := f.st.regs.Clone()
		f.mu.Unlock()
		regs.Ascend(func(r rec) bool {
			if r.myName == c.My.MyName && r.prog == c.My.Prog && r.vers == c.My.Vers && r.proc == c.My.Proc &&
				c.Owner.owns(r.node, ip{a: r.cb, n: r.cbLen}) {
				ids = append(ids, MonID{MonName: r.monName, My: c.My})
			}
			return true
		})
	}
	return ids
}

// Registrations returns up to limit registrations in MonID order strictly
// after `after` (zero MonID = from the start), only those whose MonName
// equals monName when monName != "". limit ≤ 0 means no limit.
func (f *FSM) Registrations(after MonID, limit int, monName string) []Registration {
	start := keyOf(after)
	skip := after != (MonID{})
	if monName != "" {
		if monName < after.MonName {
			return nil
		}
		if monName > after.MonName {
			start, skip = rec{monName: monName}, false
		}
	}
	var out []Registration
	walk := func(t *btree.BTreeG[rec]) {
		t.AscendGreaterOrEqual(start, func(r rec) bool {
			if skip && !lessRec(start, r) {
				return true
			}
			if monName != "" && r.monName != monName {
				return false
			}
			out = append(out, r.registration())
			return limit <= 0 || len(out) < limit
		})
	}
	if limit > 0 && limit <= 4096 {
		f.mu.RLock()
		walk(f.st.regs)
		f.mu.RUnlock()
	} else {
		v, _ := f.view() // long walk: don't hold up Apply
		walk(v.regs)
	}
	return out
}

// Targets returns every distinct monitored host (by MonName), sorted, each
// with the union of its registrations' Addrs (deduplicated, sorted).
func (f *FSM) Targets() []Target {
	v, _ := f.view()
	out := make([]Target, 0, v.hosts)
	var ps []ip
	flush := func(name string) {
		out = append(out, Target{MonName: name, Addrs: sortedAddrs(ps)})
		ps = ps[:0]
	}
	cur, have := "", false
	v.regs.Ascend(func(r rec) bool {
		if have && r.monName != cur {
			flush(cur)
		}
		cur, have = r.monName, true
		eachAddr(r.addrs, func(p ip) bool { ps = append(ps, p); return true })
		return true
	})
	if have {
		flush(cur)
	}
	return out
}

// WouldAccept reports whether a PeerRebooted with these fields would be
// accepted now (a cheap local pre-check before committing).
func (f *FSM) WouldAccept(monName string, from netip.Addr, state int32) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.wouldAccept(monName, ipOf(from), state)
}

// SenderIsHost reports whether from is one of the addresses monName's
// registrations were resolved to: an SM_NOTIFY naming monName that comes
// from the host itself, not merely from any host (a local read).
func (f *FSM) SenderIsHost(monName string, from netip.Addr) bool {
	a := ipOf(from)
	if a.n == 0 {
		return false
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, ok := f.st.byAddr.Get(addrRef{a: a, name: monName})
	return ok
}

// LastSeen is the last state recorded from a monitored host.
func (f *FSM) LastSeen(monName string) (int32, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r, ok := f.st.seen.Get(seenRec{name: monName})
	return r.state, ok
}

// Epochs returns the NFSv4 client-tracking epochs: current (≥ 1) and
// recovery, which is 0 when not in grace and current-1 during a grace
// period (between a GraceStart and its GraceDone).
func (f *FSM) Epochs() (current, recovery uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.v4Current, f.st.v4Recovery
}

// V4Clients returns the NFSv4 client records of the current epoch, or of
// the recovery epoch when recovery is true (none when not in grace),
// sorted by name. It walks a copy-on-write clone without holding the lock.
func (f *FSM) V4Clients(recovery bool) []V4Client {
	f.mu.Lock() // Clone mutates the source tree
	t := f.st.v4cur
	if recovery {
		t = f.st.v4rec
	}
	t = t.Clone()
	f.mu.Unlock()
	out := make([]V4Client, 0, t.Len())
	t.Ascend(func(r v4Rec) bool {
		out = append(out, V4Client{Name: r.name, PrincHash: r.princ})
		return true
	})
	return out
}

// V4Counts returns the number of NFSv4 client records of the current and
// of the recovery epoch, and how many names are in both (the clients that
// reclaimed, or were created again, during the grace period).
func (f *FSM) V4Counts() (current, recovery, reclaimed int) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.v4cur.Len(), f.st.v4rec.Len(), f.st.v4Both
}

// HasV4Client reports whether the current epoch and the recovery epoch
// hold a record for this client name.
func (f *FSM) HasV4Client(name string) (inCurrent, inRecovery bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	k := v4Rec{name: name}
	return f.st.v4cur.Has(k), f.st.v4rec.Has(k)
}
