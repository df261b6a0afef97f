package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// What the kernel keeps per network namespace, checked in one guest with
// two namespaces of its own (kf1, kf2) before the services test starts
// its cluster: the facts docs/kernel-facts.md ("Per network namespace")
// cites this for. Each namespace gets its own rpcbind (a private /run)
// and `rpc.nfsd` with its own nfsd filesystem, mounted from inside the
// namespace (nsenter --net) at a path the host reads; no NFSv4 tracking
// daemon serves either (the services test's namespaces part is where nsmd
// serves one namespace's cld pipe).

// kfStart starts rpcbind and nfsd with threads threads in namespace ns,
// whose nfsd filesystem is mounted at /run/kf/<ns>/nfsd.
func kfStart(ns string, threads int) string {
	return fmt.Sprintf("ip netns exec %s sh -c 'mount --bind /run/kf/%s/nfsd /proc/fs/nfsd && mount -t tmpfs tmpfs /run && mkdir -p /run/rpcbind && rpcbind -w && rpc.nfsd %d'", ns, ns, threads)
}

// kfLockd is namespace ns's lockd grace as nlm_end_grace says (Y: over).
func kfLockd(ns string) string {
	return fmt.Sprintf("ip netns exec %s cat /proc/fs/lockd/nlm_end_grace | tr -d '\\0\\n'", ns)
}

var kfGraceLine = regexp.MustCompile(`starting (\d+)-second grace period \(net ([0-9a-f]+)\)`)

