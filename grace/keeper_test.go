package grace

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func write(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A whole incarnation against a fake procfs (plain files with the
// kernel's content): NLM ends once its host is back and locks are quiet;
// NFSv4 waits for its NFSv4.1 client's Create and for its NFSv4.0 client
// to show up confirmed in nfsd's client list.
func TestKeeperEndsEachGraceWhenItsClientsAreBack(t *testing.T) {
	root := t.TempDir()
	write(t, root, "fs/lockd/nlm_end_grace", "N\n")
	write(t, root, "fs/nfsd/v4_end_grace", "N\n")
	write(t, root, "locks", "")
	clk := &fakeClock{t: time.Unix(5000, 0)}
	var ends, backs []string
	k := NewKeeper(KeeperConfig{Proc: root, Settle: 2 * time.Second, Now: clk.now,
		OnEnd: func(m Manager, reason string, after time.Duration) { ends = append(ends, string(m)+":"+reason) },
		OnBack: func(m Manager, name string, last bool) {
			backs = append(backs, fmt.Sprintf("%s:%s:%v", m, name, last))
		}},
		[]string{"10.0.0.21"}, clk.now())
	if k.step() {
		t.Fatal("done before anything happened")
	}
	k.ExpectV4([]string{"Linux NFSv4.1 c41", "Linux NFSv4.0 c40/10.0.0.100"})
	k.Back(NLM, "10.0.0.21")
	k.Back(NLM, "10.0.0.21") // a repeat: not back again
	clk.add(time.Second)
	write(t, root, "locks", "1: POSIX  ADVISORY  WRITE 1 fe:00:12 0 EOF\n") // its reclaim
	k.step()
	clk.add(1500 * time.Millisecond)
	k.step()
	if read(t, root, "fs/lockd/nlm_end_grace") != "N" {
		t.Fatal("NLM grace ended 1.5 s after the last reclaim (settle 2 s)")
	}
	clk.add(time.Second)
	k.step()
	if read(t, root, "fs/lockd/nlm_end_grace") != "Y" {
		t.Fatal("NLM grace not ended 2.5 s after the last reclaim")
	}
	k.Back(NFSv4, "Linux NFSv4.1 c41")
	clk.add(10 * time.Second)
	k.step()
	if read(t, root, "fs/nfsd/v4_end_grace") != "N" {
		t.Fatal("NFSv4 grace ended while the NFSv4.0 client had not come back")
	}
	write(t, root, "fs/nfsd/clients/7/info", "status: confirmed\nname: \"Linux NFSv4.0 c40/10.0.0.100\"\nminor version: 0\n")
	k.step() // sees it: activity now
	clk.add(2 * time.Second)
	if !k.step() {
		t.Fatal("not done")
	}
	if read(t, root, "fs/nfsd/v4_end_grace") != "Y" {
		t.Fatal("NFSv4 grace not ended")
	}
	if strings.Join(ends, ",") != "nlm:all_reclaimed,nfsv4:all_reclaimed" {
		t.Fatalf("ends %v", ends)
	}
	// Each client once; the last expected one of each manager says so.
	if got := strings.Join(backs, ","); got != "nlm:10.0.0.21:true,nfsv4:Linux NFSv4.1 c41:false,nfsv4:Linux NFSv4.0 c40/10.0.0.100:true" {
		t.Fatalf("backs %s", got)
	}
	st := k.Status()
	if want := time.Unix(5000, 0).Add(13500 * time.Millisecond); !st.LastActivity.Equal(want) {
		t.Fatalf("last activity %v, want %v (the NFSv4.0 client seen confirmed)", st.LastActivity, want)
	}
	if st.NLM.Ended == nil || st.NFSv4.Back != 2 || st.NFSv4.Expected != 2 || st.NFSv4.Ended == nil || st.NFSv4.Ended.After != 15500*time.Millisecond {
		t.Fatalf("status %+v / %+v", st.NLM, st.NFSv4)
	}
}

// The kernel's own end (its timer, or RECLAIM_COMPLETE from everyone) is
// recorded as such, and a manager that is not there (no lockd: an
// NFSv4-only server) is not waited for.
func TestKeeperRecordsTheKernelsOwnEnd(t *testing.T) {
	root := t.TempDir()
	write(t, root, "fs/nfsd/v4_end_grace", "N\n")
	clk := &fakeClock{t: time.Unix(5000, 0)}
	k := NewKeeper(KeeperConfig{Proc: root, Now: clk.now}, nil, clk.now())
	k.ExpectV4([]string{"Linux NFSv4.2 gone"})
	if k.step() {
		t.Fatal("done while nfsd is in grace with a client missing")
	}
	write(t, root, "fs/nfsd/v4_end_grace", "Y\n")
	clk.add(90 * time.Second)
	if !k.step() {
		t.Fatal("not done after the kernel ended grace")
	}
	if e := k.Status().NFSv4.Ended; e == nil || e.Reason != ReasonKernel {
		t.Fatalf("ended %+v, want reason kernel", e)
	}
	if m := k.Status().NFSv4.Missing; len(m) != 1 || m[0] != "Linux NFSv4.2 gone" {
		t.Fatalf("missing %v", m)
	}
}

// A kernel whose write to v4_end_grace only asks nfsd's laundromat to end
// grace and returns before it did: the Keeper records the end when it
// reads it over, with its own reason, and does not write again meanwhile.
func TestKeeperWaitsForAnAsynchronousEnd(t *testing.T) {
	root := t.TempDir()
	write(t, root, "fs/nfsd/v4_end_grace", "N\n")
	clk := &fakeClock{t: time.Unix(5000, 0)}
	var ends []string
	k := NewKeeper(KeeperConfig{Proc: root, Now: clk.now,
		OnEnd: func(m Manager, reason string, after time.Duration) {
			ends = append(ends, fmt.Sprintf("%s:%s:%v", m, reason, after))
		}}, nil, clk.now())
	writes := 0
	k.kernel.write = func(string) error { writes++; return nil } // the laundromat runs later
	k.ExpectV4(nil)                                              // no client to wait for
	if k.step() {
		t.Fatal("done while the kernel still reads in grace")
	}
	if writes != 1 {
		t.Fatalf("%d writes, want 1", writes)
	}
	if e := k.Status().NFSv4.Ended; e != nil {
		t.Fatalf("grace recorded over (%+v) while the kernel reads in grace", e)
	}
	clk.add(500 * time.Millisecond)
	if k.step() || writes != 1 {
		t.Fatalf("written again (%d writes) 0.5 s after asking", writes)
	}
	write(t, root, "fs/nfsd/v4_end_grace", "Y\n") // the laundromat ended it
	clk.add(200 * time.Millisecond)
	if !k.step() {
		t.Fatal("not done once the kernel reads grace over")
	}
	if got := strings.Join(ends, ","); got != "nfsv4:nothing_to_reclaim:700ms" {
		t.Fatalf("ends %s, want the Keeper's reason at the time it read the end", got)
	}
	// A kernel that never ends it after a write is asked again.
	k2 := NewKeeper(KeeperConfig{Proc: t.TempDir(), Now: clk.now}, nil, clk.now())
	write(t, k2.cfg.Proc, "fs/nfsd/v4_end_grace", "N\n")
	writes = 0
	k2.kernel.write = func(string) error { writes++; return nil }
	k2.ExpectV4(nil)
	k2.step()
	clk.add(reaskAfter)
	k2.step()
	if writes != 2 {
		t.Fatalf("%d writes after %v without an end, want 2", writes, reaskAfter)
	}
}

// nfsd answers a write to v4_end_grace with EBUSY when grace already
// ended or its client tracking is not active: the Keeper reads the file
// back and tells the two apart.
func TestKeeperReadsBackAfterEBUSY(t *testing.T) {
	busy := func(p string) error { return &fs.PathError{Op: "write", Path: p, Err: syscall.EBUSY} }
	t.Run("ended meanwhile", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "fs/nfsd/v4_end_grace", "N\n")
		clk := &fakeClock{t: time.Unix(5000, 0)}
		k := NewKeeper(KeeperConfig{Proc: root, Now: clk.now}, nil, clk.now())
		k.kernel.write = func(p string) error {
			write(t, root, "fs/nfsd/v4_end_grace", "Y\n") // the kernel's timer, just before
			return busy(p)
		}
		k.ExpectV4(nil)
		if !k.step() {
			t.Fatal("not done: EBUSY with grace over is the end")
		}
		st := k.Status()
		if st.NFSv4.Ended == nil || st.NFSv4.Ended.Reason != ReasonKernel || st.Error != "" {
			t.Fatalf("ended %+v error %q, want the kernel's end and no error", st.NFSv4.Ended, st.Error)
		}
	})
	t.Run("not tracking", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "fs/nfsd/v4_end_grace", "N\n")
		clk := &fakeClock{t: time.Unix(5000, 0)}
		k := NewKeeper(KeeperConfig{Proc: root, Now: clk.now}, nil, clk.now())
		k.kernel.write = busy
		k.ExpectV4(nil)
		if k.step() {
			t.Fatal("done while nfsd is in grace")
		}
		st := k.Status()
		if st.NFSv4.Ended != nil || !strings.Contains(st.Error, "client tracking is not active") {
			t.Fatalf("ended %+v error %q, want in grace and the reason said", st.NFSv4.Ended, st.Error)
		}
		write(t, root, "fs/nfsd/v4_end_grace", "Y\n") // nfsd's own timer
		clk.add(90 * time.Second)
		if !k.step() {
			t.Fatal("not done after the kernel's timer")
		}
		if e := k.Status().NFSv4.Ended; e == nil || e.Reason != ReasonKernel {
			t.Fatalf("ended %+v, want the kernel's", e)
		}
	})
}
