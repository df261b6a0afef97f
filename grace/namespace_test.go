package grace

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// With LocksOn (a service's filesystem), only a new lock on that
// filesystem is reclaim activity: a lock another service's clients take
// on theirs does not hold this service's grace open. Without it (the
// control), any new lock counts.
func TestKeeperCountsOnlyTheLocksOfItsFilesystem(t *testing.T) {
	mine := t.TempDir()
	var st unix.Stat_t
	if err := unix.Stat(mine, &st); err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("%02x:%02x", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)))
	other := "fe:7f" // no filesystem of this test's
	if other == dev {
		other = "fe:7e"
	}
	for _, c := range []struct {
		name        string
		locksOn     string
		otherCounts bool
		mineCounts  bool
	}{{"its filesystem only", mine, false, true}, {"every lock (control)", "", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			clk := &fakeClock{t: time.Unix(1000, 0)}
			write(t, root, "locks", "")
			k := NewKeeper(KeeperConfig{Proc: root, LocksOn: c.locksOn, Now: clk.now}, nil, clk.now())
			k.sampleLocks(clk.now())
			start := k.r.LastActivity()
			clk.add(time.Second)
			write(t, root, "locks", "1: POSIX  ADVISORY  WRITE 7 "+other+":12 0 EOF\n")
			k.sampleLocks(clk.now())
			if got := k.r.LastActivity().After(start); got != c.otherCounts {
				t.Fatalf("a new lock on another filesystem counted: %v, want %v", got, c.otherCounts)
			}
			clk.add(time.Second)
			at := clk.now()
			write(t, root, "locks", "1: POSIX  ADVISORY  WRITE 7 "+other+":12 0 EOF\n2: POSIX  ADVISORY  WRITE 8 "+dev+":99 0 EOF\n")
			k.sampleLocks(at)
			if got := k.r.LastActivity().Equal(at); got != c.mineCounts {
				t.Fatalf("a new lock on its filesystem counted: %v, want %v", got, c.mineCounts)
			}
		})
	}
}

// A network namespace's grace files: nfsd's are those of its own nfsd
// filesystem (NFSd), read and written from any thread; lockd's is the one
// file of procfs, touched only through Within (a thread inside the
// namespace). The host's nfsd file (the control) is left alone.
func TestKernelGraceOfANamespace(t *testing.T) {
	proc := fakeProc(t, "N\n", "N\n")
	nsRoot := t.TempDir() // nfsdClient writes under <root>/fs/nfsd
	nfsd := filepath.Join(nsRoot, "fs", "nfsd")
	write(t, nfsd, "v4_end_grace", "N\n")
	var inside []string
	k := KernelGrace{Proc: proc, NFSd: nfsd, Within: func(fn func() error) error {
		inside = append(inside, "lockd")
		return fn()
	}}
	if in, err := k.InGrace(NFSv4); err != nil || !in {
		t.Fatalf("the namespace's nfsd in grace: %v, %v", in, err)
	}
	if err := k.End(NFSv4); err != nil {
		t.Fatal(err)
	}
	if got := read(t, nfsd, "v4_end_grace"); got != "Y" {
		t.Errorf("the namespace's v4_end_grace: %q", got)
	}
	if got := read(t, proc, "fs/nfsd/v4_end_grace"); got != "N" {
		t.Errorf("the host's v4_end_grace changed: %q", got)
	}
	if len(inside) != 0 {
		t.Errorf("nfsd's file touched through Within (%v): it needs no thread inside", inside)
	}
	if err := k.End(NLM); err != nil {
		t.Fatal(err)
	}
	if len(inside) != 1 {
		t.Errorf("lockd's file ended outside the namespace (%d calls of Within)", len(inside))
	}
	nfsdClient(t, nsRoot, "1", "Linux NFSv4.0 mine", 0, "confirmed")
	nfsdClient(t, proc, "2", "Linux NFSv4.0 the host's", 0, "confirmed")
	cs, err := k.Clients()
	if err != nil || len(cs) != 1 || cs[0].Name != "Linux NFSv4.0 mine" {
		t.Errorf("the namespace's nfsd clients: %+v, %v", cs, err)
	}
}
