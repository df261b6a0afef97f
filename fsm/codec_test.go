package fsm

import (
	"bytes"
	"errors"
	"math"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sampleCommands() []Command {
	full := mkReg("client.example.com", lockd, "node-1", "10.1.2.3", "2001:db8::7", "::ffff:10.9.9.9")
	full.Priv = [16]byte{0xde, 0xad, 0xbe, 0xef, 15: 0xff}
	bare := Registration{ID: MonID{MonName: "h"}}
	return []Command{
		Register{Reg: full},
		Register{Reg: bare},
		Register{Reg: full, Guarded: true},
		Unregister{ID: full.ID},
		UnregisterAll{My: MyID{MyName: strings.Repeat("m", MaxNameLen), Prog: 1<<32 - 1}},
		Unregister{ID: full.ID, Owner: Owner{Node: "node-1", Callback: netip.MustParseAddr("127.0.0.1")}},
		UnregisterAll{My: lockd, Owner: Owner{Node: strings.Repeat("n", MaxNameLen), Callback: netip.MustParseAddr("2001:db8::5")}},
		UnregisterAll{My: lockd, Owner: Owner{Callback: netip.MustParseAddr("192.0.2.1")}},
		Takeover{Node: "n", MinState: -3, GraceUntil: time.Date(2262, 1, 1, 0, 0, 0, 1, time.UTC), Reason: strings.Repeat("r", MaxReasonLen), At: time.Unix(1, 0)},
		Takeover{},
		Takeover{Node: "n", MinState: 7, Reason: "leader_elected", At: time.Unix(2, 0), Wrap: true},
		PeerRebooted{MonName: "client.example.com", From: netip.MustParseAddr("10.1.2.3"), State: 1 << 30, At: time.Date(1700, 1, 1, 0, 0, 0, 0, time.FixedZone("x", 3600))},
		PeerRebooted{State: -1},
		ClientCreate{Name: "Linux NFSv4.2 client.example.com\x00\xff", PrincHash: strings.Repeat("\xab", MaxPrincHashLen)},
		ClientCreate{Name: strings.Repeat("c", MaxClientNameLen)},
		ClientRemove{Name: "c"},
		ClientCheck{Name: "\x00"},
		GraceStart{},
		GraceDone{},
		ServingBegin{Node: "s1", NSMAddr: "192.0.2.1:1011", Promise: Promise{Mode: FenceWatchdog, WatchdogTimeout: 8 * time.Second, Lease: 2500 * time.Millisecond, HookTimeout: time.Minute, Margin: 2 * time.Second}, At: time.Unix(3, 0).UTC()},
		ServingBegin{Node: strings.Repeat("s", MaxNameLen), Promise: Promise{Mode: FenceOff}},
		ServingBegin{Node: "s2", Promise: Promise{Mode: FenceAgent, HookTimeout: MaxPromiseDuration}},
		ServingEnd{Node: "s1", At: time.Unix(4, 0).UTC()},
		FenceConfirm{Node: "s2", By: "admin 192.0.2.9 (operator certificate)", At: time.Unix(5, 0).UTC()},
		ServicesDeclared{Node: "s1", Services: []ServiceDecl{{ID: "home", Fingerprint: "832063574c84a0fe", Prefer: []string{"s2", strings.Repeat("p", MaxNameLen)}}, {ID: strings.Repeat("x", MaxServiceIDLen), Fingerprint: strings.Repeat("f", MaxFingerprintLen)}}},
		ServicesDeclared{Node: "s2"},
		ServicePlaced{Service: "home", Node: "s1", Epoch: 1, Reason: "placed", At: time.Unix(6, 0).UTC()},
		ServicePlaced{Service: "home", Epoch: 1 << 63, Reason: strings.Repeat("r", MaxReasonLen), From: strings.Repeat("n", MaxNameLen)},
		ServiceForgotten{Service: "home", Epoch: 2},
		Scoped{Service: "home", Node: "s1", Epoch: 1, Cmd: Register{Reg: full, Guarded: true}},
		Scoped{Service: "home", Node: "s1", Epoch: 1, Cmd: ClientCreate{Name: "c", PrincHash: "p"}},
		Scoped{Service: "home", Node: "s2", Epoch: 1, Cmd: ClientRemove{Name: "c"}},
		Scoped{Service: strings.Repeat("x", MaxServiceIDLen), Node: strings.Repeat("n", MaxNameLen), Epoch: math.MaxUint64,
			Cmd: UnregisterAll{My: lockd, Owner: Owner{Node: "s1", Callback: netip.MustParseAddr("::1")}}},
	}
}

// equalCommands compares commands, times with time.Time.Equal.
func equalCommands(t *testing.T, got, want []Command) {
	t.Helper()
	var norm func(c Command) Command
	norm = func(c Command) Command {
		switch c := c.(type) {
		case Scoped:
			c.Cmd = norm(c.Cmd)
			return c
		case Register:
			c.Reg.Added = c.Reg.Added.UTC()
			if len(c.Reg.Addrs) == 0 {
				c.Reg.Addrs = nil
			}
			return c
		case Takeover:
			c.GraceUntil, c.At = c.GraceUntil.UTC(), c.At.UTC()
			return c
		case PeerRebooted:
			c.At = c.At.UTC()
			return c
		}
		return c
	}
	if len(got) != len(want) {
		t.Fatalf("decoded %d commands, want %d", len(got), len(want))
	}
	for i := range want {
		if g, w := norm(got[i]), norm(want[i]); !reflect.DeepEqual(g, w) {
			t.Fatalf("command %d:\n got %#v\nwant %#v", i, g, w)
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	cmds := sampleCommands()
	b, err := Encode(cmds...)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	equalCommands(t, got, cmds)
	b2, err := Encode(got...)
	if err != nil || !bytes.Equal(b, b2) {
		t.Fatalf("re-encoding differs (%v)", err)
	}
	for _, c := range cmds {
		one, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(one)
		if err != nil {
			t.Fatalf("%T: %v", c, err)
		}
		equalCommands(t, got, []Command{c})
	}
	// decodeApply sizes its registrations by the shortest one's length.
	if b, err := Encode(Register{}); err != nil || len(b)-2 != minRegisterLen {
		t.Fatalf("shortest Register is %d bytes (%v), minRegisterLen is %d", len(b)-2, err, minRegisterLen)
	}
	// Zero time ↔ 0, and decoded times are UTC.
	b, _ = Encode(Takeover{})
	got, _ = Decode(b)
	if tk := got[0].(Takeover); !tk.At.IsZero() || !tk.GraceUntil.IsZero() {
		t.Fatalf("zero times decoded as %v %v", tk.At, tk.GraceUntil)
	}
	local := time.Date(2026, 3, 4, 5, 6, 7, 8, time.FixedZone("CET", 3600))
	b, _ = Encode(PeerRebooted{At: local})
	got, _ = Decode(b)
	if at := got[0].(PeerRebooted).At; !at.Equal(local) || at.Location() != time.UTC {
		t.Fatalf("time %v (%v)", at, at.Location())
	}
}

// An Unregister or UnregisterAll without an Owner keeps the bytes of the
// releases before owners (kinds 2 and 3), which every member applies;
// with one it is kind 11 or 12, and an owner without a callback address
// is refused both ways.
func TestOwnerKindsAndTheOwnerlessEncoding(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		c    Command
		kind byte
	}{
		{Unregister{ID: MonID{"h", lockd}}, kindUnregister},
		{UnregisterAll{My: lockd}, kindUnregisterAll},
		{Unregister{ID: MonID{"h", lockd}, Owner: Owner{Node: "n1", Callback: lo}}, kindUnregisterOwn},
		{UnregisterAll{My: lockd, Owner: Owner{Node: "n1", Callback: lo}}, kindUnregAllOwn},
		{Takeover{Node: "n1"}, kindTakeover},
		{Takeover{Node: "n1", Wrap: true}, kindTakeoverWrap},
		{Register{Reg: mkReg("h", lockd, "n1")}, kindRegister},
		{Register{Reg: mkReg("h", lockd, "n1"), Guarded: true}, kindRegisterGuard},
	} {
		b, err := Encode(tc.c)
		if err != nil {
			t.Fatalf("%+v: %v", tc.c, err)
		}
		if b[2] != tc.kind {
			t.Fatalf("%+v encoded as kind %d, want %d", tc.c, b[2], tc.kind)
		}
	}
	// Version-1 bytes of an owner-less SM_UNMON_ALL, as older releases wrote them.
	b, _ := Encode(UnregisterAll{My: MyID{MyName: "a", Prog: 1, Vers: 2, Proc: 3}})
	if want := []byte{1, 1, kindUnregisterAll, 1, 'a', 1, 2, 3}; !bytes.Equal(b, want) {
		t.Fatalf("owner-less UnregisterAll = %x, want %x", b, want)
	}
	if _, err := Encode(UnregisterAll{My: lockd, Owner: Owner{Node: "n1"}}); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("owner without callback encoded: %v", err)
	}
	// kind 12, my_id "a" 1 2 3, owner node "n", empty callback.
	if _, err := Decode([]byte{1, 1, kindUnregAllOwn, 1, 'a', 1, 2, 3, 1, 'n', 0}); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("owner without callback decoded: %v", err)
	}
}

