package fsm

import (
	"errors"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// XNFS (X/Open CAE "Protocols for X/Open Interworking: XNFS", chapter
// "Network Status Monitor Protocol"), SM_MON: the monitor records mon_name
// with my_id and priv; rpc.statd keys an entry by mon_name + my_id, and
// nsmd's contract (DESIGN.md) is that a repeat SM_MON replaces the old
// entry's cookie, node, callback and addresses.
func TestRegisterAddsAndRepeatReplaces(t *testing.T) {
	f := New(Options{})
	a := mkReg("client-a", lockd, "node1", "10.0.0.1")
	res := applyOK(t, f, 1, Register{Reg: a})
	if r := res[0]; r.State != 0 || r.Removed != 0 || r.Accepted || r.Matched != nil {
		t.Fatalf("result = %+v", res[0])
	}
	other := lockd
	other.Vers = 1
	b := mkReg("client-a", other, "node1", "10.0.0.1")
	applyOK(t, f, 2, Register{Reg: b})
	if f.Len() != 2 || f.Hosts() != 1 {
		t.Fatalf("Len=%d Hosts=%d, want 2 registrations of 1 host", f.Len(), f.Hosts())
	}

	a2 := mkReg("client-a", lockd, "node2", "10.0.0.9", "2001:db8::9")
	a2.Priv = [16]byte{1, 2, 3}
	a2.Callback = netip.MustParseAddr("192.0.2.7")
	applyOK(t, f, 3, Register{Reg: a2})
	if f.Len() != 2 {
		t.Fatalf("repeat SM_MON added an entry: Len=%d", f.Len())
	}
	got, ok := f.Get(a.ID)
	if !ok {
		t.Fatal("registration missing after replace")
	}
	if got.Node != "node2" || got.Priv != a2.Priv || got.Callback != a2.Callback || !slices.Equal(got.Addrs, a2.Addrs) || !got.Added.Equal(a2.Added) {
		t.Fatalf("replace kept old fields: %+v", got)
	}
	// The old address no longer matches a notify; the new one does.
	if !f.WouldAccept("x", netip.MustParseAddr("10.0.0.1"), 5) { // still in b
		t.Fatal("10.0.0.1 still belongs to the other registration")
	}
	applyOK(t, f, 4, Unregister{ID: b.ID})
	if f.WouldAccept("x", netip.MustParseAddr("10.0.0.1"), 5) {
		t.Fatal("replaced address still matches")
	}
	if !f.WouldAccept("x", netip.MustParseAddr("2001:db8::9"), 5) {
		t.Fatal("new address does not match")
	}
}

// XNFS SM_UNMON: stop monitoring mon_name for this my_id only; the
// result carries the monitor's current state. Once no registration of a
// host remains, its last-seen state is forgotten.
func TestUnregisterRemovesOnlyThatMonIDAndForgetsUnmonitoredHosts(t *testing.T) {
	other := lockd
	other.MyName = "nfs2"
	tests := []struct {
		name        string
		remove      MonID
		wantRemoved int
		wantLen     int
		wantSeen    bool
	}{
		{"exact MonID", MonID{"client-a", lockd}, 1, 1, true},
		{"unknown host", MonID{"client-z", lockd}, 0, 2, true},
		{"other proc", MonID{"client-a", MyID{"nfs1", 100021, 4, 24}}, 0, 2, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := New(Options{})
			applyOK(t, f, 1, Takeover{MinState: 7}, Register{Reg: mkReg("client-a", lockd, "n1")}, Register{Reg: mkReg("client-a", other, "n1")},
				PeerRebooted{MonName: "client-a", State: 3})
			res := applyOK(t, f, 2, Unregister{ID: tc.remove})
			if res[0].Removed != tc.wantRemoved || res[0].State != 7 {
				t.Fatalf("result %+v, want Removed=%d State=7", res[0], tc.wantRemoved)
			}
			if f.Len() != tc.wantLen {
				t.Fatalf("Len=%d want %d", f.Len(), tc.wantLen)
			}
			if _, ok := f.LastSeen("client-a"); ok != tc.wantSeen {
				t.Fatalf("LastSeen present=%v want %v", ok, tc.wantSeen)
			}
		})
	}
	t.Run("last registration forgets last-seen", func(t *testing.T) {
		f := New(Options{})
		applyOK(t, f, 1, Register{Reg: mkReg("client-a", lockd, "n1")}, PeerRebooted{MonName: "client-a", State: 3})
		applyOK(t, f, 2, Unregister{ID: MonID{"client-a", lockd}})
		if _, ok := f.LastSeen("client-a"); ok || f.Hosts() != 0 {
			t.Fatalf("last-seen kept for an unmonitored host (hosts=%d)", f.Hosts())
		}
	})
}

