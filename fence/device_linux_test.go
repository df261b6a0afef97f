//go:build linux

package fence

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// These tests never open a watchdog: a missing path, a regular file, and
// /dev/null (a character device that is not a watchdog, harmless to
// open).

func TestOpenDeviceMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "watchdog")
	_, err := OpenDevice(path)
	if !errors.Is(err, unix.ENOENT) {
		t.Fatalf("OpenDevice(missing) = %v, want ENOENT", err)
	}
	for _, want := range []string{"no watchdog device " + path, "modprobe softdog", "fence_watchdog: off"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestOpenDeviceRegularFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "watchdog")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := OpenDevice(path)
	if err == nil || !strings.Contains(err.Error(), "not a character device") {
		t.Fatalf("OpenDevice(regular file) = %v, want a refusal", err)
	}
	// Refused before any open: a write would have pinged a real one, and
	// here would have written the file.
	if b, _ := os.ReadFile(path); len(b) != 0 {
		t.Fatalf("the file was written: %q", b)
	}
}

func TestOpenDeviceNotAWatchdog(t *testing.T) {
	// Where sysfs says what it is, it is refused before any open.
	if class, ok := deviceClass(sysRoot, 1, 3); ok {
		_, err := OpenDevice("/dev/null")
		if err == nil || !strings.Contains(err.Error(), "/dev/null is a "+class+" device, not a watchdog") {
			t.Errorf("OpenDevice(/dev/null) = %v, want a refusal by its class %q", err, class)
		}
	}
	// Where it does not, the open's WDIOC_GETSUPPORT tells.
	_, err := openDevice(t.TempDir(), t.TempDir(), "/dev/null", false)
	if !errors.Is(err, unix.ENOTTY) || !strings.Contains(err.Error(), "/dev/null is not a watchdog") {
		t.Fatalf("openDevice(/dev/null) without sysfs = %v, want ENOTTY and that it is not a watchdog", err)
	}
}

func TestDeviceClass(t *testing.T) {
	root := t.TempDir()
	for dev, class := range map[string]string{"248:0": "watchdog", "1:3": "mem"} {
		dir := filepath.Join(root, "dev", "char", dev)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../../../../class/"+class, filepath.Join(dir, "subsystem")); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		major, minor uint32
		class        string
		ok           bool
	}{
		{248, 0, "watchdog", true},
		{1, 3, "mem", true},
		{10, 130, "watchdog", true},
		{4, 64, "", false},
	} {
		class, ok := deviceClass(root, c.major, c.minor)
		if class != c.class || ok != c.ok {
			t.Errorf("deviceClass(%d:%d) = %q, %v; want %q, %v", c.major, c.minor, class, ok, c.class, c.ok)
		}
	}
}

