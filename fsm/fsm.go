package fsm

import (
	"fmt"
	"math"
	"net/netip"
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

// state is the replicated state, plus the derived address index. The
// embedded scope holds the registrations and NFSv4 records of the node's
// own service (the cluster without services:); scopes those of each
// service (scope.go).
type state struct {
	scope
	sm    int32
	grace time.Time
	last  Takeover
	// lastTerm is the raft term of the log entry that carried last (0
	// before the first Takeover, or after a version-1 snapshot).
	lastTerm uint64

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

	// scopes are the services' registrations and NFSv4 records (scope.go),
	// by service id; nil when none. A view's clone copies the map and
	// clones each scope.
	scopes map[string]*scope
}

func newState() state { return state{scope: newScope()} }

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
			if guarded[k] && !f.st.mayStore(&regs[k], f.st.last.Node) {
				res[i] = Result{State: f.st.sm, Refused: true}
			} else {
				f.st.store(regs[k])
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
	case Takeover:
		s.sm = nextState(s.sm, c.MinState, c.Wrap)
		s.grace = c.GraceUntil
		c.Wrap = false // a property of the command, not of the state (snapshots do not keep it)
		s.last = c
		s.lastTerm = term
		s.unconfirm(c.Node) // it may serve again: an operator's "off" no longer holds
		return Result{State: s.sm}
	case ServingBegin, ServingEnd, FenceConfirm:
		s.applyServing(c)
		return Result{State: s.sm}
	case ServicesDeclared, ServicePlaced, ServiceForgotten, ServiceReleased:
		return s.applyServices(c)
	case Scoped:
		return f.applyScoped(c)
	}
	res := f.applyIn(&s.scope, c, s.last.Node)
	res.State = s.sm
	return res
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

// clone returns an immutable copy-on-write view of the replicated state,
// without the address indexes (derived; readers of a view never use
// them); mu is held exclusively (BTreeG.Clone mutates the source tree).
func (s *state) clone() state {
	c := *s
	c.scope = s.scope.clone(false)
	if s.scopes != nil {
		c.scopes = make(map[string]*scope, len(s.scopes))
		for id, sc := range s.scopes {
			x := sc.clone(false)
			c.scopes[id] = &x
		}
	}
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

// AppliedIndex returns the index of the last log entry applied, or of the
// snapshot last restored.
func (f *FSM) AppliedIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.applied
}

// CommandLevel is the newest optional set of entry kinds this build
// applies: 0 is kinds 1–10; 1 adds kinds 11 and 12 (Unregister and
// UnregisterAll with an Owner) and 13 (Takeover with Wrap); 2 adds kind
// 14 (Register with Guarded), kinds 15–17 (ServingBegin, ServingEnd,
// FenceConfirm: who serves, and what it promised) and kinds 18–21
// (ServicesDeclared, ServicePlaced, ServiceForgotten, ServiceReleased: where each service
// runs) and kind 22 (Scoped: one service's own registrations and NFSv4
// records). A cluster proposes a level's kinds only once every member
// advertises that level.
const CommandLevel = 2

// The node-level scope's reads (Scope("") has them all).

// Len returns the number of registrations.
func (f *FSM) Len() int { return f.Scope("").Len() }

// Hosts returns the number of distinct monitored hosts (MonNames).
func (f *FSM) Hosts() int { return f.Scope("").Hosts() }

// Get returns the registration with this MonID.
func (f *FSM) Get(id MonID) (Registration, bool) { return f.Scope("").Get(id) }

// MayRegister is Scope("").MayRegister.
func (f *FSM) MayRegister(g Registration) bool { return f.Scope("").MayRegister(g) }

// Owned is Scope("").Owned.
func (f *FSM) Owned(c Command) []MonID { return f.Scope("").Owned(c) }

// Registrations is Scope("").Registrations.
func (f *FSM) Registrations(after MonID, limit int, monName string) []Registration {
	return f.Scope("").Registrations(after, limit, monName)
}

// Targets is Scope("").Targets.
func (f *FSM) Targets() []Target { return f.Scope("").Targets() }

// WouldAccept is Scope("").WouldAccept.
func (f *FSM) WouldAccept(monName string, from netip.Addr, state int32) bool {
	return f.Scope("").WouldAccept(monName, from, state)
}

// SenderIsHost is Scope("").SenderIsHost.
func (f *FSM) SenderIsHost(monName string, from netip.Addr) bool {
	return f.Scope("").SenderIsHost(monName, from)
}

// LastSeen is Scope("").LastSeen.
func (f *FSM) LastSeen(monName string) (int32, bool) { return f.Scope("").LastSeen(monName) }

// Epochs is Scope("").Epochs.
func (f *FSM) Epochs() (current, recovery uint64) { return f.Scope("").Epochs() }

// V4Clients is Scope("").V4Clients.
func (f *FSM) V4Clients(recovery bool) []V4Client { return f.Scope("").V4Clients(recovery) }

// V4Counts is Scope("").V4Counts.
func (f *FSM) V4Counts() (current, recovery, reclaimed int) { return f.Scope("").V4Counts() }

// HasV4Client is Scope("").HasV4Client.
func (f *FSM) HasV4Client(name string) (inCurrent, inRecovery bool) {
	return f.Scope("").HasV4Client(name)
}
