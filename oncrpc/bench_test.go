package oncrpc

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
)

// BenchmarkServerTCPNullPipelined: 64 concurrent callers (2 cores × 32)
// share 4 TCP connections, pipelining NULL calls.
func BenchmarkServerTCPNullPipelined(b *testing.B) {
	benchNull(b, "tcp", 4)
}

// BenchmarkServerUDPNull: 64 concurrent callers share 4 UDP sockets.
func BenchmarkServerUDPNull(b *testing.B) {
	benchNull(b, "udp", 4)
}

func benchNull(b *testing.B, network string, conns int) {
	ts := startServer(b, ServerConfig{}, nil)
	clients := make([]*Client, conns)
	for i := range clients {
		clients[i] = dialTest(b, ClientConfig{Net: network, Addr: ts.addr(network)})
	}
	var next atomic.Uint32
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(64 / max(1, testingProcs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := clients[int(next.Add(1))%len(clients)]
		for pb.Next() {
			if err := c.Call(ctx, testProg, testVers, procNull, nil, nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

// BenchmarkXDRDecodeCall decodes the SM_STAT call vector: header, AUTH_SYS
// credential and arguments.
func BenchmarkXDRDecodeCall(b *testing.B) {
	rec := smStatCall[4:]
	b.ReportAllocs()
	var r Reader
	for b.Loop() {
		r.Reset(rec)
		var h CallHeader
		if err := h.UnmarshalXDR(&r); err != nil {
			b.Fatal(err)
		}
		if _, err := parseAuthSys(h.Cred.Body); err != nil {
			b.Fatal(err)
		}
		r.String(1024)
		if r.Done() != nil {
			b.Fatal(r.Done())
		}
	}
}

// BenchmarkAcceptAtCap: MaxConns (1024) idle connections are open; each
// iteration dials a new connection, which evicts the longest idle one, and
// makes a NULL call on it. BenchmarkAcceptBelowCap does the same with room
// to spare (the client closes its oldest connection instead), so the
// difference is the cost of eviction.
func BenchmarkAcceptAtCap(b *testing.B) { benchAccept(b, 1024) }

func BenchmarkAcceptBelowCap(b *testing.B) { benchAccept(b, 4096) }

func benchAccept(b *testing.B, maxConns int) {
	const open = 1024
	var evicted atomic.Int64
	ts := startServer(b, ServerConfig{MaxConns: maxConns, MaxConnsPerHost: open, OnConn: func(ev string) {
		if ev == ConnEvictedIdle {
			evicted.Add(1)
		}
	}}, nil)
	// Source addresses rotate over 64 loopback addresses so that TIME_WAIT
	// never exhausts the ephemeral ports of one.
	src := func(i int) string { return fmt.Sprintf("127.1.0.%d", 1+i%64) }
	ring := make([]net.Conn, open)
	for i := range ring {
		ring[i] = dialFromAddr(b, src(i), ts.tcpAddr)
	}
	testutil.WaitFor(b, 5*time.Second, "every connection open", func() bool { return ts.srv.Conns() == open })
	b.ResetTimer()
	for i := range b.N {
		c, err := dialLoopback(src(i), ts.tcpAddr)
		if err != nil {
			b.Fatal(err)
		}
		if err := rawNull(c, uint32(i)); err != nil {
			b.Fatal(err)
		}
		ring[i%open].Close()
		ring[i%open] = c
	}
	b.StopTimer()
	for _, c := range ring {
		c.Close()
	}
	b.ReportMetric(float64(evicted.Load())/float64(b.N), "evictions/op")
}

// BenchmarkLongestIdleScan: the worst case of choosing a connection to
// evict, MaxConns (1024) connections of which only the newest is idle.
func BenchmarkLongestIdleScan(b *testing.B) {
	s := NewServer(Programs{}, ServerConfig{})
	var last *serverConn
	for range s.cfg.MaxConns {
		last = &serverConn{sem: make(chan struct{}, 1)}
		last.sem <- struct{}{}
		last.elem = s.conns.PushBack(last)
	}
	<-last.sem
	s.mu.Lock()
	defer s.mu.Unlock()
	for b.Loop() {
		if s.longestIdle() != last {
			b.Fatal("wrong connection")
		}
	}
}
