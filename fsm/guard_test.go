package fsm

import (
	"net/netip"
	"slices"
	"testing"
)

// A guarded Register (kind 14) replaces a registration only for the lock
// manager that made it, or for the serving node's lockd (the node of the
// last Takeover) over another node's lockd; anything else is refused and
// changes nothing. MayRegister, the check a proposer runs while the
// cluster cannot use kind 14 yet, answers what Apply then does. The
// unguarded cases are the control: kind 1 replaces whoever asks.
func TestGuardedRegisterReplacesOnlyForItsOwnerOrTheServingNode(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	remote := netip.MustParseAddr("10.0.0.50")
	by := func(mon, node string, cb netip.Addr, cookie byte) Registration {
		g := mkReg(mon, lockd, node)
		g.Callback = cb
		g.Priv[15] = cookie
		return g
	}
	setup := func(t *testing.T) *FSM {
		f := New(Options{})
		applyOK(t, f, 1, Takeover{Node: "n1", MinState: 5},
			Register{Reg: by("c1", "n1", lo, 1)},     // the serving node's lockd
			Register{Reg: by("c2", "n2", remote, 1)}, // a trusted remote lock manager, through n2
			Register{Reg: by("c3", "w", lo, 1)},      // a loopback caller on the witness
		)
		return f
	}
	tests := []struct {
		name    string
		reg     Registration
		guarded bool
		refused bool
		owner   string // node@callback of the registration afterwards
	}{
		{"the witness names the serving node's lockd", by("c1", "w", lo, 9), true, true, "n1@127.0.0.1"},
		{"the standby names the serving node's lockd", by("c1", "n2", lo, 9), true, true, "n1@127.0.0.1"},
		{"the owner re-monitors with a new cookie", by("c1", "n1", lo, 9), true, false, "n1@127.0.0.1"},
		{"the serving node's lockd over the witness's", by("c3", "n1", lo, 9), true, false, "n1@127.0.0.1"},
		{"the standby over the witness's", by("c3", "n2", lo, 9), true, true, "w@127.0.0.1"},
		{"the remote lock manager through another node", by("c2", "n3", remote, 9), true, false, "n3@10.0.0.50"},
		{"another remote lock manager", by("c2", "n2", netip.MustParseAddr("10.0.0.51"), 9), true, true, "n2@10.0.0.50"},
		{"the serving node's lockd over a remote's", by("c2", "n1", lo, 9), true, true, "n2@10.0.0.50"},
		{"a new host, from the witness", by("c4", "w", lo, 9), true, false, "w@127.0.0.1"},
		{"control: unguarded, the witness names the serving node's lockd", by("c1", "w", lo, 9), false, false, "w@127.0.0.1"},
		{"control: unguarded, over a remote's", by("c2", "n1", lo, 9), false, false, "n1@127.0.0.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			before, had := f.Get(tc.reg.ID)
			if may := f.MayRegister(tc.reg); tc.guarded && may == tc.refused {
				t.Fatalf("MayRegister = %v before an apply that refuses: %v", may, tc.refused)
			}
			res := applyOK(t, f, 2, Register{Reg: tc.reg, Guarded: tc.guarded})
			if res[0].Refused != tc.refused || res[0].State != 5 {
				t.Fatalf("result %+v, want Refused=%v State=5", res[0], tc.refused)
			}
			got, ok := f.Get(tc.reg.ID)
			if !ok {
				t.Fatal("registration gone")
			}
			if o := got.Node + "@" + got.Callback.String(); o != tc.owner {
				t.Fatalf("owner %s, want %s", o, tc.owner)
			}
			if tc.refused {
				if !had || got.Priv != before.Priv || got.Node != before.Node {
					t.Fatalf("a refused Register changed %+v into %+v", before, got)
				}
			} else if got.Priv != tc.reg.Priv {
				t.Fatalf("cookie %x, want the new %x", got.Priv, tc.reg.Priv)
			}
		})
	}
}

// The serving node is the node of the last Takeover: after a failover the
// new server's lockd takes over a host the old server's lockd registered
// (same my_name: the callback must reach the lockd that holds the locks
// now), and the old server can no longer take it back.
func TestGuardedRegisterFollowsTheServingNodeAcrossTakeovers(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	f := New(Options{})
	applyOK(t, f, 1, Takeover{Node: "n1"}, Register{Reg: mkReg("c", lockd, "n1"), Guarded: true})
	if res := applyOK(t, f, 2, Register{Reg: mkReg("c", lockd, "n2"), Guarded: true}); !res[0].Refused {
		t.Fatal("the standby took the serving node's registration")
	}
	applyOK(t, f, 3, Takeover{Node: "n2"})
	if res := applyOK(t, f, 4, Register{Reg: mkReg("c", lockd, "n2"), Guarded: true}); res[0].Refused {
		t.Fatal("the new serving node's lockd could not re-monitor the host")
	}
	if g, _ := f.Get(MonID{"c", lockd}); g.Node != "n2" || g.Callback != lo {
		t.Fatalf("owner %s@%s, want n2's lockd", g.Node, g.Callback)
	}
	if res := applyOK(t, f, 5, Register{Reg: mkReg("c", lockd, "n1"), Guarded: true}); !res[0].Refused {
		t.Fatal("the old server took the registration back while another serves")
	}
}

// The attack, on the real FSM: SM_MONs naming the serving node's lockd
// from another member, then that member's SM_UNMON_ALL. Guarded, every
// registration is left; unguarded (the releases before kind 14), none.
func TestStealingRegistrationsThroughSMMonRemovesNothing(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	hosts := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}
	for _, guarded := range []bool{true, false} {
		f := New(Options{})
		idx := uint64(1)
		applyOK(t, f, idx, Takeover{Node: "n1"})
		for _, h := range hosts {
			idx++
			applyOK(t, f, idx, Register{Reg: mkReg(h, lockd, "n1", h), Guarded: true})
		}
		for _, attacker := range []string{"w", "n2"} {
			for _, h := range hosts {
				idx++
				applyOK(t, f, idx, Register{Reg: mkReg(h, lockd, attacker, h), Guarded: guarded})
			}
			idx++
			applyOK(t, f, idx, UnregisterAll{My: lockd, Owner: Owner{Node: attacker, Callback: lo}})
		}
		var left []string
		for _, g := range f.Registrations(MonID{}, 0, "") {
			if g.Node == "n1" {
				left = append(left, g.ID.MonName)
			}
		}
		if guarded && !slices.Equal(left, hosts) {
			t.Fatalf("guarded: n1's registrations left %v, want %v", left, hosts)
		}
		if !guarded && len(left) != 0 {
			t.Fatalf("control (unguarded): %v left, want none (the attack must work without the guard)", left)
		}
	}
}
