package fsm

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// applyOK encodes cmds as one entry, applies it at index (raft term 0)
// and returns the results.
func applyOK(t testing.TB, f *FSM, index uint64, cmds ...Command) []Result {
	t.Helper()
	return applyTermOK(t, f, index, 0, cmds...)
}

// applyTermOK is applyOK for an entry of raft term term.
func applyTermOK(t testing.TB, f *FSM, index, term uint64, cmds ...Command) []Result {
	t.Helper()
	b, err := Encode(cmds...)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	out := f.Apply(&raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: b})
	res, ok := out.([]Result)
	if !ok {
		t.Fatalf("Apply returned %T (%v), want []Result", out, out)
	}
	if len(res) != len(cmds) {
		t.Fatalf("Apply returned %d results for %d commands", len(res), len(cmds))
	}
	return res
}

var lockd = MyID{MyName: "nfs1", Prog: 100021, Vers: 4, Proc: 16}

func mkReg(mon string, my MyID, node string, addrs ...string) Registration {
	g := Registration{
		ID:       MonID{MonName: mon, My: my},
		Node:     node,
		Callback: netip.MustParseAddr("127.0.0.1"),
		Added:    time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
	}
	copy(g.Priv[:], mon+"/"+node)
	for _, a := range addrs {
		g.Addrs = append(g.Addrs, netip.MustParseAddr(a))
	}
	return g
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
	closed, cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

func persist(t testing.TB, f *FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer snap.Release()
	var s memSink
	if err := snap.Persist(&s); err != nil {
		t.Fatalf("Persist: %v", err)
	}
	if !s.closed || s.cancelled {
		t.Fatalf("sink closed=%v cancelled=%v", s.closed, s.cancelled)
	}
	return s.Bytes()
}

func restoreFrom(f *FSM, b []byte) error {
	return f.Restore(io.NopCloser(bytes.NewReader(b)))
}

// gen produces a random but valid command stream over small pools of
// hosts, addresses and lock managers, so that commands collide often.
type gen struct {
	r     *rand.Rand
	state int32
	svc   *svcModel // the placement state, if every command drawn is applied
}

func newGen(seed uint64) *gen {
	return &gen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), svc: newSvcModel()}
}

func (g *gen) host() string { return fmt.Sprintf("host%02d.example.net", g.r.IntN(40)) }
func (g *gen) addr() netip.Addr {
	if g.r.IntN(4) == 0 {
		return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(g.r.IntN(20))})
	}
	return netip.AddrFrom4([4]byte{10, 0, 0, byte(g.r.IntN(30))})
}
func (g *gen) my() MyID {
	return MyID{MyName: fmt.Sprintf("lockd%d", g.r.IntN(3)), Prog: 100021, Vers: uint32(1 + g.r.IntN(2)*3), Proc: 16}
}
func (g *gen) when() time.Time {
	return time.Unix(1_800_000_000+int64(g.r.IntN(1000)), int64(g.r.IntN(1e9))).UTC()
}

// command draws a command: NSM commands five times in six, NFSv4
// client-tracking commands (v4Command) otherwise.
func (g *gen) command() Command {
	switch n := g.r.IntN(140); {
	case n >= 130:
		c := servicesCommand(g.r)
		if g.r.IntN(2) == 0 {
			c = g.svc.valid(g.r)
		}
		g.svc.apply(c)
		return c
	case n >= 120:
		return servingCommand(g.r)
	case n >= 100:
		return v4Command(g.r)
	case n < 50:
		reg := Registration{
			ID:       MonID{MonName: g.host(), My: g.my()},
			Node:     fmt.Sprintf("node%d", g.r.IntN(3)),
			Callback: netip.AddrFrom4([4]byte{127, 0, 0, 1}),
			Added:    g.when(),
		}
		for i := g.r.IntN(3); i > 0; i-- {
			reg.Addrs = append(reg.Addrs, g.addr())
		}
		for i := range reg.Priv {
			reg.Priv[i] = byte(g.r.Uint32())
		}
		return Register{Reg: reg, Guarded: g.r.IntN(2) == 0}
	case n < 65:
		return Unregister{ID: MonID{MonName: g.host(), My: g.my()}}
	case n < 68:
		return UnregisterAll{My: g.my()}
	case n < 73:
		return Takeover{Node: "node0", MinState: int32(g.r.IntN(40)), GraceUntil: g.when(), Reason: "test", At: g.when()}
	default:
		ev := PeerRebooted{MonName: g.host(), State: int32(g.r.IntN(4)), At: g.when()}
		if g.r.IntN(2) == 0 {
			ev.MonName = "unknown-name"
			ev.From = g.addr()
		}
		return ev
	}
}

func (g *gen) batch() []Command {
	cmds := make([]Command, 1+g.r.IntN(8))
	for i := range cmds {
		cmds[i] = g.command()
	}
	return cmds
}
