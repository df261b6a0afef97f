package nsm

import (
	"container/heap"
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

type notifyRec struct {
	arg  StatChge
	from netip.AddrPort
	at   time.Time
}

// fakeHost plays a monitored host: a portmapper on addr:pmapPort and a
// statd on addr:<ephemeral>, both served by one oncrpc server.
type fakeHost struct {
	addr netip.Addr
	mu   sync.Mutex
	recs []notifyRec
	pmap []netip.AddrPort
	drop int // SM_NOTIFYs to leave unanswered first
	// notified, if set, gets the host's address at each SM_NOTIFY.
	notified chan<- netip.Addr
}

func (h *fakeHost) snapshot() ([]notifyRec, []netip.AddrPort) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]notifyRec(nil), h.recs...), append([]netip.AddrPort(nil), h.pmap...)
}

func startFakeHost(t testing.TB, addr netip.Addr, pmapPort int, drop int) (*fakeHost, error) {
	h := &fakeHost{addr: addr, drop: drop}
	pmapPC, err := net.ListenPacket("udp", netip.AddrPortFrom(addr, uint16(pmapPort)).String())
	if err != nil {
		return nil, err
	}
	statdPC, err := net.ListenPacket("udp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		pmapPC.Close()
		return nil, err
	}
	pm := oncrpc.NewPortmapper()
	pm.Register(oncrpc.Mapping{Prog: Program.Prog, Vers: Program.Vers, Prot: oncrpc.IPProtoUDP,
		Port: uint32(statdPC.LocalAddr().(*net.UDPAddr).Port)})
	pmh := oncrpc.HandlerFunc(func(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
		h.mu.Lock()
		h.pmap = append(h.pmap, c.Remote)
		h.mu.Unlock()
		return pm.ServeRPC(ctx, c, res)
	})
	statd := oncrpc.HandlerFunc(func(_ context.Context, c *oncrpc.Call, _ *oncrpc.Writer) error {
		if c.Proc != ProcNotify {
			return oncrpc.ErrProcUnavail
		}
		var sc StatChge
		if err := decodeArgs(c, "SM_NOTIFY", &sc); err != nil {
			return err
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		h.recs = append(h.recs, notifyRec{arg: sc, from: c.Remote, at: time.Now()})
		if h.notified != nil {
			h.notified <- h.addr
		}
		if h.drop > 0 {
			h.drop--
			return oncrpc.ErrNoReply
		}
		return nil
	})
	srv := oncrpc.NewServer(oncrpc.Programs{{Prog: oncrpc.PmapProg, Vers: oncrpc.PmapVers}: pmh, Program: statd}, oncrpc.ServerConfig{})
	serveOn(t, srv, nil, pmapPC, statdPC)
	return h, nil
}

// sharedPmapPort finds a port free on 127.0.0.10 to use as every fake
// host's portmapper port.
func sharedPmapPort(t testing.TB) int {
	pc, err := net.ListenPacket("udp", "127.0.0.10:0")
	if err != nil {
		t.Fatal(err)
	}
	p := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	return p
}

func addr4(n int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, byte(n >> 8), byte(n)}) }

