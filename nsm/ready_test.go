package nsm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

// Until the registry is ready, SM_STAT, SM_MON, SM_UNMON, SM_UNMON_ALL and
// SM_SIMU_CRASH get no reply and change nothing; SM_NULL and SM_NOTIFY
// are served. The drops are counted per procedure and logged at most once
// a second, with the number dropped since the last line.
func TestNotReadyGetsNoReplyCountedAndLoggedSparingly(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Unix(1_800_000_000, 0).UnixNano())
	logs := &testutil.LockedBuffer{}
	m := NewMetrics(prometheus.NewRegistry())
	s := newNSMServer(t, Config{
		Metrics: m,
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
		Now:     func() time.Time { return time.Unix(0, now.Load()) },
	})
	s.reg.setReady(false)

	// Over UDP, as lockd and clients ask: no reply at all, NULL answered.
	u, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "udp", Addr: s.udp,
		Timeout: 300 * time.Millisecond, Retransmit: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	var res SMStatRes
	if err := call(t, u, ProcStat, &SMName{"x"}, &res); !errors.Is(err, oncrpc.ErrTimeout) {
		t.Fatalf("SM_STAT while not ready: %v (%+v), want no reply", err, res)
	}
	if err := call(t, u, ProcNull, nil, nil); err != nil {
		t.Fatalf("SM_NULL while not ready: %v", err)
	}
	statDrops := counter(m.notReady.WithLabelValues("stat"))
	if statDrops < 1 {
		t.Fatalf("dropped SM_STAT counted %v times", statDrops)
	}

	// Every state procedure, straight through the handler, from a trusted
	// privileged caller whose call would otherwise succeed.
	caller := netip.AddrPortFrom(lo, 700)
	calls := []struct {
		proc uint32
		args oncrpc.Marshaler
	}{
		{ProcStat, &SMName{"x"}},
		{ProcMon, mon("10.0.0.1", lockd)},
		{ProcUnmon, &MonID{MonName: "10.0.0.1", My: lockd}},
		{ProcUnmonAll, &lockd},
		{ProcSimuCrash, oncrpc.Void{}},
	}
	serve := func(proc uint32, args oncrpc.Marshaler) error {
		w := oncrpc.NewWriter(nil)
		args.MarshalXDR(w)
		out := oncrpc.NewWriter(nil)
		err := s.svc.ServeRPC(context.Background(), &oncrpc.Call{Prog: Program.Prog, Vers: Program.Vers, Proc: proc,
			Net: "udp", Remote: caller, Args: oncrpc.NewReader(w.Bytes())}, out)
		if err != nil && len(out.Bytes()) != 0 {
			t.Errorf("proc %d: %d result bytes written with %v", proc, len(out.Bytes()), err)
		}
		return err
	}
	for range 50 {
		for _, c := range calls {
			if err := serve(c.proc, c.args); !errors.Is(err, oncrpc.ErrNoReply) || !errors.Is(err, ErrNotReady) {
				t.Fatalf("proc %d while not ready: %v, want ErrNoReply and ErrNotReady", c.proc, err)
			}
		}
	}
	if err := serve(ProcNull, oncrpc.Void{}); err != nil {
		t.Fatalf("SM_NULL through the handler: %v", err)
	}
	if err := serve(ProcNotify, &StatChge{MonName: "unmonitored", State: 5}); err != nil {
		t.Fatalf("SM_NOTIFY through the handler: %v", err)
	}
	if w, regs, _ := s.reg.snapshot(); w != 0 || len(regs) != 0 || s.reg.crashes != 0 {
		t.Fatalf("not-ready calls wrote: writes %d registrations %d crashes %d", w, len(regs), s.reg.crashes)
	}
	for _, p := range []string{"stat", "mon", "unmon", "unmon_all", "simu_crash"} {
		want := 50.0
		if p == "stat" {
			want += statDrops
		}
		if got := counter(m.notReady.WithLabelValues(p)); got != want {
			t.Errorf("not-ready drops of %s: %v, want %v", p, got, want)
		}
	}
	if got := logs.Lines("does not know the current sm_state"); len(got) != 1 {
		t.Fatalf("%d log lines for %v drops within one second, want 1:\n%s", len(got), 250+statDrops, strings.Join(got, ""))
	}
	now.Add(int64(time.Second))
	if err := serve(ProcStat, &SMName{"x"}); !errors.Is(err, oncrpc.ErrNoReply) {
		t.Fatal(err)
	}
	got := logs.Lines("does not know the current sm_state")
	since := fmt.Sprintf("dropped=%d", int(statDrops)+250) // all but the first logged, and this one
	if len(got) != 2 || !strings.Contains(got[1], since) {
		t.Fatalf("after a second: log lines\n%s\nwant a second one with %s", strings.Join(got, ""), since)
	}

	s.reg.setReady(true)
	if err := call(t, u, ProcStat, &SMName{"x"}, &res); err != nil || res != (SMStatRes{Res: StatSucc, State: 3}) {
		t.Fatalf("SM_STAT once ready: %+v %v", res, err)
	}
}

