package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
)

// The real-kernel tier: Debian's cloud kernel booted under QEMU (TCG: no
// KVM here) from one initramfs that this process builds once. Every VM
// gets busybox, the host's own rpcbind and nfs-utils binaries with the
// libraries ldd lists, the kernel modules for virtio, NFS client and
// server, a static nsmd, the deploy/ hook scripts and vmagent (the test's
// hand inside, see e2e/vmagent). Its network is a tap on the bridge of a
// topology (switch namespace), so a VM is one more host on 10.77.0.0/24.
//
// The kernel comes from `make vm-kernel` (e2e/vmkernel.sh): the package
// linux-image-cloud-amd64 depends on, unpacked, with depmod run. Where it
// or qemu is missing the tests skip and say why.

const (
	vmAgentPort = 7000
	vmMemMB     = 320
	vmBootWait  = 180 * time.Second // from qemu start to vmagent listening (TCG, 2 busy cores: 1.5 min seen at load 20)
)

// vmKernelDir is where `make vm-kernel` unpacked the kernel packages, one
// directory per kernel series (vmKernelSeries).
func vmKernelDir() string {
	if d := os.Getenv("NSMD_VM_KERNEL_DIR"); d != "" {
		return d
	}
	abs, _ := filepath.Abs("../out/vm-kernel")
	return abs
}

// The kernels the tier boots: Debian 12's cloud kernel (6.1) and Debian
// 13's (6.12: merged /usr, its modules shipped as .ko.xz, which
// vmkernel.sh unpacks to plain .ko for busybox's insmod).
const (
	kernel61  = "6.1"
	kernel612 = "6.12"
)

var vmKernelSeries = []string{kernel61, kernel612}

// vmKernel is the unpacked kernel: vmlinuz, its version and module tree.
type vmKernel struct {
	series  string // "6.1", "6.12": what reports name the kernel by
	vmlinuz string
	version string
	root    string // holds lib/modules/<version>
}

// findVMKernel finds kernel series in vmKernelDir()/<series>/root (for
// 6.1 also vmKernelDir()/root, where an older vmkernel.sh put it).
func findVMKernel(series string) (vmKernel, error) {
	root := filepath.Join(vmKernelDir(), series, "root")
	if _, err := os.Stat(root); err != nil && series == kernel61 {
		root = filepath.Join(vmKernelDir(), "root")
	}
	m, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-"+series+".*"))
	if len(m) == 0 {
		return vmKernel{}, fmt.Errorf("no %s kernel in %s (run `make vm-kernel`, or set NSMD_VM_KERNEL_DIR)", series, vmKernelDir())
	}
	k := vmKernel{series: series, vmlinuz: m[0], version: strings.TrimPrefix(filepath.Base(m[0]), "vmlinuz-"), root: root}
	if _, err := os.Stat(filepath.Join(root, "lib", "modules", k.version, "modules.dep")); err != nil {
		return vmKernel{}, fmt.Errorf("kernel %s has no modules.dep (depmod not run?): %w", k.version, err)
	}
	return k, nil
}

// vmImage is what every VM boots.
type vmImage struct {
	kernel vmKernel
	initrd string
	qemu   string
}

// vmImages holds the image of each kernel series, built once per test
// process.
var vmImages = struct {
	sync.Mutex
	m map[string]*vmImageBuild
}{m: map[string]*vmImageBuild{}}

type vmImageBuild struct {
	once sync.Once
	img  *vmImage
	err  error
	skip string
}

// needVMImage is needVMImageFor the 6.1 kernel.
func needVMImage(t *testing.T) *vmImage {
	t.Helper()
	return needVMImageFor(t, kernel61)
}

// needVMImageFor builds the initramfs for kernel series once per test
// process, or skips the test saying what is missing.
func needVMImageFor(t *testing.T, series string) *vmImage {
	t.Helper()
	if why := canNetns(); why != "" {
		t.Skip(why)
	}
	vmImages.Lock()
	b := vmImages.m[series]
	if b == nil {
		b = &vmImageBuild{}
		vmImages.m[series] = b
	}
	vmImages.Unlock()
	b.once.Do(func() { b.img, b.skip, b.err = buildVMImage(series) })
	if b.skip != "" {
		t.Skip(b.skip)
	}
	if b.err != nil {
		t.Fatalf("building the VM image (kernel %s): %v", series, b.err)
	}
	return b.img
}

