package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// The service mode of the shipped hook, run against stand-ins: no kernel
// nfsd, no network namespace and no mount is touched. The stand-in `ip`
// records its argv and, for `ip netns exec NS CMD…`, runs CMD with
// STANDIN_NS=NS, so that every other stand-in (mount, umount, exportfs,
// rpcbind, rpc.mountd, rpc.nfsd, …) records the namespace it ran in
// ("host" outside any). rpcbind and rpc.mountd stand-ins stay running like
// the daemons, so that stop has processes to find by their pid files.

const svcStandinRecord = `echo "${STANDIN_NS:-host}: $(basename "$0")${*:+ $*}" >> "$STANDIN_LOG"
`

var svcStandins = map[string]string{
	"ip": `[ "$*" = "netns list" ] && exit 0
` + svcStandinRecord + `case "$1 $2" in
"netns exec")
	ns=$3
	shift 3
	[ -e "$NFS_HA_NETNS_DIR/$ns" ] || { echo "Cannot open network namespace \"$ns\": No such file or directory" >&2; exit 1; }
	STANDIN_NS=$ns exec "$@" ;;
esac
case "$*" in
"-o addr show") [ "${STANDIN_NS:-host}" = host ] || printf '%s\n' "$STANDIN_ADDRS" ;;
esac
`,
	"mount":    svcStandinRecord,
	"sync":     svcStandinRecord,
	"modprobe": svcStandinRecord,
	"exportfs": svcStandinRecord,
	"umount": svcStandinRecord + `[ "${STANDIN_UMOUNT_BUSY:-}" = yes ] && { echo "umount: $1: target is busy." >&2; exit 32; }
exit 0
`,
	"dumpe2fs": "#!/bin/sh\necho 'Filesystem features:      has_journal extent mmp'\n",
	"rpcbind": svcStandinRecord + `: > "${STANDIN_SOCK_DIR:-.}/rpcbind.sock"
trap 'exit 0' TERM
while :; do sleep 1 & wait $!; done
`,
	"rpc.mountd": svcStandinRecord + `[ "$1" = -F ] || exit 0
trap 'exit 0' TERM
while :; do sleep 1 & wait $!; done
`,
	// rpc.nfsd: -h (the scope probe) answers as nfs-utils 2.6.3+ does;
	// otherwise it records and writes its thread count (the last argument)
	// where nfsd's threads file is.
	"rpc.nfsd": `for a in "$@"; do [ "$a" = -h ] && exit 0; done
` + svcStandinRecord + `for a in "$@"; do n=$a; done
[ -z "${STANDIN_THREADS:-}" ] || echo "$n" > "$STANDIN_THREADS"
`,
}

// svcRig is one service's world: stand-ins, the namespace's file, the run
// directory, a mounts file and nsmd's tracking status file.
type svcRig struct {
	t                                *testing.T
	bin, log, runDir, netnsDir, mnts string
	status, nlm                      string
}

const (
	svcNS   = "nsmd-home"
	svcMnt  = "/srv/nfs/home"
	svcAddr = "10.0.0.50"
)

