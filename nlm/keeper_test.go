package nlm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	if st.NLM.Ended == nil || st.NFSv4.Back != 2 || st.NFSv4.Expected != 2 || st.NFSv4.Seconds != 15.5 {
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