// Over TCP, where the caller does not retransmit before its own timeout,
// a call that needs the current sm_state waits for readiness (up to
// Config.ReadyWait) and is answered once the registry is ready; one that
// waited in vain is dropped like a UDP call.
func TestNotReadyTCPCallWaitsForReadinessThenIsAnsweredOrDropped(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	s := newNSMServer(t, Config{Metrics: m, ReadyWait: time.Minute})
	s.reg.mu.Lock()
	s.reg.notReady, s.reg.asked = true, make(chan struct{}, 1)
	s.reg.mu.Unlock()
	c := s.dial(t, "tcp", lo, false)
	got := make(chan error, 1)
	var res SMStatRes
	go func() { got <- call(t, c, ProcMon, mon("10.0.0.1", lockd), &res) }()
	recv(t, s.reg.asked) // the first check
	recv(t, s.reg.asked) // and a later one: the call is held
	select {
	case err := <-got:
		t.Fatalf("answered while not ready: %+v %v", res, err)
	default:
	}
	s.reg.setReady(true)
	if err := recv(t, got); err != nil || res != (SMStatRes{Res: StatSucc, State: 3}) {
		t.Fatalf("held SM_MON once ready: %+v %v", res, err)
	}
	if w, regs, _ := s.reg.snapshot(); w != 1 || len(regs) != 1 {
		t.Fatalf("held SM_MON: writes %d registrations %d, want 1 and 1", w, len(regs))
	}
	if n := counter(m.notReady.WithLabelValues("mon")); n != 0 {
		t.Fatalf("a held call that was answered counted as dropped %v times", n)
	}

	short := newNSMServer(t, Config{Metrics: m, ReadyWait: 50 * time.Millisecond})
	short.reg.setReady(false)
	u, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: short.tcp, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if err := call(t, u, ProcStat, &SMName{"x"}, &res); !errors.Is(err, oncrpc.ErrTimeout) {
		t.Fatalf("TCP SM_STAT never ready: %v (%+v), want no reply", err, res)
	}
	if n := counter(m.notReady.WithLabelValues("stat")); n != 1 {
		t.Fatalf("dropped TCP SM_STAT counted %v times, want 1", n)
	}
}

// notifiedRegistry is a mapRegistry that is a ReadyNotifier.
type notifiedRegistry struct {
	*mapRegistry
	mu sync.Mutex
	ch chan struct{}
}

func (r *notifiedRegistry) ReadyChanged() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ch
}

// fire closes the current channel: an event that may make Ready true.
func (r *notifiedRegistry) fire() {
	r.mu.Lock()
	close(r.ch)
	r.ch = make(chan struct{})
	r.mu.Unlock()
}

// dialEventService serves an NSM service over reg that holds calls up to a
// minute for readiness and polls only hourly (so only events wake them),
// and returns a TCP client of it, closed when the test ends.
func dialEventService(t *testing.T, reg Registry) *oncrpc.Client {
	t.Helper()
	svc, err := NewService(reg, Config{NodeID: "n1", Resolve: testResolve, ReadyWait: time.Minute, ReadyPoll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tcp, _ := serveRPC(t, oncrpc.Programs{Program: svc}, loStr+":0")
	c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: tcp, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// With a ReadyNotifier, a held call waits on its event, not on a poll: with
// the poll at an hour, the call is answered as soon as readiness comes
// with an event, having asked Ready only when it started and then.
func TestHeldCallWakesOnTheReadyEvent(t *testing.T) {
	reg := &notifiedRegistry{mapRegistry: newMapRegistry(3), ch: make(chan struct{})}
	reg.notReady, reg.asked = true, make(chan struct{}, 8)
	c := dialEventService(t, reg)
	got := make(chan error, 1)
	var res SMStatRes
	go func() { got <- call(t, c, ProcStat, &SMName{"x"}, &res) }()
	recv(t, reg.asked) // ServeRPC's check
	recv(t, reg.asked) // awaitReady's, after it took the event channel
	reg.setReady(true)
	reg.fire()
	if err := recv(t, got); err != nil || res.Res != StatSucc {
		t.Fatalf("held SM_STAT after the ready event: %+v %v", res, err)
	}
	if n := len(reg.asked); n > 2 {
		t.Fatalf("Ready asked %d more times: polled, not woken", n)
	}
}

// countingRegistry counts Ready calls.
type countingRegistry struct {
	*notifiedRegistry
	n atomic.Int64
}

func (r *countingRegistry) Ready() bool {
	r.n.Add(1)
	return r.notifiedRegistry.Ready()
}

// Calls held for readiness share one check: 50 TCP calls wait through ten
// events that do not make the node ready, and Ready is asked once per
// event, not once per call per event (500); then one event that does
// answers them all.
func TestHeldCallsShareOneReadyCheck(t *testing.T) {
	const calls, events = 50, 10
	reg := &countingRegistry{notifiedRegistry: &notifiedRegistry{mapRegistry: newMapRegistry(3), ch: make(chan struct{})}}
	reg.notReady = true
	c := dialEventService(t, reg)
	got := make(chan error, calls)
	for range calls {
		go func() {
			var res SMStatRes
			err := call(t, c, ProcStat, &SMName{"x"}, &res)
			if err == nil && res.Res != StatSucc {
				err = fmt.Errorf("SM_STAT %+v", res)
			}
			got <- err
		}()
	}
	// Each call asked once when it arrived; the checker once when it started.
	testutil.WaitFor(t, 10*time.Second, "every call held", func() bool { return reg.n.Load() >= calls+1 })
	base := reg.n.Load()
	for i := range events {
		reg.fire()
		testutil.WaitFor(t, 10*time.Second, "the event checked", func() bool { return reg.n.Load() >= base+int64(i)+1 })
	}
	if n := reg.n.Load() - base; n > events+2 {
		t.Fatalf("Ready asked %d times for %d events with %d calls held: each call checks, not one checker", n, events, calls)
	}
	reg.setReady(true)
	reg.fire()
	for range calls {
		if err := recv(t, got); err != nil {
			t.Fatal(err)
		}
	}
}