// DESIGN.md invariant 4: every live host gets SM_NOTIFY with the new
// state, from the VIP, within seconds; dead hosts are retried until the
// window ends without delaying live ones.
func TestNotifierNotifiesLiveHostsFromSourceAndGivesUpDeadOnes(t *testing.T) {
	const live, dead = 150, 50
	source := netip.MustParseAddr("127.0.0.250")
	var port int
	var hosts []*fakeHost
	for attempt := 0; ; attempt++ {
		port = sharedPmapPort(t)
		hosts = hosts[:0]
		var err error
		for i := range live {
			drop := 0
			if i%10 == 0 {
				drop = 1 // lose the first SM_NOTIFY: retransmission
			}
			if i == 5 {
				drop = 3 // unanswered past PmapRequery: re-asks the portmapper
			}
			var h *fakeHost
			if h, err = startFakeHost(t, addr4(10+i), port, drop); err != nil {
				break
			}
			hosts = append(hosts, h)
		}
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatal(err)
		}
	}
	var targets []fsm.Target
	for i := range live + dead {
		targets = append(targets, fsm.Target{MonName: fmt.Sprintf("host%d", i), Addrs: []netip.Addr{addr4(10 + i)}})
	}
	targets[1] = fsm.Target{MonName: addr4(11).String()}      // no address: the name is an IP literal
	targets[2] = fsm.Target{MonName: "host-two.example.test"} // no address: resolved
	resolve := func(_ context.Context, name string) ([]netip.Addr, error) {
		if name == "host-two.example.test" {
			return []netip.Addr{addr4(12)}, nil
		}
		return nil, fmt.Errorf("unknown %q", name)
	}
	const window = 1500 * time.Millisecond
	m := NewMetrics(prometheus.NewRegistry())
	n, err := NewNotifier(NotifierConfig{
		Name: "nfs.example.test", Source: source, Window: window, InitialRTO: 100 * time.Millisecond,
		MaxRTO: 200 * time.Millisecond, PmapRequery: 2, PmapPort: port, Resolve: resolve, Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sum := n.Run(context.Background(), 7, targets)
	if sum.Done != live || sum.Failed != dead || sum.Pending != 0 || sum.Canceled || sum.Err != nil {
		t.Errorf("summary %+v", sum)
	}
	if sum.Elapsed < window || sum.Elapsed > window+time.Second {
		t.Errorf("elapsed %v, want about the %v window", sum.Elapsed, window)
	}
	if p, d, f := n.Progress(); p != 0 || d != live || f != dead {
		t.Errorf("progress %d %d %d", p, d, f)
	}
	if d, f := counterOrGauge(m.notifyTargets.WithLabelValues("done")), counterOrGauge(m.notifyTargets.WithLabelValues("failed")); d != live || f != dead {
		t.Errorf("nsmd_notify_targets done %v failed %v", d, f)
	}
	var lastFirst time.Duration
	for i, h := range hosts {
		recs, pmaps := h.snapshot()
		if len(recs) == 0 {
			t.Errorf("host %v got no SM_NOTIFY", h.addr)
			continue
		}
		lastFirst = max(lastFirst, recs[0].at.Sub(start))
		for _, r := range recs {
			if r.arg != (StatChge{MonName: "nfs.example.test", State: 7}) || r.from.Addr() != source {
				t.Errorf("host %v got %+v from %v", h.addr, r.arg, r.from)
			}
		}
		for _, p := range pmaps {
			if p.Addr() != source {
				t.Errorf("host %v: GETPORT from %v", h.addr, p)
			}
		}
		if i%10 == 0 && len(recs) < 2 {
			t.Errorf("host %v: %d SM_NOTIFY, want a retransmission", h.addr, len(recs))
		}
		if i == 5 && len(pmaps) < 2 {
			t.Errorf("host %v: %d GETPORT, want a re-query", h.addr, len(pmaps))
		}
	}
	if lastFirst > window/2 {
		t.Errorf("last live host first reached after %v: dead hosts delayed live ones", lastFirst)
	}
	t.Logf("live hosts all reached within %v; run %v", lastFirst, sum.Elapsed)
}

// DESIGN.md invariant 4, "dead hosts ... without delaying live ones": with
// the first-round budget (Parallel) far smaller than the number of dead
// hosts, and a retransmit timeout of an hour, every live host is still
// notified — each with one GETPORT and one SM_NOTIFY, no retransmission —
// because a host that does not answer leaves the budget after a few round
// trips' time, not after its retransmit timeout. Before, the dead hosts
// filled the budget and the live ones behind them waited an hour.
func TestNotifierDeadHostsDoNotHoldLiveOnesBack(t *testing.T) {
	const total, parallel = 60, 4
	port := sharedPmapPort(t)
	notified := make(chan netip.Addr, total)
	var targets []fsm.Target
	var live []*fakeHost
	for i := range total {
		a := addr4(600 + i)
		targets = append(targets, fsm.Target{MonName: a.String(), Addrs: []netip.Addr{a}})
		if i%3 == 2 { // live: one in three (the last host too), the rest dead (no listener)
			h, err := startFakeHost(t, a, port, 0)
			if err != nil {
				t.Fatal(err)
			}
			h.mu.Lock()
			h.notified = notified
			h.mu.Unlock()
			live = append(live, h)
		}
	}
	m := NewMetrics(prometheus.NewRegistry())
	n, err := NewNotifier(NotifierConfig{Name: "nfs.example.test", Source: lo, PmapPort: port, Parallel: parallel,
		InitialRTO: time.Hour, MaxRTO: time.Hour, Window: 2 * time.Hour, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan Summary, 1)
	go func() { got <- n.Run(ctx, 11, targets) }()
	seen := map[netip.Addr]bool{}
	guard := time.After(30 * time.Second) // a failure guard, not a timing assertion
	for len(seen) < len(live) {
		select {
		case a := <-notified:
			seen[a] = true
		case <-guard:
			cancel()
			t.Fatalf("%d of %d live hosts notified; the dead ones hold the first-round budget", len(seen), len(live))
		}
	}
	// The hosts answer after recording: wait for the notifier to count them.
	testutil.WaitForSeen(t, 30*time.Second, "the notifier to count every live host done", func() (bool, string) {
		_, d, _ := n.Progress()
		return d >= len(live), fmt.Sprintf("%d of %d", d, len(live))
	})
	cancel()
	sum := <-got
	if sum.Done != len(live) || sum.Pending != total-len(live) || !sum.Canceled {
		t.Errorf("summary %+v, want %d done and %d pending (dead, cancelled)", sum, len(live), total-len(live))
	}
	for _, h := range live {
		recs, pmaps := h.snapshot()
		if len(recs) != 1 || len(pmaps) != 1 {
			t.Errorf("host %v: %d SM_NOTIFY, %d GETPORT; want one of each (no retransmission)", h.addr, len(recs), len(pmaps))
		}
	}
	if r := counterOrGauge(m.notifySends.WithLabelValues("getport", "retry")); r != 0 {
		t.Errorf("%v GETPORT retransmissions with an hour's timeout", r)
	}
	if f := counterOrGauge(m.notifySends.WithLabelValues("getport", "first")); f != total {
		t.Errorf("%v first GETPORTs, want one per host (%d)", f, total)
	}
}

func TestNotifierStopsPromptlyOnCancel(t *testing.T) {
	port := sharedPmapPort(t)
	// A black hole: reads GETPORTs and never answers.
	hole, err := net.ListenPacket("udp", netip.AddrPortFrom(addr4(220), uint16(port)).String())
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	n, err := NewNotifier(NotifierConfig{Name: "nfs", PmapPort: port, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan Summary, 1)
	go func() {
		got <- n.Run(ctx, 3, []fsm.Target{{MonName: "a", Addrs: []netip.Addr{addr4(220)}}, {MonName: "b", Addrs: []netip.Addr{addr4(221)}}})
	}()
	buf := make([]byte, 512)
	if _, _, err := hole.ReadFrom(buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case sum := <-got:
		if !sum.Canceled || sum.Pending != 2 {
			t.Errorf("summary %+v", sum)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestNotifierReportsUnusableSource(t *testing.T) {
	n, err := NewNotifier(NotifierConfig{Name: "nfs", Source: netip.MustParseAddr("192.0.2.1")})
	if err != nil {
		t.Fatal(err)
	}
	sum := n.Run(context.Background(), 3, []fsm.Target{{MonName: "a", Addrs: []netip.Addr{lo}}})
	if sum.Err == nil || sum.Failed != 1 {
		t.Errorf("summary %+v", sum)
	}
	if _, err := NewNotifier(NotifierConfig{}); err == nil {
		t.Error("empty Name accepted")
	}
}

// TestNotifierParseReplyTellsMalformedFromRefused: a reply that cannot be
// decoded (not a REPLY, truncated, bad verifier) is ignored, while any
// decodable refusal — MSG_DENIED, an unknown reply_stat, an accept_stat
// other than SUCCESS — counts as an answer that is not a success (RFC 5531
// §9), which sends the host back to the portmapper.
func TestNotifierParseReplyTellsMalformedFromRefused(t *testing.T) {
	accepted := []byte{
		0, 0, 0, 9, // XID
		0, 0, 0, 1, // msg_type REPLY
		0, 0, 0, 0, // reply_stat MSG_ACCEPTED
		0, 0, 0, 0, // verf flavor AUTH_NONE
		0, 0, 0, 0, // verf length 0
	}
	cat := func(a, b []byte) []byte { return append(append([]byte(nil), a...), b...) }
	tests := []struct {
		name string
		in   []byte
		ok   bool
		want reply
	}{
		{"GETPORT answered with port 1000", cat(accepted, []byte{0, 0, 0, 0, 0, 0, 0x03, 0xe8}), true, reply{xid: 9, ok: true, val: 1000, hasVal: true}},
		{"SM_NOTIFY answered (void)", cat(accepted, []byte{0, 0, 0, 0}), true, reply{xid: 9, ok: true}},
		{"PROC_UNAVAIL", cat(accepted, []byte{0, 0, 0, 3}), true, reply{xid: 9}},
		{"PROG_MISMATCH without its range", cat(accepted, []byte{0, 0, 0, 2}), true, reply{xid: 9}},
		{"MSG_DENIED AUTH_ERROR", []byte{0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}, true, reply{xid: 9}},
		{"reply_stat 7", []byte{0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 7}, true, reply{xid: 9}},
		{"a CALL", []byte{0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 2}, false, reply{xid: 9}},
		{"no reply_stat", []byte{0, 0, 0, 9, 0, 0, 0, 1}, false, reply{xid: 9}},
		{"no accept_stat", accepted, false, reply{xid: 9}},
		{"verifier over 400 bytes", []byte{0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x91}, false, reply{xid: 9}},
		{"empty", nil, false, reply{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseReply(tt.in)
			if ok != tt.ok || (ok && got != tt.want) {
				t.Fatalf("parseReply = %+v, %v; want %+v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// notifyMany notifies n targets that all live on one fake host at
// 127.0.0.1 (the demux keys on XID, not on address).
func notifyMany(tb testing.TB, n int) (Summary, int64) {
	var calls atomic.Int64
	pm := oncrpc.NewPortmapper()
	statd := oncrpc.HandlerFunc(func(_ context.Context, c *oncrpc.Call, _ *oncrpc.Writer) error {
		calls.Add(1)
		return nil
	})
	pc, err := net.ListenPacket("udp", loStr+":0")
	if err != nil {
		tb.Fatal(err)
	}
	if u, ok := pc.(*net.UDPConn); ok {
		_ = u.SetReadBuffer(4 << 20)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pm.Register(oncrpc.Mapping{Prog: Program.Prog, Vers: Program.Vers, Prot: oncrpc.IPProtoUDP, Port: uint32(port)})
	serveOn(tb, oncrpc.NewServer(oncrpc.Programs{{Prog: oncrpc.PmapProg, Vers: oncrpc.PmapVers}: pm, Program: statd},
		oncrpc.ServerConfig{}), nil, pc)
	targets := make([]fsm.Target, n)
	for i := range targets {
		targets[i] = fsm.Target{MonName: fmt.Sprintf("h%05d", i), Addrs: []netip.Addr{lo}}
	}
	nt, err := NewNotifier(NotifierConfig{Name: "nfs.example.test", Source: lo, PmapPort: port, Window: 30 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	sum := nt.Run(context.Background(), 9, targets)
	return sum, calls.Load()
}

func TestNotifierScalesTo10kHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	sum, calls := notifyMany(t, 10_000)
	if sum.Done != 10_000 || calls < 10_000 {
		t.Fatalf("summary %+v, %d SM_NOTIFY received", sum, calls)
	}
	t.Logf("10,000 hosts notified in %v (%d SM_NOTIFY received)", sum.Elapsed, calls)
	if !raceEnabled && sum.Elapsed > 5*time.Second {
		t.Errorf("10,000 hosts took %v", sum.Elapsed)
	}
}

func BenchmarkNotify10k(b *testing.B) { benchmarkNotify(b, 10_000, "ms/10k-hosts") }

// BenchmarkNotify100k: the notifier alone (no cluster) on 100,000 targets.
func BenchmarkNotify100k(b *testing.B) { benchmarkNotify(b, 100_000, "ms/100k-hosts") }

func benchmarkNotify(b *testing.B, n int, unit string) {
	for b.Loop() {
		sum, _ := notifyMany(b, n)
		if sum.Done != n {
			b.Fatalf("summary %+v", sum)
		}
		b.ReportMetric(float64(sum.Elapsed.Milliseconds()), unit)
	}
}

// startBlackHoles opens a UDP socket on each address at port that reads
// and never answers (a host that is down), and sends each datagram's
// destination on got.
func startBlackHoles(t *testing.T, addrs []netip.Addr, port int, got chan<- netip.Addr) {
	t.Helper()
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // runs after the sockets' cleanups (last in, first out)
	for _, a := range addrs {
		pc, err := net.ListenPacket("udp", netip.AddrPortFrom(a, uint16(port)).String())
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			buf := make([]byte, 512)
			for {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					return
				}
				got <- a
			}
		})
		t.Cleanup(func() { pc.Close() })
	}
}

// overtakeHosts is the list of TestNotifierOvertakenDeadHostsLeaveTheBudget:
// live and dead hosts alternating, a live one first.
func overtakeHosts(t *testing.T, pairs int, port int, notified chan<- netip.Addr, holes chan<- netip.Addr) (targets []fsm.Target, live []*fakeHost) {
	var dead []netip.Addr
	for i := range 2 * pairs {
		a := addr4(700 + i)
		targets = append(targets, fsm.Target{MonName: a.String(), Addrs: []netip.Addr{a}})
		if i%2 == 1 {
			dead = append(dead, a)
			continue
		}
		h, err := startFakeHost(t, a, port, 0)
		if err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		h.notified = notified
		h.mu.Unlock()
		live = append(live, h)
	}
	startBlackHoles(t, dead, port, holes)
	return targets, live
}

// DESIGN.md invariant 4, "dead hosts ... without delaying live ones", by
// the order of answers alone: with the first-round budget (Parallel 4)
// far smaller than the number of dead hosts, and neither a retransmit
// timeout nor the silence check within the test (an hour each), a dead
// host leaves the budget only because calls sent after its own were
// answered; every live host is notified with one GETPORT and one SM_NOTIFY.
// The negative control turns overtaking off: the budget then fills with
// the first four dead hosts, after the four live hosts before them, and
// stays full — the fan-out is stuck at exactly four.
func TestNotifierOvertakenDeadHostsLeaveTheBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		overtake int
	}{{"overtaking", 1}, {"negative control: never overtaken", 1 << 30}} {
		t.Run(tc.name, func(t *testing.T) {
			const pairs, parallel = 20, 4
			port := sharedPmapPort(t)
			notified, holes := make(chan netip.Addr, 4*pairs), make(chan netip.Addr, 4*pairs)
			targets, live := overtakeHosts(t, pairs, port, notified, holes)
			m := NewMetrics(prometheus.NewRegistry())
			n, err := NewNotifier(NotifierConfig{Name: "nfs.example.test", Source: lo, PmapPort: port, Parallel: parallel,
				InitialRTO: time.Hour, MaxRTO: time.Hour, Window: 2 * time.Hour, Metrics: m,
				overtake: tc.overtake, silence: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			got := make(chan Summary, 1)
			go func() { got <- n.Run(ctx, 13, targets) }()
			wantLive, wantHoles := len(live), pairs
			if tc.overtake > pairs*4 {
				wantLive, wantHoles = parallel, parallel // stuck: see the comment above
			}
			seen, holed := map[netip.Addr]bool{}, map[netip.Addr]bool{}
			guard := time.After(30 * time.Second) // a failure guard, not a timing assertion
			for len(seen) < wantLive || len(holed) < wantHoles {
				select {
				case a := <-notified:
					seen[a] = true
				case a := <-holes:
					holed[a] = true
				case <-guard:
					t.Fatalf("%d live hosts notified (want %d), %d dead hosts asked (want %d)", len(seen), wantLive, len(holed), wantHoles)
				}
			}
			// The hosts answer after recording: wait for the notifier to count them.
			testutil.WaitForSeen(t, 30*time.Second, "the notifier to count every live host done", func() (bool, string) {
				_, d, _ := n.Progress()
				return d >= wantLive, fmt.Sprintf("%d of %d", d, wantLive)
			})
			cancel()
			sum := <-got
			if sum.Done != wantLive || sum.Pending != len(targets)-wantLive {
				t.Errorf("summary %+v, want %d done and the rest pending", sum, wantLive)
			}
			if f := counterOrGauge(m.notifySends.WithLabelValues("getport", "first")); int(f) != wantLive+wantHoles {
				t.Errorf("%v first GETPORTs, want %d (%d live, %d dead hosts started)", f, wantLive+wantHoles, wantLive, wantHoles)
			}
			for _, kind := range []string{"getport", "notify"} {
				if r := counterOrGauge(m.notifySends.WithLabelValues(kind, "retry")); r != 0 {
					t.Errorf("%v %s retransmissions with an hour's timeout", r, kind)
				}
			}
			for _, h := range live[:wantLive] {
				if recs, pmaps := h.snapshot(); len(recs) != 1 || len(pmaps) != 1 {
					t.Errorf("host %v: %d SM_NOTIFY, %d GETPORT; want one of each", h.addr, len(recs), len(pmaps))
				}
			}
		})
	}
}

// The silence check, on the scheduler alone (no sockets): a host in its
// first round trip keeps its place while answers keep coming within the
// silence period — however long it has itself been waiting — and gives
// it up once nothing has been answered for that long.
func TestNotifierSilenceFreesTheBudgetOnlyWhenNothingIsAnswered(t *testing.T) {
	const silence = 100 * time.Millisecond
	t0 := time.Now()
	cfg := NotifierConfig{Name: "nfs", InitialRTO: time.Hour, MaxRTO: time.Hour, Window: 2 * time.Hour, silence: silence}
	cfg.setDefaults()
	n := &Notifier{cfg: cfg, log: cfg.Logger}
	r := &run{n: n, cfg: &n.cfg, start: t0, deadline: t0.Add(cfg.Window), lastAnswer: t0, hosts: make([]host, 4)}
	for i := range r.hosts {
		r.hosts[i] = host{phase: phPmap, first: true, xid: uint32(i + 1), rto: time.Hour, rtoAt: t0.Add(time.Hour), gen: 1}
		heap.Push(&r.timers, timerEntry{at: t0.Add(silence), idx: int32(i), gen: 1})
	}
	r.next, r.inFirst, r.left = len(r.hosts), len(r.hosts), len(r.hosts)
	// Answers (to other calls) up to 90 ms in: at 100 ms nobody leaves.
	r.lastAnswer = t0.Add(90 * time.Millisecond)
	r.fire(t0.Add(silence))
	if r.inFirst != 4 {
		t.Fatalf("%d hosts in the budget after 100 ms with an answer 10 ms ago, want 4", r.inFirst)
	}
	if r.timers.Len() != 4 || r.timers[0].at != t0.Add(190*time.Millisecond) {
		t.Fatalf("checks re-armed at %v (%d), want 190 ms in", r.timers[0].at.Sub(t0), r.timers.Len())
	}
	// Nothing answered since: at 190 ms every host leaves the budget, its
	// call still outstanding until its retransmit timeout (an hour).
	r.fire(t0.Add(190 * time.Millisecond))
	if r.inFirst != 0 {
		t.Fatalf("%d hosts in the budget after 100 ms without answers, want 0", r.inFirst)
	}
	for i, h := range r.hosts {
		if h.phase != phPmap || h.xid == 0 || h.first {
			t.Errorf("host %d: %+v, want still asking the portmapper, out of the budget", i, h)
		}
	}
	if r.timers.Len() != 4 || r.timers[0].at != t0.Add(time.Hour) {
		t.Errorf("next timeouts %v (%d), want the retransmit timeout", r.timers[0].at.Sub(t0), r.timers.Len())
	}
}