// The host programs a VM needs, by where they live on the host (the same
// path inside). Libraries come from ldd.
var vmPrograms = []string{
	"/usr/sbin/rpcbind", "/usr/sbin/rpc.mountd", "/usr/sbin/exportfs", "/usr/sbin/rpc.nfsd",
	"/usr/sbin/rpc.statd", "/usr/sbin/sm-notify", "/usr/sbin/mount.nfs",
	"/usr/sbin/nfsdcld", "/usr/sbin/e2fsck",
	// Services in network namespaces: iproute2's ip (busybox's has no
	// netns) and util-linux's unshare and nsenter (busybox's lack options
	// the hook and the services test use). Earlier in PATH than busybox.
	"/usr/sbin/ip", "/usr/bin/unshare", "/usr/bin/nsenter",
	// Debian's /bin/sh, for a VM booted with vm.sh=/usr/bin/dash (vmRC):
	// busybox's static sh runs its own applets before anything in PATH,
	// so under it `ip` is busybox's whatever PATH says.
	"/usr/bin/dash",
}

// vmModules are loaded in order at boot (dependencies resolved by modprobe
// --show-depends against the unpacked tree).
var vmModules = []string{"virtio_pci", "virtio_net", "virtio_blk", "tun", "nfsd", "nfsv3", "nfsv4",
	"macvlan"} // a service's own interface in its namespace (services_vm_linux_test.go)

// vmOptionalModules are in the image but loaded only where a test asks
// (softdog: the fencing test's server VMs get a /dev/watchdog). Their
// paths are in /etc/vm/optional-modules, "name path" per line.
var vmOptionalModules = []string{"softdog"}

// vmIfPresentModules are optional modules that only some kernels build:
// i6300esb, the driver of QEMU's emulated Intel 6300ESB watchdog (6.12;
// Debian 12's cloud kernel has none).
var vmIfPresentModules = []string{"i6300esb"}

