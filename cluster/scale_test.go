package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// Environment of a scale child process (TestScaleChildNode).
const (
	scaleChildEnv = "NSMD_SCALE_CHILD" // node id
	scaleDirEnv   = "NSMD_SCALE_DIR"
	scaleBindEnv  = "NSMD_SCALE_BIND"
)

// scaleConfig is the raft setup of every node of the scale measurement.
// TrailingLogs is small so that after the leader's snapshot a wiped node
// must be sent the snapshot (the path being measured), not the whole log.
func scaleConfig(id, dir, bind string) Config {
	return testDefaults(Config{NodeID: id, DataDir: dir, RaftBind: bind, TrailingLogs: 16})
}

// TestScaleChildNode is one follower of TestMeasureScale1M, run in its own
// process so that its memory is its own: it starts an empty node (no
// bootstrap; the leader adds it), prints "applied INDEX LEN" every 50 ms
// and exits when stdin closes. Without NSMD_SCALE_CHILD it skips.
func TestScaleChildNode(t *testing.T) {
	id := os.Getenv(scaleChildEnv)
	if id == "" {
		t.Skip("child process of TestMeasureScale1M")
	}
	n, err := New(scaleConfig(id, os.Getenv(scaleDirEnv), os.Getenv(scaleBindEnv)))
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	defer n.Kill()
	stdin := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdin) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stdin:
			return
		case <-tick.C:
			fmt.Printf("applied %d %d\n", n.fsm.AppliedIndex(), n.fsm.Len())
		}
	}
}

// scaleChild is a follower process started by the measurement.
type scaleChild struct {
	id, dir, bind string
	cmd           *exec.Cmd
	stdin         io.WriteCloser
	mu            sync.Mutex
	applied       uint64
	regs          int
	changed       chan struct{} // closed and replaced at each status line
	exited        chan struct{}
}

func startScaleChild(t *testing.T, id, dir, bind string) *scaleChild {
	t.Helper()
	c := &scaleChild{id: id, dir: dir, bind: bind, changed: make(chan struct{}), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestScaleChildNode$", "-test.v=false")
	c.cmd.Env = append(os.Environ(), scaleChildEnv+"="+id, scaleDirEnv+"="+dir, scaleBindEnv+"="+bind)
	c.cmd.Stderr = os.Stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // owned by c: ends when the child's stdout closes
		defer close(c.exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var idx uint64
			var regs int
			if _, err := fmt.Sscanf(sc.Text(), "applied %d %d", &idx, &regs); err != nil {
				continue
			}
			c.mu.Lock()
			c.applied, c.regs = idx, regs
			close(c.changed)
			c.changed = make(chan struct{})
			c.mu.Unlock()
		}
		c.cmd.Wait()
	}()
	t.Cleanup(func() { c.stop(syscall.SIGKILL) })
	return c
}

func (c *scaleChild) stop(sig syscall.Signal) {
	if c.cmd.Process != nil {
		c.cmd.Process.Signal(sig)
	}
	c.stdin.Close()
	<-c.exited
}

// waitApplied waits until the child has applied index and holds regs.
func (c *scaleChild) waitApplied(t *testing.T, index uint64, regs int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		ok, ch := c.applied >= index && c.regs == regs, c.changed
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-c.exited:
			t.Fatalf("%s exited", c.id)
		case <-deadline:
			t.Fatalf("%s did not apply index %d with %d registrations within %v", c.id, index, regs, timeout)
		}
	}
}

// rssBytes is the resident set size of process pid (0 = this process).
func rssBytes(pid int) int64 {
	path := "/proc/self/status"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			n += info.Size()
		}
		return nil
	})
	return n
}

// scaleReg is the i-th of a million registrations: a distinct host with one
// IPv4 address, monitored by the local lock manager.
func scaleReg(i int, node string) fsm.Registration {
	return fsm.Registration{
		ID:       fsm.MonID{MonName: fmt.Sprintf("client%07d.nfs.example.com", i), My: fsm.MyID{MyName: "nfs-server-1", Prog: 100021, Vers: 4, Proc: 16}},
		Priv:     [16]byte{byte(i), byte(i >> 8), byte(i >> 16), 3: 1},
		Node:     node,
		Callback: netip.AddrFrom4([4]byte{127, 0, 0, 1}),
		Addrs:    []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})},
		Added:    time.Unix(1_800_000_000, int64(i)),
	}
}