// XNFS SM_UNMON_ALL: stop monitoring every host for this my_id (a lock
// manager restarting); other lock managers' registrations stay.
func TestUnregisterAllRemovesEveryRegistrationOfThatLockManager(t *testing.T) {
	f := New(Options{})
	other := MyID{MyName: "nfs2", Prog: 100021, Vers: 4, Proc: 16}
	applyOK(t, f, 1,
		Register{Reg: mkReg("a", lockd, "n1", "10.0.0.1")},
		Register{Reg: mkReg("b", lockd, "n1", "10.0.0.2")},
		Register{Reg: mkReg("b", other, "n1", "10.0.0.2")},
		Register{Reg: mkReg("c", other, "n1")},
		PeerRebooted{MonName: "a", State: 1},
		PeerRebooted{MonName: "b", State: 1},
	)
	res := applyOK(t, f, 2, UnregisterAll{My: lockd})
	if res[0].Removed != 2 {
		t.Fatalf("Removed=%d want 2", res[0].Removed)
	}
	var ids []string
	for _, g := range f.Registrations(MonID{}, 0, "") {
		ids = append(ids, g.ID.MonName+"/"+g.ID.My.MyName)
	}
	if !slices.Equal(ids, []string{"b/nfs2", "c/nfs2"}) {
		t.Fatalf("left %v", ids)
	}
	if _, ok := f.LastSeen("a"); ok {
		t.Fatal("last-seen of unmonitored host a kept")
	}
	if _, ok := f.LastSeen("b"); !ok {
		t.Fatal("last-seen of still monitored host b dropped")
	}
	if f.WouldAccept("zz", netip.MustParseAddr("10.0.0.1"), 9) {
		t.Fatal("address of removed registration still matches")
	}
	if res := applyOK(t, f, 3, UnregisterAll{My: lockd}); res[0].Removed != 0 {
		t.Fatalf("second SM_UNMON_ALL removed %d", res[0].Removed)
	}
}