// kernelFactsPerNamespace runs the checks in VM v (one that serves
// nothing yet) and returns one line per fact; a fact that does not hold
// fails the test.
func kernelFactsPerNamespace(t *testing.T, v *testVM, series string) []string {
	t.Helper()
	var facts []string
	fact := func(format string, a ...any) {
		facts = append(facts, fmt.Sprintf("KERNEL FACT kernel %s: ", series)+fmt.Sprintf(format, a...))
	}
	field := func(cmd string) string { return strings.TrimSpace(v.sh(30*time.Second, cmd)) }
	orig := field("echo kfacts-start > /dev/kmsg; cat /proc/sys/fs/nfs/nlm_grace_period")
	v.sh(30*time.Second, `for n in kf1 kf2; do ip netns add $n && ip -n $n link set lo up && mkdir -p /run/kf/$n/nfsd /run/kf/$n/pipefs &&
		nsenter --net=/run/netns/$n mount -t nfsd nfsd /run/kf/$n/nfsd &&
		nsenter --net=/run/netns/$n mount -t rpc_pipefs rpc_pipefs /run/kf/$n/pipefs || exit 1; done
		mkdir -p /run/kf/init/nfsd && mount -t nfsd nfsd /run/kf/init/nfsd`)
	t.Cleanup(func() {
		v.try(60*time.Second, `for n in kf1 kf2; do ip netns exec $n sh -c "mount --bind /run/kf/$n/nfsd /proc/fs/nfsd && rpc.nfsd 0"; ip netns pids $n | xargs -r kill -9; done
			sleep 0.5; umount /run/kf/kf1/nfsd /run/kf/kf2/nfsd /run/kf/kf1/pipefs /run/kf/kf2/pipefs /run/kf/init/nfsd; ip netns del kf1; ip netns del kf2`)
	})
	// A link made straight into a namespace (IFLA_NET_NS_FD) under a name
	// its parent has in the sender's namespace: what a service's macvlan
	// named like its interface is.
	rc, same, _ := v.try(20*time.Second, "ip link add eth0 link eth0 netns kf1 type macvlan mode bridge")
	v.sh(20*time.Second, "ip link add kfmv0 link eth0 netns kf1 type macvlan mode bridge && ip -n kf1 link set kfmv0 name eth0 && ip -n kf1 link del eth0")
	if rc == 0 {
		v.sh(10*time.Second, "ip -n kf1 link del eth0")
		fact("a macvlan named like its parent (eth0) is made straight into another namespace in one request")
	} else {
		fact("a macvlan named like its parent (eth0) cannot be made straight into another namespace in one request: %q (the name is looked up in the sender's namespace first); made under another name and renamed inside, it can", strings.TrimSpace(same))
	}

	// While nfsd starts in a namespace it makes its cld pipe in that
	// namespace's rpc_pipefs and waits a moment for a daemon to open it:
	// a watcher notes in which namespace's mount the pipe shows.
	v.sh(10*time.Second, `( i=0; while [ $i -lt 400 ]; do for n in kf1 kf2; do [ -p /run/kf/$n/pipefs/nfsd/cld ] && echo "$(cut -d' ' -f1 /proc/uptime) $n"; done; i=$((i+1)); usleep 25000; done > /run/kf/cld-seen ) >/dev/null 2>&1 &`)
	t0 := time.Now()
	v.sh(120*time.Second, kfStart("kf1", 4))
	up1 := time.Since(t0)
	v.sh(120*time.Second, kfStart("kf2", 2))
	fact("rpc.nfsd in a namespace with no tracking daemon took %.1fs (kf1)", up1.Seconds())

	// nfsd: threads and the nfsd filesystem are per namespace (three
	// mounts of one filesystem type, three superblocks, three answers).
	th := field("cat /run/kf/kf1/nfsd/threads /run/kf/kf2/nfsd/threads /run/kf/init/nfsd/threads | tr '\\n' ' '")
	if th != "4 2 0" {
		t.Errorf("kernel %s: nfsd threads in kf1, kf2, the initial namespace: %q, want 4 2 0", series, th)
	}
	fact("nfsd threads per namespace: kf1, kf2, initial namespace = %s (each read through that namespace's own nfsd mount, mounted from inside it)", th)

	// Grace: nfsd's and lockd's, per namespace.
	g4 := field("cat /run/kf/kf1/nfsd/v4_end_grace /run/kf/kf2/nfsd/v4_end_grace | tr -d '\\n'")
	gl := field(kfLockd("kf1") + "; " + kfLockd("kf2"))
	if g4 != "NN" || gl != "NN" {
		t.Errorf("kernel %s: after both starts: v4_end_grace %q nlm_end_grace %q, want both namespaces in grace (NN, NN)", series, g4, gl)
	}
	field("ip netns exec kf1 sh -c 'echo Y > /proc/fs/lockd/nlm_end_grace'")
	gl1 := field(kfLockd("kf1") + "; " + kfLockd("kf2"))
	if gl1 != "YN" {
		t.Errorf("kernel %s: after ending lockd's grace in kf1: nlm_end_grace kf1,kf2 = %q, want YN", series, gl1)
	}
	fact("lockd grace per namespace: both in grace after their starts (nlm_end_grace %s, v4_end_grace %s); Y written to nlm_end_grace from inside kf1 ends kf1's alone: %s", gl, g4, gl1)

	// v4_end_grace with no tracking: refused.
	// (busybox's echo names the error; dash's says "I/O error" for any.)
	rc, out, err := v.try(10*time.Second, "busybox sh -c 'echo Y > /run/kf/kf2/nfsd/v4_end_grace'")
	if err != nil || rc == 0 || !strings.Contains(out, "busy") {
		t.Errorf("kernel %s: Y to kf2's v4_end_grace with no tracking daemon: rc %d %q %v, want EBUSY", series, rc, out, err)
	}
	fact("v4_end_grace in a namespace whose nfsd has no client tracking refuses the early end: %s", strings.TrimSpace(out))

	// nlm_grace_period: one value for every namespace.
	gp := field("ip netns exec kf1 sh -c 'echo 37 > /proc/sys/fs/nfs/nlm_grace_period'; ip netns exec kf2 cat /proc/sys/fs/nfs/nlm_grace_period; cat /proc/sys/fs/nfs/nlm_grace_period; echo " + orig + " > /proc/sys/fs/nfs/nlm_grace_period")
	if strings.Join(strings.Fields(gp), " ") != "37 37" {
		t.Errorf("kernel %s: nlm_grace_period written 37 in kf1, read in kf2 and the initial namespace: %q, want 37 37", series, gp)
	}
	fact("/proc/sys/fs/nfs/nlm_grace_period is global: 37 written in kf1 reads %s in kf2 and the initial namespace", strings.Join(strings.Fields(gp), ", "))

	// A restart of kf2's nfsd puts kf2 alone back in grace.
	field("ip netns exec kf2 sh -c 'echo Y > /proc/fs/lockd/nlm_end_grace'")
	before := field(kfLockd("kf1") + "; " + kfLockd("kf2"))
	v.sh(120*time.Second, "ip netns exec kf2 sh -c 'mount --bind /run/kf/kf2/nfsd /proc/fs/nfsd && rpc.nfsd 0 && rpc.nfsd 2'")
	after := field(kfLockd("kf1") + "; " + kfLockd("kf2"))
	if before != "YY" || after != "YN" {
		t.Errorf("kernel %s: lockd grace kf1,kf2 before kf2's nfsd restart %q, after %q: want YY then YN", series, before, after)
	}

	dmesg := field(`dmesg | sed -n '/kfacts-start/,$p' | grep -iE 'nfsd|lockd|grace|track' | grep -v kfacts-start`)
	counts, order := map[string]int{}, []string{}
	for _, m := range kfGraceLine.FindAllStringSubmatch(dmesg, -1) {
		if counts[m[2]] == 0 {
			order = append(order, m[2])
		}
		counts[m[2]]++
	}
	if len(order) != 2 || counts[order[0]] != 1 || counts[order[1]] != 2 {
		t.Errorf("kernel %s: grace lines by net %v (order %v), want kf1's net once and kf2's twice:\n%s", series, counts, order, dmesg)
	} else {
		fact("nfsd's grace per namespace: \"starting N-second grace period\" for net %s (kf1) once and for net %s (kf2) at each of its two starts; lockd: kf1,kf2 = %s before kf2's restart, %s after", order[0], order[1], before, after)
	}
	if !strings.Contains(dmesg, "Unable to initialize client recovery tracking") {
		t.Errorf("kernel %s: no \"Unable to initialize client recovery tracking\" for a namespace without a tracking daemon:\n%s", series, dmesg)
	}
	var tracking []string
	for _, l := range strings.Split(dmesg, "\n") {
		if strings.Contains(strings.ToLower(l), "track") || strings.Contains(l, "nfsdcld") {
			tracking = append(tracking, strings.TrimSpace(l[strings.Index(l, "]")+1:]))
		}
	}
	fact("client tracking outside the initial namespace with no daemon on its cld pipe (dmesg): %s", strings.Join(uniq(tracking), " | "))
	cld := field("sleep 0.2; sort -u -k2,2 /run/kf/cld-seen | cut -d' ' -f2 | tr '\\n' ' '")
	fact("the cld pipe showed in these namespaces' own rpc_pipefs mounts while their nfsd started: %q (each namespace's rpc_pipefs mounted from inside it)", cld)
	return facts
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// oneNfsdHook is the services test's control (test tooling, not
// shipped): every service in the host's one nfsd, as a server without a
// network namespace per service has it. A service's start mounts and
// exports it and restarts nfsd with the service's grace and lease (nfsd
// takes both only while stopped): every client of every service on the
// server is then in grace. A stop unexports, stops nfsd (it holds the
// files open), unmounts, and starts nfsd again for the services left.
const oneNfsdHook = `#!/bin/sh
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
[ "$NSMD_ROLE" = service ] || exit 0
M=$NSMD_SERVICE_MOUNT
G=${NSMD_SERVICE_GRACE_SECONDS:-$NSMD_GRACE_SECONDS}
L=${NSMD_SERVICE_LEASE_SECONDS:-10}
log() { echo "$(cut -d' ' -f1 /proc/uptime) $NSMD_EVENT $NSMD_REASON $NSMD_SERVICE: $*" >> /run/one-nfsd.log; }
grep -qs ' /proc/fs/nfsd ' /proc/mounts || mount -t nfsd nfsd /proc/fs/nfsd || exit 1
restart_nfsd() {
	rpc.nfsd 0
	[ -s /var/lib/nfs/etab ] || { log "no export left: nfsd stays down"; return 0; }
	echo "$G" > /proc/fs/nfsd/nfsv4gracetime && echo "$L" > /proc/fs/nfsd/nfsv4leasetime && echo "$G" > /proc/sys/fs/nfs/nlm_grace_period || return 1
	rpc.nfsd 8 || return 1
	log "nfsd restarted: every service here in grace ($G s)"
}
case "$NSMD_EVENT" in
leader)
	pidof rpcbind >/dev/null || rpcbind -w </dev/null >/dev/null 2>&1
	mkdir -p "$M"
	grep -qs " $M " /proc/mounts || mount -t ext4 "$NSMD_SERVICE_DEVICE" "$M" || exit 1
	for c in $(echo "$NSMD_SERVICE_EXPORT_CLIENTS" | tr , ' '); do exportfs -o "$NSMD_SERVICE_EXPORT_OPTIONS" "$c:$M" || exit 1; done
	pidof rpc.mountd >/dev/null || rpc.mountd </dev/null >/dev/null 2>&1 || exit 1
	restart_nfsd || exit 1
	;;
follower)
	for c in $(echo "$NSMD_SERVICE_EXPORT_CLIENTS" | tr , ' '); do exportfs -u "$c:$M" 2>/dev/null; done
	if grep -qs " $M " /proc/mounts; then
		rpc.nfsd 0
		umount "$M" || exit 1
		restart_nfsd || exit 1
	fi
	log stopped
	;;
esac
exit 0
`
