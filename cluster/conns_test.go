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

	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/tickle"
)

func testVIPConns(n int) []tickle.Conn {
	out := make([]tickle.Conn, n)
	for i := range out {
		out[i] = tickle.Conn{
			Local:  netip.MustParseAddrPort("10.77.3.100:2049"),
			Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 77, 3, byte(1 + i%200)}), uint16(600+i)),
		}
	}
	out[n-1].Local = netip.MustParseAddrPort("[fd77:3::100]:2049")
	out[n-1].Remote = netip.MustParseAddrPort("[fd77:3::1]:700")
	return out
}

// TestFollowersLearnTheLeadersVIPConns: the leader answers CONNS with its
// last sample (bounded by what the asker takes, its total kept); a
// follower does not answer it; a follower with another cluster key is
// refused.
func TestFollowersLearnTheLeadersVIPConns(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.waitTakeover(5 * time.Second)
	li, ld := c.leader(5 * time.Second)
	f := c.nodes[(li+1)%3]
	ctx := context.Background()

	if _, _, err := f.n.Hints().LeaderVIPConns(ctx, 10); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("before the leader sampled: %v, want ErrNotLeader (nothing to share yet)", err)
	}
	conns := testVIPConns(5)
	sampled := time.Now().Add(-300 * time.Millisecond)
	ld.n.Hints().SetVIPConns(VIPConns{Conns: conns, Total: 7, At: sampled})

	from, v, err := f.n.Hints().LeaderVIPConns(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if from != ld.id || !slices.Equal(v.Conns, conns) || v.Total != 7 {
		t.Fatalf("got %v from %s (total %d), want %v from %s (total 7)", v.Conns, from, v.Total, conns, ld.id)
	}
	if d := v.At.Sub(sampled); d < -50*time.Millisecond || d > 200*time.Millisecond {
		t.Errorf("sample dated %v off the leader's time", d)
	}
	_, v, err = f.n.Hints().LeaderVIPConns(ctx, 2)
	if err != nil || !slices.Equal(v.Conns, conns[:2]) || v.Total != 7 {
		t.Fatalf("bounded to 2: %v (total %d), %v", v.Conns, v.Total, err)
	}

	// Asked directly, a follower does not answer with a list of its own.
	var res connsRes
	res.max = 10
	callConns(t, f.nsmAddr, f.n, &res)
	if res.Status != fwdNotLeader {
		t.Fatalf("a follower answered status %d, want fwdNotLeader", res.Status)
	}

	f.n.cfg.ClusterKey = []byte("another key")
	if _, _, err := f.n.Hints().LeaderVIPConns(ctx, 10); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("with another cluster key: %v, want a refusal", err)
	}
}

// callConns calls CONNS at addr as node n would (its key, its clock).
func callConns(t *testing.T, addr string, n *Node, res *connsRes) {
	t.Helper()
	cl, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	args := hintArgs{SentNS: time.Now().UnixNano(), Max: uint32(res.max)}
	args.MAC = fwdMAC(n.cfg.ClusterKey, args.SentNS, args.macInput(tagConns))
	if err := cl.Call(context.Background(), ForwardProgram.Prog, ForwardProgram.Vers, fwdProcConns, &args, res); err != nil {
		t.Fatal(err)
	}
}

// olderRelease serves the forward program as a release without
// procedure proc (CONNS, SVCCONNS) would: PROC_UNAVAIL.
type olderRelease struct {
	n    *Node
	proc uint32
}

func (o olderRelease) ServeRPC(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	if c.Proc == o.proc {
		return oncrpc.ErrProcUnavail
	}
	return o.n.ServeRPC(ctx, c, res)
}

// TestAnOlderLeaderIsNotAskedForVIPConns: a leader that answers
// PROC_UNAVAIL to CONNS is reported as ErrVIPConnsUnsupported.
func TestAnOlderLeaderIsNotAskedForVIPConns(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.waitTakeover(5 * time.Second)
	li, ld := c.leader(5 * time.Second)
	f := c.nodes[(li+1)%3]
	ld.n.Hints().SetVIPConns(VIPConns{Conns: testVIPConns(2), Total: 2, At: time.Now()})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ld.srv.Shutdown(ctx)
	ln, err := net.Listen("tcp", ld.nsmAddr)
	if err != nil {
		t.Fatal(err)
	}
	ld.srv = oncrpc.NewServer(oncrpc.Programs{ForwardProgram: olderRelease{ld.n, fwdProcConns}}, oncrpc.ServerConfig{})
	go ld.srv.ServeTCP(ln)

	// The follower's cached connection to the old server is gone: the
	// first call may fail on it, and the next one dials again; and the
	// follower may not know the leader yet (ErrNoLeader).
	testutil.WaitForSeen(t, 5*time.Second, "an older leader reported as ErrVIPConnsUnsupported", func() (bool, string) {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _, err := f.n.Hints().LeaderVIPConns(cctx, 10)
		return errors.Is(err, ErrVIPConnsUnsupported), fmt.Sprint(err)
	})
}

func TestConnsResultRoundTripAndBound(t *testing.T) {
	in := connsRes{Status: fwdOK, Total: 9, AgeMS: 250, Conns: testVIPConns(4)}
	var w oncrpc.Writer
	in.MarshalXDR(&w)
	out := connsRes{max: 4}
	if err := out.UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out.Conns, in.Conns) || out.Total != 9 || out.AgeMS != 250 {
		t.Fatalf("round trip: %+v, want %+v", out, in)
	}
	short := connsRes{max: 3}
	if err := short.UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err == nil {
		t.Fatal("an answer with more connections than asked for was accepted")
	}
}

// FuzzConnsResult: a CONNS answer decodes or is refused, never panics,
// never yields more connections than asked for, and what decodes
// encodes back to an answer that decodes the same.
func FuzzConnsResult(f *testing.F) {
	var w oncrpc.Writer
	in := connsRes{Status: fwdOK, Total: 9, AgeMS: 250, Conns: testVIPConns(3)}
	in.MarshalXDR(&w)
	f.Add(w.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		r := connsRes{max: 8}
		if r.UnmarshalXDR(oncrpc.NewReader(b)) != nil {
			return
		}
		if len(r.Conns) > 8 {
			t.Fatalf("%d connections, more than asked for", len(r.Conns))
		}
		var w oncrpc.Writer
		r.MarshalXDR(&w)
		again := connsRes{max: 8}
		if err := again.UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(again.Conns, r.Conns) || again.Total != r.Total || again.Status != r.Status || again.Err != r.Err {
			t.Fatalf("round trip: %+v, want %+v", again, r)
		}
	})
}
