package nsm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

var (
	lockd   = MyID{MyName: "nfs-server", Prog: 100021, Vers: 3, Proc: 16}
	ganesha = MyID{MyName: "ganesha", Prog: 100021, Vers: 4, Proc: 24}
	cookie  = [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	long    = strings.Repeat("a", MaxStrLen+1)
)

func mon(name string, my MyID) *Mon { return &Mon{ID: MonID{MonName: name, My: my}, Priv: cookie} }

// narrow makes 127.0.0.1 the only loopback caller trusted, so a test can
// call from 127.0.0.9 as an untrusted host; 127.0.0.8 is a configured
// trusted (remote) caller.
func narrow(c *Config) {
	c.LoopbackTrusted = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	c.Trusted = []netip.Prefix{netip.MustParsePrefix("127.0.0.8/32")}
}

// XNFS NSM SM_MON and rpc.statd's checks (PEERS.md "What rpc.statd checks").
func TestMonChecksCallerCallbackAndNames(t *testing.T) {
	garbage := oncrpc.ErrGarbageArgs
	okMon := mon("client.example.test", lockd)
	var trailing rawArgs
	{
		w := oncrpc.NewWriter(nil)
		okMon.MarshalXDR(w)
		w.Uint32(0)
		trailing = w.Bytes()
	}
	cases := []struct {
		name     string
		cfg      func(*Config)
		from     string
		args     oncrpc.Marshaler
		fail     error
		wantErr  error
		wantSucc bool
		writes   int
	}{
		{name: "lockd from loopback", args: okMon, wantSucc: true, writes: 1},
		{name: "ganesha v4 proc 24", args: mon("10.0.0.5", ganesha), wantSucc: true, writes: 1},
		{name: "untrusted loopback address", cfg: narrow, from: "127.0.0.9", args: okMon},
		{name: "configured trusted caller", cfg: narrow, from: "127.0.0.8", args: okMon, wantSucc: true, writes: 1},
		{name: "my_prog not NLM", args: mon("10.0.0.5", MyID{MyName: "x", Prog: 100003, Vers: 3, Proc: 16})},
		{name: "my_proc not callback", args: mon("10.0.0.5", MyID{MyName: "x", Prog: 100021, Vers: 3, Proc: 17})},
		{name: "any callback allowed", cfg: func(c *Config) { c.AllowAnyCallback = true },
			args: mon("10.0.0.5", MyID{MyName: "x", Prog: 200000, Vers: 1, Proc: 1}), wantSucc: true, writes: 1},
		{name: "mon_name with slash", args: mon("a/b", lockd)},
		{name: "mon_name leading dot", args: mon(".hidden", lockd)},
		{name: "empty mon_name", args: mon("", lockd)},
		{name: "empty my_name", args: mon("10.0.0.5", MyID{Prog: 100021, Vers: 3, Proc: 16})},
		{name: "my_name with slash", args: mon("10.0.0.5", MyID{MyName: "../x", Prog: 100021, Vers: 3, Proc: 16})},
		{name: "unresolvable mon_name", args: mon("nowhere.invalid", lockd)},
		{name: "1024-byte mon_name decodes", args: mon(long[:MaxStrLen], lockd)},
		{name: "registry error", args: okMon, fail: errRegistryDown, writes: 1},
		{name: "1025-byte mon_name", args: mon(long, lockd), wantErr: garbage},
		{name: "1025-byte my_name", args: mon("10.0.0.5", MyID{MyName: long, Prog: 100021}), wantErr: garbage},
		{name: "truncated", args: rawArgs{0, 0, 0, 8, 'a', 'b', 'c', 'd'}, wantErr: garbage},
		{name: "trailing bytes", args: trailing, wantErr: garbage},
		{name: "nonzero string padding", args: rawArgs{0, 0, 0, 1, 'a', 1, 0, 0}, wantErr: garbage},
	}
	for _, tc := range cases {
		for _, network := range networks {
			t.Run(tc.name+"/"+network, func(t *testing.T) {
				var cfg Config
				if tc.cfg != nil {
					tc.cfg(&cfg)
				}
				s := newNSMServer(t, cfg)
				s.reg.setFail(tc.fail)
				from := lo
				if tc.from != "" {
					from = netip.MustParseAddr(tc.from)
				}
				var res SMStatRes
				err := call(t, s.dial(t, network, from, false), ProcMon, tc.args, &res)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("err = %v, want %v", err, tc.wantErr)
					}
				} else if err != nil {
					t.Fatal(err)
				}
				want := SMStatRes{Res: StatFail, State: -1}
				if tc.wantSucc {
					want = SMStatRes{Res: StatSucc, State: 3}
				}
				if tc.wantErr == nil && res != want {
					t.Errorf("result = %+v, want %+v", res, want)
				}
				writes, regs, _ := s.reg.snapshot()
				if writes != tc.writes {
					t.Errorf("registry writes = %d, want %d", writes, tc.writes)
				}
				if tc.wantSucc && len(regs) != 1 {
					t.Errorf("registrations = %d, want 1", len(regs))
				}
			})
		}
	}
}

