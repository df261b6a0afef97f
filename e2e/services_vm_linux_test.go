package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
)

// Services in network namespaces on real kernels: the pair topology of
// pair_vm_linux_test.go (two server VMs with the default fencing, the
// witness) serving two services, a and b, each with its own address, its
// own shared disk (a: /dev/vda, b: /dev/vdb on both servers) and export,
// and two client VMs, each with an NFSv3 (c3) or NFSv4.2 (c42) mount of
// each service. One boot per kernel:
//
//   - kernel facts: two namespaces of the test's own in client c3, before
//     anything else (svcfacts_vm_linux_test.go);
//   - namespaces (`service_namespaces: auto`, the shipped hook): a on s1,
//     b on s2, every client holding a lock on each; a power cut of s1: a
//     moves to s2 (its locks come back, a new lock is granted) while b's
//     clients, started right after the cut and again as soon as a's nfsd
//     is in grace on s2 — b's server —, are granted new locks without
//     waiting; then a's unmount on s2 is kept busy and `nsmd move a --to
//     s1` fails its stop there: s2 is reset, and b moves with a to s1 and
//     stays there when s2 is back (no failback); then `nsmd move b --to
//     s2`, with a untouched. An outside sampler never sees one service's
//     filesystem mounted on both servers, and the lock-safety workload
//     (lockwork_vm_linux_test.go: a worker per client and service) runs
//     through all three moves; at the end its checks are shown to see a
//     lock granted twice (b's server made to forget its NLM locks);
//   - the control (`service_namespaces: off`, both services in the host's
//     one nfsd through the test's hook one-nfsd): a moved onto b's
//     server restarts that nfsd, and b's clients' new locks wait out the
//     grace.
//
// Every VM runs dash as /bin/sh (vm.sh=, as Debian does): the shipped
// hook and the test's commands then find iproute2's ip and util-linux's
// nsenter and unshare through PATH (busybox's sh would run its own
// applets first, and its ip has no netns).
//
// The servers run with leases off (fs.leases-enable=0): no NFSv4
// delegations, whose recall after a failover costs up to minutes on 6.12
// (the pair test covers them); what is measured here is grace.

// vmService is one service of the test.
type vmService struct {
	id, addr, dev, mount string
	prefer               []string
	fsid                 int
}

var vmServices = []vmService{
	{id: "a", addr: topoNet + ".101", dev: "/dev/vda", mount: "/srv/a", prefer: []string{"s1", "s2"}, fsid: 11},
	{id: "b", addr: topoNet + ".102", dev: "/dev/vdb", mount: "/srv/b", prefer: []string{"s2", "s1"}, fsid: 12},
}

// svcRaft are the raft timings of every member and svcServe the servers'
// fencing: both servers serve here (the pair test's one does), each
// running hooks that keep its one TCG vCPU busy for seconds, and at the
// pair's 1 s / 5 s, and at 2 s / 10 s while the other server booted, a
// busy guest serving a service as a raft follower lost its proof,
// starved its watchdog and was reset while nothing was wrong. The fencing is the
// default (softdog as /dev/watchdog), with a longer timeout.
var (
	svcRaft  = []string{"--heartbeat-timeout", "3s", "--election-timeout", "3s", "--leader-lease-timeout", "1500ms"}
	svcServe = append([]string{"--fence-timeout", "20s"}, svcRaft...)
)

// vmDash boots a VM with dash as /bin/sh.
const vmDash = "vm.sh=/usr/bin/dash"

const (
	svcGrace = 20 // seconds: each service's grace
	// svcNoWait bounds "without waiting": a new lock on a service not in
	// grace, on TCG guests sharing two busy cores.
	svcNoWait = 5.0
	// svcWaited is the least a new lock must wait in the control (grace
	// svcGrace, started as the restarted nfsd is seen in grace).
	svcWaited = 8.0
)

