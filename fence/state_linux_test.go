//go:build linux

package fence

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeProc is a procfs of its own: each pid's fd directory holds links to
// the given paths (as the kernel's /proc/PID/fd links do), and comm its
// name.
func fakeProc(t *testing.T, procs map[string][]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, targets := range procs {
		name, pidDir := pid, pid
		if i := strings.IndexByte(pid, ':'); i > 0 {
			pidDir, name = pid[:i], pid[i+1:]
		}
		fd := filepath.Join(root, pidDir, "fd")
		if err := os.MkdirAll(fd, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pidDir, "comm"), []byte(name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for i, target := range targets {
			if err := os.Symlink(target, filepath.Join(fd, string(rune('3'+i)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// writeAttr sets a sysfs attribute of the fake watchdog /dev/null (1:3).
func writeAttr(t *testing.T, root, name, value string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, "dev", "char", "1:3", name), []byte(value+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A running watchdog that another process holds (systemd's
// RuntimeWatchdogSec) is told apart from one a process of this node left
// running when it died: the first is ErrHeldByOther and names the holder,
// the second ErrLeftRunning. The negative control is the procfs nsmd used
// to ignore: without it (no holder visible) the held device reads as left
// running.
func TestAHeldWatchdogIsToldApartFromOneLeftRunning(t *testing.T) {
	sys := fakeSysfs(t, "active")
	held := fakeProc(t, map[string][]string{"1:systemd": {"/dev/null"}, "77:bash": {"/dev/zero"}})
	err := probe(sys, held, "/dev/null")
	if !errors.Is(err, ErrHeldByOther) || errors.Is(err, ErrLeftRunning) || !strings.Contains(err.Error(), "pid 1 (systemd)") || !strings.Contains(err.Error(), "RuntimeWatchdogSec") {
		t.Errorf("probe(held by systemd) = %v, want ErrHeldByOther naming pid 1 (systemd) and RuntimeWatchdogSec", err)
	}
	if _, err := openDevice(sys, held, "/dev/null", true); !errors.Is(err, ErrHeldByOther) {
		t.Errorf("openDevice(held, leftRunning) = %v, want ErrHeldByOther: the release must not take another's device", err)
	}
	nobody := fakeProc(t, map[string][]string{"77:bash": {"/dev/zero"}})
	if err := probe(sys, nobody, "/dev/null"); !errors.Is(err, ErrLeftRunning) || errors.Is(err, ErrHeldByOther) {
		t.Errorf("probe(left running) = %v, want ErrLeftRunning", err)
	}
	// Control: the same held device, with procfs unread.
	if err := probe(sys, t.TempDir(), "/dev/null"); errors.Is(err, ErrHeldByOther) {
		t.Errorf("control: without procfs the holder cannot be seen, yet probe = %v", err)
	}
}

// A kernel or driver with nowayout: nsmd never opens it — not at a
// standby's start, not to arm it. The control: nowayout=0 probes clean.
func TestAWatchdogWithNoWayOutIsRefusedBeforeAnyOpen(t *testing.T) {
	sys := fakeSysfs(t, "inactive")
	proc := fakeProc(t, nil)
	writeAttr(t, sys, "nowayout", "1")
	for name, err := range map[string]error{
		"probe": probe(sys, proc, "/dev/null"),
		"open":  func() error { _, err := openDevice(sys, proc, "/dev/null", false); return err }(),
	} {
		if !errors.Is(err, ErrNoWayOut) || !strings.Contains(err.Error(), "nowayout=0") {
			t.Errorf("%s(nowayout) = %v, want ErrNoWayOut saying how to load it", name, err)
		}
	}
	// Left running with nowayout: nothing can stop it.
	writeAttr(t, sys, "state", "active")
	if _, err := openDevice(sys, proc, "/dev/null", true); !errors.Is(err, ErrNoWayOut) {
		t.Errorf("openDevice(nowayout, left running) = %v, want ErrNoWayOut", err)
	}
	writeAttr(t, sys, "state", "inactive")
	writeAttr(t, sys, "nowayout", "0")
	if err := probe(sys, proc, "/dev/null"); err != nil {
		t.Errorf("control: probe(nowayout=0) = %v", err)
	}
}

// At a standby's start the release opens nothing when sysfs says the
// watchdog is not running (an open would start it).
func TestReleaseOpensNoWatchdogThatIsNotRunning(t *testing.T) {
	sys := fakeSysfs(t, "inactive")
	if _, err := openDevice(sys, fakeProc(t, nil), "/dev/null", true); !errors.Is(err, ErrNotRunning) {
		t.Errorf("openDevice(inactive, leftRunning) = %v, want ErrNotRunning", err)
	}
}
