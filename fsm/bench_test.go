package fsm

import (
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// bigReg is the i-th registration of a large table: a distinct host with
// one IPv4 address, monitored by the local lock manager.
func bigReg(i int) Registration {
	return Registration{
		ID:       MonID{MonName: fmt.Sprintf("client%07d.nfs.example.com", i), My: MyID{MyName: "nfs-server-1", Prog: 100021, Vers: 4, Proc: 16}},
		Priv:     [16]byte{byte(i), byte(i >> 8), byte(i >> 16), 3: 1},
		Node:     "node-1",
		Callback: netip.AddrFrom4([4]byte{127, 0, 0, 1}),
		Addrs:    []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})},
		Added:    time.Unix(1_800_000_000, int64(i)),
	}
}

// fill applies n registrations in batches of 64, in a scattered order (as
// SM_MONs arrive), so the B-tree grows as it does in service.
func fill(tb testing.TB, f *FSM, n int) {
	const batch = 64
	cmds := make([]Command, 0, batch)
	idx := f.AppliedIndex()
	for i := 0; i < n; i++ {
		cmds = append(cmds, Register{Reg: bigReg(int((uint64(i) * 7919) % uint64(n)))})
		if len(cmds) == batch || i == n-1 {
			b, err := Encode(cmds...)
			if err != nil {
				tb.Fatal(err)
			}
			idx++
			if err, ok := f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: b}).(error); ok {
				tb.Fatal(err)
			}
			cmds = cmds[:0]
		}
	}
}

func BenchmarkApplyRegister(b *testing.B) {
	for _, guarded := range []bool{false, true} {
		b.Run(map[bool]string{false: "kind1", true: "guarded"}[guarded], func(b *testing.B) { benchApplyRegister(b, guarded) })
	}
}

// benchApplyRegister: SM_MONs in batches of 64 over 200k registrations,
// unguarded (kind 1) or guarded (kind 14: the owner check on every one).
func benchApplyRegister(b *testing.B, guarded bool) {
	f := New(Options{})
	const batch = 64
	entries := make([][]byte, 1024)
	for e := range entries {
		cmds := make([]Command, batch)
		for j := range cmds {
			cmds[j] = Register{Reg: bigReg((e*batch + j) * 7919 % 200_000), Guarded: guarded}
		}
		entries[e], _ = Encode(cmds...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: entries[i%len(entries)]})
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "registrations/s")
}

// BenchmarkApplyClientCreate: NFSv4 Create upcalls in batches of 64 over
// 200k client names (about 40-byte names and a 32-byte principal hash,
// as a Linux client's id and a SHA-256 principal hash are).
func BenchmarkApplyClientCreate(b *testing.B) {
	f := New(Options{})
	const batch = 64
	entries := make([][]byte, 1024)
	for e := range entries {
		cmds := make([]Command, batch)
		for j := range cmds {
			i := (e*batch + j) * 7919 % 200_000
			cmds[j] = ClientCreate{Name: fmt.Sprintf("Linux NFSv4.2 client%07d.nfs.example.com", i), PrincHash: fmt.Sprintf("%032d", i)}
		}
		entries[e], _ = Encode(cmds...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: entries[i%len(entries)]})
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "creates/s")
}

const million = 1_000_000

func BenchmarkSnapshotPersist1M(b *testing.B) {
	if testing.Short() {
		b.Skip("1M registrations")
	}
	f := New(Options{})
	fill(b, f, million)
	b.ResetTimer()
	var size int
	for i := 0; i < b.N; i++ {
		var s countSink
		snap, _ := f.Snapshot()
		if err := snap.Persist(&s); err != nil {
			b.Fatal(err)
		}
		size = s.n
	}
	b.ReportMetric(float64(size)/million, "snapshot-bytes/reg")
}

func BenchmarkRestore1M(b *testing.B) {
	if testing.Short() {
		b.Skip("1M registrations")
	}
	src := New(Options{})
	fill(b, src, million)
	data := persist(b, src)
	src = nil
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f := New(Options{})
		if err := restoreFrom(f, data); err != nil {
			b.Fatal(err)
		}
		if f.Len() != million {
			b.Fatalf("restored %d", f.Len())
		}
	}
}

// BenchmarkMemoryPerRegistration1M reports the heap held per registration
// (HeapInuse delta, after GC) with 1M registrations, built by Apply and
// by Restore.
func BenchmarkMemoryPerRegistration1M(b *testing.B) {
	if testing.Short() {
		b.Skip("1M registrations")
	}
	for i := 0; i < b.N; i++ {
		base := heapInuse()
		f := New(Options{})
		fill(b, f, million)
		applied := heapInuse()
		data := persist(b, f)
		f = nil
		afterData := heapInuse()
		g := New(Options{})
		if err := restoreFrom(g, data); err != nil {
			b.Fatal(err)
		}
		restored := heapInuse()
		b.ReportMetric(float64(applied-base)/million, "bytes/reg(applied)")
		b.ReportMetric(float64(restored-afterData)/million, "bytes/reg(restored)")
		runtime.KeepAlive(g)
		runtime.KeepAlive(data)
	}
}

func heapInuse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

type countSink struct{ n int }

func (s *countSink) Write(p []byte) (int, error) { s.n += len(p); return len(p), nil }
func (s *countSink) ID() string                  { return "count" }
func (s *countSink) Cancel() error               { return nil }
func (s *countSink) Close() error                { return nil }

var _ io.Writer = (*countSink)(nil)
