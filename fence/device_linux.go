//go:build linux

package fence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sysRoot is where sysfs is mounted; tests of deviceState use a tree of
// their own.
const sysRoot = "/sys"

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
	return openDevice(sysRoot, path, false)
}

// OpenDeviceLeftRunning is OpenDevice that also opens a watchdog left
// running by a process that died (which the open does not ping): only to
// stop it with MagicClose, once whatever that process served is stopped
// ([Watchdog.Release]).
func OpenDeviceLeftRunning(path string) (Device, error) {
	return openDevice(sysRoot, path, true)
}

// openDevice is OpenDevice with sysfs at root; leftRunning allows a
// watchdog left running.
func openDevice(root, path string, leftRunning bool) (Device, error) {
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
		if state, ok := deviceState(root, major, minor); ok && state == "active" && !leftRunning {
			return nil, fmt.Errorf("%s: %w: it resets the machine when it expires; to use it again, reboot", path, ErrLeftRunning)
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
	dir := filepath.Join(root, "dev", "char", fmt.Sprintf("%d:%d", major, minor))
	if major == 10 && minor == 130 {
		dir = filepath.Join(root, "class", "watchdog", "watchdog0")
	}
	b, err := os.ReadFile(filepath.Join(dir, "state"))
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
// it; and, where sysfs says, that it is a watchdog, and not one left
// running by a process that died ([ErrLeftRunning]). Without sysfs it
// cannot tell a watchdog from another character device; OpenDevice can.
func Probe(path string) error {
	return probe(sysRoot, path)
}

// probe is Probe with sysfs at root.
func probe(root, path string) error {
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
		if state, known := deviceState(root, major, minor); known && state == "active" {
			return fmt.Errorf("%s: %w: it resets the machine when it expires", path, ErrLeftRunning)
		}
	}
	return nil
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
