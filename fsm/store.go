package fsm

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
	"time"
)

// ip is a compact, pointer-free netip.Addr without zone: n is 0 (invalid),
// 4 or 16 and a holds the n address bytes.
type ip struct {
	a [16]byte
	n uint8
}

func ipOf(a netip.Addr) ip {
	switch {
	case !a.IsValid():
		return ip{}
	case a.Is4():
		b := a.As4()
		var p ip
		copy(p.a[:], b[:])
		p.n = 4
		return p
	default:
		return ip{a: a.As16(), n: 16}
	}
}

func (p ip) addr() netip.Addr {
	switch p.n {
	case 4:
		return netip.AddrFrom4([4]byte(p.a[:4]))
	case 16:
		return netip.AddrFrom16(p.a)
	}
	return netip.Addr{}
}

// cmp orders addresses as netip.Addr.Compare does for zoneless ones:
// IPv4 before IPv6, then by bytes (unused bytes of an IPv4 are zero).
func (p ip) cmp(q ip) int {
	if p.n != q.n {
		return cmp.Compare(p.n, q.n)
	}
	if c := cmp.Compare(binary.BigEndian.Uint64(p.a[:8]), binary.BigEndian.Uint64(q.a[:8])); c != 0 {
		return c
	}
	return cmp.Compare(binary.BigEndian.Uint64(p.a[8:]), binary.BigEndian.Uint64(q.a[8:]))
}

// packAddrs packs addresses as (length byte, bytes)… into a string: one
// small pointer-free allocation per registration, none when empty.
func packAddrs(as []netip.Addr) string {
	if len(as) == 0 {
		return ""
	}
	b := make([]byte, 0, len(as)*5)
	for _, a := range as {
		p := ipOf(a)
		b = append(b, p.n)
		b = append(b, p.a[:p.n]...)
	}
	return string(b)
}

// eachAddr calls fn for every address packed in s until fn returns false.
// s was validated when packed or decoded.
func eachAddr(s string, fn func(ip) bool) {
	for len(s) > 0 {
		var p ip
		p.n = s[0]
		copy(p.a[:], s[1:1+int(p.n)])
		s = s[1+int(p.n):]
		if !fn(p) {
			return
		}
	}
}

func unpackAddrs(s string) []netip.Addr {
	if s == "" {
		return nil
	}
	out := make([]netip.Addr, 0, len(s)/5)
	eachAddr(s, func(p ip) bool { out = append(out, p.addr()); return true })
	return out
}

func hasAddr(s string, q ip) bool {
	found := false
	eachAddr(s, func(p ip) bool { found = p == q; return !found })
	return found
}

// rec is the stored form of a Registration: a value type (about 120 bytes)
// kept directly in the B-tree nodes, with interned strings, the callback
// address inline and the addresses packed into one string.
type rec struct {
	monName string
	myName  string
	node    string
	addrs   string // packAddrs form
	priv    [16]byte
	cb      [16]byte
	added   int64 // Unix ns, 0 = zero time
	prog    uint32
	vers    uint32
	proc    uint32
	cbLen   uint8
}

func keyOf(id MonID) rec {
	return rec{monName: id.MonName, myName: id.My.MyName, prog: id.My.Prog, vers: id.My.Vers, proc: id.My.Proc}
}

func lessRec(a, b rec) bool {
	if a.monName != b.monName {
		return a.monName < b.monName
	}
	if a.myName != b.myName {
		return a.myName < b.myName
	}
	if a.prog != b.prog {
		return a.prog < b.prog
	}
	if a.vers != b.vers {
		return a.vers < b.vers
	}
	return a.proc < b.proc
}

func (r *rec) id() MonID {
	return MonID{MonName: r.monName, My: MyID{MyName: r.myName, Prog: r.prog, Vers: r.vers, Proc: r.proc}}
}

func (r *rec) my() MyID { return MyID{MyName: r.myName, Prog: r.prog, Vers: r.vers, Proc: r.proc} }

func (r *rec) callback() netip.Addr { return ip{a: r.cb, n: r.cbLen}.addr() }

func (r *rec) registration() Registration {
	return Registration{
		ID:       r.id(),
		Priv:     r.priv,
		Node:     r.node,
		Callback: r.callback(),
		Addrs:    unpackAddrs(r.addrs),
		Added:    timeOf(r.added),
	}
}

func recOf(g *Registration) rec {
	cb := ipOf(g.Callback)
	return rec{
		monName: g.ID.MonName,
		myName:  g.ID.My.MyName,
		node:    g.Node,
		addrs:   packAddrs(g.Addrs),
		priv:    g.Priv,
		cb:      cb.a,
		cbLen:   cb.n,
		added:   nanosOf(g.Added),
		prog:    g.ID.My.Prog,
		vers:    g.ID.My.Vers,
		proc:    g.ID.My.Proc,
	}
}

// addrRef says that refs registrations of host name list address a.
type addrRef struct {
	a    ip
	refs int32
	name string
}

func cmpAddrRef(x, y addrRef) int {
	if c := x.a.cmp(y.a); c != 0 {
		return c
	}
	return cmp.Compare(x.name, y.name)
}

func lessAddrRef(x, y addrRef) bool { return cmpAddrRef(x, y) < 0 }

// seenRec is the last state seen from a monitored host.
type seenRec struct {
	name  string
	state int32
}

func lessSeen(x, y seenRec) bool { return x.name < y.name }

// v4Rec is the stored form of a V4Client.
type v4Rec struct {
	name  string
	princ string
}

func lessV4(x, y v4Rec) bool { return x.name < y.name }

// nanosOf and timeOf map times to Unix nanoseconds and back; the zero
// time is 0. Callers check the range with timeOK first.
func nanosOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func timeOf(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// timeOK reports whether t survives nanosOf/timeOf (zero, or within the
// int64 nanosecond range of years 1678–2262).
func timeOK(t time.Time) bool {
	if t.IsZero() {
		return true
	}
	return !t.Before(time.Unix(0, minInt64)) && !t.After(time.Unix(0, maxInt64))
}

const (
	minInt64 = -1 << 63
	maxInt64 = 1<<63 - 1
)

// sortedAddrs returns the distinct addresses of a packed list set, sorted.
func sortedAddrs(ps []ip) []netip.Addr {
	slices.SortFunc(ps, ip.cmp)
	ps = slices.Compact(ps)
	out := make([]netip.Addr, len(ps))
	for i, p := range ps {
		out[i] = p.addr()
	}
	return out
}