func TestMonStoresRegistrationWithLoopbackCallback(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	s := newNSMServer(t, Config{NodeID: "node-a", Now: func() time.Time { return now }})
	c := s.dial(t, "tcp", netip.MustParseAddr("127.0.0.5"), false)
	var res SMStatRes
	if err := call(t, c, ProcMon, mon("client.example.test", lockd), &res); err != nil {
		t.Fatal(err)
	}
	// A repeat with a new cookie replaces the first (rpc.statd).
	m2 := mon("client.example.test", lockd)
	m2.Priv[0] = 0xff
	if err := call(t, c, ProcMon, m2, &res); err != nil {
		t.Fatal(err)
	}
	_, regs, _ := s.reg.snapshot()
	got, ok := regs[fsm.MonID{MonName: "client.example.test", My: lockd.FSM()}]
	if !ok || len(regs) != 1 {
		t.Fatalf("registrations = %+v", regs)
	}
	want := fsm.Registration{
		ID:       fsm.MonID{MonName: "client.example.test", My: lockd.FSM()},
		Priv:     m2.Priv,
		Node:     "node-a",
		Callback: lo,
		Addrs:    []netip.Addr{netip.MustParseAddr("127.0.0.7"), netip.MustParseAddr("::1")},
		Added:    now,
	}
	if got.ID != want.ID || got.Priv != want.Priv || got.Node != want.Node || got.Callback != want.Callback ||
		!slices.Equal(got.Addrs, want.Addrs) || !got.Added.Equal(want.Added) {
		t.Errorf("registration = %+v\nwant %+v", got, want)
	}
}

// An IP-literal mon_name is its own address (rpc.statd: literals always
// resolve) and never reaches the resolver; any other name does, and a
// failed lookup is stat_fail.
func TestMonIPLiteralSkipsTheResolver(t *testing.T) {
	var looked []string
	s := newNSMServer(t, Config{Resolve: func(_ context.Context, name string) ([]netip.Addr, error) {
		looked = append(looked, name)
		return nil, errors.New("no lookups here")
	}})
	c := s.dial(t, "tcp", netip.MustParseAddr("127.0.0.5"), false)
	for _, tc := range []struct {
		name, addr string
		want       Res
	}{
		{"127.0.3.4", "127.0.3.4", StatSucc},
		{"::ffff:127.0.3.5", "127.0.3.5", StatSucc},
		{"client.example.test", "", StatFail},
	} {
		var res SMStatRes
		if err := call(t, c, ProcMon, mon(tc.name, lockd), &res); err != nil || res.Res != tc.want {
			t.Fatalf("SM_MON %s: %+v %v, want %v", tc.name, res, err, tc.want)
		}
		if tc.want != StatSucc {
			continue
		}
		_, regs, _ := s.reg.snapshot()
		got := regs[fsm.MonID{MonName: tc.name, My: lockd.FSM()}]
		if !slices.Equal(got.Addrs, []netip.Addr{netip.MustParseAddr(tc.addr)}) {
			t.Errorf("SM_MON %s: addresses %v, want [%s]", tc.name, got.Addrs, tc.addr)
		}
	}
	if !slices.Equal(looked, []string{"client.example.test"}) {
		t.Errorf("resolver asked for %q, want only the host name", looked)
	}
}

