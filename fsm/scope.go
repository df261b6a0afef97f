package fsm

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/google/btree"
)

// A scope is one NFS service's NSM and NFSv4 state: its registrations
// (with their address index and last-seen states) and nfsdcld's database
// of its clients. The state's embedded scope is the node-level service of
// a cluster without services:; each service of services: has its own
// (state.scopes), changed only by Scoped commands, so that one service's
// clients, reclaims and grace never touch another's.
type scope struct {
	regs   *btree.BTreeG[rec]     // by MonID
	seen   *btree.BTreeG[seenRec] // by MonName; only monitored hosts
	byAddr *btree.BTreeG[addrRef] // (address, MonName) → refs; derived, not snapshotted
	hosts  int                    // distinct MonNames in regs

	// NFSv4 client tracking (nfsdcld's database): the records of the
	// current epoch and of the recovery epoch, by name. v4Current ≥ 1;
	// v4Recovery is 0 (not in grace, v4rec empty) or v4Current-1.
	v4cur      *btree.BTreeG[v4Rec]
	v4rec      *btree.BTreeG[v4Rec]
	v4Current  uint64
	v4Recovery uint64
	v4Both     int // names in both v4cur and v4rec; derived, not snapshotted
}

func newScope() scope {
	return scope{
		regs:      btree.NewG(btreeDegree, lessRec),
		seen:      btree.NewG(btreeDegree, lessSeen),
		byAddr:    btree.NewG(btreeDegree, lessAddrRef),
		v4cur:     newV4Tree(),
		v4rec:     newV4Tree(),
		v4Current: 1,
	}
}

// clone returns a copy-on-write copy of s; withIndex keeps a clone of the
// address index too (a snapshot's view drops it: it is derived). The
// caller holds mu exclusively (BTreeG.Clone mutates the source tree).
func (s *scope) clone(withIndex bool) scope {
	c := *s
	c.regs = s.regs.Clone()
	c.seen = s.seen.Clone()
	c.byAddr = nil
	if withIndex {
		c.byAddr = s.byAddr.Clone()
	}
	c.v4cur = s.v4cur.Clone()
	c.v4rec = s.v4rec.Clone()
	return c
}

// empty reports whether s holds nothing a fresh scope does not.
func (s *scope) empty() bool {
	return s.regs.Len() == 0 && s.seen.Len() == 0 && s.v4cur.Len() == 0 && s.v4rec.Len() == 0 &&
		s.v4Current == 1 && s.v4Recovery == 0
}

// Scoped applies Cmd to one service's scope (entry kind 22, CommandLevel
// 2): its registrations, last-seen states and NFSv4 client records, and
// nothing else. Cmd is a Register, Unregister, UnregisterAll,
// PeerRebooted, ClientCreate, ClientRemove, ClientCheck, GraceStart or
// GraceDone, with the meaning it has for the node-level scope, except
// that the node that serves the scope (Register.Guarded) is the node the
// service is placed on, not the node of the last Takeover.
//
// Node and Epoch name the run of the service that sent the command: the
// node that serves it and the epoch of the placement it serves. The
// command is applied only while that run is the service's current one —
// the service's latest placement names Node at Epoch; otherwise it
// changes nothing and is refused (ErrStaleRun), so a write that a server
// sent while it served the service and that commits only after the
// service moved (or restarted) never lands in the later run's state. A
// service without a placement record refuses every command
// (ErrNotPlaced). Result.State is the service's sm_state (ServiceSMState
// of its current epoch).
type Scoped struct {
	Service string
	Node    string // 1…MaxNameLen bytes
	Epoch   uint64 // ≥ 1
	Cmd     Command
}

func (Scoped) isCommand() {}

var (
	// ErrNotPlaced means a Scoped command named a service with no
	// placement record: a service's NSM and NFSv4 state exists only
	// while the cluster knows the service.
	ErrNotPlaced = errors.New("fsm: the service has no placement record")
	// ErrStaleRun means a Scoped command was sent by a run of the service
	// that is no longer its current one (the service moved, restarted or
	// was taken away since; the command's epoch is stale): it changed
	// nothing, and its sender must not report it done.
	ErrStaleRun = errors.New("fsm: the write's run of the service is not the service's current one")
)