func buildVMImage(series string) (*vmImage, string, error) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, "qemu-system-x86_64 not installed (Debian package qemu-system-x86; .ci/run installs it)", nil
	}
	k, err := findVMKernel(series)
	if err != nil {
		return nil, err.Error(), nil
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil || !isStatic(busybox) {
		return nil, "no static busybox (Debian package busybox-static)", nil
	}
	for _, p := range vmPrograms {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Sprintf("%s missing (Debian packages rpcbind, nfs-common, nfs-kernel-server, iproute2, util-linux)", p), nil
		}
	}
	dir, err := os.MkdirTemp("", "nsmd-vm-")
	if err != nil {
		return nil, "", err
	}
	img := &vmImage{kernel: k, qemu: qemu, initrd: filepath.Join(dir, "initrd.cpio")}
	cw := newCpio()

	// Static Go programs: nsmd and vmagent.
	for _, b := range []struct{ pkg, dst string }{{"../cmd/nsmd", "usr/local/bin/nsmd"}, {"./vmagent", "usr/local/bin/vmagent"}} {
		out := filepath.Join(dir, filepath.Base(b.dst))
		cmd := exec.Command("go", "build", "-o", out, b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
		if o, err := cmd.CombinedOutput(); err != nil {
			return nil, "", fmt.Errorf("go build %s: %w: %s", b.pkg, err, o)
		}
		if err := cw.addFile(b.dst, out, 0o755); err != nil {
			return nil, "", err
		}
	}

	// busybox and its applets; /init is busybox's init.
	if err := cw.addFile("bin/busybox", busybox, 0o755); err != nil {
		return nil, "", err
	}
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, "", fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(list)) {
		if a != "busybox" {
			cw.addSymlink("bin/"+a, "busybox")
		}
	}
	cw.addSymlink("init", "bin/busybox")
	cw.addSymlink("sbin", "bin")

	// Host programs and their libraries.
	libs := map[string]bool{}
	for _, p := range vmPrograms {
		if err := cw.addFile(strings.TrimPrefix(p, "/"), p, 0o755); err != nil {
			return nil, "", err
		}
		deps, err := lddLibs(p)
		if err != nil {
			return nil, "", err
		}
		for _, l := range deps {
			libs[l] = true
		}
	}
	for _, l := range sortedKeys(libs) {
		if err := cw.addFileResolved(strings.TrimPrefix(l, "/"), l); err != nil {
			return nil, "", err
		}
	}

	// Kernel modules, in load order: each with the modules it depends on,
	// each file once; the optional ones (loaded only where a test wants
	// them) listed apart.
	// An optional module's list names every module it needs, also those
	// another optional one already brought (its loader skips what is
	// loaded); the boot order names each once.
	seen, listed := map[string]bool{}, map[string]bool{}
	addModule := func(m string, added func(rel string)) error {
		out, err := exec.Command("modprobe", "-d", k.root, "-S", k.version, "--show-depends", m).Output()
		if err != nil {
			return fmt.Errorf("modprobe --show-depends %s: %w", m, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "insmod" || listed[f[1]] {
				continue
			}
			rel := strings.TrimPrefix(f[1], k.root+"/")
			if !seen[f[1]] {
				seen[f[1]] = true
				if err := cw.addFile(rel, f[1], 0o644); err != nil {
					return err
				}
			}
			added(rel)
		}
		return nil
	}
	var order []string
	for _, m := range vmModules {
		if err := addModule(m, func(rel string) { order = append(order, "/"+rel); listed[k.root+"/"+rel] = true }); err != nil {
			return nil, "", err
		}
	}
	cw.addData("etc/vm/modules", []byte(strings.Join(order, "\n")+"\n"), 0o644)
	var optional []string
	for _, m := range vmOptionalModules {
		if err := addModule(m, func(rel string) { optional = append(optional, m+" /"+rel) }); err != nil {
			return nil, "", err
		}
	}
	for _, m := range vmIfPresentModules {
		if exec.Command("modprobe", "-d", k.root, "-S", k.version, "--show-depends", m).Run() != nil {
			continue // not built for this kernel
		}
		if err := addModule(m, func(rel string) { optional = append(optional, m+" /"+rel) }); err != nil {
			return nil, "", err
		}
	}
	cw.addData("etc/vm/optional-modules", []byte(strings.Join(optional, "\n")+"\n"), 0o644)

	// The shipped hooks, unchanged.
	hooks, _ := filepath.Glob("../deploy/hooks/*")
	for _, h := range hooks {
		if err := cw.addFile("usr/lib/nsmd/hooks/"+filepath.Base(h), h, 0o755); err != nil {
			return nil, "", err
		}
	}

	// The positive control of the NFSv4 drills (test tooling, not shipped).
	cw.addData("usr/local/bin/nfsdcld-control", []byte(nfsdcldControlHook), 0o755)
	// The fencing test's stand-in for a fence agent (test tooling, not
	// shipped: fence_vm_linux_test.go says what it is and is not).
	cw.addData("usr/lib/nsmd/test/fence_qemu", []byte(fenceQemuAgent), 0o755)
	// The services test's control: every service in the host's one nfsd.
	cw.addData("usr/local/bin/one-nfsd", []byte(oneNfsdHook), 0o755)

	// Configuration files the RPC programs read.
	for _, f := range []string{"/etc/netconfig", "/etc/services", "/etc/rpc", "/etc/protocols"} {
		if err := cw.addFile(strings.TrimPrefix(f, "/"), f, 0o644); err != nil {
			return nil, "", err
		}
	}
	cw.addData("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n_rpc:x:100:65534::/run/rpcbind:/bin/false\nstatd:x:101:65534::/var/lib/nfs:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"), 0o644)
	cw.addData("etc/group", []byte("root:x:0:\nnogroup:x:65534:\n"), 0o644)
	cw.addData("etc/nsswitch.conf", []byte("passwd: files\ngroup: files\nhosts: files\nservices: files\nprotocols: files\nrpc: files\n"), 0o644)
	cw.addData("etc/hosts", []byte("127.0.0.1 localhost\n"), 0o644)
	cw.addSymlink("etc/mtab", "/proc/mounts")
	cw.addData("etc/exports", nil, 0o644)
	cw.addData("etc/inittab", []byte(vmInittab), 0o644)
	cw.addData("etc/vm/rc", []byte(vmRC), 0o755)
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "mnt", "srv", "root", "var/lib/nfs", "var/lib/nsmd", "etc/nsmd"} {
		cw.addDir(d)
	}

	f, err := os.Create(img.initrd)
	if err != nil {
		return nil, "", err
	}
	if err := cw.write(f); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("write initramfs: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, "", err
	}
	return img, "", nil
}