// svcYAML is the services config file every member gets; namespaces is
// the service_namespaces value ("" leaves the key out: the default).
func svcYAML(namespaces string) string {
	var b strings.Builder
	if namespaces != "" {
		fmt.Fprintf(&b, "service_namespaces: %s\n", namespaces)
	}
	b.WriteString("services:\n")
	for _, s := range vmServices {
		fmt.Fprintf(&b, "  - id: %s\n    address: %s/%d\n    interface: eth0\n    device: %s\n    mount: %s\n", s.id, s.addr, topoBits, s.dev, s.mount)
		fmt.Fprintf(&b, "    export_clients: [%s.0/%d]\n    export_options: rw,sync,no_subtree_check,no_root_squash,fsid=%d\n", topoNet, topoBits, s.fsid)
		fmt.Fprintf(&b, "    grace: %ds\n    lease: 10s\n    prefer: [%s]\n", svcGrace, strings.Join(s.prefer, ", "))
	}
	return b.String()
}

// svcClient is a client VM with a mount of each service (/mnt/<id>).
type svcClient struct {
	vm      *testVM
	vers    string
	holders map[string]int    // service → pid of its `vmagent lock`
	keys    map[string]string // service → the held file as /proc/locks names it (maj:min:ino)
}

func (c *svcClient) file(id string) string { return fmt.Sprintf("/mnt/%s/held-%s", id, c.vm.name) }

// svcRig is one kernel's boot.
type svcRig struct {
	p       *pairTopo
	fvms    []*fenceVM
	clients []*svcClient
	sampler *fenceSampler
	rows    []string // the new-lock table
}

// vmServiceByID is the test's service id.
func vmServiceByID(id string) vmService {
	for _, s := range vmServices {
		if s.id == id {
			return s
		}
	}
	panic("no service " + id)
}

func (r *svcRig) server(id string) *pairNode {
	for _, n := range r.p.servers {
		if n.id == id {
			return n
		}
	}
	r.p.t.Fatalf("no server %s", id)
	return nil
}

// use points the rig's helpers at subtest t (they fail the running test).
func (r *svcRig) use(t *testing.T) {
	r.p.t = t
	for _, n := range r.p.servers {
		n.vm.t = t
	}
	for _, c := range r.clients {
		c.vm.t = t
	}
}

// TestServicesInNamespacesOnRealKernels: see the comment above.
func TestServicesInNamespacesOnRealKernels(t *testing.T) {
	for _, series := range vmKernelSeries {
		t.Run(series, func(t *testing.T) { servicesOnKernel(t, series) })
	}
}

// nsmdHasServiceNamespaces says whether the nsmd under test knows
// service_namespaces (the positive part needs it).
func nsmdHasServiceNamespaces() bool {
	out, _ := exec.Command(nsmdBin, "agent", "--help").CombinedOutput()
	return strings.Contains(string(out), "service-namespaces")
}

func servicesOnKernel(t *testing.T, series string) {
	img := needVMImageFor(t, series)
	start := time.Now()
	r := newSvcRig(t, img, series)
	t.Run("kernel-facts", func(t *testing.T) {
		r.use(t)
		for _, f := range kernelFactsPerNamespace(t, r.clients[0].vm, series) {
			t.Log(f)
		}
	})
	r.use(t)
	p := r.p
	r.writeConf("") // the witness reads it at start
	p.witnessArgs = svcRaft
	p.startWitness()
	for _, n := range p.servers {
		n.vm.sh(10*time.Second, "sysctl -w fs.leases-enable=0 >/dev/null")
	}
	r.sampler = startSampler(t, r.fvms)
	// The control first: its servers stop cleanly (the host's nfsd), and
	// the namespaces part ends the boot. On 6.12 the control runs with
	// NSMD_E2E_612_FULL=1 only (the budget): 6.1's shows the one shared
	// grace, and what differs on 6.12 is the positive part's.
	control := series != kernel612 || os.Getenv("NSMD_E2E_612_FULL") == "1"
	ok := true
	if control {
		ok = t.Run("control", func(t *testing.T) { r.use(t); r.control() })
	} else {
		t.Logf("CONTROL kernel %s: not run (6.1 runs it; NSMD_E2E_612_FULL=1 runs it here too)", series)
	}
	if ok {
		t.Run("namespaces", func(t *testing.T) {
			r.use(t)
			if !nsmdHasServiceNamespaces() {
				t.Skipf("kernel %s: this nsmd has no service_namespaces (`nsmd agent --help` does not list --service-namespaces): the positive part needs the product (services in network namespaces) and skips", series)
			}
			if control {
				r.powerCycle()
			} else {
				r.startNamespaced()
			}
			r.namespaces(control)
		})
	}
	r.use(t)
	for _, id := range []string{"/srv/a", "/srv/b"} {
		held := func(s holdSample) bool { return slices.Contains(s.mounts, id) }
		if o := r.sampler.overlaps(held, start, start); len(o) > 0 {
			t.Errorf("kernel %s: %s mounted on both servers at once: %v", series, id, o)
		}
	}
	t.Logf("new-lock latency of the clients of the service that does not move, kernel %s, seconds from the attempt's start to its grant:\n| kernel | case | its NFSv3 client | its NFSv4.2 client | the moving service in grace meanwhile |\n%s",
		series, strings.Join(r.rows, "\n"))
	t.Logf("kernel %s: %.1f min in all", series, time.Since(start).Minutes())
}