func TestProbe(t *testing.T) {
	dir := t.TempDir()
	if err := Probe(filepath.Join(dir, "watchdog")); !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "load a driver") {
		t.Errorf("Probe(missing) = %v", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Probe(file); err == nil || !strings.Contains(err.Error(), "not a character device") {
		t.Errorf("Probe(regular file) = %v", err)
	}
	// Where sysfs tells, /dev/null is refused by its class; where it does
	// not, a writable character device passes: Probe does not open.
	if _, ok := deviceClass(sysRoot, 1, 3); ok {
		if err := Probe("/dev/null"); err == nil || !strings.Contains(err.Error(), "not a watchdog") {
			t.Errorf("Probe(/dev/null) = %v, want a refusal by its class", err)
		}
	}
	if err := probe(t.TempDir(), t.TempDir(), "/dev/null"); err != nil {
		t.Errorf("probe(/dev/null) without sysfs = %v", err)
	}
}

// fakeSysfs makes /dev/null (1:3) a watchdog in state under a sysfs of
// its own.
func fakeSysfs(t *testing.T, state string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "dev", "char", "1:3")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../class/watchdog", filepath.Join(dir, "subsystem")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state"), []byte(state+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// A watchdog that sysfs says is active, with nobody holding it (else the
// open would be EBUSY), was left running: not opened, not probed well.
func TestOpenDeviceLeftRunning(t *testing.T) {
	root := fakeSysfs(t, "active")
	if _, err := openDevice(root, t.TempDir(), "/dev/null", false); !errors.Is(err, ErrLeftRunning) {
		t.Errorf("openDevice(active) = %v, want ErrLeftRunning", err)
	}
	if err := probe(root, t.TempDir(), "/dev/null"); !errors.Is(err, ErrLeftRunning) {
		t.Errorf("probe(active) = %v, want ErrLeftRunning", err)
	}
	// Inactive: opened, and then WDIOC_GETSUPPORT tells it is no watchdog.
	root = fakeSysfs(t, "inactive")
	if _, err := openDevice(root, t.TempDir(), "/dev/null", false); !errors.Is(err, unix.ENOTTY) {
		t.Errorf("openDevice(inactive) = %v, want ENOTTY from the ioctl", err)
	}
	if err := probe(root, t.TempDir(), "/dev/null"); err != nil {
		t.Errorf("probe(inactive) = %v", err)
	}
}

func TestOpenErrorSaysWhatToDo(t *testing.T) {
	for _, c := range []struct {
		errno unix.Errno
		want  []string
	}{
		{unix.EBUSY, []string{"/dev/watchdog is held by another process", "RuntimeWatchdogSec", "sbd"}},
		{unix.EACCES, []string{"needs root or write access to /dev/watchdog", "DeviceAllow=/dev/watchdog rw"}},
		{unix.EPERM, []string{"needs root or write access"}},
		{unix.ENODEV, []string{"no watchdog device /dev/watchdog", "modprobe softdog"}},
		{unix.EIO, []string{"open watchdog /dev/watchdog"}},
	} {
		err := openError("/dev/watchdog", &os.PathError{Op: "open", Path: "/dev/watchdog", Err: c.errno})
		if !errors.Is(err, c.errno) {
			t.Errorf("%v: %v does not wrap it", c.errno, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %q does not say %q", c.errno, err, w)
			}
		}
	}
}

func TestDeviceState(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("dev/char/248:0/state", "active\n")
	write("dev/char/248:1/state", "inactive\n")
	write("class/watchdog/watchdog0/state", "active\n")

	for _, c := range []struct {
		major, minor uint32
		state        string
		known        bool
	}{
		{248, 0, "active", true},
		{248, 1, "inactive", true},
		{10, 130, "active", true}, // /dev/watchdog is watchdog0's
		{248, 2, "", false},       // no such device, or no watchdog sysfs
		{1, 3, "", false},         // /dev/null
	} {
		state, known := deviceState(root, c.major, c.minor)
		if state != c.state || known != c.known {
			t.Errorf("deviceState(%d:%d) = %q, %v; want %q, %v", c.major, c.minor, state, known, c.state, c.known)
		}
	}
}

// The descriptor plumbing, on /dev/null: its ioctls fail with ENOTTY, its
// writes succeed, and a closed device says so.
func TestLinuxDeviceOnDevNull(t *testing.T) {
	open := func(keepalive bool) *linuxDevice {
		fd, err := unix.Open("/dev/null", unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return &linuxDevice{path: "/dev/null", fd: fd, keepalive: keepalive}
	}
	d := open(true)
	if err := d.Keepalive(); !errors.Is(err, unix.ENOTTY) {
		t.Errorf("Keepalive = %v, want ENOTTY", err)
	}
	if _, err := d.SetTimeout(5); !errors.Is(err, unix.ENOTTY) || !strings.Contains(err.Error(), "set timeout 5s") {
		t.Errorf("SetTimeout = %v, want ENOTTY", err)
	}
	if err := d.MagicClose(); err != nil {
		t.Errorf("MagicClose = %v", err)
	}
	for name, op := range map[string]func() error{
		"Keepalive":  d.Keepalive,
		"SetTimeout": func() error { _, err := d.SetTimeout(5); return err },
		"MagicClose": d.MagicClose,
		"Close":      d.Close,
	} {
		if err := op(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("%s after close = %v, want os.ErrClosed", name, err)
		}
	}

	// A driver without WDIOF_KEEPALIVEPING is pinged by a write.
	d = open(false)
	if err := d.Keepalive(); err != nil {
		t.Errorf("Keepalive by write = %v", err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
}
