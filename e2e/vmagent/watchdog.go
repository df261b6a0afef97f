//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The watchdog ioctls (linux/watchdog.h).
const (
	wdiocKeepalive  = 0x80045705 // _IOR('W', 5, int)
	wdiocSetTimeout = 0xc0045706 // _IOWR('W', 6, int)
)

// watchdog arms DEV with a timeout of SECONDS, pings it once, prints
// "pinged TIMEOUT" (the timeout the driver took) and then holds the device
// without another ping, so the machine resets TIMEOUT after that ping: the
// test times the reset from outside (vmboot_linux_test.go).
func watchdog(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: vmagent watchdog DEV SECONDS")
	}
	secs, err := strconv.Atoi(args[1])
	if err != nil || secs < 1 {
		return fmt.Errorf("SECONDS: %q: want a whole number ≥ 1", args[1])
	}
	f, err := os.OpenFile(args[0], os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	t := int32(secs)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocSetTimeout, uintptr(unsafe.Pointer(&t))); e != 0 {
		return fmt.Errorf("WDIOC_SETTIMEOUT %d: %w", secs, e)
	}
	var dummy int32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocKeepalive, uintptr(unsafe.Pointer(&dummy))); e != 0 {
		return fmt.Errorf("WDIOC_KEEPALIVE: %w", e)
	}
	fmt.Println("pinged", t)
	for {
		time.Sleep(time.Hour) // f stays open and unpinged until the reset
	}
}
