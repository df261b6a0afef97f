package fencetest

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fence"
)

// The fake keeps the deadline as the kernel's watchdog core does.
func TestFakeDeviceKernelRules(t *testing.T) {
	clock := &Clock{}
	f := &FakeDevice{Now: clock.Now, DefaultTimeout: 30}
	t0 := clock.Now()
	d, err := f.Open("/dev/watchdog")
	if err != nil {
		t.Fatal(err)
	}
	if !f.Active() || !f.Deadline().Equal(t0.Add(30*time.Second)) {
		t.Fatalf("open did not start it with the driver's timeout: deadline %v", f.Deadline())
	}
	if _, err := f.Open("/dev/watchdog"); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("second open = %v, want EBUSY", err)
	}

	clock.Advance(5 * time.Second)
	if got, err := d.SetTimeout(10); err != nil || got != 10 {
		t.Fatalf("SetTimeout = %d, %v", got, err)
	}
	if !f.Deadline().Equal(clock.Now().Add(10 * time.Second)) {
		t.Fatal("SETTIMEOUT did not ping")
	}
	before := f.Deadline()
	clock.Advance(time.Second)
	if _, err := d.SetTimeout(0); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("SetTimeout(0) = %v, want EINVAL", err)
	}
	if !f.Deadline().Equal(before) || f.Timeout() != 10 {
		t.Fatal("a rejected SETTIMEOUT changed the watchdog")
	}
	if err := d.Keepalive(); err != nil || !f.Deadline().Equal(clock.Now().Add(10*time.Second)) {
		t.Fatalf("Keepalive = %v, deadline %v", err, f.Deadline())
	}

	// A death: the close without "V" pings and leaves it running.
	clock.Advance(3 * time.Second)
	if !f.ProcessDied() {
		t.Fatal("no handle was open")
	}
	if !f.Active() || !f.Deadline().Equal(clock.Now().Add(10*time.Second)) {
		t.Fatalf("after a death: active %v, deadline %v", f.Active(), f.Deadline())
	}
	if err := d.Keepalive(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Keepalive on the dead handle = %v", err)
	}
	if _, err := f.Open("/dev/watchdog"); !errors.Is(err, fence.ErrLeftRunning) {
		t.Fatalf("open of a watchdog left running = %v, want ErrLeftRunning", err)
	}

	// The kernel itself opens it, without a ping.
	f.AllowOpenRunning = true
	clock.Advance(time.Second)
	deadline := f.Deadline()
	d, err = f.Open("/dev/watchdog")
	if err != nil || !f.Deadline().Equal(deadline) {
		t.Fatalf("open of a running watchdog = %v, deadline %v, want %v (no ping)", err, f.Deadline(), deadline)
	}
	if err := d.MagicClose(); err != nil || f.Active() || f.IsOpen() {
		t.Fatalf("MagicClose = %v, active %v, open %v", err, f.Active(), f.IsOpen())
	}
}

func TestFakeDeviceNoWayOutAndReset(t *testing.T) {
	clock := &Clock{}
	f := &FakeDevice{Now: clock.Now, NoWayOut: true, NoSysfs: true}
	d, err := f.Open("/dev/watchdog")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.SetTimeout(5); err != nil {
		t.Fatal(err)
	}
	if err := d.MagicClose(); err != nil {
		t.Fatal(err)
	}
	if !f.Active() {
		t.Fatal("nowayout: the magic close stopped it")
	}
	want := f.Deadline()
	clock.Advance(4 * time.Second)
	if _, reset := f.ResetAt(); reset {
		t.Fatal("reset before the deadline")
	}
	clock.Advance(2 * time.Second)
	at, reset := f.ResetAt()
	if !reset || !at.Equal(want) {
		t.Fatalf("ResetAt = %v, %v; want %v", at, reset, want)
	}
	if _, err := f.Open("/dev/watchdog"); !errors.Is(err, ErrMachineReset) {
		t.Fatalf("open after the reset = %v, want ErrMachineReset", err)
	}
}