// scopable reports whether c may be the command of a Scoped.
func scopable(c Command) bool {
	switch c.(type) {
	case Register, Unregister, UnregisterAll, PeerRebooted, ClientCreate, ClientRemove, ClientCheck, GraceStart, GraceDone:
		return true
	}
	return false
}

// ServiceSMState is the sm_state a service has at epoch: 2·epoch+1. Every
// placement of a service raises its epoch by one and an epoch is never
// handed out twice (fsm/services.go), so the state is odd while the
// service runs (NSM's rule for a monitored host that is up), differs at
// every move and restart of the service, and only grows: a monitored host
// that compares it with the last one it saw always sees a new one. At
// the top of the int32 range (a billion moves) it stays at
// math.MaxInt32.
func ServiceSMState(epoch uint64) int32 {
	if epoch >= (math.MaxInt32-1)/2 {
		return math.MaxInt32
	}
	return int32(2*epoch + 1)
}

// applyScoped applies a Scoped command; mu is held exclusively.
func (f *FSM) applyScoped(c Scoped) Result {
	s := &f.st
	p, ok := s.placed[c.Service]
	if !ok {
		return Result{State: s.sm, Refused: true, Refusal: fmt.Errorf("%w: service %q", ErrNotPlaced, c.Service)}
	}
	if p.Node != c.Node || p.Epoch != c.Epoch {
		// Decided here, at apply, in the log's order: every node refuses
		// it alike, whenever its sender sent it.
		return Result{State: ServiceSMState(p.Epoch), Refused: true, Refusal: fmt.Errorf(
			"%w: service %q is on %q at epoch %d; the write was sent by %q's run at epoch %d",
			ErrStaleRun, c.Service, p.Node, p.Epoch, c.Node, c.Epoch)}
	}
	sc := s.scopes[c.Service]
	if sc == nil {
		n := newScope()
		sc = &n
		if s.scopes == nil {
			s.scopes = map[string]*scope{}
		}
		s.scopes[c.Service] = sc
	}
	res := f.applyIn(sc, c.Cmd, p.Node)
	res.State = ServiceSMState(p.Epoch)
	return res
}

// dropScope forgets a service's scope (its placement record was
// forgotten: nobody declares, serves or holds it any more).
func (s *state) dropScope(service string) {
	delete(s.scopes, service)
	if len(s.scopes) == 0 {
		s.scopes = nil
	}
}

// applyIn applies a scope's command to sc, with serving the node that
// serves the scope; Result.State is left for the caller. mu is held
// exclusively.
func (f *FSM) applyIn(s *scope, c Command, serving string) Result {
	switch c := c.(type) {
	case Register:
		if c.Guarded && !s.mayRegister(&c.Reg, serving) {
			return Result{Refused: true}
		}
		f.register(s, &c.Reg)
	case Unregister:
		n := 0
		if r, ok := s.regs.Get(keyOf(c.ID)); ok && c.Owner.owns(r.node, ip{a: r.cb, n: r.cbLen}) {
			if old, ok := s.regs.Delete(r); ok {
				s.dropped(old)
				n = 1
			}
		}
		return Result{Removed: n}
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
		return Result{Removed: len(gone)}
	case PeerRebooted:
		return s.peerRebooted(c)
	case ClientCreate:
		s.v4Put(v4Rec{name: c.Name, princ: c.PrincHash})
	case ClientRemove:
		n := 0
		if _, ok := s.v4cur.Delete(v4Rec{name: c.Name}); ok {
			n = 1
			if s.v4rec.Has(v4Rec{name: c.Name}) {
				s.v4Both--
			}
		}
		return Result{Removed: n}
	case ClientCheck:
		if s.v4Recovery == 0 {
			s.graceStart()
		}
		r, ok := s.v4rec.Get(v4Rec{name: c.Name})
		if ok {
			s.v4Put(r)
		}
		return Result{Accepted: ok}
	case GraceStart:
		return Result{Removed: s.graceStart()}
	case GraceDone:
		if s.v4Recovery == 0 {
			s.graceStart()
		}
		s.v4rec = newV4Tree()
		s.v4Recovery = 0
		s.v4Both = 0
	}
	return Result{}
}

// peerRebooted applies a PeerRebooted to s.
func (s *scope) peerRebooted(c PeerRebooted) Result {
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
	res := Result{Accepted: accepted}
	if accepted {
		res.Matched = make([]Registration, len(matched))
		for i := range matched {
			res.Matched[i] = matched[i].registration()
		}
	}
	return res
}