// TestMeasureScale1M loads 1,000,000 registrations into a 3-node cluster
// (leader in this process, each follower in a process of its own, raft over
// TCP on loopback, fsync on) and measures the scale figures of BENCHMARKS.md: RSS per
// node, snapshot time and size, restore time, and how long a follower whose
// data was wiped takes to catch up (snapshot installed from the leader); also
// how long a follower restarted with its data takes to replay its log.
// A measurement, not a check:
//
//	NSMD_MEASURE=1 go test -run TestMeasureScale1M -v -timeout 30m ./cluster
//
// NSMD_MEASURE_REGS changes the count, NSMD_MEASURE_BATCH the registrations
// per log entry (4096; group commit makes entries of up to 512, typically
// ~30 at 64 connections).
func TestMeasureScale1M(t *testing.T) {
	if os.Getenv("NSMD_MEASURE") == "" {
		t.Skip("measurement; set NSMD_MEASURE=1 to run")
	}
	total := 1_000_000
	if v := os.Getenv("NSMD_MEASURE_REGS"); v != "" {
		total, _ = strconv.Atoi(v)
	}
	root := t.TempDir()
	lead, err := New(testDefaults(Config{NodeID: "n1", DataDir: filepath.Join(root, "n1"), RaftBind: testutil.FreeAddr(t, "127.0.0.1"), Bootstrap: true, TrailingLogs: 16}))
	if err != nil {
		t.Fatal(err)
	}
	lead.Start()
	defer lead.Kill()
	testutil.WaitFor(t, 10*time.Second, "n1 to take over", lead.Leading)
	var children []*scaleChild
	for _, id := range []string{"n2", "n3"} {
		c := startScaleChild(t, id, filepath.Join(root, id), testutil.FreeAddr(t, "127.0.0.1"))
		if err := lead.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(c.bind), 0, 10*time.Second).Error(); err != nil {
			t.Fatalf("add %s: %v", id, err)
		}
		children = append(children, c)
	}

	// Load: batches of registrations straight into raft, a few in flight.
	batch := 4096
	if v := os.Getenv("NSMD_MEASURE_BATCH"); v != "" {
		batch, _ = strconv.Atoi(v)
	}
	const inflight = 4
	start := time.Now()
	futures := make(chan raft.ApplyFuture, inflight)
	loadErr := make(chan error, 1)
	go func() {
		for f := range futures {
			if err := f.Error(); err != nil {
				loadErr <- err
				for range futures {
				}
				return
			}
		}
		loadErr <- nil
	}()
	cmds := make([]fsm.Command, 0, batch)
	for i := range total {
		cmds = append(cmds, fsm.Register{Reg: scaleReg(i, "n1")})
		if len(cmds) == batch || i == total-1 {
			data, err := fsm.Encode(cmds...)
			if err != nil {
				t.Fatal(err)
			}
			futures <- lead.raft.Apply(data, time.Minute)
			cmds = cmds[:0]
		}
	}
	close(futures)
	if err := <-loadErr; err != nil {
		t.Fatalf("load: %v", err)
	}
	last := lead.raft.LastIndex()
	for _, c := range children {
		c.waitApplied(t, last, total, 5*time.Minute)
	}
	loadTime := time.Since(start)
	if got := lead.fsm.Len(); got != total {
		t.Fatalf("leader holds %d registrations, want %d", got, total)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("load: %d registrations in %v (%.0f/s), %d entries, on every node", total, loadTime.Round(time.Millisecond), float64(total)/loadTime.Seconds(), last)
	t.Logf("RSS: leader (this process, test included) %d MiB (Go heap in use %d MiB); %s %d MiB; %s %d MiB",
		rssBytes(0)>>20, ms.HeapInuse>>20, children[0].id, rssBytes(children[0].cmd.Process.Pid)>>20,
		children[1].id, rssBytes(children[1].cmd.Process.Pid)>>20)
	t.Logf("raft.db: leader %d MiB", dirSize(filepath.Join(root, "n1", "raft.db"))>>20)

	// Snapshot on the leader (a user snapshot: FSM clone, Persist, fsync).
	start = time.Now()
	if err := lead.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	snapTime := time.Since(start)
	snaps, err := raft.NewFileSnapshotStore(filepath.Join(root, "n1"), 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	metas, err := snaps.List()
	if err != nil || len(metas) == 0 {
		t.Fatalf("no snapshot listed: %v", err)
	}
	t.Logf("snapshot: %v, %d MiB (%d B/registration) at index %d", snapTime.Round(time.Millisecond), metas[0].Size>>20, metas[0].Size/int64(total), metas[0].Index)

	// Restore: the leader's snapshot into a fresh FSM.
	_, rc, err := snaps.Open(metas[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	f := fsm.New(fsm.Options{})
	start = time.Now()
	if err := f.Restore(rc); err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Logf("restore: %v (%d registrations)", time.Since(start).Round(time.Millisecond), f.Len())
	f = nil

	// A follower restarts with its data (no snapshot of its own: it
	// replays its log from bolt), then catches up.
	r := children[0]
	r.stop(syscall.SIGKILL)
	start = time.Now()
	r2 := startScaleChild(t, r.id, r.dir, r.bind)
	r2.waitApplied(t, lead.raft.LastIndex(), total, 5*time.Minute)
	t.Logf("restarted follower %s (log replay, %d entries) back in %v", r2.id, lead.raft.LastIndex(), time.Since(start).Round(time.Millisecond))

	// A follower loses its disk: kill it, wipe its data, start it empty at
	// the same address; the leader sends it the snapshot.
	w := children[1]
	w.stop(syscall.SIGKILL)
	if err := os.RemoveAll(w.dir); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	w2 := startScaleChild(t, w.id, w.dir, w.bind)
	w2.waitApplied(t, lead.raft.LastIndex(), total, 5*time.Minute)
	t.Logf("wiped follower %s caught up (snapshot install + restore) in %v; its RSS %d MiB", w2.id,
		time.Since(start).Round(time.Millisecond), rssBytes(w2.cmd.Process.Pid)>>20)

	// And the cluster still commits.
	if _, err := lead.Registry().Monitor(context.Background(), scaleReg(total, "n1")); err != nil {
		t.Fatalf("write after catch-up: %v", err)
	}
}
