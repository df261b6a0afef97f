//go:build linux

package fence

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sysRoot is where sysfs is mounted, procRoot procfs; tests use trees of
// their own.
const (
	sysRoot  = "/sys"
	procRoot = "/proc"
)

// OpenDevice opens the watchdog device at path (O_WRONLY|O_CLOEXEC), which
// STARTS it: from then on the machine resets unless the device is pinged
// within its timeout, or disarmed with MagicClose. Call it only on a node
// that is about to need the watchdog ([Probe] checks a device without
// opening it).
//
// Before opening, it asks sysfs what the device is, and refuses one of
// another class (a write to /dev/mem or a tty does harm); and it reads the
// watchdog's state there: a watchdog that is
// already active while nobody holds it was left running by a process that
// died without disarming it, and is refused with an error wrapping
// [ErrLeftRunning] (opening it would not ping it, but feeding it would
// extend a dead process's deadline). A kernel without watchdog sysfs
// (CONFIG_WATCHDOG_SYSFS) does not tell; the device is then opened.
//
// After opening, it asks the driver what it supports (WDIOC_GETSUPPORT): a
// device that does not answer is not a watchdog and is closed; a driver
// without WDIOF_MAGICCLOSE stops whenever its holder closes it, a process
// death included, so it cannot fence, and is closed (which stops it).
//
// Errors name the device and what to do about them. The returned Device
// holds the raw descriptor, with no finalizer: a Device that is dropped
// without Close stays open (and the watchdog armed) until the process
// exits, rather than being closed, which pings it, by a garbage
// collection at some unknown time.
func OpenDevice(path string) (Device, error) {
	return openDevice(sysRoot, procRoot, path, false)
}

// OpenDeviceLeftRunning is OpenDevice that also opens a watchdog left
// running by a process that died (which the open does not ping): only to
// stop it with MagicClose, once whatever that process served is stopped
// ([Watchdog.Release]). A watchdog that sysfs says is not running is not
// opened ([ErrNotRunning]: there is nothing to release, and an open would
// start it).
func OpenDeviceLeftRunning(path string) (Device, error) {
	return openDevice(sysRoot, procRoot, path, true)
}

// openDevice is OpenDevice with sysfs at root and procfs at proc;
// leftRunning: open a watchdog left running, and only such a one.
func openDevice(root, proc, path string, leftRunning bool) (Device, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, openError(path, err)
	}
	if st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice == 0 {
		return nil, fmt.Errorf("%s is not a character device (%s), so not a watchdog: set fence_watchdog to the watchdog device, e.g. /dev/watchdog", path, st.Mode().Type())
	}
	known := false // sysfs says it is a watchdog
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		major, minor := unix.Major(uint64(sys.Rdev)), unix.Minor(uint64(sys.Rdev))
		if class, ok := deviceClass(root, major, minor); ok && class != "watchdog" {
			// Not opened: a write to another device (/dev/mem, a tty) does harm.
			return nil, fmt.Errorf("%s is a %s device, not a watchdog: set fence_watchdog to the watchdog device, e.g. /dev/watchdog", path, class)
		} else if ok {
			known = true
		}
		if err := checkState(root, proc, path, uint64(sys.Rdev), major, minor, leftRunning); err != nil {
			return nil, err
		}
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, openError(path, &os.PathError{Op: "open", Path: path, Err: err})
	}
	info, err := unix.IoctlGetWatchdogInfo(fd)
	if err != nil {
		if known {
			// A watchdog, started by the open: stop it again if it lets us.
			_, _ = unix.Write(fd, []byte("V"))
		}
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a watchdog (ioctl WDIOC_GETSUPPORT: %w): set fence_watchdog to the watchdog device, e.g. /dev/watchdog", path, err)
	}
	if info.Options&unix.WDIOF_MAGICCLOSE == 0 {
		// Without magic close the driver stops on any close: this one too.
		unix.Close(fd)
		return nil, fmt.Errorf("watchdog %s (%s) does not support the magic close: it stops whenever its holder closes it, a process death included, so it cannot fence; use another driver (softdog, or the board's)", path, identity(info))
	}
	return &linuxDevice{
		path:      path,
		fd:        fd,
		keepalive: info.Options&unix.WDIOF_KEEPALIVEPING != 0,
	}, nil
}

