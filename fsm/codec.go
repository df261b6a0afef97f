package fsm

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// Log entry format, version 1 (all integers unsigned LEB128 "uvarint"
// unless noted; every varint must be minimally encoded):
//
//	entry    = version:u8(=1) count:uvarint(1…MaxBatch) command{count}
//	command  = kind:u8 body
//	Register      (1) = registration
//	Unregister    (2) = str(mon_name) myid
//	UnregisterAll (3) = myid
//	Takeover      (4) = str(node) min_state:varint time(grace_until) str(reason) time(at)
//	PeerRebooted  (5) = str(mon_name) addr(from) state:varint time(at)
//	ClientCreate  (6) = cname str(princ_hash)
//	ClientRemove  (7) = cname
//	ClientCheck   (8) = cname
//	GraceStart    (9) =                 (no body)
//	GraceDone    (10) =                 (no body)
//	Unregister    (11) = str(mon_name) myid owner        (Owner not zero)
//	UnregisterAll (12) = myid owner                      (Owner not zero)
//	Takeover      (13) = as kind 4                        (Wrap set)
//	Register      (14) = registration                     (Guarded set)
//	ServingBegin  (15) = servingrec
//	ServingEnd    (16) = node time(at)
//	FenceConfirm  (17) = node str(by) time(at)             (by ≤ 256)
//	ServicesDeclared (18) = declaration
//	ServicePlaced    (19) = placement
//	ServiceForgotten (20) = str(service) epoch
//	ServiceReleased  (21) = str(service) str(node) epoch
//	Scoped           (22) = str(service) node epoch command
//	                        (the run that sent it: node, epoch; command
//	                        one of kinds 1–3, 5–12 and 14)
//
//	registration = str(mon_name) myid priv:16 bytes str(node) addr(callback)
//	               naddrs:uvarint(≤16) addr{naddrs} time(added)
//	myid     = str(my_name) prog:uvarint vers:uvarint proc:uvarint
//	owner    = str(node) addr(callback)   (callback: 4 or 16 bytes, never empty)
//	str(x)   = len:uvarint bytes        (len ≤ 1024; reason ≤ 256; princ_hash ≤ 32)
//	cname    = str(name), 1…1024 bytes (an empty client name is refused)
//	node     = str(node), 1…1024 bytes (an empty node is refused)
//	servingrec = node str(nsm_addr) promise time(since)      (nsm_addr ≤ 256)
//	promise  = mode:u8(1 off, 2 agent, 3 watchdog) watchdog_timeout lease
//	           hook_timeout margin      (each uvarint ns ≤ MaxPromiseDuration)
//	declaration = node count:uvarint(0…256) decl{count}  (strictly ascending by service)
//	decl     = str(service) str(fingerprint) n:uvarint(0…64) node{n}  (prefer, none twice)
//	placement = str(service) str(node) epoch str(reason) time(at) str(from)
//	           (node and from may be empty: unplaced)
//	service  = 1…64 bytes; fingerprint 1…64 bytes; epoch = uvarint ≥ 1
//	addr     = len:u8 (0, 4 or 16) bytes
//	time     = Unix nanoseconds, int64 big-endian, 0 = zero time
//	varint   = zigzag signed varint, within int32
//
// Addresses in Addrs must be valid; zones are not encoded.
//
// Kinds 6–10 (NFSv4 client tracking) extend version 1 compatibly: an entry
// without them has the same bytes as before, so the version stays 1. A
// build that predates them refuses an entry carrying one as an unknown
// kind (ErrBadCommand) and applies none of it, so its state would diverge
// from upgraded nodes': every node of a cluster must run a build that
// knows them before any is proposed, i.e. before NFSv4 client tracking is
// used.
//
// Kinds 11 and 12 (an Unregister or UnregisterAll with an Owner) and 13
// (a Takeover with Wrap) extend it the same way: an Unregister or
// UnregisterAll with the zero Owner is still kind 2 or 3, a Takeover
// without Wrap kind 4. A build that predates them would refuse them, and
// one that applied kind 2 or 3 in their place would remove registrations
// the owner check keeps, so they are proposed only once every member of
// the cluster advertises CommandLevel ≥ 1 (package cluster gates it); an
// older build would also apply a kind-13 Takeover differently at the end
// of the range.
//
// Kind 14 (a Register with Guarded) extends it once more: a Register
// without Guarded is still kind 1. A build that applied kind 1 in its
// place would replace a registration the guard keeps, so it is proposed
// only once every member advertises CommandLevel ≥ 2.
//
// Kinds 15–17 (who serves, and what it promised: serving.go) are new
// commands with no older equivalent; they are proposed only once every
// member advertises CommandLevel ≥ 2, and never lowered.
//
// Kinds 18–21 (where each service runs: services.go) are new commands too,
// CommandLevel 2, proposed only once every member advertises it. So is
// kind 22 (Scoped: scope.go), whose body is a service id, the node and
// epoch of the service's run that sent it, and then one of kinds 1–3,
// 5–12 and 14 as a command of its own.
const (
	entryVersion = 1

	kindRegister      = 1
	kindUnregister    = 2
	kindUnregisterAll = 3
	kindTakeover      = 4
	kindPeerRebooted  = 5
	kindClientCreate  = 6
	kindClientRemove  = 7
	kindClientCheck   = 8
	kindGraceStart    = 9
	kindGraceDone     = 10
	kindUnregisterOwn = 11
	kindUnregAllOwn   = 12
	kindTakeoverWrap  = 13
	kindRegisterGuard = 14

	minCommandLen  = 1  // kind + the shortest body (GraceStart, GraceDone: none)
	minRegisterLen = 33 // kind + the shortest registration
)

