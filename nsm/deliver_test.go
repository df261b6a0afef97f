package nsm

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nlm"
	"github.com/nsmd/nsmd/oncrpc"
)

type lmCall struct {
	st   nlm.Status
	from netip.AddrPort
	proc uint32
}

// startLockd runs a fake lock manager (NLM v3 over UDP on 127.0.0.1) that
// records every callback it receives.
func startLockd(t *testing.T) (port uint16, got <-chan lmCall) {
	t.Helper()
	ch := make(chan lmCall, 16)
	h := oncrpc.HandlerFunc(func(_ context.Context, c *oncrpc.Call, _ *oncrpc.Writer) error {
		var st nlm.Status
		if err := st.UnmarshalXDR(c.Args); err != nil {
			return errors.Join(oncrpc.ErrGarbageArgs, err)
		}
		ch <- lmCall{st: st, from: c.Remote, proc: c.Proc}
		return nil
	})
	pc, err := net.ListenPacket("udp", loStr+":0")
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, oncrpc.NewServer(oncrpc.Programs{{Prog: nlm.Program, Vers: nlm.Vers3}: h}, oncrpc.ServerConfig{}), nil, pc)
	return uint16(pc.LocalAddr().(*net.UDPAddr).Port), ch
}

// startPmap runs an embedded portmapper on 127.0.0.1 (UDP); every GETPORT
// is signalled on the returned channel after its answer is computed.
func startPmap(t *testing.T) (*oncrpc.Portmapper, int, <-chan struct{}) {
	t.Helper()
	pm := oncrpc.NewPortmapper()
	getports := make(chan struct{}, 64)
	h := oncrpc.HandlerFunc(func(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
		err := pm.ServeRPC(ctx, c, res)
		if c.Proc == 3 {
			getports <- struct{}{}
		}
		return err
	})
	pc, err := net.ListenPacket("udp", loStr+":0")
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, oncrpc.NewServer(oncrpc.Programs{{Prog: oncrpc.PmapProg, Vers: oncrpc.PmapVers}: h}, oncrpc.ServerConfig{}), nil, pc)
	return pm, pc.LocalAddr().(*net.UDPAddr).Port, getports
}