// newSvcRig boots the servers, the clients and the witness's namespace.
func newSvcRig(t *testing.T, img *vmImage, series string) *svcRig {
	p := &pairTopo{t: t, img: img, dir: t.TempDir(), kernel: series}
	r := &svcRig{p: p}
	p.tp = newTopology(t, 1, 0)
	p.w = p.tp.nodes[0]
	p.wlog = filepath.Join(p.dir, "witness.log")
	p.witness = &pairNode{id: "w", ip: p.w.ip, admin: net.JoinHostPort(p.w.ip.String(), strconv.Itoa(adminPort))}
	p.pki = newClusterPKI(t, map[string]string{"w": p.w.ip.String(), "s1": topoNet + ".12", "s2": topoNet + ".13"})
	p.http = httpIn(p.w.ns, p.pki.clientTLS(t))
	p.svcConf = filepath.Join(p.dir, "nsmd.yaml")
	var shared []string
	for _, s := range vmServices {
		d := filepath.Join(p.dir, "shared-"+s.id+".img")
		makeDisk(t, d, 64)
		shared = append(shared, d)
	}
	idx := 0
	vmFor := func(name, ip string, disks []string, extra string) *testVM {
		idx++
		return newVM(t, img, p.tp, p.w, vmSpec{name: name, ip: netip.MustParseAddr(ip), disks: disks, extra: extra}, idx)
	}
	for i := range 2 {
		name := fmt.Sprintf("s%d", i+1)
		local := filepath.Join(p.dir, name+"-local.img")
		makeDisk(t, local, 160)
		ip := fmt.Sprintf("%s.%d", topoNet, 12+i)
		n := &pairNode{id: name, ip: netip.MustParseAddr(ip), vm: vmFor(name, ip, append(slices.Clone(shared), local), "vm.disk=/dev/vdc:/var/lib/nsmd "+vmDash),
			admin: net.JoinHostPort(ip, strconv.Itoa(adminPort))}
		p.servers = append(p.servers, n)
		r.fvms = append(r.fvms, &fenceVM{n: n})
	}
	for i, vers := range []string{"3", "4.2"} {
		name := "c" + strings.ReplaceAll(vers, ".", "")
		disk := filepath.Join(p.dir, name+"-varnfs.img")
		makeDisk(t, disk, 16)
		r.clients = append(r.clients, &svcClient{vm: vmFor(name, fmt.Sprintf("%s.%d", topoNet, 21+i), []string{disk}, "vm.disk=/dev/vda:/var/lib/nfs "+vmDash), vers: vers,
			holders: map[string]int{}, keys: map[string]string{}})
	}
	t.Cleanup(func() { r.cleanup(t) })
	bootStart := time.Now()
	for _, f := range r.fvms {
		f.boot()
	}
	for _, c := range r.clients {
		c.vm.boot()
	}
	for _, f := range r.fvms {
		f.n.vm.waitReady()
	}
	for _, c := range r.clients {
		c.vm.waitReady()
	}
	t.Logf("kernel %s (%s): 4 VMs up %v after the first qemu start", series, img.kernel.version, time.Since(bootStart).Round(10*time.Millisecond))
	return r
}