// A trusted remote lock manager is called back at its own address.
func TestRegistrationCallbackIsRemoteCallerAddress(t *testing.T) {
	svc, err := NewService(newMapRegistry(1), Config{NodeID: "n"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ remote, want string }{
		{"192.0.2.7:700", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:700", "192.0.2.7"},
		{"[::1]:700", "127.0.0.1"},
		{"127.0.0.9:40000", "127.0.0.1"},
	} {
		c := &oncrpc.Call{Remote: netip.MustParseAddrPort(tc.remote)}
		reg := svc.registration(c, mon("h", lockd), nil)
		if reg.Callback != netip.MustParseAddr(tc.want) {
			t.Errorf("caller %s: callback %v, want %s", tc.remote, reg.Callback, tc.want)
		}
	}
}

// XNFS NSM SM_STAT: our own state; no registration.
func TestStatReturnsOwnStateAndNeverRegisters(t *testing.T) {
	cases := []struct {
		name    string
		arg     string
		want    Res
		wantErr error
	}{
		{"monitored or not", "10.1.1.1", StatSucc, nil},
		{"empty name", "", StatFail, nil},
		{"slash", "a/b", StatFail, nil},
		{"leading dot", ".x", StatFail, nil},
		{"1025 bytes", long, 0, oncrpc.ErrGarbageArgs},
	}
	for _, tc := range cases {
		for _, network := range networks {
			t.Run(tc.name+"/"+network, func(t *testing.T) {
				s := newNSMServer(t, Config{})
				var res SMStatRes
				err := call(t, s.dial(t, network, netip.MustParseAddr("127.0.0.9"), false), ProcStat, &SMName{tc.arg}, &res)
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				if tc.wantErr == nil && res != (SMStatRes{Res: tc.want, State: 3}) {
					t.Errorf("res = %+v", res)
				}
				if w, regs, _ := s.reg.snapshot(); w != 0 || len(regs) != 0 {
					t.Errorf("writes %d registrations %d", w, len(regs))
				}
			})
		}
	}
}

// XNFS NSM SM_UNMON and SM_UNMON_ALL: trusted callers only; refusals answer
// the current state, registry errors −1.
func TestUnmonAndUnmonAll(t *testing.T) {
	cases := []struct {
		name      string
		proc      uint32
		args      oncrpc.Marshaler
		from      string
		fail      error
		wantState int32
		writes    int
		left      int // registrations left of 3
		wantErr   error
	}{
		{name: "unmon one", proc: ProcUnmon, args: &MonID{"10.0.0.1", lockd}, wantState: 3, writes: 1, left: 2},
		{name: "unmon other my_id", proc: ProcUnmon, args: &MonID{"10.0.0.2", ganesha}, wantState: 3, writes: 1, left: 3},
		{name: "unmon untrusted", proc: ProcUnmon, args: &MonID{"10.0.0.1", lockd}, from: "127.0.0.9", wantState: 3, left: 3},
		{name: "unmon bad name", proc: ProcUnmon, args: &MonID{"/etc", lockd}, wantState: 3, left: 3},
		{name: "unmon registry error", proc: ProcUnmon, args: &MonID{"10.0.0.1", lockd}, fail: errRegistryDown, wantState: -1, writes: 1, left: 3},
		{name: "unmon 1025", proc: ProcUnmon, args: &MonID{long, lockd}, wantErr: oncrpc.ErrGarbageArgs, left: 3},
		{name: "unmon_all", proc: ProcUnmonAll, args: &lockd, wantState: 3, writes: 1, left: 1},
		{name: "unmon_all untrusted", proc: ProcUnmonAll, args: &lockd, from: "127.0.0.9", wantState: 3, left: 3},
		{name: "unmon_all trusted remote", proc: ProcUnmonAll, args: &ganesha, from: "127.0.0.8", wantState: 3, writes: 1, left: 2},
		{name: "unmon_all registry error", proc: ProcUnmonAll, args: &lockd, fail: errRegistryDown, wantState: -1, writes: 1, left: 3},
		{name: "unmon_all truncated", proc: ProcUnmonAll, args: rawArgs{0, 0, 0, 2, 'a', 'b', 0, 0}, wantErr: oncrpc.ErrGarbageArgs, left: 3},
	}
	for _, tc := range cases {
		for _, network := range networks {
			t.Run(tc.name+"/"+network, func(t *testing.T) {
				s := newNSMServer(t, Config{LoopbackTrusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
					Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.8/32")}})
				c := s.dial(t, network, lo, false)
				for _, m := range []*Mon{mon("10.0.0.1", lockd), mon("10.0.0.2", lockd), mon("10.0.0.1", ganesha)} {
					var res SMStatRes
					if err := call(t, c, ProcMon, m, &res); err != nil || res.Res != StatSucc {
						t.Fatalf("SM_MON: %v %+v", err, res)
					}
				}
				s.reg.setFail(tc.fail)
				from := lo
				if tc.from != "" {
					from = netip.MustParseAddr(tc.from)
					c = s.dial(t, network, from, false)
				}
				var res SMStat
				err := call(t, c, tc.proc, tc.args, &res)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("err = %v, want %v", err, tc.wantErr)
					}
				} else if err != nil {
					t.Fatal(err)
				} else if res.State != tc.wantState {
					t.Errorf("state = %d, want %d", res.State, tc.wantState)
				}
				writes, regs, _ := s.reg.snapshot()
				if writes-3 != tc.writes || len(regs) != tc.left {
					t.Errorf("writes %d (want %d), registrations %d (want %d)", writes-3, tc.writes, len(regs), tc.left)
				}
			})
		}
	}
}

// TestUnmonWhileNotServingKeepsEveryRegistration: on a node that does not
// serve now (UnmonCounts false) — its lockd stopping with the NFS server
// unmonitors every host — SM_UNMON and SM_UNMON_ALL answer the state and
// remove nothing, counted in nsmd_unmon_kept_total; the control, the same
// calls while the node serves, removes them.
func TestUnmonWhileNotServingKeepsEveryRegistration(t *testing.T) {
	for _, serving := range []bool{false, true} {
		for _, tc := range []struct {
			name string
			proc uint32
			args oncrpc.Marshaler
			left int // of 3 when serving
		}{
			{"unmon", ProcUnmon, &MonID{"10.0.0.1", lockd}, 2},
			{"unmon_all", ProcUnmonAll, &lockd, 1},
		} {
			t.Run(fmt.Sprintf("%s/serving=%v", tc.name, serving), func(t *testing.T) {
				m := NewMetrics(nil)
				s := newNSMServer(t, Config{Metrics: m, UnmonCounts: func() bool { return serving }})
				c := s.dial(t, "tcp", lo, false)
				for _, mn := range []*Mon{mon("10.0.0.1", lockd), mon("10.0.0.2", lockd), mon("10.0.0.1", ganesha)} {
					var res SMStatRes
					if err := call(t, c, ProcMon, mn, &res); err != nil || res.Res != StatSucc {
						t.Fatalf("SM_MON: %v %+v", err, res)
					}
				}
				var res SMStat
				if err := call(t, c, tc.proc, tc.args, &res); err != nil || res.State != 3 {
					t.Fatalf("%s: %v, state %d", tc.name, err, res.State)
				}
				_, regs, _ := s.reg.snapshot()
				want, kept := tc.left, 0.0
				if !serving {
					want, kept = 3, 1
				}
				if len(regs) != want {
					t.Errorf("%d registrations left, want %d", len(regs), want)
				}
				if v := testutil.MetricValue(t, m.unmonKept); v != kept {
					t.Errorf("nsmd_unmon_kept_total = %v, want %v", v, kept)
				}
			})
		}
	}
}

// A registration belongs to the lock manager that made it: SM_UNMON and
// SM_UNMON_ALL from this node's loopback name this node and the loopback
// callback as the owner, so registrations another node's lockd made (the
// serving node's, in a cluster) are kept, and so are those of a remote
// lock manager (fsm's tests cover the remote owner).
func TestUnmonActsOnlyOnTheCallersRegistrations(t *testing.T) {
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			s := newNSMServer(t, Config{NodeID: "witness"})
			lockdCB := netip.MustParseAddr("127.0.0.1")
			remote := netip.MustParseAddr("10.0.0.50") // a remote lock manager's registration
			for i, r := range []fsm.Registration{
				{ID: fsm.MonID{MonName: "10.0.0.1", My: lockd.FSM()}, Node: "serving", Callback: lockdCB},
				{ID: fsm.MonID{MonName: "10.0.0.2", My: lockd.FSM()}, Node: "serving", Callback: lockdCB},
				{ID: fsm.MonID{MonName: "10.0.0.3", My: ganesha.FSM()}, Node: "serving", Callback: remote},
			} {
				if _, err := s.reg.Monitor(context.Background(), r); err != nil {
					t.Fatalf("registration %d: %v", i, err)
				}
			}
			c := s.dial(t, network, lo, false)
			var res SMStat
			if err := call(t, c, ProcUnmonAll, &lockd, &res); err != nil || res.State != 3 {
				t.Fatalf("SM_UNMON_ALL: %v state %d", err, res.State)
			}
			if err := call(t, c, ProcUnmon, &MonID{"10.0.0.1", lockd}, &res); err != nil || res.State != 3 {
				t.Fatalf("SM_UNMON: %v state %d", err, res.State)
			}
			if err := call(t, c, ProcUnmonAll, &ganesha, &res); err != nil || res.State != 3 {
				t.Fatalf("SM_UNMON_ALL of ganesha from loopback: %v state %d", err, res.State)
			}
			if _, regs, _ := s.reg.snapshot(); len(regs) != 3 {
				t.Fatalf("%d registrations left after this node's loopback unmonitored another node's, want 3", len(regs))
			}
		})
	}
}

