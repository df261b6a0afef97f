package e2e

import (
	"net/netip"
	"testing"
)

// TestVMBoots boots one guest of the real-kernel tier and runs a command in
// it: the image, the tap on the bridge and vmagent work.
func TestVMBoots(t *testing.T) {
	img := needVMImage(t)
	tp := newTopology(t, 1, 0)
	v := newVM(t, img, tp, tp.nodes[0], vmSpec{name: "b1", ip: netip.MustParseAddr(topoNet + ".31")}, 1)
	v.boot()
	t.Cleanup(v.kill)
	t.Logf("booted in %v", v.waitReady())
	out := v.sh(10e9, "uname -r; hostname; lsmod | wc -l; ip -4 addr show eth0 | grep inet")
	t.Log(out)
}