func TestEncodeRefusesWhatDecodeWouldReject(t *testing.T) {
	many := make([]netip.Addr, MaxAddrs+1)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
	}
	long := strings.Repeat("x", MaxNameLen+1)
	tests := map[string][]Command{
		"empty batch":          nil,
		"nil command":          {nil},
		"long mon_name":        {Register{Reg: Registration{ID: MonID{MonName: long}}}},
		"long my_name":         {UnregisterAll{My: MyID{MyName: long}}},
		"long node":            {Takeover{Node: long}},
		"long reason":          {Takeover{Reason: strings.Repeat("r", MaxReasonLen+1)}},
		"too many addrs":       {Register{Reg: Registration{Addrs: many}}},
		"invalid addr":         {Register{Reg: Registration{Addrs: []netip.Addr{{}}}}},
		"time out of range":    {PeerRebooted{At: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}},
		"create: empty name":   {ClientCreate{PrincHash: "p"}},
		"create: long name":    {ClientCreate{Name: strings.Repeat("c", MaxClientNameLen+1)}},
		"create: long princ":   {ClientCreate{Name: "c", PrincHash: strings.Repeat("p", MaxPrincHashLen+1)}},
		"remove: empty name":   {ClientRemove{}},
		"remove: long name":    {ClientRemove{Name: strings.Repeat("c", MaxClientNameLen+1)}},
		"check: empty name":    {ClientCheck{}},
		"check: long name":     {ClientCheck{Name: strings.Repeat("c", MaxClientNameLen+1)}},
		"bad one among good":   {GraceStart{}, ClientCreate{Name: "a"}, ClientRemove{}, GraceDone{}},
		"pointer to a command": {&GraceStart{}},
	}
	for name, cmds := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := Encode(cmds...); !errors.Is(err, ErrBadCommand) {
				t.Fatalf("Encode error %v, want ErrBadCommand", err)
			}
		})
	}
	if _, err := Encode(make([]Command, MaxBatch+1)...); !errors.Is(err, ErrBadCommand) {
		t.Fatal("oversized batch accepted")
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	good, _ := Encode(sampleCommands()...)
	reg, _ := Encode(Register{Reg: mkReg("h", lockd, "n", "10.0.0.1")})
	tests := map[string][]byte{
		"empty":                  {},
		"version only":           {1},
		"unknown version":        {2, 1, 3, 0, 0, 0, 0},
		"zero count":             {1, 0},
		"count beyond data":      {1, 2, 3, 0, 0, 0, 0},
		"count beyond MaxBatch":  {1, 0x81, 0x80, 0x04, 3, 0, 0, 0, 0},
		"non-minimal varint":     {1, 0x81, 0x00, 3, 0, 0, 0, 0},
		"overlong varint":        {1, 1, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"unknown kind":           {1, 1, 11, 0, 0, 0, 0},
		"kind 0":                 {1, 1, 0},
		"create: empty name":     {1, 1, 6, 0, 0},
		"create: no princ":       {1, 1, 6, 1, 'a'},
		"create: princ of 33":    append([]byte{1, 1, 6, 1, 'a', 33}, make([]byte, 33)...),
		"create: name of 1025":   append([]byte{1, 1, 6, 0x81, 0x08}, make([]byte, 1025+1)...),
		"create: princ beyond":   {1, 1, 6, 1, 'a', 2, 'p'},
		"remove: empty name":     {1, 1, 7, 0},
		"remove: name beyond":    {1, 1, 7, 2, 'a'},
		"check: empty name":      {1, 1, 8, 0},
		"check: no name":         {1, 1, 8},
		"grace start: trailing":  {1, 1, 9, 0},
		"grace done: one short":  {1, 2, 10},
		"v4 batch, bad last":     {1, 3, 9, 6, 1, 'a', 0, 7, 0},
		"prog beyond 32 bits":    {1, 1, 3, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0},
		"string beyond data":     {1, 1, 3, 5, 'a', 0, 0, 0},
		"mon_name beyond 1024":   append([]byte{1, 1, 2, 0x81, 0x08}, make([]byte, 1025+4)...),
		"bad address length":     {1, 1, 5, 0, 5, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"state beyond int32":     {1, 1, 5, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0, 0, 0, 0, 0, 0},
		"trailing bytes":         append(append([]byte{}, good...), 0),
		"truncated":              good[:len(good)-3],
		"addr count beyond 16":   bytes.Replace(reg, []byte{1, 4, 10, 0, 0, 1}, []byte{17, 4, 10, 0, 0, 1}, 1),
		"invalid address in set": bytes.Replace(reg, []byte{1, 4, 10, 0, 0, 1}, []byte{1, 0, 10, 0, 0, 1}, 1),
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			cmds, err := Decode(b)
			if !errors.Is(err, ErrBadCommand) || cmds != nil {
				t.Fatalf("Decode = %v, %v; want ErrBadCommand", cmds, err)
			}
			if cmds, _, _, err := decodeApply(b, newStrTable()); !errors.Is(err, ErrBadCommand) || cmds != nil {
				t.Fatalf("decodeApply = %v, %v; want ErrBadCommand", cmds, err)
			}
		})
	}
	if _, err := Decode([]byte{2, 1}); !errors.Is(err, ErrVersion) {
		t.Fatalf("unknown version: %v, want ErrVersion too", err)
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to
// the same bytes (the format is canonical) and applies without panicking.
// decodeApply (Apply's decoder) accepts exactly the same entries and yields
// the same commands.
func FuzzDecode(f *testing.F) {
	for _, c := range sampleCommands() {
		b, _ := Encode(c)
		f.Add(b)
	}
	b, _ := Encode(sampleCommands()...)
	f.Add(b)
	f.Add([]byte{1, 1, 3, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		cmds, err := Decode(b)
		acmds, regs, guarded, aerr := decodeApply(b, newStrTable())
		if (err == nil) != (aerr == nil) {
			t.Fatalf("Decode error %v but decodeApply error %v", err, aerr)
		}
		if err != nil {
			if !errors.Is(err, ErrBadCommand) {
				t.Fatalf("error %v does not wrap ErrBadCommand", err)
			}
			return
		}
		k := 0
		for i := range acmds {
			if acmds[i] == nil {
				if k >= len(regs) {
					t.Fatalf("decodeApply: %d registrations for more nil commands", len(regs))
				}
				acmds[i] = Register{Reg: regs[k].registration(), Guarded: guarded[k]}
				k++
			}
		}
		if k != len(regs) || len(guarded) != len(regs) {
			t.Fatalf("decodeApply: %d registrations for %d nil commands", len(regs), k)
		}
		if a, err := Encode(acmds...); err != nil || !bytes.Equal(a, b) {
			t.Fatalf("decodeApply's commands re-encode differently (%v):\n in %x\nout %x", err, b, a)
		}
		again, err := Encode(cmds...)
		if err != nil {
			t.Fatalf("decoded commands do not re-encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, again)
		}
		f := New(Options{})
		res := applyOK(t, f, 1, cmds...)
		for i, r := range res {
			switch c := cmds[i].(type) {
			case ServicePlaced, ServiceForgotten, ServiceReleased:
				if r.Refused != (r.Refusal != nil) {
					t.Fatalf("command %d (%T): Refused %v with Refusal %v", i, c, r.Refused, r.Refusal)
				}
			case Scoped:
				// Refused with a reason (no placement, a stale run), or
				// without one only as a guarded Register is.
				reg, guarded := c.Cmd.(Register)
				if r.Refusal != nil && !r.Refused || r.Refused && r.Refusal == nil && !(guarded && reg.Guarded) {
					t.Fatalf("command %d (scoped %T): Refused %v with Refusal %v", i, c.Cmd, r.Refused, r.Refusal)
				}
			case Register:
				if r.Refused && !c.Guarded {
					t.Fatalf("command %d: an unguarded Register refused", i)
				}
			default:
				if r.Refused || r.Refusal != nil {
					t.Fatalf("command %d (%T) refused: only a guarded Register, a placement or a forget is", i, c)
				}
			}
		}
		checkV4Invariants(t, f)
	})
}