// Encode encodes a batch of commands as one log entry (versioned binary).
// It refuses (ErrBadCommand) an empty batch, more than MaxBatch commands,
// nil or foreign Command values, strings or address lists beyond their
// limits, empty client names, invalid addresses in Addrs and times
// outside the int64 nanosecond range, so that whatever it returns Decode
// accepts.
func Encode(cmds ...Command) ([]byte, error) {
	if len(cmds) == 0 || len(cmds) > MaxBatch {
		return nil, fmt.Errorf("%w: batch of %d commands (want 1…%d)", ErrBadCommand, len(cmds), MaxBatch)
	}
	e := encoder{b: make([]byte, 0, 16+64*len(cmds))}
	e.b = append(e.b, entryVersion)
	e.b = binary.AppendUvarint(e.b, uint64(len(cmds)))
	for i, c := range cmds {
		if err := e.command(c); err != nil {
			return nil, fmt.Errorf("%w: command %d: %w", ErrBadCommand, i, err)
		}
	}
	return e.b, nil
}

// Decode is Encode's inverse; malformed input → ErrBadCommand, never a
// panic. An entry of another format version → an error wrapping both
// ErrBadCommand and ErrVersion. Decoded times are in UTC.
func Decode(b []byte) ([]Command, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty entry", ErrBadCommand)
	}
	if b[0] != entryVersion {
		return nil, fmt.Errorf("%w: %w: entry version %d", ErrBadCommand, ErrVersion, b[0])
	}
	d := decoder{b: b[1:]}
	n := d.uvarint()
	if d.err == nil && (n == 0 || n > MaxBatch || n > uint64(len(d.b)/minCommandLen)) {
		d.fail("batch count %d (want 1…%d, fitting %d bytes)", n, MaxBatch, len(d.b))
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCommand, d.err)
	}
	cmds := make([]Command, 0, n)
	for i := uint64(0); i < n; i++ {
		c := d.command()
		if d.err != nil {
			return nil, fmt.Errorf("%w: command %d: %w", ErrBadCommand, i, d.err)
		}
		cmds = append(cmds, c)
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrBadCommand, len(d.b))
	}
	return cmds, nil
}

// decodeApply decodes an entry as Decode does, for FSM.Apply: a Register
// comes back in its stored form, with cmds[i] nil and the stored forms in
// regs in entry order (the k-th nil command is regs[k]; guarded[k] says
// whether it was a guarded one, kind 14), its strings shared through in
// (interned MyName/Node), so applying it needs no Registration and no
// re-packing of its addresses. regs holds only the registrations, so what
// it allocates is bounded by the entry's length.
func decodeApply(b []byte, in *strTable) (cmds []Command, regs []rec, guarded []bool, err error) {
	if len(b) == 0 {
		return nil, nil, nil, fmt.Errorf("%w: empty entry", ErrBadCommand)
	}
	if b[0] != entryVersion {
		return nil, nil, nil, fmt.Errorf("%w: %w: entry version %d", ErrBadCommand, ErrVersion, b[0])
	}
	d := decoder{b: b[1:]}
	n := d.uvarint()
	if d.err == nil && (n == 0 || n > MaxBatch || n > uint64(len(d.b)/minCommandLen)) {
		d.fail("batch count %d (want 1…%d, fitting %d bytes)", n, MaxBatch, len(d.b))
	}
	if d.err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", ErrBadCommand, d.err)
	}
	cmds = make([]Command, n)
	regs = make([]rec, 0, min(n, uint64(len(d.b)/minRegisterLen)))
	guarded = make([]bool, 0, cap(regs))
	for i := range n {
		if len(d.b) > 0 && (d.b[0] == kindRegister || d.b[0] == kindRegisterGuard) {
			guarded = append(guarded, d.b[0] == kindRegisterGuard)
			d.b = d.b[1:]
			regs = append(regs, d.rec(in))
		} else {
			cmds[i] = d.command()
		}
		if d.err != nil {
			return nil, nil, nil, fmt.Errorf("%w: command %d: %w", ErrBadCommand, i, d.err)
		}
	}
	if len(d.b) != 0 {
		return nil, nil, nil, fmt.Errorf("%w: %d trailing bytes", ErrBadCommand, len(d.b))
	}
	return cmds, regs, guarded, nil
}

