package grace

import (
	"fmt"
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
