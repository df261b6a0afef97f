package nsm

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

// fsmRegistry is a Registry over the real state machine, as one node of a
// cluster sees it: every Service built over one (each with its node's
// NodeID) shares the FSM, as the members share the replicated state. It
// proposes SM_MON guarded (what the cluster does once every member
// applies kind 14), or unguarded with guarded false (the releases before).
type fsmRegistry struct {
	mu      sync.Mutex
	f       *fsm.FSM
	idx     uint64
	guarded bool
}

func newFSMRegistry(t testing.TB, serving string, guarded bool) *fsmRegistry {
	r := &fsmRegistry{f: fsm.New(fsm.Options{}), guarded: guarded}
	r.apply(t, fsm.Takeover{Node: serving})
	return r
}

func (r *fsmRegistry) apply(t testing.TB, cmd fsm.Command) fsm.Result {
	res, err := r.commit(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (r *fsmRegistry) commit(cmd fsm.Command) (fsm.Result, error) {
	b, err := fsm.Encode(cmd)
	if err != nil {
		return fsm.Result{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.idx++
	out := r.f.Apply(&raft.Log{Index: r.idx, Term: 1, Type: raft.LogCommand, Data: b})
	if err, ok := out.(error); ok {
		return fsm.Result{}, err
	}
	return out.([]fsm.Result)[0], nil
}

func (r *fsmRegistry) Monitor(_ context.Context, reg fsm.Registration) (int32, error) {
	res, err := r.commit(fsm.Register{Reg: reg, Guarded: r.guarded})
	if err == nil && res.Refused {
		err = fmt.Errorf("test registry: %w", fsm.ErrOwnedElsewhere)
	}
	return res.State, err
}

func (r *fsmRegistry) Unmonitor(_ context.Context, id fsm.MonID, owner fsm.Owner) (int32, error) {
	res, err := r.commit(fsm.Unregister{ID: id, Owner: owner})
	return res.State, err
}

func (r *fsmRegistry) UnmonitorAll(_ context.Context, my fsm.MyID, owner fsm.Owner) (int32, error) {
	res, err := r.commit(fsm.UnregisterAll{My: my, Owner: owner})
	return res.State, err
}

func (r *fsmRegistry) SimuCrash(context.Context) error { return nil }
func (r *fsmRegistry) PeerRebooted(_ context.Context, ev fsm.PeerRebooted) error {
	_, err := r.commit(ev)
	return err
}
func (r *fsmRegistry) State() int32                             { return r.f.State() }
func (r *fsmRegistry) ReadState(context.Context) (int32, error) { return r.f.State(), nil }
func (r *fsmRegistry) Ready() bool                              { return true }
func (r *fsmRegistry) Monitored(name string) bool {
	return len(r.f.Registrations(fsm.MonID{}, 1, name)) > 0
}
func (r *fsmRegistry) WouldAccept(n string, a netip.Addr, s int32) bool {
	return r.f.WouldAccept(n, a, s)
}

// serveNode serves a Service of node id over the shared registry.
func serveNode(t testing.TB, reg Registry, id string, cfg Config) *nsmServer {
	t.Helper()
	cfg.NodeID = id
	if cfg.Resolve == nil {
		cfg.Resolve = testResolve
	}
	svc, err := NewService(reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &nsmServer{svc: svc}
	s.tcp, s.udp = serveRPC(t, oncrpc.Programs{Program: svc}, loStr+":0")
	return s
}

// The attack of a local user on another member, through the NSM service:
// SM_MON naming the serving node's lockd for each of its clients (from
// the witness and from the standby), then SM_UNMON_ALL there. Every
// registration of the serving node's lockd is left, with its cookie, and
// each SM_MON is answered stat_fail and counted as owned_elsewhere. The
// control (SM_MON unguarded, as before kind 14) loses every one.
func TestMonFromAnotherMemberCannotTakeTheServingNodesRegistrations(t *testing.T) {
	hosts := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	for _, guarded := range []bool{true, false} {
		t.Run(fmt.Sprintf("guarded=%v", guarded), func(t *testing.T) {
			reg := newFSMRegistry(t, "n1", guarded)
			prom := prometheus.NewRegistry()
			m := NewMetrics(prom)
			serving := serveNode(t, reg, "n1", Config{})
			lockdConn := serving.dial(t, "tcp", lo, true)
			for _, h := range hosts {
				var res SMStatRes
				if err := call(t, lockdConn, ProcMon, mon(h, lockd), &res); err != nil || res.Res != StatSucc {
					t.Fatalf("lockd's SM_MON %s: %v %+v", h, err, res)
				}
			}
			for _, id := range []string{"witness", "n2"} {
				other := serveNode(t, reg, id, Config{Metrics: m})
				for _, network := range networks {
					c := other.dial(t, network, lo, false)
					for _, h := range hosts {
						stolen := mon(h, lockd)
						stolen.Priv = [16]byte{15: 0xee}
						var res SMStatRes
						if err := call(t, c, ProcMon, stolen, &res); err != nil {
							t.Fatal(err)
						}
						if want := map[bool]Res{true: StatFail, false: StatSucc}[guarded]; res.Res != want {
							t.Fatalf("%s/%s SM_MON %s: %+v, want %v", id, network, h, res, want)
						}
					}
					var st SMStat
					if err := call(t, c, ProcUnmonAll, &lockd, &st); err != nil {
						t.Fatal(err)
					}
				}
			}
			left := 0
			for _, g := range reg.f.Registrations(fsm.MonID{}, 0, "") {
				if g.Node == "n1" && g.Priv == cookie {
					left++
				}
			}
			refused := testutil.GatheredValue(t, prom, "nsmd_mon_refused_total", "reason", "owned_elsewhere")
			if guarded && (left != len(hosts) || refused != float64(4*len(hosts))) {
				t.Fatalf("%d of %d registrations left with n1's cookie, %v refusals counted (want %d)", left, len(hosts), refused, 4*len(hosts))
			}
			if !guarded && left != 0 {
				t.Fatalf("control: %d registrations left, want none (the attack must work unguarded)", left)
			}
		})
	}
}

// An unprivileged caller may add only MonUnprivBurst new hosts, one more
// every MonUnprivEvery; every loopback address is the same caller; a host
// already monitored is not new; a privileged caller (lockd) is not
// bounded. The control, MonUnprivBurst −1, takes every one.
func TestNewHostsFromUnprivilegedCallersAreBounded(t *testing.T) {
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
			reg := newFSMRegistry(t, "n1", true)
			prom := prometheus.NewRegistry()
			var mu sync.Mutex
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			cfg := Config{Metrics: NewMetrics(prom), Now: clock, MonUnprivBurst: 3, MonUnprivEvery: time.Hour}
			if !bounded {
				cfg.MonUnprivBurst = -1
			}
			s := serveNode(t, reg, "n1", cfg)
			user := s.dial(t, "udp", lo, false)
			user2 := s.dial(t, "tcp", netip.MustParseAddr("127.0.0.2"), false)
			lockdConn := s.dial(t, "tcp", lo, true)
			try := func(c *oncrpc.Client, name string) Res {
				var res SMStatRes
				if err := call(t, c, ProcMon, mon(name, lockd), &res); err != nil {
					t.Fatal(err)
				}
				return res.Res
			}
			want := func(ok bool) Res {
				if ok || !bounded {
					return StatSucc
				}
				return StatFail
			}
			steps := []struct {
				c    *oncrpc.Client
				name string
				ok   bool
			}{
				{user, "10.1.0.1", true}, {user, "10.1.0.2", true}, {user2, "10.1.0.3", true},
				{user, "10.1.0.4", false},  // a fourth new host
				{user2, "10.1.0.5", false}, // another loopback address is the same caller
				{user, "10.1.0.1", true},   // not a new host
				{lockdConn, "10.1.0.6", true},
			}
			for i, st := range steps {
				if got := try(st.c, st.name); got != want(st.ok) {
					t.Fatalf("step %d SM_MON %s: %v, want %v", i, st.name, got, want(st.ok))
				}
			}
			mu.Lock()
			now = now.Add(time.Hour)
			mu.Unlock()
			if got := try(user, "10.1.0.4"); got != StatSucc {
				t.Fatalf("an hour later: %v, want one more host", got)
			}
			if got := try(user, "10.1.0.7"); got != want(false) {
				t.Fatalf("and only one: %v", got)
			}
			limited := testutil.GatheredValue(t, prom, "nsmd_mon_refused_total", "reason", "unprivileged_limit")
			if bounded && limited != 3 || !bounded && limited != 0 {
				t.Fatalf("nsmd_mon_refused_total{reason=unprivileged_limit} = %v", limited)
			}
		})
	}
}