// encoder appends the wire form to b.
type encoder struct{ b []byte }

func (e *encoder) command(c Command) error {
	switch c := c.(type) {
	case Register:
		if c.Guarded {
			e.b = append(e.b, kindRegisterGuard)
		} else {
			e.b = append(e.b, kindRegister)
		}
		return e.registration(&c.Reg)
	case Unregister:
		if c.Owner.IsZero() {
			e.b = append(e.b, kindUnregister)
		} else {
			e.b = append(e.b, kindUnregisterOwn)
		}
		if err := e.str(c.ID.MonName, MaxNameLen, "mon_name"); err != nil {
			return err
		}
		if err := e.myID(c.ID.My); err != nil {
			return err
		}
		return e.owner(c.Owner)
	case UnregisterAll:
		if c.Owner.IsZero() {
			e.b = append(e.b, kindUnregisterAll)
		} else {
			e.b = append(e.b, kindUnregAllOwn)
		}
		if err := e.myID(c.My); err != nil {
			return err
		}
		return e.owner(c.Owner)
	case Takeover:
		if c.Wrap {
			e.b = append(e.b, kindTakeoverWrap)
		} else {
			e.b = append(e.b, kindTakeover)
		}
		return e.takeover(&c)
	case PeerRebooted:
		e.b = append(e.b, kindPeerRebooted)
		if err := e.str(c.MonName, MaxNameLen, "mon_name"); err != nil {
			return err
		}
		e.addr(ipOf(c.From))
		e.b = binary.AppendVarint(e.b, int64(c.State))
		return e.time(c.At, "at")
	case ClientCreate:
		e.b = append(e.b, kindClientCreate)
		if err := e.clientName(c.Name); err != nil {
			return err
		}
		return e.str(c.PrincHash, MaxPrincHashLen, "principal hash")
	case ClientRemove:
		e.b = append(e.b, kindClientRemove)
		return e.clientName(c.Name)
	case ClientCheck:
		e.b = append(e.b, kindClientCheck)
		return e.clientName(c.Name)
	case GraceStart:
		e.b = append(e.b, kindGraceStart)
		return nil
	case GraceDone:
		e.b = append(e.b, kindGraceDone)
		return nil
	case nil:
		return fmt.Errorf("nil command")
	default:
		if ok, err := e.servingCommand(c); ok {
			return err
		}
		if ok, err := e.servicesCommand(c); ok {
			return err
		}
		if ok, err := e.scopedCommand(c); ok {
			return err
		}
		return fmt.Errorf("unknown command type %T", c)
	}
}

func (e *encoder) takeover(t *Takeover) error {
	if err := e.str(t.Node, MaxNameLen, "node"); err != nil {
		return err
	}
	e.b = binary.AppendVarint(e.b, int64(t.MinState))
	if err := e.time(t.GraceUntil, "grace_until"); err != nil {
		return err
	}
	if err := e.str(t.Reason, MaxReasonLen, "reason"); err != nil {
		return err
	}
	return e.time(t.At, "at")
}

func (e *encoder) registration(g *Registration) error {
	if err := e.str(g.ID.MonName, MaxNameLen, "mon_name"); err != nil {
		return err
	}
	if err := e.myID(g.ID.My); err != nil {
		return err
	}
	e.b = append(e.b, g.Priv[:]...)
	if err := e.str(g.Node, MaxNameLen, "node"); err != nil {
		return err
	}
	e.addr(ipOf(g.Callback))
	if len(g.Addrs) > MaxAddrs {
		return fmt.Errorf("%d addresses (max %d)", len(g.Addrs), MaxAddrs)
	}
	e.b = binary.AppendUvarint(e.b, uint64(len(g.Addrs)))
	for _, a := range g.Addrs {
		if !a.IsValid() {
			return fmt.Errorf("invalid address in Addrs")
		}
		e.addr(ipOf(a))
	}
	return e.time(g.Added, "added")
}

