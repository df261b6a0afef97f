package e2e

import (
	"net/netip"
	"strings"
	"testing"
)

// TestVMBoots boots one guest of the real-kernel tier on each kernel and
// runs a command in it: the image, its modules (nfsd, lockd, the NFS
// client, softdog's files), the tap on the bridge and vmagent work.
func TestVMBoots(t *testing.T) {
	for _, series := range vmKernelSeries {
		t.Run(series, func(t *testing.T) {
			img := needVMImageFor(t, series)
			tp := newTopology(t, 1, 0)
			v := newVM(t, img, tp, tp.nodes[0], vmSpec{name: "b1", ip: netip.MustParseAddr(topoNet + ".31")}, 1)
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
		})
	}
}
