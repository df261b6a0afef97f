package agent

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/fence"
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

// A serving node whose watchdog another process holds (systemd's
// RuntimeWatchdogSec: a fake /sys says the device runs, a fake /proc shows
// pid 1 holding it) refuses to start, naming the holder, rather than
// starting and failing at its first takeover; so does one with nowayout.
// The control: the same running device with no holder was left running by
// a process of this node that died, and the node starts (to stop what it
// served, then release it).
func TestAServerWhoseWatchdogIsBusyRefusesToStart(t *testing.T) {
	for _, c := range []struct {
		name, nowayout string
		holder         bool
		want           error
	}{
		{"held_by_systemd", "0", true, fence.ErrHeldByOther},
		{"nowayout", "1", false, fence.ErrNoWayOut},
		{"control_left_running", "0", false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			dev := filepath.Join(root, "sys", "dev", "char", "1:3") // /dev/null plays the watchdog
			files := map[string]string{filepath.Join(dev, "state"): "active\n", filepath.Join(dev, "nowayout"): c.nowayout + "\n"}
			if err := os.MkdirAll(filepath.Join(root, "proc", "1", "fd"), 0o755); err != nil {
				t.Fatal(err)
			}
			if c.holder {
				files[filepath.Join(root, "proc", "1", "comm")] = "systemd\n"
				if err := os.Symlink("/dev/null", filepath.Join(root, "proc", "1", "fd", "3")); err != nil {
					t.Fatal(err)
				}
			}
			for p, content := range files {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink("../../../../class/watchdog", filepath.Join(dev, "subsystem")); err != nil {
				t.Fatal(err)
			}
			cfg := config.Config{NodeID: "n1", OnLeader: "/bin/true", OnFollower: "/bin/true", FenceWatchdog: "/dev/null", FenceTimeout: 5 * time.Second}
			a := &Agent{cfg: cfg, log: slog.New(slog.DiscardHandler), hostRoot: root}
			var cc cluster.Config
			err := a.fencing(&cc)
			if c.want == nil {
				if err != nil || cc.Watchdog == nil {
					t.Fatalf("a watchdog left running by this node's dead process: fencing = %v, watchdog %v", err, cc.Watchdog)
				}
				return
			}
			if !errors.Is(err, c.want) || cc.Watchdog != nil {
				t.Fatalf("fencing = %v, want %v and no watchdog", err, c.want)
			}
			if c.holder && !strings.Contains(err.Error(), "pid 1 (systemd)") {
				t.Fatalf("the refusal does not name the holder: %v", err)
			}
		})
	}
}