func (r *svcRig) cleanup(t *testing.T) {
	if t.Failed() {
		for i, n := range r.p.servers {
			for _, e := range r.fvms[i].exitsSince(time.Time{}) {
				t.Logf("== %s ended at %s: %s", n.id, e.at.UTC().Format("15:04:05.000"), e.how)
			}
			lines := 15
			for _, e := range r.fvms[i].exitsSince(time.Time{}) {
				if e.how == "reset" { // not the watchdog's, not the harness's: a kernel oops or panic shows here
					lines = 120
				}
			}
			t.Logf("== %s console (last lines):\n%s", n.id, tail(n.vm.console.String(), lines))
			if w := r.fvms[i].lastWords(); w != "" {
				t.Logf("== %s nsmd log as the sampler read it (notable lines, last 60):\n%s", n.id, tail(w, 60))
			}
			if r.fvms[i].isDown() {
				// Its nsmd log is on its local disk (the last image it was given).
				img := n.vm.disks[len(n.vm.disks)-1]
				if out, err := exec.Command("debugfs", "-R", "cat /nsmd.log", img).Output(); err == nil {
					var keep []string
					for _, l := range strings.Split(string(out), "\n") {
						if !strings.Contains(l, "component=gossip") && (strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "hook") || strings.Contains(l, "watchdog")) {
							keep = append(keep, l)
						}
					}
					t.Logf("== %s nsmd log from its disk (warnings, hooks, watchdog; last 60):\n%s", n.id, tail(strings.Join(keep, "\n"), 60))
				}
			}
			if _, out, err := n.vm.try(15*time.Second, "grep -E 'hook|service|fence|watchdog|placed|level=ERROR|^nsmd' /var/lib/nsmd/nsmd.log | grep -v component=gossip | tail -n 80; ip netns list; grep -E 'vd|nfsd|pipefs' /proc/mounts; cat /proc/locks; cat /run/one-nfsd.log; dmesg | grep -iE 'nfsd|lockd|grace|track' | tail -n 30"); err == nil {
				t.Logf("== %s:\n%s", n.id, out)
			}
		}
		for _, c := range r.clients {
			if _, out, err := c.vm.try(5*time.Second, "dmesg | tail -n 20; grep nfs /proc/mounts"); err == nil {
				t.Logf("== %s:\n%s", c.vm.name, out)
			}
		}
		if b, err := os.ReadFile(r.p.wlog); err == nil {
			t.Logf("== witness log (last lines):\n%s", tail(string(b), 30))
		}
	}
	for _, f := range r.fvms {
		f.powerOff("harness")
	}
	for _, c := range r.clients {
		c.vm.kill()
	}
}

// writeConf writes the services file for every member: the witness's
// here, the servers' at their next start (startServer copies it).
func (r *svcRig) writeConf(namespaces string) {
	if err := os.WriteFile(r.p.svcConf, []byte(svcYAML(namespaces)), 0o644); err != nil {
		r.p.t.Fatal(err)
	}
}

// services is GET /v1/services of n, by id.
func (p *pairTopo) services(n *pairNode) (map[string]admin.ServiceStatus, error) {
	resp, err := p.http.Get("https://" + n.admin + "/v1/services")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", n.id, resp.Status)
	}
	var list []admin.ServiceStatus
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	out := map[string]admin.ServiceStatus{}
	for _, s := range list {
		out[s.ID] = s
	}
	return out, nil
}

// waitPlaced waits until each service of want is placed on its server as
// the witness sees it, and serving as that server sees it, with nfsd up
// (ready says how to check on the server VM), and returns the witness's view.
func (r *svcRig) waitPlaced(want map[string]string, ready func(v *testVM, id string) bool, timeout time.Duration) map[string]admin.ServiceStatus {
	p := r.p
	var st map[string]admin.ServiceStatus
	testutil.WaitForSeen(p.t, timeout, fmt.Sprintf("services placed and serving: %v", want), func() (bool, string) {
		var err error
		st, err = p.services(p.witness)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		done := true
		for id, node := range want {
			seen = append(seen, fmt.Sprintf("%s=%s@%d(%s)", id, st[id].Owner, st[id].Epoch, st[id].State))
			if st[id].Owner != node {
				done = false
				continue
			}
			own, err := p.services(r.server(node))
			if err != nil || own[id].State != admin.ServiceServing || !ready(r.server(node).vm, id) {
				seen = append(seen, fmt.Sprintf("on %s: %s %v", node, own[id].State, err))
				done = false
			}
		}
		slices.Sort(seen)
		time.Sleep(drillPoll)
		return done, strings.Join(seen, " ")
	})
	return st
}

// nsRunDir is service id's run directory (its namespace's nfsd mount is
// under it).
func nsRunDir(id string) string { return "/run/nsmd/services/" + id }

