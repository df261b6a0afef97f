package nsm

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nsmd/nsmd/oncrpc"
)

// sum adds up every series of a counter or gauge vector.
func sum(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var total float64
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) == nil {
			total += pb.GetCounter().GetValue() + pb.GetGauge().GetValue()
		}
	}
	return total
}

func TestNilMetricsAreNoOps(t *testing.T) {
	var m *Metrics
	m.ObserveRPC(&oncrpc.Call{}, nil, time.Millisecond)
	m.monRefusedInc("x")
	m.notReadyInc(ProcStat)
	m.callback("x")
	m.notifyProgress(1, 2, 3)
	m.notifyAcked(time.Second)
	m.notifyReceivedInc("x")
}

func TestObserveRPCCountsByProcAndResult(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	svc, err := NewService(newMapRegistry(3), Config{NodeID: "n", Metrics: m, Resolve: testResolve,
		LoopbackTrusted: []netip.Prefix{}})
	if err != nil {
		t.Fatal(err)
	}
	observed := make(chan struct{}, 16)
	observe := func(c *oncrpc.Call, err error, d time.Duration) {
		m.ObserveRPC(c, err, d)
		observed <- struct{}{}
	}
	srv := oncrpc.NewServer(oncrpc.Programs{Program: svc}, oncrpc.ServerConfig{Observe: observe})
	ln, err := net.Listen("tcp", loStr+":0")
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, ln)
	c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = call(t, c, ProcNull, nil, nil)
	if err := call(t, c, 9, nil, nil); !errors.Is(err, oncrpc.ErrProcUnavail) {
		t.Fatal(err)
	}
	var res SMStatRes
	_ = call(t, c, ProcMon, mon("10.0.0.1", lockd), &res) // refused: no caller is trusted
	_ = call(t, c, ProcNotify, &StatChge{MonName: "x", State: 1}, nil)
	// Observe runs after the reply is sent: wait for all four.
	for range 4 {
		recv(t, observed)
	}
	for _, tc := range []struct {
		proc, result string
	}{{"null", "success"}, {"unknown", "proc_unavail"}, {"mon", "success"}, {"notify", "success"}} {
		if v := counter(m.rpcRequests.WithLabelValues(tc.proc, tc.result)); v != 1 {
			t.Errorf("%s/%s = %v", tc.proc, tc.result, v)
		}
	}
	if v := counter(m.monRefused.WithLabelValues("untrusted")); v != 1 {
		t.Errorf("refused untrusted = %v", v)
	}
	if v := counter(m.notifyReceived.WithLabelValues("ignored")); v != 1 {
		t.Errorf("notify ignored = %v", v)
	}
	if _, err := reg.Gather(); err != nil {
		t.Error(err)
	}
}

func counterOrGauge(c prometheus.Collector) float64 { return sum(c) }