// vmInittab: busybox init runs rc once, then keeps vmagent running on the
// console (its "listening" line is the test's boot event).
const vmInittab = `::sysinit:/etc/vm/rc
::respawn:/usr/local/bin/vmagent serve 0.0.0.0:7000
`

// vmRC is the VM's boot script: filesystems, modules, hostname and address
// from the kernel command line (vm.host=, vm.ip=), and the persistent disks
// it names (vm.disk=/dev/vdX:/dir, any number: a client's /var/lib/nfs, a
// server's /var/lib/nsmd); vm.sh= replaces busybox as /bin/sh.
const vmRC = `#!/bin/sh
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs -o mode=755 run /run
mount -t tmpfs tmp /tmp
DISKS=
while read m; do insmod "$m" || echo "vm: insmod $m failed"; done < /etc/vm/modules
for w in $(cat /proc/cmdline); do
  case "$w" in
    vm.host=*) VMHOST=${w#vm.host=} ;;
    vm.ip=*) VMIP=${w#vm.ip=} ;;
    vm.disk=*) DISKS="$DISKS ${w#vm.disk=}" ;;
    vm.sh=*) VMSH=${w#vm.sh=} ;;
  esac
done
# vm.sh=PROGRAM: /bin/sh is PROGRAM from here on (vmagent's commands and
# every #!/bin/sh script: the hooks), as dash is on Debian.
[ -n "$VMSH" ] && ln -sf "$VMSH" /bin/sh
hostname "$VMHOST"
echo "${VMIP%/*} $VMHOST" >> /etc/hosts
ip link set lo up
ip addr add "$VMIP" dev eth0
ip link set eth0 up
mkdir -p /run/rpcbind /var/lib/nfs
for d in $DISKS; do
  mkdir -p "${d#*:}" && mount -t ext4 "${d%%:*}" "${d#*:}" || echo "vm: mount $d failed"
done
mkdir -p /var/lib/nfs/sm /var/lib/nfs/sm.bak /var/lib/nfs/v4recovery
chown statd /var/lib/nfs /var/lib/nfs/sm /var/lib/nfs/sm.bak
[ -f /var/lib/nfs/etab ] || : > /var/lib/nfs/etab
[ -f /var/lib/nfs/rmtab ] || : > /var/lib/nfs/rmtab
echo "vm: $VMHOST up at $VMIP"
`

// nfsdcldControlHook is the positive control of the NFSv4 drills, used
// as on_leader and on_follower with nsmd's own tracking off: the stock
// nfsdcld with its database on the shared disk (what Pacemaker's nfsserver
// agent does), and the shipped hook for everything else (one scope).
const nfsdcldControlHook = `#!/bin/sh
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
. /etc/nsmd/nfsd-ha.conf
case "$NSMD_EVENT" in
leader)
	mkdir -p /var/lib/nfs/rpc_pipefs
	grep -qs ' /var/lib/nfs/rpc_pipefs ' /proc/mounts || mount -t rpc_pipefs sunrpc /var/lib/nfs/rpc_pipefs || exit 1
	mkdir -p "$NFS_HA_MOUNT"
	grep -qs " $NFS_HA_MOUNT " /proc/mounts || mount -t ext4 "$NFS_HA_DEVICE" "$NFS_HA_MOUNT" || exit 1
	mkdir -p "$NFS_HA_MOUNT/.nfsdcld"
	nfsdcld -F -s "$NFS_HA_MOUNT/.nfsdcld" >> /run/nfsdcld.log 2>&1 &
	echo $! > /run/nfsdcld.pid
	exec env NFS_HA_UNSAFE_NODE_LOCAL_TRACKING=yes /usr/lib/nsmd/hooks/nfsd-ha
	;;
follower)
	[ -e /proc/fs/nfsd/threads ] && rpc.nfsd 0
	[ -f /run/nfsdcld.pid ] && kill "$(cat /run/nfsdcld.pid)" && rm -f /run/nfsdcld.pid
	exec /usr/lib/nsmd/hooks/nfsd-ha
	;;
esac
exec /usr/lib/nsmd/hooks/nfsd-ha
`