// nsServing: service id's nfsd runs in its namespace on v.
func nsServing(v *testVM, id string) bool {
	rc, out, err := v.try(5*time.Second, "cat "+nsRunDir(id)+"/nfsd/threads")
	n, _ := strconv.Atoi(strings.TrimSpace(out))
	return err == nil && rc == 0 && n > 0
}

// hostServing: the host's nfsd runs on v with service id's mount exported.
func hostServing(v *testVM, id string) bool {
	rc, out, err := v.try(5*time.Second, "cat /proc/fs/nfsd/threads && exportfs | grep -q '^/srv/"+id+"'")
	n, _ := strconv.Atoi(strings.Fields(out + " 0")[0])
	return err == nil && rc == 0 && n > 0
}

// nsGrace is service id's lockd and nfsd grace on v, from inside its
// namespace ("YY": both over; "" when it cannot be read).
func nsGrace(v *testVM, id string) string {
	rc, out, err := v.try(5*time.Second, fmt.Sprintf("ip netns exec nsmd-%s cat /proc/fs/lockd/nlm_end_grace | tr -d '\\0\\n'; cat %s/nfsd/v4_end_grace", id, nsRunDir(id)))
	if err != nil || rc != 0 {
		return ""
	}
	return strings.Join(strings.Fields(out), "")
}

// hostGrace is the host's lockd and nfsd grace on v.
func hostGrace(v *testVM) string {
	rc, out, err := v.try(5*time.Second, "tr -d '\\0\\n' < /proc/fs/lockd/nlm_end_grace; cat /proc/fs/nfsd/v4_end_grace")
	if err != nil || rc != 0 {
		return ""
	}
	return strings.Join(strings.Fields(out), "")
}

// mountAll mounts each service of ids on every client.
func (r *svcRig) mountAll(ids ...string) {
	for _, c := range r.clients {
		for _, s := range vmServices {
			if !slices.Contains(ids, s.id) {
				continue
			}
			c.vm.sh(90*time.Second, fmt.Sprintf("mkdir -p /mnt/%s && mount.nfs %s:%s /mnt/%s -o vers=%s,proto=tcp,hard,timeo=20 && %s",
				s.id, s.addr, s.mount, s.id, c.vers, probeDirs(fmt.Sprintf("/mnt/%s/probe-%s", s.id, c.vm.name))))
		}
	}
}

// hold makes every client take and hold a lock on a file of its own on
// service s, served by server n; it records where /proc/locks shows it.
func (r *svcRig) hold(s vmService, n *pairNode) {
	dev := strings.Fields(n.vm.sh(5*time.Second, "stat -L -c '%t %T' "+s.dev))
	maj, _ := strconv.ParseUint(dev[0], 16, 32)
	minor, _ := strconv.ParseUint(dev[1], 16, 32)
	for _, c := range r.clients {
		line, pid := c.vm.start(60*time.Second, "vmagent lock "+c.file(s.id))
		if !strings.HasPrefix(line, "locked") {
			r.p.t.Fatalf("%s lock on %s: %q", c.vm.name, s.id, line)
		}
		c.holders[s.id] = pid
		ino := strings.TrimSpace(n.vm.sh(5*time.Second, "stat -c %i "+s.mount+"/"+filepath.Base(c.file(s.id))))
		c.keys[s.id] = fmt.Sprintf("%02x:%02x:%s", maj, minor, ino)
	}
}

// heldOn lists the write locks in v's /proc/locks by maj:min:ino.
func heldOn(v *testVM) map[string]int {
	rc, out, err := v.try(5*time.Second, "cat /proc/locks")
	held := map[string]int{}
	if err != nil || rc != 0 {
		return held
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && (f[1] == "POSIX" || f[1] == "DELEG") && f[3] == "WRITE" {
			held[f[5]]++
		}
	}
	return held
}