func counter(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

type doneCB struct {
	cb    Callback
	tries int
	err   error
}

func runDeliverer(t *testing.T, cfg DelivererConfig) (*Deliverer, <-chan doneCB, *Metrics) {
	t.Helper()
	done := make(chan doneCB, 16)
	cfg.Done = func(cb Callback, tries int, err error) { done <- doneCB{cb, tries, err} }
	cfg.Metrics = NewMetrics(prometheus.NewRegistry())
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	d := NewDeliverer(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	return d, done, cfg.Metrics
}

func testCallback() Callback {
	return Callback{
		Reg: fsm.Registration{
			ID:       fsm.MonID{MonName: "client.example.test", My: lockd.FSM()},
			Priv:     cookie,
			Node:     "n1",
			Callback: lo,
		},
		MonName: "client.example.test",
		State:   7,
	}
}

// PEERS.md "How rpc.statd calls the lock manager back": UDP to loopback,
// port from the portmapper, privileged source port, status{mon_name,
// state, priv}.
func TestDelivererCallsLockManagerFromPrivilegedPort(t *testing.T) {
	lmPort, got := startLockd(t)
	pm, pmPort, _ := startPmap(t)
	pm.Register(oncrpc.Mapping{Prog: nlm.Program, Vers: nlm.Vers3, Prot: oncrpc.IPProtoUDP, Port: uint32(lmPort)})
	d, done, m := runDeliverer(t, DelivererConfig{PmapPort: pmPort})
	if !d.Enqueue(testCallback()) {
		t.Fatal("Enqueue refused")
	}
	c := recv(t, got)
	want := nlm.Status{MonName: "client.example.test", State: 7, Priv: cookie}
	if c.st != want || c.proc != nlm.ProcSMNotify {
		t.Errorf("lock manager got %+v proc %d, want %+v proc 16", c.st, c.proc, want)
	}
	if c.from.Addr() != lo || c.from.Port() >= 1024 {
		t.Errorf("callback came from %v, want 127.0.0.1 and a port below 1024", c.from)
	}
	if r := recv(t, done); r.err != nil || r.tries != 1 {
		t.Errorf("done: %+v", r)
	}
	if v := counter(m.callbacks.WithLabelValues("delivered")); v != 1 {
		t.Errorf("delivered = %v", v)
	}
}

func TestDelivererRetriesUntilLockManagerAppears(t *testing.T) {
	lmPort, got := startLockd(t)
	pm, pmPort, getports := startPmap(t)
	d, done, m := runDeliverer(t, DelivererConfig{PmapPort: pmPort, Interval: 100 * time.Millisecond})
	d.Enqueue(testCallback())
	recv(t, getports) // the first try found nothing registered
	pm.Register(oncrpc.Mapping{Prog: nlm.Program, Vers: nlm.Vers3, Prot: oncrpc.IPProtoUDP, Port: uint32(lmPort)})
	c := recv(t, got)
	if c.st.State != 7 || c.st.Priv != cookie {
		t.Errorf("got %+v", c.st)
	}
	if r := recv(t, done); r.err != nil || r.tries != 2 {
		t.Errorf("done: %+v", r)
	}
	if v := counter(m.callbacks.WithLabelValues("retried")); v != 1 {
		t.Errorf("retried = %v", v)
	}
}

func TestDelivererGivesUpAfterAttempts(t *testing.T) {
	_, pmPort, getports := startPmap(t)
	d, done, m := runDeliverer(t, DelivererConfig{PmapPort: pmPort, Attempts: 3, Interval: 20 * time.Millisecond})
	d.Enqueue(testCallback())
	r := recv(t, done)
	if r.err == nil || r.tries != 3 || !errors.Is(r.err, oncrpc.ErrProgUnavail) {
		t.Errorf("done: %+v", r)
	}
	if n := len(getports); n != 3 {
		t.Errorf("%d GETPORTs, want 3", n)
	}
	if v := counter(m.callbacks.WithLabelValues("failed")); v != 1 {
		t.Errorf("failed = %v", v)
	}
}

func TestDelivererQueueIsBounded(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	d := NewDeliverer(DelivererConfig{QueueSize: 1, Metrics: m})
	if !d.Enqueue(testCallback()) || d.Enqueue(testCallback()) {
		t.Fatal("queue of 1 took 0 or 2")
	}
	if v := counter(m.callbacks.WithLabelValues("dropped")); v != 1 {
		t.Errorf("dropped = %v", v)
	}
}

// TestAppliedQueuesOnlyTheOwnersCallbacksOfNewEntries: of an applied
// command, only an accepted PeerRebooted calls for callbacks, only for
// the registrations this node owns (the node that took the SM_MON calls
// its lock manager back), and never for a replayed entry — its callbacks
// went out before the restart, and a second one could make lockd drop
// locks reclaimed since.
func TestAppliedQueuesOnlyTheOwnersCallbacksOfNewEntries(t *testing.T) {
	my := fsm.MyID{MyName: "lockd", Prog: 100021, Vers: 3, Proc: 16}
	mine := fsm.Registration{ID: fsm.MonID{MonName: "client-a", My: my}, Node: "n1", Priv: [16]byte{1}}
	theirs := fsm.Registration{ID: fsm.MonID{MonName: "client-a", My: fsm.MyID{MyName: "other"}}, Node: "n2"}
	rebooted := fsm.PeerRebooted{MonName: "client-a", State: 7, From: netip.MustParseAddr("192.0.2.1")}
	matched := fsm.Result{Accepted: true, Matched: []fsm.Registration{mine, theirs}}
	for _, tc := range []struct {
		name   string
		cmd    fsm.Command
		res    fsm.Result
		replay bool
		want   []fsm.Registration
	}{
		{"accepted: the owner's only", rebooted, matched, false, []fsm.Registration{mine}},
		{"replayed", rebooted, matched, true, nil},
		{"not accepted (a state seen before)", rebooted, fsm.Result{Matched: []fsm.Registration{mine}}, false, nil},
		{"another command", fsm.Register{Reg: mine}, matched, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDeliverer(DelivererConfig{})
			d.Applied("n1", tc.cmd, tc.res, tc.replay)
			var got []fsm.Registration
			for len(d.queue) > 0 {
				j := <-d.queue
				if j.cb.State != rebooted.State || j.cb.MonName != j.cb.Reg.ID.MonName || j.cb.From != rebooted.From {
					t.Errorf("callback %+v, want state %d, the registration's mon_name and the sender %v", j.cb, rebooted.State, rebooted.From)
				}
				got = append(got, j.cb.Reg)
			}
			if len(got) != len(tc.want) || (len(got) == 1 && got[0].ID != tc.want[0].ID) {
				t.Errorf("queued callbacks for %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Callbacks for notifications that did not come from the host's own
// addresses take at most half of the queue: a flood of them leaves room
// for the callbacks of hosts that notified from their own address.
func TestForgedNotificationsNeverFillTheCallbackQueue(t *testing.T) {
	const size = 8
	d := NewDeliverer(DelivererConfig{QueueSize: size}) // not running: nothing leaves the queue
	host := netip.MustParseAddr("192.0.2.7")
	reg := fsm.Registration{ID: fsm.MonID{MonName: "client"}, Addrs: []netip.Addr{host}}
	forged, real := 0, 0
	for i := range 2 * size {
		if d.Enqueue(Callback{Reg: reg, MonName: "client", State: int32(2*i + 1), From: netip.MustParseAddr("198.51.100.9")}) {
			forged++
		}
	}
	for i := range size {
		if d.Enqueue(Callback{Reg: reg, MonName: "client", State: int32(2*i + 1), From: host}) {
			real++
		}
	}
	if forged != size/2 || real != size/2 {
		t.Fatalf("queued %d forged and %d from the host, want %d and %d", forged, real, size/2, size/2)
	}
}