func identity(info *unix.WatchdogInfo) string {
	b := info.Identity[:]
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// openError turns an error from stat or open into one that says what to
// do.
func openError(path string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENXIO):
		return fmt.Errorf("no watchdog device %s: load a driver (modprobe softdog, or the board's: iTCO_wdt, i6300esb, …) or set fence_watchdog: off: %w", path, err)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%s is held by another process (a watchdog daemon, systemd's RuntimeWatchdogSec, sbd): stop it or give nsmd another device: %w", path, err)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("opening %s needs root or write access to %s (the systemd unit: DeviceAllow=%s rw): %w", path, path, path, err)
	default:
		return fmt.Errorf("open watchdog %s: %w", path, err)
	}
}

// deviceState reads the watchdog core's state ("active" or "inactive") of
// the character device major:minor from sysfs under root. known is false
// when sysfs does not say (no CONFIG_WATCHDOG_SYSFS, a driver outside the
// watchdog core). The legacy /dev/watchdog (misc 10:130) belongs to
// watchdog0.
func deviceState(root string, major, minor uint32) (state string, known bool) {
	return deviceAttr(root, major, minor, "state")
}

// deviceAttr reads one of the watchdog core's sysfs attributes (state,
// nowayout, timeout, …) of the character device major:minor under root;
// known is false when sysfs does not say. The legacy /dev/watchdog (misc
// 10:130) is watchdog0's.
func deviceAttr(root string, major, minor uint32, name string) (value string, known bool) {
	dir := filepath.Join(root, "dev", "char", fmt.Sprintf("%d:%d", major, minor))
	if major == 10 && minor == 130 {
		dir = filepath.Join(root, "class", "watchdog", "watchdog0")
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// deviceClass is the sysfs class of the character device major:minor
// under root ("watchdog", "mem", "tty", …); ok is false when sysfs does
// not say. The legacy /dev/watchdog (misc 10:130) is a watchdog.
func deviceClass(root string, major, minor uint32) (class string, ok bool) {
	if major == 10 && minor == 130 {
		return "watchdog", true
	}
	link, err := os.Readlink(filepath.Join(root, "dev", "char", fmt.Sprintf("%d:%d", major, minor), "subsystem"))
	if err != nil {
		return "", false
	}
	return filepath.Base(link), true
}

// Probe checks, without opening it (an open starts many drivers), that
// path exists, is a character device, and that this process may write to
// it; and, where sysfs says, that it is a watchdog, that it was not built
// or loaded with nowayout ([ErrNoWayOut]), that no other process holds it
// ([ErrHeldByOther]: procfs names the holder), and that it was not left
// running by a process that died ([ErrLeftRunning]). Without sysfs it
// cannot tell a watchdog from another character device; OpenDevice can.
func Probe(path string) error {
	return probe(sysRoot, procRoot, path)
}

// ProbeAt is Probe with sysfs and procfs under root (tests give a tree of
// their own; "/" is the machine's).
func ProbeAt(root, path string) error {
	return probe(filepath.Join(root, "sys"), filepath.Join(root, "proc"), path)
}

// probe is Probe with sysfs at root and procfs at proc.
func probe(root, proc, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return openError(path, err)
	}
	if st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice == 0 {
		return fmt.Errorf("%s is not a character device (%s), so not a watchdog: set fence_watchdog to the watchdog device, e.g. /dev/watchdog", path, st.Mode().Type())
	}
	if err := unix.Faccessat(unix.AT_FDCWD, path, unix.W_OK, unix.AT_EACCESS); err != nil {
		return openError(path, &os.PathError{Op: "access", Path: path, Err: err})
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		major, minor := unix.Major(uint64(sys.Rdev)), unix.Minor(uint64(sys.Rdev))
		if class, ok := deviceClass(root, major, minor); ok && class != "watchdog" {
			return fmt.Errorf("%s is a %s device, not a watchdog: set fence_watchdog to the watchdog device, e.g. /dev/watchdog", path, class)
		}
		if err := checkState(root, proc, path, uint64(sys.Rdev), major, minor, false); err != nil {
			return err
		}
	}
	return nil
}

// checkState refuses, from what sysfs and procfs say and before any open,
// a watchdog with nowayout ([ErrNoWayOut]), one held by another process
// ([ErrHeldByOther]) and one left running by a process that died
// ([ErrLeftRunning]) unless leftRunning; with leftRunning it refuses one
// that is not running ([ErrNotRunning]). What sysfs does not say is not
// refused.
func checkState(root, proc, path string, rdev uint64, major, minor uint32, leftRunning bool) error {
	state, known := deviceAttr(root, major, minor, "state")
	if leftRunning && known && state != "active" {
		return fmt.Errorf("%s: %w", path, ErrNotRunning)
	}
	if v, ok := deviceAttr(root, major, minor, "nowayout"); ok && v == "1" {
		return fmt.Errorf("%s: %w", path, ErrNoWayOut)
	}
	if !known || state != "active" {
		return nil
	}
	switch pids, complete := holders(proc, rdev, os.Getpid()); {
	case len(pids) > 0:
		return fmt.Errorf("%s: %w: %s; stop it (systemd: RuntimeWatchdogSec=0 in system.conf; a watchdog daemon; sbd) or give nsmd another device", path, ErrHeldByOther, describePIDs(proc, pids))
	case leftRunning:
		return nil
	case complete:
		return fmt.Errorf("%s: %w (no process holds it): it resets the machine when it expires", path, ErrLeftRunning)
	default:
		return fmt.Errorf("%s: %w, or it is held by a process this one may not look at (run nsmd as root to tell): it resets the machine when it expires", path, ErrLeftRunning)
	}
}

// holders lists the processes under proc (other than self) that hold the
// character device rdev open; complete is false when some process's
// descriptors could not be read.
func holders(proc string, rdev uint64, self int) (pids []int, complete bool) {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, false
	}
	complete = true
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		fdDir := filepath.Join(proc, e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) { // a process that exited meanwhile
				complete = false
			}
			continue
		}
		for _, fd := range fds {
			st, err := os.Stat(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			if sys, ok := st.Sys().(*syscall.Stat_t); ok && st.Mode()&os.ModeCharDevice != 0 && uint64(sys.Rdev) == rdev {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids, complete
}

// describePIDs names processes for a message: "pid 1 (systemd)".
func describePIDs(proc string, pids []int) string {
	var parts []string
	for _, pid := range pids {
		comm, _ := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "comm"))
		if c := strings.TrimSpace(string(comm)); c != "" {
			parts = append(parts, fmt.Sprintf("pid %d (%s)", pid, c))
		} else {
			parts = append(parts, fmt.Sprintf("pid %d", pid))
		}
	}
	return strings.Join(parts, ", ")
}