func newSvcRig(t *testing.T, standins map[string]string) *svcRig {
	t.Helper()
	d := t.TempDir()
	r := &svcRig{t: t, bin: filepath.Join(d, "bin"), log: filepath.Join(d, "calls"), runDir: filepath.Join(d, "svc"),
		netnsDir: filepath.Join(d, "netns"), mnts: filepath.Join(d, "mounts"), status: filepath.Join(d, "tracking.status"),
		nlm: filepath.Join(d, "nlm_grace_period")}
	for _, dir := range []string{r.bin, r.netnsDir, filepath.Join(r.runDir, "nfsd"), filepath.Join(r.runDir, "rpc_pipefs", "nfsd"),
		filepath.Join(r.runDir, "run"), filepath.Join(r.runDir, "state")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range standins {
		if err := os.WriteFile(filepath.Join(r.bin, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r.write(filepath.Join(r.netnsDir, svcNS), "")
	for _, f := range []string{"threads", "nfsv4gracetime", "nfsv4leasetime"} {
		r.write(filepath.Join(r.runDir, "nfsd", f), "0\n")
	}
	r.write(r.mnts, "")
	r.write(r.nlm, "0\n")
	r.write(r.status, "state=waiting\nerror=\ngrace_start_sm_state=7\n")
	t.Cleanup(r.killDaemons)
	return r
}

func (r *svcRig) write(path, body string) {
	r.t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// env: the environment nsmd gives the hook of service home at epoch 3.
func (r *svcRig) env(event, reason string, extra ...string) []string {
	return append([]string{
		"PATH=" + r.bin + ":" + os.Getenv("PATH"), "NSMD_NFSD_HA_CONF=" + os.DevNull, "STANDIN_LOG=" + r.log,
		"STANDIN_ADDRS=2: eth0    inet " + svcAddr + "/24 brd 10.0.0.255 scope global eth0",
		"STANDIN_THREADS=" + filepath.Join(r.runDir, "nfsd", "threads"),
		"NFS_HA_NETNS_DIR=" + r.netnsDir, "NFS_HA_MOUNTS_FILE=" + r.mnts,
		"NSMD_EVENT=" + event, "NSMD_REASON=" + reason, "NSMD_ROLE=service", "NSMD_NODE_ID=nfs1",
		"NSMD_SERVICE=home", "NSMD_SERVICE_ADDRESS=" + svcAddr, "NSMD_SERVICE_PREFIX=24", "NSMD_SERVICE_INTERFACE=eth0",
		"NSMD_VIP=" + svcAddr + "/24", "NSMD_SERVICE_DEVICE=/dev/sdz", "NSMD_SERVICE_MOUNT=" + svcMnt,
		"NSMD_SERVICE_EXPORT_CLIENTS=10.0.0.0/24,@admins", "NSMD_SERVICE_EXPORT_OPTIONS=rw,sync,no_subtree_check,fsid=11",
		"NSMD_SERVICE_NAMESPACE=" + svcNS, "NSMD_SERVICE_RUN_DIR=" + r.runDir, "NSMD_SERVICE_NAMESPACES=on",
		"NSMD_SERVICE_GRACE_SECONDS=", "NSMD_GRACE_SECONDS=60", "NSMD_SERVICE_LEASE_SECONDS=15",
		"NSMD_SERVICE_EPOCH=3", "NSMD_SM_STATE=7", "NSMD_NFSV4_TRACKING=on",
		"NSMD_SERVICE_NFSV4_TRACKING_STATUS=" + r.status, "NFS_HA_NLM_GRACE_FILE=" + r.nlm,
	}, extra...)
}

func (r *svcRig) run(env []string, args ...string) (string, error) {
	r.t.Helper()
	sh := "sh"
	if _, err := os.Stat(filepath.Join(r.bin, "sh")); err == nil {
		sh = filepath.Join(r.bin, "sh") // the rig's own shell (busybox)
	}
	cmd := exec.Command(sh, append([]string{filepath.Join(repoRoot, "deploy/hooks/nfsd-ha")}, args...)...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// calls returns the recorded calls (and empties the record).
func (r *svcRig) calls() []string {
	r.t.Helper()
	b, err := os.ReadFile(r.log)
	if err != nil && !os.IsNotExist(err) {
		r.t.Fatal(err)
	}
	os.Remove(r.log)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// daemonPid: the pid in the run directory's pid file of name, 0 without.
func (r *svcRig) daemonPid(name string) int {
	b, err := os.ReadFile(filepath.Join(r.runDir, "run", "nfsd-ha", name+".pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// alive: pid is a process that has not exited (a zombie has: its new
// parent may be slow to reap it).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if pid <= 0 || err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if st, ok := strings.CutPrefix(l, "State:"); ok {
			st = strings.TrimSpace(st)
			return !strings.HasPrefix(st, "Z") && !strings.HasPrefix(st, "X")
		}
	}
	return false
}

func (r *svcRig) killDaemons() {
	for _, n := range []string{"rpcbind", "mountd"} {
		if pid := r.daemonPid(n); alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (r *svcRig) hook() string {
	p, err := filepath.Abs(filepath.Join(repoRoot, "deploy/hooks/nfsd-ha"))
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

// A service's start runs, in order: the address check inside the
// namespace, the mount on the host, then in the namespace the binds,
// rpcbind, one export per client of this service, rpc.mountd and rpc.nfsd
// with the service's scope; the namespace's grace and lease files get the
// service's values. Its stop undoes it in reverse, inside the namespace,
// then unmounts on the host, and the daemons are gone. The same stand-ins
// record "host" for what runs outside (the storage mount, umount), so a
// daemon started on the host would fail the comparison.
func TestHookServiceStartAndStopRunInTheNamespace(t *testing.T) {
	r := newSvcRig(t, svcStandins)
	out, err := r.run(r.env("leader", "start"))
	if err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	hook, rd := r.hook(), r.runDir
	calls := r.calls()
	var mountd []string
	calls = slices.DeleteFunc(calls, func(c string) bool {
		if strings.Contains(c, "rpc.mountd") {
			mountd = append(mountd, c)
			return true
		}
		return false
	})
	want := []string{
		"host: ip netns exec nsmd-home ip -o addr show",
		"nsmd-home: ip -o addr show",
		"host: modprobe nfsd",
		"host: mount -t ext4 /dev/sdz /srv/nfs/home",
		"host: modprobe lockd",
		"host: ip netns exec nsmd-home sh " + hook + " _netns-start",
		"nsmd-home: mount --bind " + rd + "/nfsd /proc/fs/nfsd",
		"nsmd-home: mount --bind " + rd + "/state /var/lib/nfs",
		"nsmd-home: mount --bind " + rd + "/run /run",
		"nsmd-home: rpcbind -f",
		"nsmd-home: exportfs -i -o rw,sync,no_subtree_check,fsid=11 10.0.0.0/24:/srv/nfs/home",
		"nsmd-home: exportfs -i -o rw,sync,no_subtree_check,fsid=11 @admins:/srv/nfs/home",
		"nsmd-home: rpc.nfsd --scope nsmd-home 8",
	}
	if !slices.Equal(calls, want) || !slices.Equal(mountd, []string{"nsmd-home: rpc.mountd -F"}) {
		t.Fatalf("start ran:\n%s\n%s\nwant:\n%s\nnsmd-home: rpc.mountd -F", strings.Join(calls, "\n"), strings.Join(mountd, "\n"), strings.Join(want, "\n"))
	}
	for f, v := range map[string]string{"nfsv4gracetime": "60", "nfsv4leasetime": "15", "threads": "8"} {
		if b, _ := os.ReadFile(filepath.Join(rd, "nfsd", f)); strings.TrimSpace(string(b)) != v {
			t.Errorf("%s is %q, want %s", f, b, v)
		}
	}
	rpcbind, mountdPid := r.daemonPid("rpcbind"), r.daemonPid("mountd")
	if !alive(rpcbind) || !alive(mountdPid) {
		t.Fatalf("rpcbind %d, rpc.mountd %d not running after start", rpcbind, mountdPid)
	}

	// The filesystem is mounted now; stop.
	r.write(r.mnts, "/dev/sdz /srv/nfs/home ext4 rw 0 0\n")
	out, err = r.run(r.env("follower", "stop"))
	if err != nil {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	want = []string{
		"host: ip netns exec nsmd-home sh " + hook + " _netns-stop",
		"nsmd-home: mount --bind " + rd + "/nfsd /proc/fs/nfsd",
		"nsmd-home: mount --bind " + rd + "/state /var/lib/nfs",
		"nsmd-home: mount --bind " + rd + "/run /run",
		"nsmd-home: rpc.nfsd 0",
		"nsmd-home: exportfs -ua",
		"host: sync",
		"host: umount /srv/nfs/home",
	}
	if calls := r.calls(); !slices.Equal(calls, want) {
		t.Fatalf("stop ran:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
	if alive(rpcbind) || alive(mountdPid) {
		t.Fatalf("rpcbind %d alive %v, rpc.mountd %d alive %v after stop", rpcbind, alive(rpcbind), mountdPid, alive(mountdPid))
	}
}

// check prints what start would do for the service and changes nothing.
func TestHookServiceCheckPrintsTheService(t *testing.T) {
	r := newSvcRig(t, svcStandins)
	out, err := r.run(r.env("", ""), "check")
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	for _, s := range []string{"namespace nsmd-home", "mount -t ext4 /dev/sdz /srv/nfs/home", "exportfs -i -o rw,sync,no_subtree_check,fsid=11 @admins:/srv/nfs/home",
		"rpc.nfsd --scope nsmd-home 8", "nfsv4gracetime 60 nfsv4leasetime 15", "/dev/sdz has ext4 multi-mount protection"} {
		if !strings.Contains(out, s) {
			t.Errorf("check does not say %q:\n%s", s, out)
		}
	}
	if c := r.calls(); len(c) != 1 || c[0] != "" {
		t.Fatalf("check ran %q", c)
	}
	// NFS_HA_SCOPE_PREFIX gives another scope, the same on every server.
	if out, err := r.run(r.env("", "", "NFS_HA_SCOPE_PREFIX=example-"), "check"); err != nil || !strings.Contains(out, "rpc.nfsd --scope example-home 8") {
		t.Fatalf("check with NFS_HA_SCOPE_PREFIX: %v\n%s", err, out)
	}
}

// Start refuses before it mounts anything: without service namespaces
// (the services would share one nfsd and its grace), without the
// namespace, without the service's address in it, without nsmd's
// client tracking for the service's namespace. Each refusal names why.
func TestHookServiceStartRefuses(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(r *svcRig) []string
		says  string
	}{
		{"namespaces off", func(r *svcRig) []string { return []string{"NSMD_SERVICE_NAMESPACES=off"} },
			"they would share this host's one nfsd and lockd and their grace"},
		{"no namespace", func(r *svcRig) []string { os.Remove(filepath.Join(r.netnsDir, svcNS)); return nil },
			"its network namespace nsmd-home does not exist"},
		{"address not in the namespace", func(r *svcRig) []string { return []string{"NSMD_SERVICE_ADDRESS=10.0.0.51"} },
			"the address '10.0.0.51' of service home is not in its namespace nsmd-home"},
		{"no tracking for the service", func(r *svcRig) []string { return []string{"NSMD_SERVICE_NFSV4_TRACKING_STATUS="} },
			"nsmd does not serve NFSv4 client tracking for service home"},
		{"tracking not ready", func(r *svcRig) []string {
			r.write(r.status, "state=error\nerror=no pipe\ngrace_start_sm_state=0\n")
			return nil
		}, "not ready (state 'error': no pipe)"},
		{"no client", func(r *svcRig) []string { return []string{"NSMD_SERVICE_EXPORT_CLIENTS="} }, "refusing to export /srv/nfs/home to every host"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newSvcRig(t, svcStandins)
			out, err := r.run(append(r.env("leader", "start"), c.setup(r)...))
			if err == nil || !strings.Contains(out, c.says) {
				t.Fatalf("start: %v (want a refusal saying %q)\n%s", err, c.says, out)
			}
			for _, call := range r.calls() {
				if strings.Contains(call, "mount ") || strings.Contains(call, "_netns-start") {
					t.Fatalf("refused start still ran %q", call)
				}
			}
		})
	}
}

// nfsd that does not use nsmd's tracking of the service (nsmd answered
// no GraceStart of this term) is stopped again inside the namespace, and
// start fails.
func TestHookServiceStartStopsNfsdWithoutTracking(t *testing.T) {
	r := newSvcRig(t, svcStandins)
	r.write(r.status, "state=open\nerror=\ngrace_start_sm_state=5\n")
	out, err := r.run(append(r.env("leader", "start"), "NFS_HA_TRACKING_WAIT=1"))
	if err == nil || !strings.Contains(out, "did not use nsmd's NFSv4 client tracking") {
		t.Fatalf("start: %v\n%s", err, out)
	}
	calls := r.calls()
	i := slices.Index(calls, "host: ip netns exec nsmd-home sh "+r.hook()+" _netns-stop-nfsd")
	if i < 0 || !slices.Contains(calls[i:], "nsmd-home: rpc.nfsd 0") || !slices.Contains(calls[i:], "nsmd-home: exportfs -ua") {
		t.Fatalf("nfsd not stopped in the namespace:\n%s", strings.Join(calls, "\n"))
	}
}

// At start-of-process the namespace may not exist: stop then enters no
// namespace, unmounts the service's filesystem if it is mounted here, and
// succeeds. A busy unmount fails the stop (nsmd then resets the server).
// Without namespaces, stop still unmounts the service's filesystem.
func TestHookServiceStopWithoutNamespaceAndBusy(t *testing.T) {
	r := newSvcRig(t, svcStandins)
	os.Remove(filepath.Join(r.netnsDir, svcNS))
	out, err := r.run(r.env("follower", "start-of-process"))
	if err != nil || !strings.Contains(out, "namespace nsmd-home does not exist") {
		t.Fatalf("stop at start-of-process, nothing here: %v\n%s", err, out)
	}
	if c := r.calls(); len(c) != 1 || c[0] != "" {
		t.Fatalf("stop with nothing here ran %q", c)
	}
	r.write(r.mnts, "/dev/sdz /srv/nfs/home ext4 rw 0 0\n/dev/sdy /srv/nfs/other ext4 rw 0 0\n")
	if out, err := r.run(r.env("follower", "start-of-process")); err != nil {
		t.Fatalf("stop at start-of-process, mounted: %v\n%s", err, out)
	}
	if c := r.calls(); !slices.Equal(c, []string{"host: sync", "host: umount /srv/nfs/home"}) {
		t.Fatalf("stop at start-of-process, mounted, ran %q", c)
	}
	out, err = r.run(append(r.env("follower", "stop"), "STANDIN_UMOUNT_BUSY=yes"))
	if err == nil || !strings.Contains(out, "cannot unmount /srv/nfs/home of service home") {
		t.Fatalf("stop with a busy filesystem: %v (want a failure)\n%s", err, out)
	}
	r.calls()
	if out, err := r.run(append(r.env("follower", "stop"), "NSMD_SERVICE_NAMESPACES=off")); err != nil || !strings.Contains(out, "unmounted /srv/nfs/home") || strings.Contains(out, "namespace") {
		t.Fatalf("stop without namespaces: %v\n%s", err, out)
	}
	if c := r.calls(); !slices.Equal(c, []string{"host: sync", "host: umount /srv/nfs/home"}) {
		t.Fatalf("stop without namespaces ran %q", c)
	}
}

// Stop kills by pid file only a process that is that daemon in this
// namespace: a pid file naming another program (a stale file whose pid
// was reused) is left alone, the process with it.
func TestHookServiceStopLeavesAStrangerAlone(t *testing.T) {
	r := newSvcRig(t, svcStandins)
	stranger := exec.Command("sleep", "60")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stranger.Process.Kill(); stranger.Wait() })
	os.MkdirAll(filepath.Join(r.runDir, "run", "nfsd-ha"), 0o755)
	r.write(filepath.Join(r.runDir, "run", "nfsd-ha", "rpcbind.pid"), strconv.Itoa(stranger.Process.Pid)+"\n")
	out, err := r.run(r.env("follower", "stop"))
	if err != nil || !strings.Contains(out, "names no rpcbind of namespace nsmd-home: left alone") {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	if !alive(stranger.Process.Pid) {
		t.Fatal("stop killed a process that is not the namespace's rpcbind")
	}
}

// The hook parses in sh and in busybox sh (the VM tier's).
func TestHookParses(t *testing.T) {
	hook := filepath.Join(repoRoot, "deploy/hooks/nfsd-ha")
	if out, err := exec.Command("sh", "-n", hook).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v\n%s", err, out)
	}
	if bb, err := exec.LookPath("busybox"); err == nil {
		if out, err := exec.Command(bb, "sh", "-n", hook).CombinedOutput(); err != nil {
			t.Fatalf("busybox sh -n: %v\n%s", err, out)
		}
	}
}

// lockd's grace (nlm_grace_period) is one setting for the whole host:
// a service's start sets it when it is unset (0) or equal, and otherwise
// leaves it and says so; the first start's value stays.
func TestHookServiceLockdGraceIsHostWide(t *testing.T) {
	for _, c := range []struct{ before, after, says string }{
		{"0", "60", ""},
		{"60", "60", ""},
		{"90", "90", "lockd's grace for service home stays 90s, not 60s: nlm_grace_period is one setting for the whole host"},
	} {
		r := newSvcRig(t, svcStandins)
		r.write(r.nlm, c.before+"\n")
		cmd := exec.Command("sh", "-c", `. "$HOOK" && svc_set_lockd_grace`)
		cmd.Env = append(r.env("leader", "start"), "HOOK="+r.hook(), "NFS_HA_FUNCTIONS_ONLY=yes")
		out, err := cmd.CombinedOutput()
		b, _ := os.ReadFile(r.nlm)
		if err != nil || strings.TrimSpace(string(b)) != c.after || !strings.Contains(string(out), c.says) || (c.says == "" && len(out) > 0) {
			t.Fatalf("nlm_grace_period %s: now %q, %v\n%s", c.before, b, err, out)
		}
	}
}

// Stop fails, and leaves the filesystem mounted, when the namespace's
// nfsd still runs after rpc.nfsd 0 (nsmd then resets the server); a
// namespace without a run directory has nothing of the hook to stop.
func TestHookServiceStopFailsWhileNfsdRuns(t *testing.T) {
	r := newSvcRig(t, svcStandins)
	r.write(filepath.Join(r.runDir, "nfsd", "threads"), "8\n")
	r.write(r.mnts, "/dev/sdz /srv/nfs/home ext4 rw 0 0\n")
	out, err := r.run(append(r.env("follower", "stop"), "STANDIN_THREADS=/dev/null"))
	if err == nil || !strings.Contains(out, "still has 8 threads after rpc.nfsd 0") {
		t.Fatalf("stop with nfsd still running: %v (want a failure)\n%s", err, out)
	}
	if calls := r.calls(); slices.Contains(calls, "host: umount /srv/nfs/home") {
		t.Fatalf("stop unmounted while nfsd ran:\n%s", strings.Join(calls, "\n"))
	}
	// Control: the same stop with an nfsd that stops succeeds.
	if out, err := r.run(r.env("follower", "stop")); err != nil {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	if calls := r.calls(); !slices.Contains(calls, "host: umount /srv/nfs/home") {
		t.Fatalf("stop did not unmount:\n%s", strings.Join(calls, "\n"))
	}

	if err := os.RemoveAll(r.runDir); err != nil {
		t.Fatal(err)
	}
	out, err = r.run(r.env("follower", "start-of-process"))
	if err != nil || !strings.Contains(out, "nothing of service home was started in nsmd-home") {
		t.Fatalf("stop without a run directory: %v\n%s", err, out)
	}
}