// v4Put inserts or replaces a current-epoch client record.
func (s *scope) v4Put(r v4Rec) {
	if _, replaced := s.v4cur.ReplaceOrInsert(r); !replaced && s.v4rec.Has(r) {
		s.v4Both++
	}
}

// graceStart applies a GraceStart and returns the number of current-epoch
// records it discarded. At the top of the uint64 range the current epoch
// stays at math.MaxUint64 (recovery becomes math.MaxUint64-1, keeping
// recovery = current-1); only a crafted snapshot gets there.
func (s *scope) graceStart() int {
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

// register adds or replaces a registration in s; mu is held exclusively.
func (f *FSM) register(s *scope, g *Registration) {
	r := recOf(g)
	r.myName = f.names.internString(r.myName)
	r.node = f.names.internString(r.node)
	s.store(r)
}

// store adds or replaces r, whose MyName and Node are interned; mu is held
// exclusively.
func (s *scope) store(r rec) {
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
func (s *scope) firstOf(name string) (rec, bool) {
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
func (s *scope) dropped(r rec) {
	s.unref(&r)
	if _, ok := s.firstOf(r.monName); !ok {
		s.hosts--
		s.seen.Delete(seenRec{name: r.monName})
	}
}

func (s *scope) ref(r *rec) {
	eachAddr(r.addrs, func(p ip) bool {
		k := addrRef{a: p, name: r.monName, refs: 1}
		if old, ok := s.byAddr.ReplaceOrInsert(k); ok { // rare: count it
			k.refs += old.refs
			s.byAddr.ReplaceOrInsert(k)
		}
		return true
	})
}

func (s *scope) unref(r *rec) {
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
func (s *scope) match(name string, from ip) []rec {
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
func (s *scope) wouldAccept(name string, from ip, st int32) bool {
	matched := s.match(name, from)
	for _, r := range matched {
		if old, ok := s.seen.Get(seenRec{name: r.monName}); !ok || old.state != st {
			return true
		}
	}
	return false
}

// mayRegister is the guard of Register.Guarded, with serving the node that
// serves the scope now; mu is held.
func (s *scope) mayRegister(g *Registration, serving string) bool {
	r := keyOf(g.ID)
	r.node = g.Node
	cb := ipOf(g.Callback)
	r.cb, r.cbLen = cb.a, cb.n
	return s.mayStore(&r, serving)
}

// mayStore is mayRegister on a registration in its stored form (its key,
// node and callback); mu is held.
func (s *scope) mayStore(r *rec, serving string) bool {
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
	return r.node != "" && r.node == serving && cb.addr().IsLoopback() && oldCB.addr().IsLoopback()
}

// kindScoped is the entry kind of a Scoped command: the service id, the
// node and epoch of the run that sent it, then the scoped command as a
// command of its own (its kind and body).
const kindScoped = 22

// scopedCommand encodes c if it is a Scoped.
func (e *encoder) scopedCommand(c Command) (ok bool, err error) {
	sc, ok := c.(Scoped)
	if !ok {
		return false, nil
	}
	if !scopable(sc.Cmd) {
		return true, fmt.Errorf("scoped %T: not a registration or NFSv4 client-tracking command", sc.Cmd)
	}
	e.b = append(e.b, kindScoped)
	if err := e.serviceID(sc.Service); err != nil {
		return true, err
	}
	if err := e.nodeName(sc.Node); err != nil {
		return true, fmt.Errorf("scoped command's sender: %w", err)
	}
	if err := e.epoch(sc.Epoch); err != nil {
		return true, fmt.Errorf("scoped command's run: %w", err)
	}
	return true, e.command(sc.Cmd)
}

// scopedCommand decodes kind 22's body.
func (d *decoder) scopedCommand() Command {
	id := d.serviceID()
	node := d.nodeName()
	epoch := d.epoch()
	if d.err != nil {
		return nil
	}
	if len(d.b) > 0 && d.b[0] == kindScoped {
		d.fail("a scoped command inside a scoped command")
		return nil
	}
	c := d.command()
	if d.err == nil && !scopable(c) {
		d.fail("scoped %T: not a registration or NFSv4 client-tracking command", c)
	}
	if d.err != nil {
		return nil
	}
	return Scoped{Service: id, Node: node, Epoch: epoch, Cmd: c}
}
