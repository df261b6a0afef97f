package bench

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/nsm/nsmtest"
	"github.com/nsmd/nsmd/oncrpc"
)

// fakeNSM is an NSM server whose answer depends on the mon_name's last
// octet: 1 mod 4 stat_fail, 2 SYSTEM_ERR, 3 no reply; SM_UNMON is
// PROC_UNAVAIL.
func fakeNSM(t *testing.T) string {
	t.Helper()
	h := oncrpc.HandlerFunc(func(_ context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
		switch c.Proc {
		case nsm.ProcNull:
			return nil
		case nsm.ProcMon:
			var m nsm.Mon
			if err := m.UnmarshalXDR(c.Args); err != nil {
				return oncrpc.ErrGarbageArgs
			}
			ip, err := netip.ParseAddr(m.ID.MonName)
			if err != nil {
				return oncrpc.ErrGarbageArgs
			}
			r := nsm.SMStatRes{Res: nsm.StatSucc, State: 7}
			switch ip.As4()[3] % 4 {
			case 1:
				r = nsm.SMStatRes{Res: nsm.StatFail, State: -1}
			case 2:
				return oncrpc.ErrSystemErr
			case 3:
				return oncrpc.ErrNoReply
			}
			r.MarshalXDR(res)
			return nil
		}
		return oncrpc.ErrProcUnavail
	})
	return nsmtest.ServeNSM(t, h)
}

// TestBenchMonCountsErrors: refusals, RPC errors and timeouts are counted
// by kind, not timed when unanswered, and fail the command.
func TestBenchMonCountsErrors(t *testing.T) {
	t.Parallel()
	addr := fakeNSM(t)
	o := MonOptions{Addr: addr, Net: "tcp", Conns: 2, Depth: 2, Calls: 40, MonBase: netip.MustParseAddr("127.1.0.1"),
		MyName: "127.0.0.1", Timeout: 300 * time.Millisecond}
	rep, err := RunMon(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	// Names 127.1.0.1 … 127.1.0.40: ten of each last octet mod 4.
	if rep.Calls != 40 || rep.OK != 10 || rep.Failed != 30 || rep.Errors["stat_fail"] != 10 ||
		rep.Errors["system_err"] != 10 || rep.Errors["timeout"] != 10 {
		t.Fatalf("calls %d ok %d failed %d errors %v", rep.Calls, rep.OK, rep.Failed, rep.Errors)
	}
	if rep.Latency.N != 20 { // answered: 10 ok + 10 stat_fail
		t.Errorf("%d latencies, want 20 (timeouts and RPC errors are not timed)", rep.Latency.N)
	}
	if !strings.Contains(rep.Samples["stat_fail"], "stat_fail") || !strings.Contains(rep.Samples["timeout"], "timed out") {
		t.Errorf("samples %v", rep.Samples)
	}
	var table bytes.Buffer
	if err := PrintMon(&table, rep); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"30 failed", "stat_fail", "system_err", "timeout"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, table.String())
		}
	}

	// SM_UNMON of a name monitored before, refused as PROC_UNAVAIL.
	o = MonOptions{Addr: addr, Net: "tcp", Conns: 1, Depth: 1, Calls: 8, MonBase: netip.MustParseAddr("127.1.0.4"),
		MyName: "127.0.0.1", Timeout: 300 * time.Millisecond, Unmon: true}
	got, err := RunMon(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Procs) != 2 || got.Procs[1].Calls == 0 || got.Procs[1].Errors["proc_unavail"] != got.Procs[1].Calls || got.Errors["proc_unavail"] != got.Procs[1].Calls {
		t.Errorf("SM_UNMON of a monitored name: %+v", got.Procs)
	}
}

func TestBenchMonOptionsStayInLoopback(t *testing.T) {
	for _, c := range []struct {
		base  string
		calls int
		ok    bool
	}{
		{"127.1.0.1", 1000, true},
		{"127.255.255.250", 6, true},
		{"127.255.255.250", 7, false},
		{"10.0.0.1", 1, false},
		{"::1", 1, false},
	} {
		o := MonOptions{Net: "tcp", Conns: 1, Depth: 1, Calls: c.calls, MonBase: netip.MustParseAddr(c.base)}
		if err := o.check(); (err == nil) != c.ok {
			t.Errorf("--mon-base %s -n %d: %v, want ok=%v", c.base, c.calls, err, c.ok)
		}
	}
	if got := benchName(0x7f010203); got != "127.1.2.3" {
		t.Errorf("benchName = %s", got)
	}
}

func TestBenchHistogram(t *testing.T) {
	h := benchHistogram([]float64{0.1, 0.1, 0.105, 0.5, 1, 1.01, 30})
	total := 0
	for i, b := range h {
		total += b.Count
		if i > 0 && b.FromMS < h[i-1].ToMS-1e-12 {
			t.Errorf("buckets overlap: %+v", h)
		}
	}
	if total != 7 || h[0].Count != 2 || h[0].ToMS < 0.1 || h[0].FromMS >= 0.1 {
		t.Errorf("histogram %+v", h)
	}
}