// A registration belongs to the lock manager that made it: lockd on the
// node that took it (loopback callback), or a trusted remote lock manager
// (its callback address, on any node). SM_UNMON and SM_UNMON_ALL with an
// Owner remove only the owner's; the zero Owner (older releases) removes
// any. Owned lists exactly what Apply would remove.
func TestUnregisterWithOwnerRemovesOnlyTheOwnersRegistrations(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	remote := netip.MustParseAddr("10.0.0.50")
	onN2 := mkReg("c", lockd, "n2")
	remoteOnN1 := mkReg("d", lockd, "n1")
	remoteOnN1.Callback = remote
	setup := func(t *testing.T) *FSM {
		f := New(Options{})
		applyOK(t, f, 1, Takeover{MinState: 5},
			Register{Reg: mkReg("a", lockd, "n1", "10.0.0.1")},
			Register{Reg: mkReg("b", lockd, "n1")},
			Register{Reg: onN2},
			Register{Reg: remoteOnN1},
		)
		return f
	}
	left := func(f *FSM) []string {
		var ids []string
		for _, g := range f.Registrations(MonID{}, 0, "") {
			ids = append(ids, g.ID.MonName+"@"+g.Node)
		}
		return ids
	}
	tests := []struct {
		name    string
		cmd     Command
		removed int
		left    []string
	}{
		{"unmon_all from another node's loopback", UnregisterAll{My: lockd, Owner: Owner{Node: "n3", Callback: lo}}, 0,
			[]string{"a@n1", "b@n1", "c@n2", "d@n1"}},
		{"unmon_all from n1's loopback", UnregisterAll{My: lockd, Owner: Owner{Node: "n1", Callback: lo}}, 2,
			[]string{"c@n2", "d@n1"}},
		{"unmon_all from the remote lock manager, on n2", UnregisterAll{My: lockd, Owner: Owner{Node: "n2", Callback: remote}}, 1,
			[]string{"a@n1", "b@n1", "c@n2"}},
		{"unmon of n2's from n1", Unregister{ID: onN2.ID, Owner: Owner{Node: "n1", Callback: lo}}, 0,
			[]string{"a@n1", "b@n1", "c@n2", "d@n1"}},
		{"unmon of n2's from n2", Unregister{ID: onN2.ID, Owner: Owner{Node: "n2", Callback: lo}}, 1,
			[]string{"a@n1", "b@n1", "d@n1"}},
		{"unmon of the remote's from n1's loopback", Unregister{ID: remoteOnN1.ID, Owner: Owner{Node: "n1", Callback: lo}}, 0,
			[]string{"a@n1", "b@n1", "c@n2", "d@n1"}},
		{"unmon of n1's by another remote", Unregister{ID: MonID{"a", lockd}, Owner: Owner{Node: "n1", Callback: netip.MustParseAddr("10.0.0.51")}}, 0,
			[]string{"a@n1", "b@n1", "c@n2", "d@n1"}},
		{"owner-less unmon_all (older releases)", UnregisterAll{My: lockd}, 4, nil},
		{"owner-less unmon", Unregister{ID: onN2.ID}, 1, []string{"a@n1", "b@n1", "d@n1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			owned := f.Owned(tc.cmd)
			res := applyOK(t, f, 2, tc.cmd)
			if res[0].Removed != tc.removed || res[0].State != 5 {
				t.Fatalf("result %+v, want Removed=%d State=5", res[0], tc.removed)
			}
			if len(owned) != tc.removed {
				t.Fatalf("Owned listed %v before the apply that removed %d", owned, tc.removed)
			}
			if got := left(f); !slices.Equal(got, tc.left) {
				t.Fatalf("left %v, want %v", got, tc.left)
			}
			for _, id := range owned {
				if _, ok := f.Get(id); ok {
					t.Fatalf("Owned listed %v, which the apply kept", id)
				}
			}
		})
	}
}

