package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/tickle"
)

// svcTestConns are n connections on address local:2049.
func svcTestConns(local string, n int) []tickle.Conn {
	out := make([]tickle.Conn, n)
	for i := range out {
		out[i] = tickle.Conn{Local: netip.AddrPortFrom(netip.MustParseAddr(local), 2049),
			Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 77, 5, byte(1 + i%200)}), uint16(600+i))}
	}
	return out
}

// TestServersShareTheirServicesConns: the server of a service answers
// SVCCONNS with its last sample of that service (bounded by what the
// asker takes, its total and age kept), and with nothing of a service it
// does not serve, whatever its samples hold (the control: its samples
// hold one); a node does not ask itself. (Refusals:
// TestServiceConnsRefusedWithoutTheKeysMAC.)
func TestServersShareTheirServicesConns(t *testing.T) {
	fc, _, _ := newServicesCluster(t, 3, 2*time.Second, nil)
	var srv, asker *Node
	testutil.WaitForSeen(t, 20*time.Second, "service a served by its owner", func() (bool, string) {
		for _, tn := range fc.nodes {
			for _, r := range tn.n.Services().Runs() {
				if r.Service == "a" && r.Phase == "serving" {
					srv = tn.n
				}
			}
		}
		return srv != nil, fmt.Sprint(srv != nil)
	})
	for _, tn := range fc.nodes {
		if tn.n != srv {
			asker = tn.n
			break
		}
	}
	id := srv.cfg.NodeID
	ctx := context.Background()
	if m, err := asker.Hints().ServerServiceConns(ctx, id, 10); err != nil || len(m) != 0 {
		t.Fatalf("before the server sampled: %v, %v; want nothing", m, err)
	}
	conns := svcTestConns("10.77.9.1", 5)
	sampled := time.Now().Add(-300 * time.Millisecond)
	srv.Hints().SetServiceConns(map[string]VIPConns{
		"a":     {Conns: conns, Total: 7, At: sampled},
		"other": {Conns: svcTestConns("10.77.9.9", 2), Total: 2, At: sampled}, // not served there
	})
	m, err := asker.Hints().ServerServiceConns(ctx, id, 10)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m["a"]
	if len(m) != 1 || !ok || !slices.Equal(v.Conns, conns) || v.Total != 7 {
		t.Fatalf("got %+v, want only a's %v (total 7)", m, conns)
	}
	if d := v.At.Sub(sampled); d < -50*time.Millisecond || d > 200*time.Millisecond {
		t.Errorf("sample dated %v off the server's time", d)
	}
	m, err = asker.Hints().ServerServiceConns(ctx, id, 2)
	if err != nil || !slices.Equal(m["a"].Conns, conns[:2]) || m["a"].Total != 7 {
		t.Fatalf("bounded to 2: %+v, %v", m, err)
	}
	if _, err := srv.Hints().ServerServiceConns(ctx, id, 10); err == nil {
		t.Fatal("a node asked itself")
	}
}