// At MaxRegistrations an SM_MON that would add a registration is refused
// stat_fail and counted; a repeat (which replaces) still succeeds.
func TestMonRefusedAtTheRegistrationsCap(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	s := newNSMServer(t, Config{MaxRegistrations: 2, Metrics: m})
	c := s.dial(t, "tcp", lo, false)
	for i, tc := range []struct {
		mon  *Mon
		want Res
	}{
		{mon("10.0.0.1", lockd), StatSucc},
		{mon("10.0.0.2", lockd), StatSucc},
		{mon("10.0.0.3", lockd), StatFail}, // a third
		{mon("10.0.0.1", lockd), StatSucc}, // a repeat replaces
		{mon("10.0.0.1", ganesha), StatFail},
	} {
		var res SMStatRes
		if err := call(t, c, ProcMon, tc.mon, &res); err != nil || res.Res != tc.want {
			t.Fatalf("SM_MON %d (%s): %v %+v, want %v", i, tc.mon.ID.MonName, err, res, tc.want)
		}
	}
	if _, regs, _ := s.reg.snapshot(); len(regs) != 2 {
		t.Fatalf("%d registrations, want the cap of 2", len(regs))
	}
	if got := testutil.GatheredValue(t, reg, "nsmd_mon_refused_total", "reason", "registrations_cap"); got != 2 {
		t.Fatalf("nsmd_mon_refused_total{reason=registrations_cap} = %v, want 2", got)
	}
}