// rec writes a stored registration in the registration wire form.
func (e *encoder) rec(r *rec) {
	e.b = binary.AppendUvarint(e.b, uint64(len(r.monName)))
	e.b = append(e.b, r.monName...)
	e.b = binary.AppendUvarint(e.b, uint64(len(r.myName)))
	e.b = append(e.b, r.myName...)
	e.b = binary.AppendUvarint(e.b, uint64(r.prog))
	e.b = binary.AppendUvarint(e.b, uint64(r.vers))
	e.b = binary.AppendUvarint(e.b, uint64(r.proc))
	e.b = append(e.b, r.priv[:]...)
	e.b = binary.AppendUvarint(e.b, uint64(len(r.node)))
	e.b = append(e.b, r.node...)
	e.addr(ip{a: r.cb, n: r.cbLen})
	n := 0
	eachAddr(r.addrs, func(ip) bool { n++; return true })
	e.b = binary.AppendUvarint(e.b, uint64(n))
	e.b = append(e.b, r.addrs...)
	e.b = binary.BigEndian.AppendUint64(e.b, uint64(r.added))
}

func (e *encoder) myID(m MyID) error {
	if err := e.str(m.MyName, MaxNameLen, "my_name"); err != nil {
		return err
	}
	e.b = binary.AppendUvarint(e.b, uint64(m.Prog))
	e.b = binary.AppendUvarint(e.b, uint64(m.Vers))
	e.b = binary.AppendUvarint(e.b, uint64(m.Proc))
	return nil
}

// owner writes a non-zero Owner (nothing for the zero one: kinds 2 and 3).
func (e *encoder) owner(o Owner) error {
	if o.IsZero() {
		return nil
	}
	if !o.Callback.IsValid() {
		return fmt.Errorf("owner %q without a callback address", o.Node)
	}
	if err := e.str(o.Node, MaxNameLen, "owner node"); err != nil {
		return err
	}
	e.addr(ipOf(o.Callback))
	return nil
}

func (e *encoder) clientName(s string) error {
	if s == "" {
		return fmt.Errorf("empty client name")
	}
	return e.str(s, MaxClientNameLen, "client name")
}

func (e *encoder) str(s string, max int, what string) error {
	if len(s) > max {
		return fmt.Errorf("%s is %d bytes (max %d)", what, len(s), max)
	}
	e.b = binary.AppendUvarint(e.b, uint64(len(s)))
	e.b = append(e.b, s...)
	return nil
}

func (e *encoder) addr(p ip) {
	e.b = append(e.b, p.n)
	e.b = append(e.b, p.a[:p.n]...)
}

func (e *encoder) time(t time.Time, what string) error {
	if !timeOK(t) {
		return fmt.Errorf("%s %v is outside the encodable range", what, t)
	}
	e.b = binary.BigEndian.AppendUint64(e.b, uint64(nanosOf(t)))
	return nil
}

// decoder reads the wire form from b with a sticky error: after the first
// failure every read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
	d.b = nil
}

func (d *decoder) u8() byte {
	if len(d.b) < 1 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) fixed(n int) []byte {
	if len(d.b) < n {
		d.fail("truncated")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated or overlong varint")
		return 0
	}
	if n > 1 && d.b[n-1] == 0 {
		d.fail("non-minimal varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.fail("value %d exceeds 32 bits", v)
		return 0
	}
	return uint32(v)
}

func (d *decoder) i32() int32 {
	u := d.uvarint() // zigzag: same bytes as binary.Varint
	v := int64(u>>1) ^ -int64(u&1)
	if v < math.MinInt32 || v > math.MaxInt32 {
		d.fail("value %d exceeds int32", v)
		return 0
	}
	return int32(v)
}

// strBytes returns the bytes of a string of at most max bytes, aliasing
// the input.
func (d *decoder) strBytes(max int, what string) []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(max) {
		d.fail("%s is %d bytes (max %d)", what, n, max)
		return nil
	}
	return d.fixed(int(n))
}

func (d *decoder) str(max int, what string) string { return string(d.strBytes(max, what)) }

// clientName reads an NFSv4 client name: 1…MaxClientNameLen bytes.
func (d *decoder) clientName() string {
	b := d.strBytes(MaxClientNameLen, "client name")
	if d.err == nil && len(b) == 0 {
		d.fail("empty client name")
	}
	return string(b)
}