// linuxDevice is an open watchdog descriptor.
type linuxDevice struct {
	path      string
	keepalive bool // the driver has WDIOF_KEEPALIVEPING; else a write pings

	mu     sync.Mutex
	fd     int
	closed bool
}

func (d *linuxDevice) Keepalive() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("watchdog %s keepalive: %w", d.path, os.ErrClosed)
	}
	var err error
	if d.keepalive {
		err = unix.IoctlWatchdogKeepalive(d.fd)
	} else {
		// Any write is a ping; one that is not "V" also cancels a magic close.
		_, err = unix.Write(d.fd, []byte{0})
	}
	if err != nil {
		return fmt.Errorf("watchdog %s keepalive: %w", d.path, err)
	}
	return nil
}

func (d *linuxDevice) SetTimeout(seconds int) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("watchdog %s set timeout: %w", d.path, os.ErrClosed)
	}
	// The kernel reads the int and writes back the timeout it took.
	v := int32(seconds)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(d.fd), uintptr(unix.WDIOC_SETTIMEOUT), uintptr(unsafe.Pointer(&v)))
	if errno != 0 {
		return 0, fmt.Errorf("watchdog %s set timeout %ds: %w", d.path, seconds, errno)
	}
	return int(v), nil
}

func (d *linuxDevice) MagicClose() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("watchdog %s magic close: %w", d.path, os.ErrClosed)
	}
	_, werr := unix.Write(d.fd, []byte("V"))
	d.closed = true
	cerr := unix.Close(d.fd)
	if werr != nil {
		return fmt.Errorf("watchdog %s: write of the magic character failed, closed without it (the watchdog keeps running): %w", d.path, werr)
	}
	if cerr != nil {
		return fmt.Errorf("watchdog %s close: %w", d.path, cerr)
	}
	return nil
}

func (d *linuxDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("watchdog %s close: %w", d.path, os.ErrClosed)
	}
	d.closed = true
	if err := unix.Close(d.fd); err != nil {
		return fmt.Errorf("watchdog %s close: %w", d.path, err)
	}
	return nil
}
