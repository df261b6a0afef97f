package nsm

import (
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
)

const benchCallers = 64

// BenchmarkMonTCP: SM_MON through a real server over TCP with the map
// registry, 64 concurrent callers each on its own connection.
func BenchmarkMonTCP(b *testing.B) {
	s := newNSMServer(b, Config{})
	var next atomic.Uint32
	b.SetParallelism((benchCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := s.dial(b, "tcp", lo, false)
		for pb.Next() {
			n := next.Add(1)
			m := mon(fmt.Sprintf("10.%d.%d.%d", byte(n>>16), byte(n>>8), byte(n)), lockd)
			var res SMStatRes
			if err := call(b, c, ProcMon, m, &res); err != nil || res.Res != StatSucc {
				b.Errorf("SM_MON: %v %+v", err, res)
				return
			}
		}
	})
}

// BenchmarkStatUDP: SM_STAT over UDP, 64 concurrent callers.
func BenchmarkStatUDP(b *testing.B) {
	s := newNSMServer(b, Config{})
	b.SetParallelism((benchCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := s.dial(b, "udp", netip.MustParseAddr("127.0.0.1"), false)
		for pb.Next() {
			var res SMStatRes
			if err := call(b, c, ProcStat, &SMName{"client.example.test"}, &res); err != nil || res.Res != StatSucc {
				b.Errorf("SM_STAT: %v %+v", err, res)
				return
			}
		}
	})
}