// XNFS: the state number is odd while the monitor runs and grows at every
// restart; peers drop a notification whose state they have seen. nsmd's
// Takeover picks the smallest odd number above the current one and ≥ MinState.
func TestTakeoverStateIsOddIncreasingAndHonoursMinState(t *testing.T) {
	tests := []struct {
		cur, min, want int32
	}{
		{0, 0, 1},
		{1, 0, 3},
		{3, 0, 5},
		{2, 0, 3}, // restored from an even (stopped) state
		{3, 10, 11},
		{3, 11, 11},
		{3, 4, 5},
		{11, 3, 13},
		{0, -5, 1},
		{math.MaxInt32 - 2, 0, math.MaxInt32},
		{math.MaxInt32, 0, math.MaxInt32}, // saturates without Wrap
	}
	for _, tc := range tests {
		if got := nextState(tc.cur, tc.min, false); got != tc.want {
			t.Errorf("nextState(%d, %d) = %d, want %d", tc.cur, tc.min, got, tc.want)
		}
	}
	// With Wrap, the end of the range wraps to the smallest odd state that
	// differs from the current one and from the imported server's
	// (MinState−1): every peer compares for inequality, so each sees a
	// new state; below the end Wrap changes nothing.
	wrapTests := []struct {
		cur, min, want int32
	}{
		{math.MaxInt32 - 2, 0, math.MaxInt32},
		{math.MaxInt32, 0, 1},
		{math.MaxInt32, math.MaxInt32, 1},
		{math.MaxInt32 - 1, 0, math.MaxInt32}, // even (stopped) just below the top
		{1, math.MaxInt32, math.MaxInt32},
		{math.MaxInt32, 2, 3}, // the imported server had 1
		{3, 0, 5},
	}
	for _, tc := range wrapTests {
		if got := nextState(tc.cur, tc.min, true); got != tc.want {
			t.Errorf("nextState(%d, %d, wrap) = %d, want %d", tc.cur, tc.min, got, tc.want)
		}
	}
	t.Run("wrap through Apply", func(t *testing.T) {
		f := New(Options{})
		applyOK(t, f, 1, Takeover{MinState: math.MaxInt32})
		res := applyOK(t, f, 2, Takeover{Node: "n1", Wrap: true, Reason: "leader"})
		if res[0].State != 1 || f.State() != 1 {
			t.Fatalf("state after a wrapping takeover at the top: %d (%d), want 1", res[0].State, f.State())
		}
		if lt := f.LastTakeover(); lt.Wrap || lt.Node != "n1" {
			t.Fatalf("last takeover %+v: Wrap is the command's, not the state's", lt)
		}
		if res := applyOK(t, f, 3, Takeover{Wrap: true}); res[0].State != 3 {
			t.Fatalf("next takeover: %d, want 3", res[0].State)
		}
	})
	t.Run("through Apply", func(t *testing.T) {
		f := New(Options{})
		grace := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
		at := grace.Add(-90 * time.Second)
		prev := f.State()
		for i, min := range []int32{0, 0, 10, 0, 3, 100} {
			tk := Takeover{Node: "n1", MinState: min, GraceUntil: grace.Add(time.Duration(i) * time.Second), Reason: "leader", At: at}
			res := applyOK(t, f, uint64(i+1), tk)
			s := res[0].State
			if s%2 != 1 || s <= prev || s < min || s != f.State() {
				t.Fatalf("takeover %d: state %d after %d (min %d)", i, s, prev, min)
			}
			prev = s
			if !f.GraceUntil().Equal(tk.GraceUntil) {
				t.Fatalf("grace %v want %v", f.GraceUntil(), tk.GraceUntil)
			}
			if lt := f.LastTakeover(); lt.Node != "n1" || lt.MinState != min || !lt.At.Equal(at) || lt.Reason != "leader" {
				t.Fatalf("last takeover %+v", lt)
			}
		}
		if prev != 101 {
			t.Fatalf("final state %d, want 101", prev)
		}
	})
}

