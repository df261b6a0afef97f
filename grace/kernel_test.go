package grace

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The kernel's files are procfs; here they are plain files with the
// kernel's content ("Y"/"N"). The real files are driven in the QEMU tier
// (e2e/nfs4_vm_linux_test.go).
func fakeProc(t *testing.T, lockd, nfsd string) string {
	t.Helper()
	root := t.TempDir()
	for rel, content := range map[string]string{"fs/lockd/nlm_end_grace": lockd, "fs/nfsd/v4_end_grace": nfsd} {
		if content == "" {
			continue
		}
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestKernelGraceReadsAndEnds(t *testing.T) {
	k := KernelGrace{Proc: fakeProc(t, "N\n\x00", "Y\n")} // lockd's read ends in a NUL
	if in, err := k.InGrace(NLM); err != nil || !in {
		t.Fatalf("lockd: in grace %v, %v; want true", in, err)
	}
	if in, err := k.InGrace(NFSv4); err != nil || in {
		t.Fatalf("nfsd: in grace %v, %v; want false", in, err)
	}
	if err := k.End(NLM); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(k.Proc, "fs/lockd/nlm_end_grace"))
	if string(b[:1]) != "Y" {
		t.Fatalf("End wrote %q, want Y first", b)
	}
}

func TestKernelGraceWithoutTheManager(t *testing.T) {
	k := KernelGrace{Proc: fakeProc(t, "N", "")}
	if _, err := k.InGrace(NFSv4); !errors.Is(err, ErrNoManager) {
		t.Fatalf("InGrace without nfsd: %v, want ErrNoManager", err)
	}
	if err := k.End(NFSv4); !errors.Is(err, ErrNoManager) {
		t.Fatalf("End without nfsd: %v, want ErrNoManager", err)
	}
	k = KernelGrace{Proc: fakeProc(t, "maybe", "")}
	if _, err := k.InGrace(NLM); err == nil || errors.Is(err, ErrNoManager) {
		t.Fatalf("garbage content: %v, want an error", err)
	}
}

func TestReclaimsNothingExpectedEndsAtOnce(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := NewReclaims(ReclaimPlan{Settle: 3 * time.Second}, t0)
	for _, m := range Managers() {
		if ok, why, _ := r.MayEnd(m, t0); !ok || why != ReasonNothingToReclaim {
			t.Errorf("%s: MayEnd = %v %q, want true %q", m, ok, why, ReasonNothingToReclaim)
		}
	}
}

// The rule: every expected client back, then Settle of quiet. A client
// that never comes back keeps grace on (the negative control: the same
// schedule minus one client must not end).
func TestReclaimsWaitsForEveryClientAndSettle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	plan := ReclaimPlan{NLMHosts: []string{"c1", "c2"}, V4Clients: []string{"Linux NFSv4.2 c3"}, Settle: 2 * time.Second}
	for _, skip := range []string{"", "c2"} {
		r := NewReclaims(plan, t0)
		if ok, _, _ := r.MayEnd(NLM, at(time.Hour)); ok {
			t.Fatal("NLM grace may end before anyone came back")
		}
		r.Back(NLM, "c1", at(1*time.Second))
		r.Back(NLM, "stranger", at(2*time.Second)) // activity, not an expected host
		if skip != "c2" {
			r.Back(NLM, "c2", at(3*time.Second))
		}
		r.Activity(at(4 * time.Second)) // a reclaimed lock showed up
		ok, why, wait := r.MayEnd(NLM, at(5*time.Second))
		if ok || (skip == "" && wait != time.Second) {
			t.Fatalf("skip %q: at 5s MayEnd = %v %q wait %v; want false, wait 1s (quiet since 4s)", skip, ok, why, wait)
		}
		ok, why, _ = r.MayEnd(NLM, at(6*time.Second))
		if want := skip == ""; ok != want || (ok && why != ReasonAllReclaimed) {
			t.Fatalf("skip %q: at 6s MayEnd = %v %q, want %v", skip, ok, why, want)
		}
		if skip == "c2" {
			if m := r.Missing(NLM, 10); !slices.Equal(m, []string{"c2"}) {
				t.Fatalf("missing %v, want [c2]", m)
			}
		}
		// NFSv4 is judged on its own clients.
		if ok, _, _ := r.MayEnd(NFSv4, at(time.Hour)); ok {
			t.Fatal("NFSv4 grace may end before its client came back")
		}
		r.Back(NFSv4, "Linux NFSv4.2 c3", at(7*time.Second))
		r.Back(NFSv4, "Linux NFSv4.2 c3", at(8*time.Second)) // a repeat: not activity
		if b, e := r.Progress(NFSv4); b != 1 || e != 1 {
			t.Fatalf("progress %d/%d", b, e)
		}
		if ok, _, _ := r.MayEnd(NFSv4, at(8*time.Second)); ok {
			t.Fatal("NFSv4 may end 1s after the last activity (settle 2s)")
		}
		if ok, _, _ := r.MayEnd(NFSv4, at(9*time.Second)); !ok {
			t.Fatal("NFSv4 may not end after its client came back and 2s of quiet")
		}
	}
}
