package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
)

// A serving node under a hypervisor (a fake /proc and /sys: a QEMU guest)
// fenced by its watchdog alone says that a pause of its VM is not covered:
// the metric the alert reads and /v1/status's fence fields. The controls:
// the same VM with a fence agent, the same node on bare metal, and a
// witness (it serves nothing).
func TestAWatchdogOnlyNodeUnderAHypervisorSaysAPauseIsNotCovered(t *testing.T) {
	guest := t.TempDir()
	for rel, content := range map[string]string{
		"proc/cpuinfo":                  "processor\t: 0\nflags\t\t: fpu hypervisor\n",
		"sys/class/dmi/id/sys_vendor":   "QEMU\n",
		"sys/class/dmi/id/product_name": "Standard PC (i440FX + PIIX, 1996)\n",
	} {
		p := filepath.Join(guest, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	metal := t.TempDir()
	for _, c := range []struct {
		name      string
		root      string
		tune      func(*config.Config)
		uncovered bool
	}{
		{"watchdog_only_in_a_vm", guest, nil, true},
		{"control_with_a_fence_agent", guest, func(c *config.Config) { c.FenceAgent = "/usr/sbin/fence_virsh" }, false},
		{"control_bare_metal", metal, nil, false},
		{"control_witness", guest, func(c *config.Config) { c.Witness = true }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.Config{NodeID: "n1", OnLeader: "/usr/lib/nsmd/nfsd-ha", FenceWatchdog: "/dev/watchdog"}
			if c.tune != nil {
				c.tune(&cfg)
			}
			a := &Agent{cfg: cfg, reg: prometheus.NewRegistry(), log: slog.New(slog.DiscardHandler)}
			if err := a.registerFenceMetrics(c.root); err != nil {
				t.Fatal(err)
			}
			want := 0.0
			if c.uncovered {
				want = 1
			}
			if got := testutil.GatheredValue(t, a.reg, "nsmd_fence_pause_uncovered"); got != want {
				t.Errorf("nsmd_fence_pause_uncovered = %v, want %v", got, want)
			}
			if got := pauseUncovered(fenceMode(a.cfg), a.hypervisor); got != c.uncovered {
				t.Errorf("pause_uncovered = %v (hypervisor %q), want %v", got, a.hypervisor, c.uncovered)
			}
			if c.uncovered && a.hypervisor != "cpuinfo hypervisor flag; dmi QEMU Standard PC (i440FX + PIIX, 1996)" {
				t.Errorf("hypervisor = %q", a.hypervisor)
			}
		})
	}
}