// XNFS SM_NOTIFY / rpc.statd: a notification is honoured when mon_name, or
// the sender's address, matches a monitored host and the state is new for
// that host; then the lock managers that monitor it are called back.
func TestPeerRebootedAcceptance(t *testing.T) {
	setup := func(t *testing.T) *FSM {
		f := New(Options{})
		applyOK(t, f, 1,
			Takeover{MinState: 5},
			Register{Reg: mkReg("client-a", lockd, "n1", "10.0.0.1")},
			Register{Reg: mkReg("client-a", MyID{"nfs2", 100021, 4, 16}, "n2", "10.0.0.1")},
			Register{Reg: mkReg("client-b", lockd, "n1", "10.0.0.2", "2001:db8::2")},
			Register{Reg: mkReg("client-c", lockd, "n1", "10.0.0.2")}, // shares an address with b
		)
		return f
	}
	type step struct {
		ev       PeerRebooted
		accepted bool
		matched  []string // MonName/MyName
	}
	a := netip.MustParseAddr
	tests := []struct {
		name  string
		steps []step
	}{
		{"by mon_name", []step{{PeerRebooted{MonName: "client-a", State: 3}, true, []string{"client-a/nfs1", "client-a/nfs2"}}}},
		{"by sender address", []step{{PeerRebooted{MonName: "a.example.com", From: a("10.0.0.1"), State: 3}, true, []string{"client-a/nfs1", "client-a/nfs2"}}}},
		{"by IPv6 sender address", []step{{PeerRebooted{MonName: "x", From: a("2001:db8::2"), State: 3}, true, []string{"client-b/nfs1"}}}},
		{"address shared by two hosts", []step{{PeerRebooted{MonName: "x", From: a("10.0.0.2"), State: 3}, true, []string{"client-b/nfs1", "client-c/nfs1"}}}},
		{"name and address of different hosts", []step{{PeerRebooted{MonName: "client-c", From: a("10.0.0.1"), State: 3}, true, []string{"client-a/nfs1", "client-a/nfs2", "client-c/nfs1"}}}},
		{"repeated state rejected", []step{
			{PeerRebooted{MonName: "client-a", State: 3}, true, []string{"client-a/nfs1", "client-a/nfs2"}},
			{PeerRebooted{MonName: "client-a", State: 3}, false, nil},
			{PeerRebooted{MonName: "zzz", From: a("10.0.0.1"), State: 3}, false, nil},
			{PeerRebooted{MonName: "client-a", State: 5}, true, []string{"client-a/nfs1", "client-a/nfs2"}},
		}},
		{"new for one of two matched hosts", []step{
			{PeerRebooted{MonName: "client-b", State: 7}, true, []string{"client-b/nfs1"}},
			{PeerRebooted{MonName: "x", From: a("10.0.0.2"), State: 7}, true, []string{"client-b/nfs1", "client-c/nfs1"}},
			{PeerRebooted{MonName: "x", From: a("10.0.0.2"), State: 7}, false, nil},
		}},
		{"unmonitored host rejected", []step{
			{PeerRebooted{MonName: "stranger", From: a("192.0.2.1"), State: 3}, false, nil},
			{PeerRebooted{MonName: "stranger", State: 3}, false, nil},
		}},
		{"invalid sender matches by name only", []step{{PeerRebooted{MonName: "nobody", State: 1}, false, nil}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			before := f.Digest()
			for i, s := range tc.steps {
				if w := f.WouldAccept(s.ev.MonName, s.ev.From, s.ev.State); w != s.accepted {
					t.Fatalf("step %d: WouldAccept=%v want %v", i, w, s.accepted)
				}
				res := applyOK(t, f, uint64(10+i), s.ev)[0]
				var got []string
				for _, g := range res.Matched {
					got = append(got, g.ID.MonName+"/"+g.ID.My.MyName)
				}
				if res.Accepted != s.accepted || !slices.Equal(got, s.matched) || res.State != 5 {
					t.Fatalf("step %d: %+v → accepted=%v matched=%v state=%d; want %v %v 5", i, s.ev, res.Accepted, got, res.State, s.accepted, s.matched)
				}
				if s.accepted {
					for _, g := range res.Matched {
						if st, ok := f.LastSeen(g.ID.MonName); !ok || st != s.ev.State {
							t.Fatalf("step %d: LastSeen(%s)=%d,%v", i, g.ID.MonName, st, ok)
						}
					}
				}
			}
			if len(tc.steps) > 0 && !tc.steps[0].accepted && f.Digest() != before {
				t.Fatal("rejected notify changed state")
			}
			if _, ok := f.LastSeen("stranger"); ok {
				t.Fatal("unmonitored host got a last-seen entry")
			}
		})
	}
}

func TestApplyRejectsMalformedEntryAndChangesNothing(t *testing.T) {
	f := New(Options{})
	applyOK(t, f, 1, Takeover{MinState: 3}, Register{Reg: mkReg("a", lockd, "n1", "10.0.0.1")})
	before := f.Digest()
	good, _ := Encode(Register{Reg: mkReg("b", lockd, "n1")}, Unregister{ID: MonID{"a", lockd}}, Takeover{})
	for name, data := range map[string][]byte{
		"empty":          nil,
		"truncated last": good[:len(good)-1],
		"trailing byte":  append(slices.Clone(good), 0),
		"bad version":    append([]byte{9}, good[1:]...),
		"bad kind":       {1, 1, 99, 0, 0, 0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			out := f.Apply(&raft.Log{Index: 7, Type: raft.LogCommand, Data: data})
			err, ok := out.(error)
			if !ok || !errors.Is(err, ErrBadCommand) {
				t.Fatalf("Apply = %v, want an error wrapping ErrBadCommand", out)
			}
			if f.Digest() != before || f.Len() != 1 || f.State() != 3 {
				t.Fatal("malformed entry changed state")
			}
		})
	}
}

