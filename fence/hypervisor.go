package fence

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Hypervisor says whether this machine runs under a hypervisor, from what
// the kernel and the firmware say under root ("/" on a real machine; tests
// give a tree of their own): the CPU's "hypervisor" flag in /proc/cpuinfo
// (x86 hypervisors set it), /sys/hypervisor/type (Xen), and the DMI vendor
// and product (/sys/class/dmi/id/sys_vendor, product_name). It returns
// what told, e.g. "cpuinfo hypervisor flag; dmi QEMU Standard PC", or ""
// when nothing does (bare metal, or a guest that hides itself).
//
// Why it matters: a watchdog is a timer of the machine it resets. A
// hypervisor that pauses the guest (live migration, a stopped VM, an
// overloaded host) pauses the guest's watchdog with it, so the guest's
// reset does not come while it is paused, and it resumes still serving —
// possibly beside its successor. A fence agent (which powers the VM off
// through the hypervisor) or a guard on the shared disk itself (ext4
// multi-mount protection) covers that; the watchdog alone does not.
func Hypervisor(root string) string {
	var found []string
	if cpuHypervisorFlag(filepath.Join(root, "proc", "cpuinfo")) {
		found = append(found, "cpuinfo hypervisor flag")
	}
	if t := readTrim(filepath.Join(root, "sys", "hypervisor", "type")); t != "" {
		found = append(found, "hypervisor type "+t)
	}
	if dmi := dmiHypervisor(filepath.Join(root, "sys", "class", "dmi", "id")); dmi != "" {
		found = append(found, "dmi "+dmi)
	}
	return strings.Join(found, "; ")
}

// cpuHypervisorFlag: a "flags" line of cpuinfo lists "hypervisor".
func cpuHypervisorFlag(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(key) == "flags" {
			return slices.Contains(strings.Fields(val), "hypervisor")
		}
	}
	return false
}

// dmiVendors are the DMI system vendors (and, where the vendor also makes
// real machines, products) of virtual machines.
var dmiVendors = []struct{ vendor, product string }{
	{"QEMU", ""}, {"VMware, Inc.", ""}, {"innotek GmbH", ""}, {"Xen", ""},
	{"Parallels Software International Inc.", ""}, {"Bochs", ""}, {"BHYVE", ""},
	{"Microsoft Corporation", "Virtual Machine"}, {"Google", "Google Compute Engine"},
	{"Amazon EC2", ""}, {"OpenStack Foundation", ""}, {"Nutanix", "AHV"},
	{"Red Hat", "KVM"}, {"DigitalOcean", ""}, {"Hetzner", "vServer"},
}

// dmiHypervisor is "vendor product" when DMI names a virtual machine.
func dmiHypervisor(dir string) string {
	vendor := readTrim(filepath.Join(dir, "sys_vendor"))
	product := readTrim(filepath.Join(dir, "product_name"))
	if vendor == "" {
		return ""
	}
	if strings.HasSuffix(product, ".metal") { // EC2 bare-metal instances
		return ""
	}
	for _, v := range dmiVendors {
		if strings.EqualFold(vendor, v.vendor) && (v.product == "" || strings.Contains(product, v.product)) {
			return strings.TrimSpace(vendor + " " + product)
		}
	}
	if product == "KVM" || strings.HasPrefix(product, "VirtualBox") {
		return strings.TrimSpace(vendor + " " + product)
	}
	return ""
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