func (d *decoder) addr() ip {
	var p ip
	p.n = d.u8()
	switch p.n {
	case 0:
	case 4, 16:
		copy(p.a[:], d.fixed(int(p.n)))
	default:
		d.fail("address length %d", p.n)
		return ip{}
	}
	return p
}

func (d *decoder) time() time.Time {
	b := d.fixed(8)
	if b == nil {
		return time.Time{}
	}
	return timeOf(int64(binary.BigEndian.Uint64(b)))
}

func (d *decoder) myID() MyID {
	return MyID{MyName: d.str(MaxNameLen, "my_name"), Prog: d.u32(), Vers: d.u32(), Proc: d.u32()}
}

func (d *decoder) command() Command {
	switch k := d.u8(); k {
	case kindRegister, kindRegisterGuard:
		r := d.rec(nil)
		return Register{Reg: r.registration(), Guarded: k == kindRegisterGuard}
	case kindUnregister:
		return Unregister{ID: MonID{MonName: d.str(MaxNameLen, "mon_name"), My: d.myID()}}
	case kindUnregisterAll:
		return UnregisterAll{My: d.myID()}
	case kindUnregisterOwn:
		return Unregister{ID: MonID{MonName: d.str(MaxNameLen, "mon_name"), My: d.myID()}, Owner: d.owner()}
	case kindUnregAllOwn:
		return UnregisterAll{My: d.myID(), Owner: d.owner()}
	case kindTakeover:
		return d.takeover()
	case kindTakeoverWrap:
		t := d.takeover()
		t.Wrap = true
		return t
	case kindPeerRebooted:
		return PeerRebooted{MonName: d.str(MaxNameLen, "mon_name"), From: d.addr().addr(), State: d.i32(), At: d.time()}
	case kindClientCreate:
		return ClientCreate{Name: d.clientName(), PrincHash: d.str(MaxPrincHashLen, "principal hash")}
	case kindClientRemove:
		return ClientRemove{Name: d.clientName()}
	case kindClientCheck:
		return ClientCheck{Name: d.clientName()}
	case kindGraceStart:
		return GraceStart{}
	case kindGraceDone:
		return GraceDone{}
	default:
		if c, ok := d.servingCommand(k); ok {
			return c
		}
		if c, ok := d.servicesCommand(k); ok {
			return c
		}
		if k == kindScoped {
			return d.scopedCommand()
		}
		if d.err == nil {
			d.fail("unknown command kind %d", k)
		}
		return nil
	}
}

// owner reads the owner of kinds 11 and 12: its callback address must
// not be empty (that Owner would be the zero one, kinds 2 and 3).
func (d *decoder) owner() Owner {
	node := d.str(MaxNameLen, "owner node")
	cb := d.addr()
	if d.err == nil && cb.n == 0 {
		d.fail("owner without a callback address")
	}
	return Owner{Node: node, Callback: cb.addr()}
}

func (d *decoder) takeover() Takeover {
	return Takeover{
		Node:       d.str(MaxNameLen, "node"),
		MinState:   d.i32(),
		GraceUntil: d.time(),
		Reason:     d.str(MaxReasonLen, "reason"),
		At:         d.time(),
	}
}

// rec decodes a registration into its stored form. in, if not nil,
// supplies shared strings.
func (d *decoder) rec(in *strTable) rec {
	var r rec
	mon := d.strBytes(MaxNameLen, "mon_name")
	my := d.strBytes(MaxNameLen, "my_name")
	r.prog, r.vers, r.proc = d.u32(), d.u32(), d.u32()
	copy(r.priv[:], d.fixed(16))
	node := d.strBytes(MaxNameLen, "node")
	cb := d.addr()
	r.cb, r.cbLen = cb.a, cb.n
	n := d.uvarint()
	if n > MaxAddrs {
		d.fail("%d addresses (max %d)", n, MaxAddrs)
	}
	start := d.b
	for i := uint64(0); i < n && d.err == nil; i++ {
		if p := d.addr(); p.n == 0 && d.err == nil {
			d.fail("invalid address in Addrs")
		}
	}
	packed := start[:len(start)-len(d.b)]
	if b := d.fixed(8); b != nil {
		r.added = int64(binary.BigEndian.Uint64(b))
	}
	if d.err != nil {
		return rec{}
	}
	if n > 0 {
		r.addrs = string(packed)
	}
	if in != nil {
		r.monName = in.mon(mon)
		r.myName = in.intern(my)
		r.node = in.intern(node)
	} else {
		r.monName, r.myName, r.node = string(mon), string(my), string(node)
	}
	return r
}
