package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestVMBoots boots one guest of the real-kernel tier on each kernel and
// runs a command in it: the image, its modules (nfsd, lockd, the NFS
// client, softdog's files), the tap on the bridge and vmagent work. Then
// it times how late the guest's watchdog resets it (watchdogLateness):
// softdog on both kernels, and on 6.12 the driver of QEMU's emulated
// i6300esb in a second guest.
func TestVMBoots(t *testing.T) {
	for _, series := range vmKernelSeries {
		t.Run(series, func(t *testing.T) {
			img := needVMImageFor(t, series)
			tp := newTopology(t, 1, 0)
			v := newVM(t, img, tp, tp.nodes[0], vmSpec{name: "b1", ip: netip.MustParseAddr(topoNet + ".31")}, 1)
			var esb *testVM
			if series != kernel61 { // Debian 12's cloud kernel builds no i6300esb driver
				esb = newVM(t, img, tp, tp.nodes[0], vmSpec{name: "b2", ip: netip.MustParseAddr(topoNet + ".32"), devices: []string{"i6300esb"}}, 2)
				esb.boot()
				t.Cleanup(esb.kill)
			}
			v.boot()
			t.Cleanup(v.kill)
			t.Logf("kernel %s: booted in %v", series, v.waitReady())
			out := v.sh(10e9, "uname -r; hostname; lsmod | wc -l; ip -4 addr show eth0 | grep inet; grep -c . /etc/vm/modules; grep -E '^(nfsd|lockd|nfsv4|nfsv3|sunrpc|virtio_net|virtio_blk) ' /proc/modules | cut -d' ' -f1 | sort | tr '\\n' ' '")
			t.Log(out)
			if !strings.HasPrefix(out, img.kernel.version+"\n") {
				t.Fatalf("kernel %s: the guest runs %q, want %s", series, strings.SplitN(out, "\n", 2)[0], img.kernel.version)
			}
			if !strings.Contains(out, "lockd nfsd nfsv3 nfsv4 sunrpc virtio_blk virtio_net") {
				t.Fatalf("kernel %s: modules not all loaded: %s", series, out)
			}
			if dm := v.sh(10e9, "dmesg | grep -E 'insmod|Unknown symbol|disagrees about version' || true"); strings.TrimSpace(dm) != "" {
				t.Fatalf("kernel %s: module load problems:\n%s", series, dm)
			}
			if con := v.console.String(); strings.Contains(con, "insmod") && strings.Contains(con, "failed") {
				t.Fatalf("kernel %s: the boot script could not load a module:\n%s", series, tail(con, 30))
			}
			watchdogLateness(t, v, series, "softdog")
			if esb != nil {
				esb.waitReady()
				watchdogLateness(t, esb, series, "i6300esb")
			}
		})
	}
}

// lateTimeout is the watchdog timeout the lateness check arms: whole
// seconds, as every driver counts.
const lateTimeout = 2

// watchdogLateness arms the guest's watchdog (driver module) with
// lateTimeout, pings it once and never again, and times the guest's end
// (QEMU runs with -no-reboot: a reset ends it) from outside. The ping came
// after the request was sent and before its answer arrived, so the reset
// came between (end − answer − timeout) and (end − request − timeout)
// after the timeout ran out: what nsmd's fence margin (2 s past the
// timeout, cluster/serving.go) must cover beside the whole-second rounding.
// A reset before the timeout fails the test; one later than the margin too.
func watchdogLateness(t *testing.T, v *testVM, series, driver string) {
	t.Helper()
	if rc, out, err := v.try(20*time.Second, loadOptionalModule(driver)+"; test -c /dev/watchdog"); err != nil || rc != 0 {
		_, more, _ := v.try(10*time.Second, "grep "+driver+" /etc/vm/optional-modules; lsmod; ls /dev | grep -i watch; dmesg | tail -n 15")
		t.Fatalf("kernel %s, %s: no watchdog device: rc %d %v %s\n%s", series, driver, rc, err, out, more)
	}
	sent := time.Now()
	line, _ := v.start(10*time.Second, "vmagent watchdog /dev/watchdog 2")
	answered := time.Now()
	if line != "pinged 2" {
		t.Fatalf("kernel %s, %s: %q", series, driver, line)
	}
	select {
	case <-v.done:
	case <-time.After(lateTimeout*time.Second + 30*time.Second):
		t.Fatalf("kernel %s, %s: the guest still runs 30 s after its watchdog's %d s", series, driver, lateTimeout)
	}
	ended := time.Now()
	timeout := lateTimeout * time.Second
	lo, hi := ended.Sub(answered)-timeout, ended.Sub(sent)-timeout
	t.Logf("WATCHDOG kernel %s, %s: timeout %ds; the guest ended %.3f–%.3f s after it ran out (request→answer %.0f ms)",
		series, driver, lateTimeout, lo.Seconds(), hi.Seconds(), float64(answered.Sub(sent).Milliseconds()))
	if hi < 0 {
		t.Fatalf("kernel %s, %s: reset %v before the timeout ran out", series, driver, -hi)
	}
	if lo > 2*time.Second {
		t.Fatalf("kernel %s, %s: reset %v after the timeout ran out, past nsmd's 2 s fence margin", series, driver, lo)
	}
}

// loadOptionalModule is the shell command that loads an optional module of
// the image and what it depends on (/etc/vm/optional-modules).
func loadOptionalModule(name string) string {
	return `sed -n 's/^` + name + ` //p' /etc/vm/optional-modules | while read m; do grep -q "^$(basename $m .ko | tr - _) " /proc/modules || insmod $m; done`
}
