//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The hook's service mode in a real network namespace (root only): real ip,
// mount and umount, a tmpfs as the service's storage; rpcbind, rpc.mountd,
// exportfs and rpc.nfsd are stand-ins (this host's kernel may have no nfsd)
// that report what they see. It shows that the binds happen inside the
// namespace's own mount namespace: the daemons see the service's run
// directory as /run, its state as /var/lib/nfs and its nfsd directory as
// /proc/fs/nfsd, and the host storage mount; the host's /run, /var/lib/nfs
// and /proc/fs/nfsd are untouched (the negative control: what the
// stand-ins wrote inside is not there). Run with sh and, where it is
// installed, with busybox's sh and applets (the VM tier's userland).
func TestHookServiceInARealNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace and mounts")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip (iproute2)")
	}
	if fi, err := os.Stat("/proc/fs/nfsd"); err != nil || !fi.IsDir() {
		t.Skip("no /proc/fs/nfsd directory to bind onto (the nfsd module is not loaded)")
	}
	shells := map[string]string{"sh": ""}
	if bb, err := exec.LookPath("busybox"); err == nil {
		shells["busybox"] = bb
	}
	for name, bb := range shells {
		t.Run(name, func(t *testing.T) { hookInRealNamespace(t, bb) })
	}
}

func hookInRealNamespace(t *testing.T, busybox string) {
	ns := fmt.Sprintf("nsmdhook%d", os.Getpid())
	if busybox != "" {
		ns += "b"
	}
	ipRun := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ipRun("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	ipRun("netns", "exec", ns, "ip", "link", "set", "lo", "up")
	ipRun("netns", "exec", ns, "ip", "addr", "add", "192.0.2.10/32", "dev", "lo")

	standins := map[string]string{}
	for _, n := range []string{"rpcbind", "rpc.mountd", "exportfs", "modprobe", "dumpe2fs"} {
		standins[n] = svcStandins[n]
	}
	// exportfs writes its table where /var/lib/nfs is and checks that it
	// sees the host's storage mount; rpc.nfsd writes its threads where
	// /proc/fs/nfsd is and reports its network namespace.
	standins["exportfs"] = svcStandinRecord + `[ "$1" = -ua ] && exit 0
grep -q " $STANDIN_MNT tmpfs " /proc/mounts || { echo "exportfs: $STANDIN_MNT is not mounted here" >&2; exit 1; }
echo "$*" >> /var/lib/nfs/etab
`
	standins["rpc.nfsd"] = svcStandins["rpc.nfsd"] + `echo "nfsd-netns $(readlink /proc/self/ns/net)" >> "$STANDIN_LOG"
[ -e /run/nfsd-ha/rpcbind.pid ] || { echo "rpc.nfsd: no /run/nfsd-ha/rpcbind.pid" >&2; exit 1; }
`
	r := newSvcRig(t, standins)
	if busybox != "" {
		for _, a := range []string{"sh", "readlink", "dirname", "basename", "cat", "sleep", "mkdir", "grep", "sed", "head", "rm", "kill"} {
			if err := os.Symlink(busybox, filepath.Join(r.bin, a)); err != nil {
				t.Fatal(err)
			}
		}
	}
	mnt := filepath.Join(t.TempDir(), "home")
	env := r.env("leader", "start", "NSMD_SERVICE_NAMESPACE="+ns, "NFS_HA_NETNS_DIR=/run/netns", "NFS_HA_MOUNTS_FILE=/proc/mounts",
		"NSMD_SERVICE_ADDRESS=192.0.2.10", "NSMD_SERVICE_DEVICE=tmpfs", "NFS_HA_FSTYPE=tmpfs", "NFS_HA_MMP=off",
		"NSMD_SERVICE_MOUNT="+mnt, "STANDIN_MNT="+mnt, "STANDIN_SOCK_DIR=/run", "STANDIN_THREADS=/proc/fs/nfsd/threads")
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })

	hostBefore := hostNFSView(t)
	out, err := r.run(env)
	if err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	var inode syscall.Stat_t
	if err := syscall.Stat("/run/netns/"+ns, &inode); err != nil {
		t.Fatal(err)
	}
	calls := strings.Join(r.calls(), "\n")
	if !strings.Contains(calls, fmt.Sprintf("nfsd-netns net:[%d]", inode.Ino)) {
		t.Fatalf("rpc.nfsd did not run in namespace %s (net:[%d]):\n%s", ns, inode.Ino, calls)
	}
	for f, want := range map[string]string{"run/rpcbind.sock": "", "state/etab": "-i -o rw,sync,no_subtree_check,fsid=11 @admins:" + mnt, "nfsd/threads": "8"} {
		b, err := os.ReadFile(filepath.Join(r.runDir, f))
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s in the run directory: %q %v (want %q): the bind did not happen inside", f, b, err, want)
		}
	}
	if !mountedAt(t, mnt) {
		t.Fatalf("the storage is not mounted on the host at %s", mnt)
	}
	if after := hostNFSView(t); after != hostBefore {
		t.Fatalf("the host's view changed:\nbefore %s\nafter  %s", hostBefore, after)
	}
	rpcbind, mountd := r.daemonPid("rpcbind"), r.daemonPid("mountd")
	if !alive(rpcbind) || !alive(mountd) {
		t.Fatalf("rpcbind %d, rpc.mountd %d not running after start", rpcbind, mountd)
	}

	out, err = r.run(append(env, "NSMD_EVENT=follower", "NSMD_REASON=stop"))
	if err != nil {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	if alive(rpcbind) || alive(mountd) || mountedAt(t, mnt) {
		t.Fatalf("after stop: rpcbind alive %v, rpc.mountd alive %v, mounted %v\n%s", alive(rpcbind), alive(mountd), mountedAt(t, mnt), out)
	}
	if b, _ := os.ReadFile(filepath.Join(r.runDir, "nfsd/threads")); strings.TrimSpace(string(b)) != "0" {
		t.Fatalf("nfsd threads %q after stop", b)
	}
}

// hostNFSView: what the host shows where the service's daemons write.
func hostNFSView(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, p := range []string{"/run/rpcbind.sock", "/run/nfsd-ha", "/var/lib/nfs/etab", "/proc/fs/nfsd/threads"} {
		fi, err := os.Stat(p)
		if err != nil {
			fmt.Fprintf(&b, "%s absent; ", p)
			continue
		}
		fmt.Fprintf(&b, "%s %d %s; ", p, fi.Size(), fi.ModTime())
	}
	return b.String()
}

func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), " "+dir+" tmpfs ")
}