// XNFS NSM SM_SIMU_CRASH: trusted caller and a privileged source port.
func TestSimuCrashNeedsTrustedPrivilegedCaller(t *testing.T) {
	cases := []struct {
		name       string
		from       string
		privileged bool
		crashes    int
	}{
		{"privileged loopback", "127.0.0.1", true, 1},
		{"unprivileged port", "127.0.0.1", false, 0},
		{"untrusted privileged", "127.0.0.9", true, 0},
	}
	for _, tc := range cases {
		for _, network := range networks {
			t.Run(tc.name+"/"+network, func(t *testing.T) {
				s := newNSMServer(t, Config{LoopbackTrusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
				c := s.dial(t, network, netip.MustParseAddr(tc.from), tc.privileged)
				if err := call(t, c, ProcSimuCrash, nil, nil); err != nil {
					t.Fatal(err)
				}
				s.reg.mu.Lock()
				crashes, writes := s.reg.crashes, s.reg.writes
				s.reg.mu.Unlock()
				if crashes != tc.crashes || writes != tc.crashes {
					t.Errorf("crashes %d writes %d, want %d", crashes, writes, tc.crashes)
				}
			})
		}
	}
}

// XNFS NSM SM_NOTIFY and rpc.statd's acceptance rule: mon_name or sender
// address matches a monitored host and the state is new.
func TestNotifyAcceptedByNameOrAddressOnlyWhenStateIsNew(t *testing.T) {
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			now := time.Unix(1700000000, 0)
			s := newNSMServer(t, Config{Now: func() time.Time { return now }})
			c := s.dial(t, network, lo, false)
			var res SMStatRes
			// client.example.test resolves to 127.0.0.7 and ::1.
			if err := call(t, c, ProcMon, mon("client.example.test", lockd), &res); err != nil || res.Res != StatSucc {
				t.Fatalf("SM_MON: %v %+v", err, res)
			}
			steps := []struct {
				from    string
				name    string
				state   int32
				accept  bool
				comment string
			}{
				{"127.0.0.1", "client.example.test", 5, true, "by name"},
				{"127.0.0.1", "client.example.test", 5, false, "repeated state"},
				{"127.0.0.7", "renamed-client", 7, true, "by sender address"},
				{"127.0.0.7", "renamed-client", 7, false, "repeated state by address"},
				{"127.0.0.9", "stranger", 9, false, "unmonitored"},
				{"127.0.0.1", long[:MaxStrLen], 9, false, "long name unmonitored"},
			}
			for _, st := range steps {
				cl := s.dial(t, network, netip.MustParseAddr(st.from), false)
				_, _, before := s.reg.snapshot()
				if err := call(t, cl, ProcNotify, &StatChge{MonName: st.name, State: st.state}, nil); err != nil {
					t.Fatalf("%s: %v", st.comment, err)
				}
				_, _, after := s.reg.snapshot()
				if got := len(after) - len(before); (got == 1) != st.accept || got > 1 {
					t.Fatalf("%s: %d events, accept=%v", st.comment, got, st.accept)
				}
				if st.accept {
					want := fsm.PeerRebooted{MonName: st.name, From: netip.MustParseAddr(st.from), State: st.state, At: now}
					if ev := after[len(after)-1]; ev != want {
						t.Errorf("%s: event %+v, want %+v", st.comment, ev, want)
					}
				}
			}
			if err := call(t, c, ProcNotify, &StatChge{MonName: long, State: 1}, nil); !errors.Is(err, oncrpc.ErrGarbageArgs) {
				t.Errorf("1025-byte stat_chge: %v", err)
			}
		})
	}
}