// isStatic reports whether the ELF file at p has no program interpreter.
func isStatic(p string) bool {
	out, err := exec.Command("ldd", p).CombinedOutput()
	return err != nil || bytes.Contains(out, []byte("not a dynamic executable"))
}

// lddLibs lists the absolute library paths (and loader) p needs.
func lddLibs(p string) ([]string, error) {
	out, err := exec.Command("ldd", p).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", p, err)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// cpioArchive is an initramfs in the "newc" format, built in memory.
type cpioArchive struct {
	entries []cpioEntry
	dirs    map[string]bool
	err     error
}

type cpioEntry struct {
	name string
	mode uint32 // with type bits
	data []byte
}

func newCpio() *cpioArchive { return &cpioArchive{dirs: map[string]bool{}} }

// parents adds the directories above name.
func (c *cpioArchive) parents(name string) {
	for d := filepath.Dir(name); d != "." && d != "/"; d = filepath.Dir(d) {
		c.addDir(d)
	}
}

func (c *cpioArchive) addDir(name string) {
	if c.dirs[name] {
		return
	}
	c.dirs[name] = true
	c.parents(name)
	c.entries = append(c.entries, cpioEntry{name: name, mode: syscall.S_IFDIR | 0o755})
}

func (c *cpioArchive) addData(name string, data []byte, perm uint32) {
	c.parents(name)
	c.entries = append(c.entries, cpioEntry{name: name, mode: syscall.S_IFREG | perm, data: data})
}

func (c *cpioArchive) addSymlink(name, target string) {
	c.parents(name)
	c.entries = append(c.entries, cpioEntry{name: name, mode: syscall.S_IFLNK | 0o777, data: []byte(target)})
}

func (c *cpioArchive) addFile(name, src string, perm uint32) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	c.addData(name, data, perm)
	return nil
}

// addFileResolved adds a library under the path it is known by; when that
// path is a symlink (libc.so.6 → libc-2.36.so, /lib → usr/lib), the file is
// stored there with the resolved contents.
func (c *cpioArchive) addFileResolved(name, src string) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return c.addFile(name, src, uint32(st.Mode().Perm()))
}

func (c *cpioArchive) write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	ino := uint32(1)
	put := func(e cpioEntry) error {
		name := e.name + "\x00"
		hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, e.mode, 0, 0, 1, 0, len(e.data), 0, 0, 0, 0, len(name), 0)
		ino++
		bw.WriteString(hdr)
		bw.WriteString(name)
		pad := (4 - (len(hdr)+len(name))%4) % 4
		bw.Write(make([]byte, pad))
		bw.Write(e.data)
		bw.Write(make([]byte, (4-len(e.data)%4)%4))
		return nil
	}
	// Directories first, so every file has its parent.
	sorted := slicesStable(c.entries)
	for _, e := range sorted {
		if err := put(e); err != nil {
			return err
		}
	}
	if err := put(cpioEntry{name: "TRAILER!!!"}); err != nil {
		return err
	}
	return bw.Flush()
}

func slicesStable(es []cpioEntry) []cpioEntry {
	out := append([]cpioEntry(nil), es...)
	sort.SliceStable(out, func(i, j int) bool {
		di, dj := out[i].mode&syscall.S_IFMT == syscall.S_IFDIR, out[j].mode&syscall.S_IFMT == syscall.S_IFDIR
		if di != dj {
			return di
		}
		if di {
			return strings.Count(out[i].name, "/") < strings.Count(out[j].name, "/")
		}
		return false
	})
	return out
}