// callSvcConns calls SVCCONNS at addr with args.
func callSvcConns(t *testing.T, addr string, args *hintArgs) svcConnsRes {
	t.Helper()
	cl, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	res := svcConnsRes{max: MaxVIPConns}
	if err := cl.Call(context.Background(), ForwardProgram.Prog, ForwardProgram.Vers, fwdProcSvcConns, args, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestServiceConnsRefusedWithoutTheKeysMAC: SVCCONNS answers only a
// request with the cluster key's MAC over its time and bound, once, and
// only while fresh: a forged MAC, a MAC of another procedure (CONNS), a
// replayed request and a stale one are refused. The first, valid call is
// the control: the same request is answered once.
func TestServiceConnsRefusedWithoutTheKeysMAC(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	_, ld := c.leader(5 * time.Second)
	key := ld.n.cfg.ClusterKey
	keyed := func(at time.Time, tag string) *hintArgs {
		a := &hintArgs{SentNS: at.UnixNano(), Max: 10}
		a.MAC = fwdMAC(key, a.SentNS, a.macInput(tag))
		return a
	}
	valid := keyed(time.Now(), tagSvcConns)
	if res := callSvcConns(t, ld.nsmAddr, valid); res.Status != fwdOK {
		t.Fatalf("a valid request: %+v", res)
	}
	forged := keyed(time.Now(), tagSvcConns)
	forged.MAC[0] ^= 1
	conns := keyed(time.Now(), tagConns)
	for name, a := range map[string]*hintArgs{
		"replayed":           valid,
		"forged":             forged,
		"CONNS's MAC":        conns,
		"a minute old":       keyed(time.Now().Add(-time.Minute), tagSvcConns),
		"no MAC":             {SentNS: time.Now().UnixNano(), Max: 10},
		"another key's MAC":  {SentNS: valid.SentNS + 1, Max: 10, MAC: fwdMAC([]byte("another key"), valid.SentNS+1, valid.macInput(tagSvcConns))},
		"a bound not signed": {SentNS: valid.SentNS + 2, Max: 11, MAC: fwdMAC(key, valid.SentNS+2, valid.macInput(tagSvcConns))},
	} {
		if res := callSvcConns(t, ld.nsmAddr, a); res.Status != fwdDenied || len(res.Services) != 0 {
			t.Errorf("%s: %+v, want denied", name, res)
		}
	}
}

// TestAnOlderServerIsReportedWithoutServiceConns: a server that answers
// PROC_UNAVAIL to SVCCONNS is ErrServiceConnsUnsupported.
func TestAnOlderServerIsReportedWithoutServiceConns(t *testing.T) {
	c := newTestCluster(t, 2, nil)
	old, asker := c.nodes[0], c.nodes[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := asker.n.Hints().ServerServiceConns(ctx, old.id, 10); err != nil {
		t.Fatalf("before the downgrade: %v", err) // the control: the same call answered
	}
	old.srv.Shutdown(ctx)
	ln, err := net.Listen("tcp", old.nsmAddr)
	if err != nil {
		t.Fatal(err)
	}
	old.srv = oncrpc.NewServer(oncrpc.Programs{ForwardProgram: olderRelease{old.n, fwdProcSvcConns}}, oncrpc.ServerConfig{})
	go old.srv.ServeTCP(ln)
	// The asker's cached connection to the old server is gone: the first
	// call may fail on it, and the next one dials again.
	var lastErr error
	for range 3 {
		_, lastErr = asker.n.Hints().ServerServiceConns(ctx, old.id, 10)
		if errors.Is(lastErr, ErrServiceConnsUnsupported) {
			return
		}
	}
	t.Fatalf("an older server: %v, want ErrServiceConnsUnsupported", lastErr)
}

func TestServiceConnsResultRoundTripAndBounds(t *testing.T) {
	in := svcConnsRes{Status: fwdOK, Services: []svcConnsEntry{
		{Service: "a", Total: 9, AgeMS: 250, Conns: svcTestConns("10.77.9.1", 4)},
		{Service: "b", Total: 1, AgeMS: 10, Conns: testVIPConns(1)},
		{Service: "c"},
	}}
	var w oncrpc.Writer
	in.MarshalXDR(&w)
	out := svcConnsRes{max: 4}
	if err := out.UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err != nil {
		t.Fatal(err)
	}
	if len(out.Services) != 3 {
		t.Fatalf("round trip: %+v", out)
	}
	for i, e := range out.Services {
		if want := in.Services[i]; e.Service != want.Service || e.Total != want.Total || e.AgeMS != want.AgeMS || !slices.Equal(e.Conns, want.Conns) {
			t.Fatalf("round trip: %+v, want %+v", e, want)
		}
	}
	if err := (&svcConnsRes{max: 3}).UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err == nil {
		t.Error("a service with more connections than asked for was accepted")
	}
	for name, bad := range map[string]svcConnsRes{
		"twice":        {Services: []svcConnsEntry{{Service: "a"}, {Service: "a"}}},
		"out of order": {Services: []svcConnsEntry{{Service: "b"}, {Service: "a"}}},
		"no id":        {Services: []svcConnsEntry{{Service: ""}}},
		"too many":     {Services: make([]svcConnsEntry, fsm.MaxServices+1)},
		"over the total": {Services: []svcConnsEntry{
			{Service: "a", Conns: svcTestConns("10.77.9.1", MaxVIPConns)}, {Service: "b", Conns: svcTestConns("10.77.9.2", 1)}}},
	} {
		if name == "too many" {
			for i := range bad.Services {
				bad.Services[i].Service = fmt.Sprintf("s%04d", i)
			}
		}
		var w oncrpc.Writer
		bad.MarshalXDR(&w)
		if err := (&svcConnsRes{max: MaxVIPConns}).UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// The most one answer carries fits a client's record (1 MiB).
	var most svcConnsRes
	shares := fairShares([]int{MaxVIPConns, MaxVIPConns, 3}, MaxVIPConns)
	for i, n := range shares {
		c := svcTestConns("10.77.9.1", n)
		for j := range c {
			c[j].Local = netip.MustParseAddrPort("[fd77:9::1]:2049")
			c[j].Remote = netip.AddrPortFrom(netip.MustParseAddr("fd77:9::2"), uint16(j))
		}
		most.Services = append(most.Services, svcConnsEntry{Service: strings.Repeat(string(rune('a'+i)), fsm.MaxServiceIDLen), Conns: c})
	}
	var wm oncrpc.Writer
	most.MarshalXDR(&wm)
	if n := len(wm.Bytes()); n > oncrpc.DefaultClientMaxRecordSize-1024 {
		t.Errorf("the largest answer is %d bytes", n)
	}
}

// fairShares: within the limit each gets what it wants; over it, the sum
// is the limit, the smallest wants are met and no share exceeds its want.
func TestFairShares(t *testing.T) {
	for _, tc := range []struct {
		wants []int
		limit int
		want  []int
	}{
		{[]int{3, 5}, 10, []int{3, 5}},
		{[]int{10, 2, 10}, 10, []int{4, 2, 4}},
		{[]int{100, 100}, 10, []int{5, 5}},
		{nil, 10, []int{}},
	} {
		got := fairShares(tc.wants, tc.limit)
		if !slices.Equal(got, tc.want) {
			t.Errorf("fairShares(%v, %d) = %v, want %v", tc.wants, tc.limit, got, tc.want)
		}
	}
}

// FuzzServiceConnsResult: an SVCCONNS answer decodes or is refused, never
// panics, never yields more than asked for, and what decodes encodes back
// to an answer that decodes the same.
func FuzzServiceConnsResult(f *testing.F) {
	var w oncrpc.Writer
	in := svcConnsRes{Status: fwdOK, Services: []svcConnsEntry{{Service: "a", Total: 3, Conns: testVIPConns(3)}, {Service: "b"}}}
	in.MarshalXDR(&w)
	f.Add(w.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		r := svcConnsRes{max: 8}
		if r.UnmarshalXDR(oncrpc.NewReader(b)) != nil {
			return
		}
		if len(r.Services) > fsm.MaxServices {
			t.Fatalf("%d services", len(r.Services))
		}
		for _, e := range r.Services {
			if len(e.Conns) > 8 {
				t.Fatalf("%d connections, more than asked for", len(e.Conns))
			}
		}
		var w oncrpc.Writer
		r.MarshalXDR(&w)
		again := svcConnsRes{max: 8}
		if err := again.UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err != nil {
			t.Fatal(err)
		}
		if len(again.Services) != len(r.Services) || again.Status != r.Status || again.Err != r.Err {
			t.Fatalf("round trip: %+v, want %+v", again, r)
		}
	})
}
