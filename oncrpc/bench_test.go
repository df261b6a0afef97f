package oncrpc

import (
	"context"
	"sync/atomic"
	"testing"
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
		var h callHeader
		if err := decodeCall(&r, &h); err != nil {
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