func TestApplyIgnoresNonCommandLogsAndTracksIndex(t *testing.T) {
	f := New(Options{})
	before := f.Digest()
	if out := f.Apply(&raft.Log{Index: 5, Type: raft.LogNoop}); out != nil {
		t.Fatalf("noop → %v", out)
	}
	if f.AppliedIndex() != 5 || f.Digest() != before {
		t.Fatal("noop entry changed state or did not advance the index")
	}
	applyOK(t, f, 6, Takeover{})
	if f.AppliedIndex() != 6 {
		t.Fatalf("AppliedIndex=%d", f.AppliedIndex())
	}
}

func TestObserverSeesEveryCommandInOrderAfterApply(t *testing.T) {
	type seen struct {
		index uint64
		cmd   Command
		res   Result
		state int32
	}
	var got []seen
	var f *FSM
	f = New(Options{Observer: func(i uint64, c Command, r Result) {
		got = append(got, seen{i, c, r, f.State()}) // reads must not deadlock
	}})
	cmds := []Command{Register{Reg: mkReg("a", lockd, "n1")}, Takeover{}, PeerRebooted{MonName: "a", State: 1},
		ClientCreate{Name: "c1", PrincHash: "p"}, ClientCheck{Name: "c1"}, ClientCreate{Name: "c2"}, GraceStart{}, ClientRemove{Name: "c2"}, GraceDone{}}
	applyOK(t, f, 42, cmds...)
	if len(got) != len(cmds) {
		t.Fatalf("observer called %d times for %d commands", len(got), len(cmds))
	}
	for i, s := range got {
		if !reflect.DeepEqual(s.cmd, cmds[i]) {
			t.Fatalf("observer call %d got %#v, want %#v", i, s.cmd, cmds[i])
		}
		if s.state != 1 {
			t.Fatalf("observer call %d: FSM state %d, want the state after the whole entry", i, s.state)
		}
	}
	// Results: the Check started grace and reclaimed c1; the restart in
	// grace discarded that reclaim and c2, created during grace; then
	// removing c2 found nothing.
	for i, want := range map[int]Result{4: {State: 1, Accepted: true}, 6: {State: 1, Removed: 2}, 7: {State: 1}} {
		if r := got[i].res; r.State != want.State || r.Accepted != want.Accepted || r.Removed != want.Removed {
			t.Fatalf("observer call %d (%T): result %+v, want %+v", i, got[i].cmd, r, want)
		}
	}
	for i, s := range got {
		if s.index != 42 {
			t.Fatalf("index %d", s.index)
		}
		if _, ok := s.cmd.(PeerRebooted); ok && (!s.res.Accepted || len(s.res.Matched) != 1) {
			t.Fatalf("observer result %+v", s.res)
		}
		if i == 0 && s.res.State != 0 || i > 0 && s.res.State != 1 {
			t.Fatalf("command %d result state %d", i, s.res.State)
		}
	}
}

func TestRegistrationsPagesInMonIDOrderWithFilter(t *testing.T) {
	f := New(Options{})
	var cmds []Command
	for _, h := range []string{"d", "b", "a", "c"} {
		for _, p := range []uint32{24, 16} {
			my := lockd
			my.Proc = p
			cmds = append(cmds, Register{Reg: mkReg(h, my, "n1")})
		}
	}
	applyOK(t, f, 1, cmds...)
	var all []MonID
	after := MonID{}
	for {
		page := f.Registrations(after, 3, "")
		if len(page) == 0 {
			break
		}
		for _, g := range page {
			all = append(all, g.ID)
		}
		after = page[len(page)-1].ID
	}
	if len(all) != 8 || !slices.IsSortedFunc(all, MonID.Compare) || slices.CompactFunc(slices.Clone(all), func(a, b MonID) bool { return a == b }) == nil {
		t.Fatalf("paging returned %v", all)
	}
	tests := []struct {
		after MonID
		limit int
		mon   string
		want  int
	}{
		{MonID{}, 0, "c", 2},
		{MonID{}, 1, "c", 1},
		{MonID{"c", MyID{"nfs1", 100021, 4, 16}}, 0, "c", 1},
		{MonID{"c", MyID{"nfs1", 100021, 4, 24}}, 0, "c", 0},
		{MonID{"d", lockd}, 0, "c", 0},
		{MonID{"a", lockd}, 0, "c", 2},
		{MonID{}, 0, "zz", 0},
		{MonID{}, 0, "", 8},
	}
	for _, tc := range tests {
		got := f.Registrations(tc.after, tc.limit, tc.mon)
		if len(got) != tc.want {
			t.Errorf("Registrations(%v, %d, %q) returned %d, want %d", tc.after, tc.limit, tc.mon, len(got), tc.want)
		}
		for _, g := range got {
			if tc.mon != "" && g.ID.MonName != tc.mon || g.ID.Compare(tc.after) <= 0 && tc.after != (MonID{}) {
				t.Errorf("Registrations(%v, %d, %q) returned %v", tc.after, tc.limit, tc.mon, g.ID)
			}
		}
	}
}

