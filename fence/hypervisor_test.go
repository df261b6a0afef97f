package fence

import (
	"os"
	"path/filepath"
	"testing"
)

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for rel, content := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// What the kernel and firmware of a guest say, and of bare metal (the
// negative controls: a physical server's cpuinfo and DMI, an EC2
// bare-metal instance).
func TestHypervisorIsDetectedFromCpuinfoDMIAndXen(t *testing.T) {
	const guestFlags = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae hypervisor lahf_lm\n"
	const metalFlags = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae lahf_lm\n"
	for _, c := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"kvm", map[string]string{"proc/cpuinfo": guestFlags, "sys/class/dmi/id/sys_vendor": "QEMU\n", "sys/class/dmi/id/product_name": "Standard PC (Q35 + ICH9, 2009)\n"},
			"cpuinfo hypervisor flag; dmi QEMU Standard PC (Q35 + ICH9, 2009)"},
		{"hyperv_dmi_only", map[string]string{"proc/cpuinfo": metalFlags, "sys/class/dmi/id/sys_vendor": "Microsoft Corporation\n", "sys/class/dmi/id/product_name": "Virtual Machine\n"},
			"dmi Microsoft Corporation Virtual Machine"},
		{"xen_pv", map[string]string{"sys/hypervisor/type": "xen\n"}, "hypervisor type xen"},
		{"control_bare_metal", map[string]string{"proc/cpuinfo": metalFlags, "sys/class/dmi/id/sys_vendor": "Dell Inc.\n", "sys/class/dmi/id/product_name": "PowerEdge R650\n"}, ""},
		{"control_surface_is_not_a_vm", map[string]string{"sys/class/dmi/id/sys_vendor": "Microsoft Corporation\n", "sys/class/dmi/id/product_name": "Surface Pro\n"}, ""},
		{"control_ec2_metal", map[string]string{"proc/cpuinfo": metalFlags, "sys/class/dmi/id/sys_vendor": "Amazon EC2\n", "sys/class/dmi/id/product_name": "c5.metal\n"}, ""},
		{"control_nothing_readable", map[string]string{}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Hypervisor(writeTree(t, c.files)); got != c.want {
				t.Errorf("Hypervisor = %q, want %q", got, c.want)
			}
		})
	}
}
