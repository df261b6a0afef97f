package bench

import (
	"bufio"
	"bytes"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"
)

// NotifyMemory is the bench process's memory around the fan-out. The
// process holds the three nodes (each with every registration), the fake
// hosts and the bench itself, so these are upper bounds for the leader's
// fan-out; NotifyMemory.FanoutHeapMiB is the part that appeared with it.
type NotifyMemory struct {
	// Before the fault: Go heap in live objects (after a GC) and RSS.
	HeapBeforeMiB float64 `json:"heap_before_mib"`
	RSSBeforeMiB  float64 `json:"rss_before_mib"`
	// During the fan-out (fault to last live host), sampled every 5 ms:
	// the largest Go heap (live and not yet collected objects), its
	// growth over HeapBeforeMiB, the bytes allocated, the peak RSS
	// (VmHWM, reset at the fault) and the most goroutines.
	HeapPeakMiB   float64 `json:"heap_peak_mib"`
	FanoutHeapMiB float64 `json:"fanout_heap_mib"`
	AllocMiB      float64 `json:"alloc_mib"`
	RSSPeakMiB    float64 `json:"rss_peak_mib"`
	HWMReset      bool    `json:"hwm_reset"` // false: VmHWM is the peak since the process started
	GoroutinesMax int     `json:"goroutines_max"`
	Goroutines    int     `json:"goroutines_before"`
}

// UDPCounters are the namespace's UDP counters (/proc/net/snmp): every
// socket in it is the bench's.
type UDPCounters struct {
	InDatagrams  int64 `json:"in_datagrams"`
	NoPorts      int64 `json:"no_ports"`
	InErrors     int64 `json:"in_errors"`
	OutDatagrams int64 `json:"out_datagrams"`
	RcvbufErrors int64 `json:"rcvbuf_errors"`
	SndbufErrors int64 `json:"sndbuf_errors"`
}

func readUDPCounters() UDPCounters {
	var c UDPCounters
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return c
	}
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, v := range f[1:] {
			if i >= len(names) {
				break
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			switch names[i] {
			case "InDatagrams":
				c.InDatagrams = n
			case "NoPorts":
				c.NoPorts = n
			case "InErrors":
				c.InErrors = n
			case "OutDatagrams":
				c.OutDatagrams = n
			case "RcvbufErrors":
				c.RcvbufErrors = n
			case "SndbufErrors":
				c.SndbufErrors = n
			}
		}
		break
	}
	return c
}

func (c UDPCounters) sub(o UDPCounters) UDPCounters {
	return UDPCounters{c.InDatagrams - o.InDatagrams, c.NoPorts - o.NoPorts, c.InErrors - o.InErrors,
		c.OutDatagrams - o.OutDatagrams, c.RcvbufErrors - o.RcvbufErrors, c.SndbufErrors - o.SndbufErrors}
}

// procStatusKB is a "Vm…: N kB" field of /proc/self/status, in KiB.
func procStatusKB(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

const mib = 1 << 20

// memSampler samples the Go heap and goroutines every 5 ms from start
// until stop, which returns the figures.
type memSampler struct {
	before  NotifyMemory
	alloc0  uint64
	stopped chan struct{}
	wg      sync.WaitGroup
	peak    uint64
	gmax    int
}

var memSamples = []string{"/memory/classes/heap/objects:bytes", "/gc/heap/allocs:bytes", "/sched/goroutines:goroutines"}

func readMem() (heap, allocs uint64, goroutines int) {
	s := make([]metrics.Sample, len(memSamples))
	for i, n := range memSamples {
		s[i].Name = n
	}
	metrics.Read(s)
	get := func(i int) uint64 {
		if s[i].Value.Kind() == metrics.KindUint64 {
			return s[i].Value.Uint64()
		}
		return 0
	}
	return get(0), get(1), int(get(2))
}

// startMemSampler is called just before the fault: it collects garbage
// once (so the "before" heap is the live one), resets the peak RSS
// (clear_refs 5) and starts sampling.
func startMemSampler(gc func()) *memSampler {
	m := &memSampler{stopped: make(chan struct{})}
	gc()
	heap, allocs, g := readMem()
	m.before.HeapBeforeMiB = float64(heap) / mib
	m.before.RSSBeforeMiB = float64(procStatusKB("VmRSS")) / 1024
	m.before.Goroutines = g
	m.before.HWMReset = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	m.alloc0, m.peak, m.gmax = allocs, heap, g
	m.wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.stopped:
				return
			case <-t.C:
				heap, _, g := readMem()
				m.peak, m.gmax = max(m.peak, heap), max(m.gmax, g)
			}
		}
	})
	return m
}

func (m *memSampler) stop() NotifyMemory {
	close(m.stopped)
	m.wg.Wait()
	heap, allocs, g := readMem()
	r := m.before
	r.HeapPeakMiB = float64(max(m.peak, heap)) / mib
	r.FanoutHeapMiB = r.HeapPeakMiB - r.HeapBeforeMiB
	r.AllocMiB = float64(allocs-m.alloc0) / mib
	r.RSSPeakMiB = float64(procStatusKB("VmHWM")) / 1024
	r.GoroutinesMax = max(m.gmax, g)
	return r
}
