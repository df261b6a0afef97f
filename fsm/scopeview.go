package fsm

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/google/btree"
)

// Scope reads one service's registrations, last-seen states and NFSv4
// client records (Scoped), or with service "" those of the node-level
// service (the FSM's own methods of the same names read that one). A
// service without a scope reads as an empty one.
type Scope struct {
	f       *FSM
	service string
}

// Scope returns the reader of service's scope ("": the node-level one).
func (f *FSM) Scope(service string) Scope { return Scope{f: f, service: service} }

// in returns the scope read; mu is held (shared or exclusive). An absent
// service's is a fresh empty scope, never stored.
func (sv Scope) in() *scope {
	if sv.service == "" {
		return &sv.f.st.scope
	}
	if sc := sv.f.st.scopes[sv.service]; sc != nil {
		return sc
	}
	sc := newScope()
	return &sc
}

// view takes a copy-on-write clone of the scope for long reads.
func (sv Scope) view() scope {
	sv.f.mu.Lock() // Clone mutates the source tree
	defer sv.f.mu.Unlock()
	return sv.in().clone(false)
}

// servingNode is the node that serves the scope now: the node of the last
// Takeover for the node-level scope, the service's owner for a service's;
// mu is held.
func (sv Scope) servingNode() string {
	if sv.service == "" {
		return sv.f.st.last.Node
	}
	return sv.f.st.placed[sv.service].Node
}

// State is the scope's sm_state: the FSM's for the node-level scope, the
// service's (ServiceSMState of its placement epoch) for a service's.
func (sv Scope) State() int32 {
	sv.f.mu.RLock()
	defer sv.f.mu.RUnlock()
	if sv.service == "" {
		return sv.f.st.sm
	}
	return ServiceSMState(sv.f.st.placed[sv.service].Epoch)
}

// Scopes returns the ids of the services that have a scope, sorted.
func (f *FSM) Scopes() []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return slices.Sorted(maps.Keys(f.st.scopes))
}

// Len returns the number of registrations.
func (sv Scope) Len() int {
	sv.f.mu.RLock()
	sc := sv.in()
	defer sv.f.mu.RUnlock()
	return sc.regs.Len()
}

// Hosts returns the number of distinct monitored hosts (MonNames).
func (sv Scope) Hosts() int {
	sv.f.mu.RLock()
	sc := sv.in()
	defer sv.f.mu.RUnlock()
	return sc.hosts
}

// Get returns the registration with this MonID.
func (sv Scope) Get(id MonID) (Registration, bool) {
	sv.f.mu.RLock()
	sc := sv.in()
	r, ok := sc.regs.Get(keyOf(id))
	sv.f.mu.RUnlock()
	if !ok {
		return Registration{}, false
	}
	return r.registration(), true
}

// MayRegister reports whether a guarded Register of g would add or
// replace g's registration if applied now (Register.Guarded), on this
// node's state. A proposer that cannot use kind 14 yet checks this and
// then commits an unguarded Register (kind 1), or refuses.
func (sv Scope) MayRegister(g Registration) bool {
	sv.f.mu.RLock()
	sc := sv.in()
	defer sv.f.mu.RUnlock()
	return sc.mayRegister(&g, sv.servingNode())
}

// Owned returns the MonIDs of the registrations that c, an Unregister or
// UnregisterAll, would remove if applied now (its MonID, or its lock
// manager's registrations, that its Owner owns), in MonID order; nil for
// other commands. A proposer that cannot use kinds 11 and 12 yet removes
// these one by one with owner-less Unregisters instead.
func (sv Scope) Owned(c Command) []MonID {
	var ids []MonID
	switch c := c.(type) {
	case Unregister:
		sv.f.mu.RLock()
		sc := sv.in()
		r, ok := sc.regs.Get(keyOf(c.ID))
		sv.f.mu.RUnlock()
		if ok && c.Owner.owns(r.node, ip{a: r.cb, n: r.cbLen}) {
			ids = append(ids, c.ID)
		}
	case UnregisterAll:
		sv.f.mu.Lock() // Clone mutates the source tree
		sc := sv.in()
		regs := sc.regs.Clone()
		sv.f.mu.Unlock()
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
func (sv Scope) Registrations(after MonID, limit int, monName string) []Registration {
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
		sv.f.mu.RLock()
		sc := sv.in()
		walk(sc.regs)
		sv.f.mu.RUnlock()
	} else {
		v := sv.view() // long walk: don't hold up Apply
		walk(v.regs)
	}
	return out
}

// Targets returns every distinct monitored host (by MonName), sorted, each
// with the union of its registrations' Addrs (deduplicated, sorted).
func (sv Scope) Targets() []Target {
	v := sv.view()
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
func (sv Scope) WouldAccept(monName string, from netip.Addr, state int32) bool {
	sv.f.mu.RLock()
	sc := sv.in()
	defer sv.f.mu.RUnlock()
	return sc.wouldAccept(monName, ipOf(from), state)
}

// SenderIsHost reports whether from is one of the addresses monName's
// registrations were resolved to: an SM_NOTIFY naming monName that comes
// from the host itself, not merely from any host (a local read).
func (sv Scope) SenderIsHost(monName string, from netip.Addr) bool {
	a := ipOf(from)
	if a.n == 0 {
		return false
	}
	sv.f.mu.RLock()
	sc := sv.in()
	defer sv.f.mu.RUnlock()
	_, ok := sc.byAddr.Get(addrRef{a: a, name: monName})
	return ok
}

// LastSeen is the last state recorded from a monitored host.
func (sv Scope) LastSeen(monName string) (int32, bool) {
	sv.f.mu.RLock()
	sc := sv.in()
	defer sv.f.mu.RUnlock()
	r, ok := sc.seen.Get(seenRec{name: monName})
	return r.state, ok
}

// Epochs returns the NFSv4 client-tracking epochs: current (≥ 1) and
// recovery, which is 0 when not in grace and current-1 during a grace
// period (between a GraceStart and its GraceDone).
func (sv Scope) Epochs() (current, recovery uint64) {
	sv.f.mu.RLock()
	sc := sv.in()
	defer sv.f.mu.RUnlock()
	return sc.v4Current, sc.v4Recovery
}

// V4Clients returns the NFSv4 client records of the current epoch, or of
// the recovery epoch when recovery is true (none when not in grace),
// sorted by name. It walks a copy-on-write clone without holding the lock.
func (sv Scope) V4Clients(recovery bool) []V4Client {
	sv.f.mu.Lock() // Clone mutates the source tree
	sc := sv.in()
	t := sc.v4cur
	if recovery {
		t = sc.v4rec
	}
	t = t.Clone()
	sv.f.mu.Unlock()
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
func (sv Scope) V4Counts() (current, recovery, reclaimed int) {
	sv.f.mu.RLock()
	sc := sv.in()
	defer sv.f.mu.RUnlock()
	return sc.v4cur.Len(), sc.v4rec.Len(), sc.v4Both
}

// HasV4Client reports whether the current epoch and the recovery epoch
// hold a record for this client name.
func (sv Scope) HasV4Client(name string) (inCurrent, inRecovery bool) {
	sv.f.mu.RLock()
	sc := sv.in()
	defer sv.f.mu.RUnlock()
	k := v4Rec{name: name}
	return sc.v4cur.Has(k), sc.v4rec.Has(k)
}