// testVM is one running QEMU guest on a topology's bridge.
type testVM struct {
	t       *testing.T
	img     *vmImage
	name    string
	ip      netip.Addr
	tap     string
	mac     string
	sw      string   // switch namespace (where the tap and qemu live)
	from    string   // namespace the test reaches the agent from
	disks   []string // raw images, attached in order as /dev/vda, vdb…
	cmdline string
	devices []string // more QEMU -device arguments

	cmd     *exec.Cmd
	console *testutil.LockedBuffer
	ready   chan struct{}
	done    chan struct{}
	started time.Time
}

// vmSpec describes a VM to boot.
type vmSpec struct {
	name    string
	ip      netip.Addr
	disks   []string
	extra   string   // more kernel command line
	devices []string // more QEMU devices (-device VALUE each)
}

// newVM makes the VM's tap on the switch; boot starts it.
func newVM(t *testing.T, img *vmImage, tp *topology, from *netHost, s vmSpec, index int) *testVM {
	t.Helper()
	v := &testVM{t: t, img: img, name: s.name, ip: s.ip, tap: "t-" + s.name, sw: tp.sw, from: from.ns, disks: s.disks,
		mac: fmt.Sprintf("52:54:00:77:00:%02x", index), cmdline: s.extra, devices: s.devices}
	for _, args := range [][]string{
		{"-n", tp.sw, "tuntap", "add", "dev", v.tap, "mode", "tap"},
		{"-n", tp.sw, "link", "set", v.tap, "master", "br0", "up"},
	} {
		if _, err := ipCmd(args...); err != nil {
			t.Fatalf("VM %s: %v", s.name, err)
		}
	}
	return v
}

// boot starts qemu (not waiting for the guest): the VM's console is
// collected, and the test process owns it (it dies with us).
func (v *testVM) boot() {
	v.t.Helper()
	// no_timer_check: on a busy host a TCG guest's boot-time check of the
	// 8254 timer through the IO-APIC can miss its ticks and panic
	// ("IO-APIC + timer doesn't work!", seen with 6.12).
	append_ := fmt.Sprintf("console=ttyS0 panic=-1 quiet loglevel=4 no_timer_check vm.host=%s vm.ip=%s/%d %s", v.name, v.ip, topoBits, v.cmdline)
	args := []string{"netns", "exec", v.sw, v.img.qemu,
		"-accel", "tcg", "-cpu", "max", "-m", fmt.Sprint(vmMemMB), "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
		"-kernel", v.img.kernel.vmlinuz, "-initrd", v.img.initrd, "-append", append_,
		"-netdev", fmt.Sprintf("tap,id=n0,ifname=%s,script=no,downscript=no", v.tap),
		"-device", "virtio-net-pci,netdev=n0,mac=" + v.mac,
	}
	for _, d := range v.devices {
		args = append(args, "-device", d)
	}
	for i, d := range v.disks {
		args = append(args, "-drive", fmt.Sprintf("file=%s,format=raw,if=virtio,index=%d,file.locking=off", d, i))
	}
	cmd := exec.Command("ip", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	v.console = &testutil.LockedBuffer{}
	v.ready, v.done = make(chan struct{}), make(chan struct{})
	out, err := cmd.StdoutPipe()
	if err != nil {
		v.t.Fatal(err)
	}
	cmd.Stderr = v.console
	v.started = time.Now()
	if err := startPinned(cmd); err != nil {
		v.t.Fatalf("start VM %s: %v", v.name, err)
	}
	v.cmd = cmd
	ready, done := v.ready, v.done
	go func() {
		sc := bufio.NewScanner(out)
		once := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(v.console, line)
			if !once && strings.Contains(line, "vmagent listening on") {
				once = true
				close(ready)
			}
		}
		cmd.Wait()
		close(done)
	}()
}

// waitReady waits for the guest's agent.
func (v *testVM) waitReady() time.Duration {
	v.t.Helper()
	select {
	case <-v.ready:
		return time.Since(v.started)
	case <-v.done:
		v.t.Fatalf("VM %s exited while booting:\n%s", v.name, tail(v.console.String(), 40))
	case <-time.After(vmBootWait):
		v.t.Fatalf("VM %s not up within %v:\n%s", v.name, vmBootWait, tail(v.console.String(), 40))
	}
	return 0
}