func TestTargetsAreDistinctHostsWithUnionOfAddrs(t *testing.T) {
	f := New(Options{})
	other := lockd
	other.MyName = "nfs2"
	applyOK(t, f, 1,
		Register{Reg: mkReg("b", lockd, "n1", "10.0.0.3", "10.0.0.1")},
		Register{Reg: mkReg("b", other, "n2", "2001:db8::1", "10.0.0.1")},
		Register{Reg: mkReg("a", lockd, "n1")},
	)
	got := f.Targets()
	want := []Target{
		{MonName: "a"},
		{MonName: "b", Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("2001:db8::1")}},
	}
	if len(got) != len(want) {
		t.Fatalf("Targets = %v", got)
	}
	for i := range want {
		if got[i].MonName != want[i].MonName || !slices.Equal(got[i].Addrs, want[i].Addrs) {
			t.Fatalf("Targets[%d] = %v, want %v", i, got[i], want[i])
		}
	}
}

// TestConcurrentReadsDuringApply is for the race detector.
func TestConcurrentReadsDuringApply(t *testing.T) {
	f := New(Options{})
	g := newGen(7)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = f.State()
				_ = f.Registrations(MonID{}, 10, "")
				_ = f.Targets()
				_ = f.WouldAccept("host01.example.net", netip.MustParseAddr("10.0.0.1"), 1)
				_ = f.Digest()
				_, _ = f.Epochs()
				_ = f.V4Clients(false)
				_ = f.V4Clients(true)
				_, _, _ = f.V4Counts()
				_, _ = f.HasV4Client("client-1")
			}
		}()
	}
	for i := 1; i <= 300; i++ {
		applyOK(t, f, uint64(i), g.batch()...)
		if i%50 == 0 {
			persist(t, f)
		}
	}
	close(stop)
	wg.Wait()
}

// SenderIsHost: an address the named host's registrations were resolved
// to, not an address of another monitored host, and not after the last
// registration naming it is gone.
func TestSenderIsHostOnlyForTheNamedHostsAddresses(t *testing.T) {
	f := New(Options{})
	applyOK(t, f, 1,
		Takeover{MinState: 5},
		Register{Reg: mkReg("client-a", lockd, "n1", "10.0.0.1")},
		Register{Reg: mkReg("client-b", lockd, "n1", "10.0.0.2", "2001:db8::2")},
	)
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name string
		from netip.Addr
		want bool
	}{
		{"client-a", a("10.0.0.1"), true},
		{"client-b", a("2001:db8::2"), true},
		{"client-a", a("10.0.0.2"), false},
		{"client-b", a("192.0.2.1"), false},
		{"stranger", a("10.0.0.1"), false},
		{"client-a", netip.Addr{}, false},
	} {
		if got := f.SenderIsHost(tc.name, tc.from); got != tc.want {
			t.Errorf("SenderIsHost(%s, %v) = %v, want %v", tc.name, tc.from, got, tc.want)
		}
	}
	applyOK(t, f, 2, Unregister{ID: MonID{MonName: "client-a", My: lockd}})
	if f.SenderIsHost("client-a", a("10.0.0.1")) {
		t.Error("SenderIsHost after the host's last registration went")
	}
}