// An acceptable SM_NOTIFY that cannot be committed gets no reply, so the
// peer retransmits it.
func TestNotifyNotCommittedGetsNoReply(t *testing.T) {
	s := newNSMServer(t, Config{})
	c := s.dial(t, "tcp", lo, false)
	var res SMStatRes
	if err := call(t, c, ProcMon, mon("10.9.9.9", lockd), &res); err != nil {
		t.Fatal(err)
	}
	s.reg.setFail(errRegistryDown)
	u, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "udp", Addr: s.udp, Timeout: 300 * time.Millisecond, Retransmit: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	err = u.Call(context.Background(), Program.Prog, Program.Vers, ProcNotify, &StatChge{MonName: "10.9.9.9", State: 9}, nil)
	if err == nil {
		t.Fatal("got a reply")
	}
}

func TestNullUnknownProcAndWrongVersion(t *testing.T) {
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			s := newNSMServer(t, Config{})
			c := s.dial(t, network, netip.MustParseAddr("127.0.0.9"), false)
			if err := call(t, c, ProcNull, nil, nil); err != nil {
				t.Errorf("NULL: %v", err)
			}
			if err := call(t, c, ProcNull, rawArgs{0, 0, 0, 0}, nil); !errors.Is(err, oncrpc.ErrGarbageArgs) {
				t.Errorf("NULL with args: %v", err)
			}
			if err := call(t, c, 7, nil, nil); !errors.Is(err, oncrpc.ErrProcUnavail) {
				t.Errorf("proc 7: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := c.Call(ctx, Program.Prog, 2, ProcNull, oncrpc.Void{}, nil)
			var me *oncrpc.MismatchError
			if !errors.Is(err, oncrpc.ErrProgMismatch) || !errors.As(err, &me) || me.Low != 1 || me.High != 1 {
				t.Errorf("version 2: %v", err)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	if _, err := NewService(newMapRegistry(1), Config{}); err == nil {
		t.Error("empty NodeID accepted")
	}
	if _, err := NewService(newMapRegistry(1), Config{NodeID: "n", Trusted: []netip.Prefix{{}}}); err == nil {
		t.Error("invalid prefix accepted")
	}
	if _, err := NewService(nil, Config{NodeID: "n"}); err == nil {
		t.Error("nil registry accepted")
	}
}

func TestDefaultResolve(t *testing.T) {
	got, err := DefaultResolve(context.Background(), "::ffff:10.1.2.3")
	if err != nil || len(got) != 1 || got[0] != netip.MustParseAddr("10.1.2.3") {
		t.Errorf("literal: %v %v", got, err)
	}
	in := make([]netip.Addr, 0, 40)
	for i := range 20 {
		a := netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
		in = append(in, a, a)
	}
	if out := normAddrs(in); len(out) != MaxAddrs || out[1] != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("normAddrs: %v", out)
	}
}

// SM_NOTIFY is limited before it reaches the registry: a sender that
// alternates states (each new to the registry) gets NotifyBurst of them
// committed, then none — unanswered, so a real peer retransmits — until a
// token is back; a forged notification for a monitored name from another
// address draws on the name's bucket too; another monitored host is not
// affected; and the held-back ones are counted.
func TestNotifyRateLimitedPerSenderAndPerName(t *testing.T) {
	now := time.Unix(1700000000, 0)
	reg := prometheus.NewRegistry()
	s := newNSMServer(t, Config{Now: func() time.Time { return now }, NotifyBurst: 2, NotifyEvery: 10 * time.Second, Metrics: NewMetrics(reg)})
	c := s.dial(t, "tcp", lo, false)
	for _, name := range []string{"10.0.0.1", "10.0.0.2"} {
		var res SMStatRes
		if err := call(t, c, ProcMon, mon(name, lockd), &res); err != nil || res.Res != StatSucc {
			t.Fatalf("SM_MON %s: %v %+v", name, err, res)
		}
	}
	notify := func(from, name string, state int32) error {
		w := oncrpc.NewWriter(nil)
		(&StatChge{MonName: name, State: state}).MarshalXDR(w)
		return s.svc.ServeRPC(context.Background(), &oncrpc.Call{Prog: Program.Prog, Vers: Program.Vers, Proc: ProcNotify,
			Net: "udp", Remote: netip.AddrPortFrom(netip.MustParseAddr(from), 900), Args: oncrpc.NewReader(w.Bytes())}, oncrpc.NewWriter(nil))
	}
	events := func() int { _, _, ev := s.reg.snapshot(); return len(ev) }
	// Alternating states from one sender: 2 committed, then held back.
	for i, st := range []int32{3, 5, 7, 9} {
		err := notify("127.0.0.50", "10.0.0.1", st)
		if limited := errors.Is(err, oncrpc.ErrNoReply); limited != (i >= 2) {
			t.Fatalf("notification %d: %v", i, err)
		}
	}
	if n := events(); n != 2 {
		t.Fatalf("%d committed, want 2", n)
	}
	// Another sender, same name: the name's bucket is empty too.
	if err := notify("127.0.0.51", "10.0.0.1", 11); !errors.Is(err, oncrpc.ErrNoReply) {
		t.Fatalf("same name from another sender: %v", err)
	}
	// Another monitored host, its own sender: committed.
	if err := notify("127.0.0.52", "10.0.0.2", 3); err != nil {
		t.Fatalf("another host: %v", err)
	}
	// A token back after NotifyEvery: the retransmission gets in.
	now = now.Add(10 * time.Second)
	if err := notify("127.0.0.50", "10.0.0.1", 9); err != nil {
		t.Fatalf("after a token came back: %v", err)
	}
	if n := events(); n != 4 {
		t.Fatalf("%d committed, want 4", n)
	}
	if got := testutil.GatheredValue(t, reg, "nsmd_notify_received_total", "result", "rate_limited"); got != 3 {
		t.Fatalf("rate_limited counted %v, want 3", got)
	}
}

// Refused calls are all counted, but logged at most once a minute per
// caller address, the next line saying how many were held back: an
// untrusted UDP flood does not write the journal full.
func TestRefusalsLoggedOncePerMinutePerCaller(t *testing.T) {
	var clock atomic.Int64 // Unix ns; the server reads it from its goroutines
	clock.Store(time.Unix(1700000000, 0).UnixNano())
	logs := &testutil.LockedBuffer{}
	reg := prometheus.NewRegistry()
	s := newNSMServer(t, Config{Now: func() time.Time { return time.Unix(0, clock.Load()) }, Metrics: NewMetrics(reg),
		LoopbackTrusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Logger:          slog.New(slog.NewTextHandler(logs, nil))})
	c := s.dial(t, "udp", netip.MustParseAddr("127.0.0.9"), false)
	for range 50 {
		var res SMStatRes
		if err := call(t, c, ProcMon, mon("10.0.0.1", lockd), &res); err != nil || res.Res != StatFail {
			t.Fatalf("untrusted SM_MON: %v %+v", err, res)
		}
	}
	if n := len(logs.Lines("NSM request refused")); n != 1 {
		t.Fatalf("%d refusal lines for 50 refusals within a minute, want 1", n)
	}
	if got := testutil.GatheredValue(t, reg, "nsmd_mon_refused_total", "reason", "untrusted"); got != 50 {
		t.Fatalf("refusals counted %v, want 50", got)
	}
	clock.Add(int64(time.Minute))
	var res SMStatRes
	call(t, c, ProcMon, mon("10.0.0.1", lockd), &res)
	lines := logs.Lines("NSM request refused")
	if len(lines) != 2 || !strings.Contains(lines[1], "suppressed=49") {
		t.Fatalf("refusal lines after a minute: %q, want a second with suppressed=49", lines)
	}
}

// SM_NOTIFYs forged for a monitored host's name from other addresses use
// up only the budget of notifications from elsewhere: the host's own
// notification, from its own address, is still committed. Under
// NotifyStrictSender the forged ones are ignored outright (counted as
// wrong_sender) and the host's own is committed.
func TestNotifyFromTheHostHasItsOwnBudgetAndStrictSenderIgnoresOthers(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			now := time.Unix(1700000000, 0)
			reg := prometheus.NewRegistry()
			s := newNSMServer(t, Config{Now: func() time.Time { return now }, NotifyBurst: 2, NotifyEvery: 10 * time.Second,
				NotifyStrictSender: strict, Metrics: NewMetrics(reg)})
			c := s.dial(t, "tcp", lo, false)
			var res SMStatRes
			if err := call(t, c, ProcMon, mon("10.0.0.1", lockd), &res); err != nil || res.Res != StatSucc {
				t.Fatalf("SM_MON: %v %+v", err, res)
			}
			notify := func(from string, state int32) error {
				w := oncrpc.NewWriter(nil)
				(&StatChge{MonName: "10.0.0.1", State: state}).MarshalXDR(w)
				return s.svc.ServeRPC(context.Background(), &oncrpc.Call{Prog: Program.Prog, Vers: Program.Vers, Proc: ProcNotify,
					Net: "udp", Remote: netip.AddrPortFrom(netip.MustParseAddr(from), 900), Args: oncrpc.NewReader(w.Bytes())}, oncrpc.NewWriter(nil))
			}
			events := func() int { _, _, ev := s.reg.snapshot(); return len(ev) }
			// Forgeries from four addresses (each its own sender bucket).
			for i := range 4 {
				err := notify(fmt.Sprintf("127.0.0.%d", 60+i), int32(101+2*i))
				if limited := errors.Is(err, oncrpc.ErrNoReply); limited != (!strict && i >= 2) {
					t.Fatalf("forgery %d: %v", i, err)
				}
			}
			want := 2
			if strict {
				want = 0
				if got := testutil.GatheredValue(t, reg, "nsmd_notify_received_total", "result", "wrong_sender"); got != 4 {
					t.Fatalf("wrong_sender counted %v, want 4", got)
				}
			}
			if n := events(); n != want {
				t.Fatalf("%d forgeries committed, want %d", n, want)
			}
			if err := notify("10.0.0.1", 201); err != nil {
				t.Fatalf("the host's own notification after the forgeries: %v", err)
			}
			if n := events(); n != want+1 {
				t.Fatalf("%d committed, want %d", n, want+1)
			}
		})
	}
}