// kill is a power cut: SIGKILL to qemu.
func (v *testVM) kill() {
	if v.cmd == nil || v.cmd.Process == nil {
		return
	}
	v.cmd.Process.Signal(syscall.SIGKILL)
	<-v.done
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// vmResponse mirrors vmagent's Response.
type vmResponse struct {
	RC       int    `json:"rc"`
	Out      string `json:"out"`
	Pid      int    `json:"pid"`
	TimedOut bool   `json:"timed_out"`
	Err      string `json:"err"`
}

// call sends one request to the guest's agent.
func (v *testVM) call(cmd string, timeout time.Duration, detach bool) (vmResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Second)
	defer cancel()
	addr := fmt.Sprintf("%s:%d", v.ip, vmAgentPort)
	c, err := dialIn(ctx, v.from, "tcp", addr)
	// Just after a boot the host may still hold a failed neighbour entry
	// from while the guest was down (EHOSTUNREACH at once, until ARP is
	// tried again): a connect to a guest that just said it listens is
	// retried for a few seconds. Nothing was sent yet.
	for tries := 0; err != nil && tries < 25 && time.Since(v.started) < 20*time.Second &&
		(errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ECONNREFUSED)); tries++ {
		select {
		case <-v.done:
			return vmResponse{}, fmt.Errorf("VM %s: %w", v.name, err)
		case <-ctx.Done():
			return vmResponse{}, fmt.Errorf("VM %s: %w", v.name, err)
		case <-time.After(200 * time.Millisecond):
		}
		c, err = dialIn(ctx, v.from, "tcp", addr)
	}
	if err != nil {
		return vmResponse{}, fmt.Errorf("VM %s: %w", v.name, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	req := map[string]any{"cmd": cmd, "timeout_ms": timeout.Milliseconds(), "detach": detach}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return vmResponse{}, fmt.Errorf("VM %s: send: %w", v.name, err)
	}
	var r vmResponse
	if err := json.NewDecoder(c).Decode(&r); err != nil {
		return vmResponse{}, fmt.Errorf("VM %s: %q: answer: %w", v.name, cmd, err)
	}
	if r.Err != "" {
		return r, fmt.Errorf("VM %s: %q: %s", v.name, cmd, r.Err)
	}
	return r, nil
}

// sh runs cmd in the guest and fails the test unless it exits 0.
func (v *testVM) sh(timeout time.Duration, cmd string) string {
	v.t.Helper()
	r, err := v.call(cmd, timeout, false)
	if err != nil {
		v.t.Fatal(err)
	}
	if r.TimedOut || r.RC != 0 {
		v.t.Fatalf("VM %s: %q: rc %d timed_out %v:\n%s", v.name, cmd, r.RC, r.TimedOut, r.Out)
	}
	return r.Out
}

// try runs cmd in the guest and returns its exit code and output.
func (v *testVM) try(timeout time.Duration, cmd string) (int, string, error) {
	r, err := v.call(cmd, timeout, false)
	if err != nil {
		return -1, "", err
	}
	if r.TimedOut {
		return -1, r.Out, fmt.Errorf("VM %s: %q timed out after %v", v.name, cmd, timeout)
	}
	return r.RC, r.Out, nil
}

// start runs a long-lived command in the guest and returns its first line
// of output (and pid) once it prints one.
func (v *testVM) start(timeout time.Duration, cmd string) (string, int) {
	v.t.Helper()
	r, err := v.call(cmd, timeout, true)
	if err != nil {
		v.t.Fatal(err)
	}
	if r.RC > 0 {
		v.t.Fatalf("VM %s: %q exited %d: %s", v.name, cmd, r.RC, r.Out)
	}
	return strings.TrimSpace(r.Out), r.Pid
}

// makeDisk creates a raw disk image of sizeMB formatted ext4.
func makeDisk(t *testing.T, path string, sizeMB int, mkfsArgs ...string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(sizeMB) << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	args := append([]string{"-q", "-F"}, mkfsArgs...)
	args = append(args, path)
	if out, err := exec.Command("mkfs.ext4", args...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v: %s", path, err, out)
	}
}