// checkHeld: each client's lock on service id is on server n and the
// other client is refused it; the holder still runs.
func (r *svcRig) checkHeld(id string, n *pairNode, when string) {
	t := r.p.t
	t.Helper()
	held := heldOn(n.vm)
	for i, c := range r.clients {
		if held[c.keys[id]] == 0 {
			t.Fatalf("%s: %s's lock on %s (%s) not on %s: %v", when, c.vm.name, id, c.keys[id], n.id, held)
		}
		o := r.clients[1-i]
		if rc, out, err := o.vm.try(60*time.Second, "vmagent trylock "+c.file(id)); err != nil || rc != 3 {
			t.Fatalf("%s: %s got %s's lock on service %s: rc %d %q %v", when, o.vm.name, c.vm.name, id, rc, out, err)
		}
		if rc, out, err := c.vm.try(5*time.Second, fmt.Sprintf("kill -0 %d && cat /run/vmagent/%d.log", c.holders[id], c.holders[id])); err != nil || rc != 0 || strings.Contains(out, "vmagent:") {
			t.Fatalf("%s: %s's holder on %s died or failed: rc %d %q %v", when, c.vm.name, id, rc, out, err)
		}
	}
}

// probe starts a new-lock prober on service id on every client.
func (r *svcRig) probe(id string) map[*svcClient]int {
	out := map[*svcClient]int{}
	for _, c := range r.clients {
		_, pid := c.vm.start(5*time.Second, fmt.Sprintf("vmagent firstlock /mnt/%s/probe-%s 500ms", id, c.vm.name))
		out[c] = pid
	}
	return out
}

// probed waits for the probers' grants and returns each client's seconds
// from its start to its grant (its own clock); during is checked at every
// poll until the last grant (false at any one: false).
func (r *svcRig) probed(id string, pids map[*svcClient]int, timeout time.Duration, during func() bool) (map[string]float64, bool) {
	got := map[string]float64{}
	all := true
	testutil.WaitForSeen(r.p.t, timeout, "new locks on service "+id, func() (bool, string) {
		if during != nil && !during() {
			all = false
		}
		for c, pid := range pids {
			if _, ok := got[c.vers]; ok {
				continue
			}
			if rc, out, err := c.vm.try(5*time.Second, fmt.Sprintf("cat /run/vmagent/%d.log", pid)); err == nil && rc == 0 && strings.Contains(out, "granted") {
				if _, after, ok := strings.Cut(out, " after "); ok {
					got[c.vers], _ = strconv.ParseFloat(strings.Fields(after)[0], 64)
				}
			}
		}
		time.Sleep(drillPoll)
		return len(got) == len(pids), fmt.Sprintf("granted %v", got)
	})
	for c, pid := range pids {
		c.vm.try(5*time.Second, fmt.Sprintf("kill %d; rm -f /mnt/%s/probe-%s/p*/free-*", pid, id, c.vm.name))
	}
	return got, all
}

func (r *svcRig) row(kase string, got map[string]float64, moverInGrace string) {
	r.rows = append(r.rows, fmt.Sprintf("| %s | %s | %.1f | %.1f | %s |", r.p.kernel, kase, got["3"], got["4.2"], moverInGrace))
	r.p.t.Logf("NEW LOCK kernel %s, %s: NFSv3 client %.1fs, NFSv4.2 client %.1fs (the moving service in grace meanwhile: %s)", r.p.kernel, kase, got["3"], got["4.2"], moverInGrace)
}

// move runs `nsmd move id --to node` from the witness's namespace, through
// the witness's admin API (never the server a drill kills).
func (r *svcRig) move(id, node string) {
	p := r.p
	args := append([]string{"netns", "exec", p.w.ns, nsmdBin, "move", id, "--to", node, "--admin", p.witness.admin}, p.pki.cliArgs()...)
	tries := 0
	testutil.WaitForSeen(p.t, 120*time.Second, "nsmd move "+id+" --to "+node+" accepted", func() (bool, string) {
		tries++
		out, err := exec.Command("ip", args...).CombinedOutput()
		// An earlier try that failed on its way back may have moved it.
		return err == nil || tries > 1 && strings.Contains(string(out), "runs there already"), string(out)
	})
}

// release ends every holder and unmounts every client's mounts.
func (r *svcRig) release() {
	for _, c := range r.clients {
		for id, pid := range c.holders {
			c.vm.try(20*time.Second, fmt.Sprintf("kill %d; while kill -0 %d 2>/dev/null; do sleep 0.1; done", pid, pid))
			delete(c.holders, id)
		}
		// A client's unmount (lazy at last: the servers' side is what the
		// sampler watches).
		c.vm.sh(60*time.Second, "for m in $(grep ' nfs' /proc/mounts | cut -d' ' -f2); do umount $m || umount -f $m || umount -l $m; done")
	}
}
