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
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The HA NFS server pair with a witness, on real Linux kernels.
//
//	s1, s2   server VMs: kernel nfsd + lockd, the real rpcbind, rpc.mountd,
//	         exportfs, rpc.nfsd, and nsmd as their only statd; one shared
//	         raw ext4 disk (/dev/vda) that only the leader mounts, through
//	         the shipped deploy/hooks/nfsd-ha; a local disk for /var/lib/nsmd
//	w        the witness: nsmd --witness in a namespace on the same bridge,
//	         started with the servers' flags (VIP and hooks included)
//	c1, c2   client VMs: the kernel NFS client, the real rpcbind and
//	         rpc.statd (/var/lib/nfs on a disk of their own, so a reboot
//	         keeps it), mounting VIP:/srv/nfs with vers=3
//
// Drills, in one boot of the topology: SIGKILL of the active server's QEMU
// (c1's lock is reclaimed on the other server, c2 is refused it and gets
// another file once grace ends), a planned transfer back to the restarted
// server with the lock held, and a crash + reboot of the client c1 holding
// the lock (its sm-notify reaches the VIP, nsmd calls lockd back, the lock
// is freed and c2's waiting lock is granted).

const (
	pairVIP    = topoNet + ".100"
	pairGrace  = 10 // seconds: lockd/nfsd grace on the servers
	pairExport = "/srv/nfs"
	// Raft timing for nodes that are TCG guests sharing two host cores:
	// the LAN defaults (300 ms) would see a busy guest as dead.
	pairHeartbeat = "1s"
	pairElection  = "1s"
	pairLease     = "500ms"
)

// pairNode is one nsmd of the pair topology: in a server VM, or the
// witness in a namespace.
type pairNode struct {
	id    string
	ip    netip.Addr
	vm    *testVM // nil for the witness
	admin string
}

type pairTopo struct {
	t       *testing.T
	img     *vmImage
	tp      *topology
	w       *netHost // the witness's namespace; the test reaches every VM from here
	servers []*pairNode
	witness *pairNode
	clients []*testVM
	http    *http.Client
	dir     string
	pki     *clusterPKI

	wmu  sync.Mutex
	wcmd *exec.Cmd
	wlog string
}

// nsmdArgs are the flags every member gets, the witness too (it must
// ignore the VIP and hook flags by itself).
func (p *pairTopo) nsmdArgs(n *pairNode, dataDir string) []string {
	var join []string
	for _, m := range append([]*pairNode{p.witness}, p.servers...) {
		join = append(join, net.JoinHostPort(m.ip.String(), strconv.Itoa(gossipPort)))
	}
	args := []string{"agent",
		"--node-id", n.id,
		"--bind", n.ip.String(),
		"--data-dir", dataDir,
		"--nsm-addr", "0.0.0.0:" + strconv.Itoa(nsmPort),
		"--admin-addr", n.admin,
		"--join", strings.Join(join, ","),
		"--bootstrap-expect", "3",
		"--vip", fmt.Sprintf("%s/%d", pairVIP, topoBits), "--vip-interface", "eth0", "--vip-mode", "netlink",
		"--notify-name", pairVIP,
		"--grace-period", fmt.Sprintf("%ds", pairGrace),
		"--on-leader", "/usr/lib/nsmd/hooks/nfsd-ha",
		"--on-follower", "/usr/lib/nsmd/hooks/nfsd-ha",
		"--on-fault", "/usr/lib/nsmd/hooks/nfsd-ha",
		"--heartbeat-timeout", pairHeartbeat, "--election-timeout", pairElection, "--leader-lease-timeout", pairLease,
		"--log-level", "debug",
	}
	if n.vm == nil {
		args = append(args, p.pki.nodeArgs(n.id)...)
		return append(args, "--witness", "--rpcbind", "off")
	}
	args = append(args, "--tls-ca", vmTLSDir+"/ca.pem", "--tls-cert", vmTLSDir+"/node.pem", "--tls-key", vmTLSDir+"/node-key.pem",
		"--gossip-key-file", vmTLSDir+"/gossip.key", "--admin-token-file", vmTLSDir+"/admin.token")
	return append(args, "--rpcbind", "register")
}

// startServer starts rpcbind and nsmd in server VM n (nsmd forks off; its
// log is /var/lib/nsmd/nsmd.log on the VM's local disk).
func (p *pairTopo) startServer(n *pairNode) {
	p.t.Helper()
	q := make([]string, 0, 64)
	for _, a := range p.nsmdArgs(n, "/var/lib/nsmd") {
		q = append(q, shellQuote(a))
	}
	p.installTLS(n)
	n.vm.sh(10*time.Second, "rpcbind -w")
	env := fmt.Sprintf("NFS_HA_DEVICE=/dev/vda NFS_HA_MOUNT=%s NFS_HA_GRACE=%d NFS_HA_CLIENTS=%s.0/24", pairExport, pairGrace, topoNet)
	n.vm.start(5*time.Second, fmt.Sprintf("echo started; exec env %s nsmd %s >>/var/lib/nsmd/nsmd.log 2>&1", env, strings.Join(q, " ")))
}

// vmTLSDir holds a server VM's certificates, gossip key and admin token
// (on the initramfs: written again at every boot).
const vmTLSDir = "/etc/nsmd/tls"

// installTLS copies server n's files from the cluster PKI into its VM.
func (p *pairTopo) installTLS(n *pairNode) {
	p.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "umask 077 && mkdir -p %s", vmTLSDir)
	for src, dst := range map[string]string{"ca.pem": "ca.pem", n.id + ".pem": "node.pem", n.id + "-key.pem": "node-key.pem", "gossip.key": "gossip.key", "admin.token": "admin.token"} {
		data, err := os.ReadFile(p.pki.file(src))
		if err != nil {
			p.t.Fatal(err)
		}
		fmt.Fprintf(&b, " && printf '%%s' %s > %s/%s", shellQuote(string(data)), vmTLSDir, dst)
	}
	n.vm.sh(10*time.Second, b.String())
}

func (p *pairTopo) startWitness() {
	p.t.Helper()
	n := p.witness
	f, err := os.OpenFile(p.wlog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	args := append([]string{"netns", "exec", p.w.ns, nsmdBin}, p.nsmdArgs(n, filepath.Join(p.dir, "witness"))...)
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startPinned(cmd); err != nil {
		p.t.Fatalf("start witness: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	p.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
	})
	p.wmu.Lock()
	p.wcmd = cmd
	p.wmu.Unlock()
}

func shellQuote(s string) string {
	if regexp.MustCompile(`^[A-Za-z0-9_./:,=@%+-]+$`).MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// status is GET /v1/status of n ("" error when it does not answer).
func (p *pairTopo) status(n *pairNode) (nodeStatus, error) {
	var s nodeStatus
	resp, err := p.http.Get("https://" + n.admin + "/v1/status")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("%s: %s", n.id, resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// waitServing waits until one of the live servers leads, holds the VIP and
// has the export up (its on_leader hook ran: nfsd threads), and returns it.
func (p *pairTopo) waitServing(timeout time.Duration, minState int32, live ...*pairNode) (*pairNode, nodeStatus) {
	p.t.Helper()
	var leader *pairNode
	var st nodeStatus
	waitFor(p.t, timeout, "a serving leader with the VIP and nfsd up", func() (bool, string) {
		var seen []string
		for _, n := range live {
			s, err := p.status(n)
			if err != nil {
				seen = append(seen, n.id+": "+err.Error())
				continue
			}
			seen = append(seen, s.String())
			if s.Role == "leader" && s.VIPHeld && s.SMState >= minState {
				rc, out, _ := n.vm.try(5*time.Second, "cat /proc/fs/nfsd/threads")
				if rc == 0 && strings.TrimSpace(out) != "0" {
					leader, st = n, s
					return true, ""
				}
				seen = append(seen, n.id+": nfsd threads "+strings.TrimSpace(out))
			}
		}
		return false, strings.Join(seen, "; ")
	})
	return leader, st
}

// locksOn lists the POSIX write locks on the server VM's /proc/locks on
// files of the export, by inode.
func locksOn(v *testVM) (map[string]int, error) {
	rc, out, err := v.try(5*time.Second, "cat /proc/locks")
	if err != nil || rc != 0 {
		return nil, fmt.Errorf("%s /proc/locks: rc %d: %v", v.name, rc, err)
	}
	locks := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		// 1: POSIX  ADVISORY  WRITE 245 fe:00:12 0 EOF
		if len(f) >= 6 && f[1] == "POSIX" && f[3] == "WRITE" {
			dev := strings.Split(f[5], ":")
			locks[dev[len(dev)-1]]++
		}
	}
	return locks, nil
}

// inode is the inode number of path on v.
func inode(t *testing.T, v *testVM, path string) string {
	t.Helper()
	return strings.TrimSpace(v.sh(5*time.Second, "stat -c %i "+path))
}

func TestHAPairKernelNFSWithWitness(t *testing.T) {
	img := needVMImage(t)
	p := &pairTopo{t: t, img: img, dir: t.TempDir()}
	p.tp = newTopology(t, 1, 0)
	p.w = p.tp.nodes[0]
	p.wlog = filepath.Join(p.dir, "witness.log")
	p.witness = &pairNode{id: "w", ip: p.w.ip, admin: net.JoinHostPort(p.w.ip.String(), strconv.Itoa(adminPort))}
	p.pki = newClusterPKI(t, map[string]string{"w": p.w.ip.String(), "s1": topoNet + ".12", "s2": topoNet + ".13"})
	p.http = httpIn(p.w.ns, p.pki.clientTLS(t))

	shared := filepath.Join(p.dir, "shared.img")
	makeDisk(t, shared, 64)
	idx := 0
	vmFor := func(name string, ip string, disks []string, extra string) *testVM {
		idx++
		return newVM(t, img, p.tp, p.w, vmSpec{name: name, ip: netip.MustParseAddr(ip), disks: disks, extra: extra}, idx)
	}
	for i := range 2 {
		name := fmt.Sprintf("s%d", i+1)
		local := filepath.Join(p.dir, name+"-local.img")
		makeDisk(t, local, 32)
		ip := fmt.Sprintf("%s.%d", topoNet, 12+i)
		v := vmFor(name, ip, []string{shared, local}, "vm.disk=/dev/vdb:/var/lib/nsmd")
		p.servers = append(p.servers, &pairNode{id: name, ip: netip.MustParseAddr(ip), vm: v, admin: net.JoinHostPort(ip, strconv.Itoa(adminPort))})
	}
	for i := range 2 {
		name := fmt.Sprintf("c%d", i+1)
		disk := filepath.Join(p.dir, name+"-varnfs.img")
		makeDisk(t, disk, 16)
		p.clients = append(p.clients, vmFor(name, fmt.Sprintf("%s.%d", topoNet, 21+i), []string{disk}, "vm.disk=/dev/vda:/var/lib/nfs"))
	}
	all := append([]*testVM{p.servers[0].vm, p.servers[1].vm}, p.clients...)
	t.Cleanup(func() {
		if t.Failed() {
			for _, v := range all {
				t.Logf("== %s console (last lines):\n%s", v.name, tail(v.console.String(), 30))
			}
			if b, err := os.ReadFile(p.wlog); err == nil {
				t.Logf("== witness log (last lines):\n%s", tail(string(b), 40))
			}
		}
		for _, v := range all {
			v.kill()
		}
	})

	// Boot all four at once.
	bootStart := time.Now()
	for _, v := range all {
		v.boot()
	}
	for _, v := range all {
		d := v.waitReady()
		t.Logf("%s booted in %v", v.name, d.Round(10*time.Millisecond))
	}
	t.Logf("all VMs up %v after the first qemu start", time.Since(bootStart).Round(10*time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range p.servers {
				if _, out, err := n.vm.try(5*time.Second, "tail -n 60 /var/lib/nsmd/nsmd.log; dmesg | tail -n 20"); err == nil {
					t.Logf("== %s nsmd log and dmesg:\n%s", n.id, out)
				}
			}
		}
	})

	// The cluster: witness first, then both servers.
	p.startWitness()
	for _, n := range p.servers {
		p.startServer(n)
	}
	leader, st := p.waitServing(60*time.Second, 1, p.servers...)
	t.Logf("serving: %s (sm_state %d, term %d)", leader.id, st.SMState, st.Term)

	// Clients: rpcbind, statd, mount the VIP with NFSv3.
	for _, c := range p.clients {
		c.sh(20*time.Second, clientBoot)
		c.sh(60*time.Second, fmt.Sprintf("mkdir -p /mnt/nfs && mount.nfs %s:%s /mnt/nfs -o vers=3,proto=tcp,hard,timeo=20", pairVIP, pairExport))
	}
	c1, c2 := p.clients[0], p.clients[1]

	// c1 takes a lock (the server may still be in grace: the kernel waits).
	line, _ := c1.start(60*time.Second, "vmagent lock /mnt/nfs/a")
	if !strings.HasPrefix(line, "locked") {
		t.Fatalf("c1 lock: %q", line)
	}
	if rc, out, err := c2.try(30*time.Second, "vmagent trylock /mnt/nfs/a"); err != nil || rc != 3 {
		t.Fatalf("c2 got c1's lock: rc %d %q %v", rc, out, err)
	}
	inoA := inode(t, leader.vm, pairExport+"/a")
	if l, err := locksOn(leader.vm); err != nil || l[inoA] != 1 {
		t.Fatalf("%s /proc/locks: %v %v (want one lock on inode %s)", leader.id, l, err, inoA)
	}
	// The server's lockd monitors both clients through nsmd (SM_MON from
	// the kernel, my_name = the VM's hostname, prog 100021).
	regs, err := p.registrations(leader)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.clients {
		if regs[c.ip.String()] != leader.id+"/100021" {
			t.Fatalf("registrations on %s: %v (want %s monitored by %s's lockd)", leader.id, regs, c.ip, leader.id)
		}
	}

	// Drill 1: power cut of the active server.
	other := p.servers[0]
	if other == leader {
		other = p.servers[1]
	}
	t0 := time.Now()
	leader.vm.kill()
	var reclaimed time.Duration
	waitFor(t, 60*time.Second, "c1's lock reclaimed on "+other.id, func() (bool, string) {
		l, err := locksOn(other.vm)
		if err != nil {
			return false, err.Error()
		}
		if len(l) > 0 {
			reclaimed = time.Since(t0)
			return true, ""
		}
		return false, fmt.Sprint(l)
	})
	st2, _ := p.status(other)
	t.Logf("DRILL kill %s: lock reclaimed on %s %.1fs after the kill (sm_state %d -> %d)", leader.id, other.id, reclaimed.Seconds(), st.SMState, st2.SMState)
	if rc, out, err := c2.try(30*time.Second, "vmagent trylock /mnt/nfs/a"); err != nil || rc != 3 {
		t.Fatalf("after failover c2 got c1's lock: rc %d %q %v", rc, out, err)
	}
	tb := time.Now()
	if rc, out, err := c2.try(60*time.Second, "vmagent trylock /mnt/nfs/b"); err != nil || rc != 0 {
		t.Fatalf("after failover c2 cannot lock a free file: rc %d %q %v", rc, out, err)
	}
	t.Logf("c2 locked a free file %.1fs after the kill (asked %.1fs after)", time.Since(t0).Seconds(), tb.Sub(t0).Seconds())

	// The killed server boots again and rejoins as a follower (its raft
	// state is on its local disk; the shared disk stays unmounted there).
	killed := leader
	killed.vm.boot()
	killed.vm.waitReady()
	p.startServer(killed)
	p.waitFollowing(killed, st2.SMState, 60*time.Second)
	if out := killed.vm.sh(5*time.Second, "/usr/lib/nsmd/hooks/nfsd-ha status"); !strings.Contains(out, "not mounted") {
		t.Fatalf("%s mounted the shared disk as a follower: %s", killed.id, out)
	}

	// Drill 2: planned transfer back, with the lock held.
	t0 = time.Now()
	resp, err := p.http.Post("https://"+other.admin+"/v1/leadership/transfer?to="+killed.id, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("transfer to %s: %s", killed.id, resp.Status)
	}
	at := waitLock(t, killed.vm, inoA, 60*time.Second, "c1's lock reclaimed on "+killed.id+" after the transfer")
	st3, _ := p.status(killed)
	t.Logf("DRILL transfer %s -> %s: lock reclaimed %.1fs after the request (sm_state %d -> %d)", other.id, killed.id, at.Sub(t0).Seconds(), st2.SMState, st3.SMState)
	if out := other.vm.sh(5*time.Second, "/usr/lib/nsmd/hooks/nfsd-ha status"); !strings.Contains(out, "not mounted") {
		t.Fatalf("%s still has the shared disk after the transfer: %s", other.id, out)
	}
	// The shipped hook refuses to mount on a node without the VIP, even
	// when told it leads: the disk is mounted on killed right now.
	rc, out, err := other.vm.try(10*time.Second, fmt.Sprintf("NSMD_EVENT=leader NSMD_ROLE=leader NSMD_VIP=%s/%d NFS_HA_DEVICE=/dev/vda NFS_HA_MOUNT=%s /usr/lib/nsmd/hooks/nfsd-ha", pairVIP, topoBits, pairExport))
	if err != nil || rc == 0 || !strings.Contains(out, "refusing to mount") {
		t.Fatalf("nfsd-ha on %s without the VIP: rc %d %q %v (want a refusal)", other.id, rc, out, err)
	}
	if out := other.vm.sh(5*time.Second, "/usr/lib/nsmd/hooks/nfsd-ha status"); !strings.Contains(out, "not mounted") {
		t.Fatalf("%s mounted the shared disk without the VIP: %s", other.id, out)
	}
	leader = killed

	// Drill 3: the client holding the lock crashes and boots again. c2
	// waits for the lock meanwhile; c1's sm-notify (run by its statd at
	// start) tells nsmd on the VIP, nsmd calls lockd back, lockd frees
	// c1's lock and grants c2's.
	_, waiter := c2.start(2*time.Second, "vmagent lock /mnt/nfs/a")
	c1.kill()
	tBoot := time.Now()
	c1.boot()
	c1.waitReady()
	c1.sh(20*time.Second, clientBoot)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, d := range []struct {
			v   *testVM
			cmd string
		}{
			{c1, "ls -la /var/lib/nfs /var/lib/nfs/sm /var/lib/nfs/sm.bak; od -An -tx4 /var/lib/nfs/state; cat /var/lib/nfs/sm/* /var/lib/nfs/sm.bak/* 2>&1; dmesg | tail -n 15"},
			{c2, "cat /proc/locks; dmesg | tail -n 15"},
			{leader.vm, "cat /proc/locks; grep -i -E 'notify|reboot|callback|deliver' /var/lib/nsmd/nsmd.log | tail -n 30; dmesg | tail -n 15"},
		} {
			if _, out, err := d.v.try(10*time.Second, d.cmd); err == nil {
				t.Logf("== %s: %s\n%s", d.v.name, d.cmd, out)
			}
		}
	})
	var granted time.Time
	waitFor(t, 60*time.Second, "c2's waiting lock granted after c1's reboot", func() (bool, string) {
		rc, out, err := c2.try(5*time.Second, fmt.Sprintf("cat /run/vmagent/%d.log", waiter))
		if err != nil || rc != 0 {
			return false, fmt.Sprint(rc, out, err)
		}
		if strings.Contains(out, "locked") {
			granted = time.Now()
			return true, ""
		}
		return false, out
	})
	t.Logf("DRILL client reboot: c2 got c1's lock %.1fs after c1's power-on", granted.Sub(tBoot).Seconds())

	// The witness, started with the servers' VIP and hook flags, never
	// held the VIP or ran a hook, and said once that it ignores them.
	ws, err := p.status(p.witness)
	if err != nil {
		t.Fatal(err)
	}
	if ws.Role != "witness" || ws.VIPHeld {
		t.Fatalf("witness status: %s", ws)
	}
	wlog, _ := os.ReadFile(p.wlog)
	if n := strings.Count(string(wlog), "ignoring settings a witness never uses"); n != 1 {
		t.Fatalf("witness warned %d times about the ignored VIP/hook settings, want once", n)
	}
	if strings.Contains(string(wlog), "running hook") || strings.Contains(string(wlog), "VIP acquired") {
		t.Fatal("the witness ran a hook or took the VIP")
	}
	t.Logf("witness: %d hand-offs during the drills", strings.Count(string(wlog), "witness handed leadership over"))
}

// registrations is GET /v1/registrations of n (mon_name → my_name).
func (p *pairTopo) registrations(n *pairNode) (map[string]string, error) {
	var page struct {
		Registrations []struct {
			MonName string `json:"mon_name"`
			MyName  string `json:"my_name"`
			MyProg  uint32 `json:"my_prog"`
		} `json:"registrations"`
	}
	resp, err := p.http.Get("https://" + n.admin + "/v1/registrations")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		return nil, fmt.Errorf("%s registrations: %w", n.id, err)
	}
	out := map[string]string{}
	for _, r := range page.Registrations {
		out[r.MonName] = fmt.Sprintf("%s/%d", r.MyName, r.MyProg)
	}
	return out, nil
}

// waitLock waits until server v's /proc/locks shows a write lock on ino
// and returns when it was first seen.
func waitLock(t *testing.T, v *testVM, ino string, timeout time.Duration, what string) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, timeout, what, func() (bool, string) {
		l, err := locksOn(v)
		if err != nil {
			return false, err.Error()
		}
		if l[ino] > 0 {
			at = time.Now()
			return true, ""
		}
		return false, fmt.Sprintf("%s /proc/locks by inode: %v", v.name, l)
	})
	return at
}

// waitFollowing waits until n answers as a follower of a leader with
// sm_state ≥ minState.
func (p *pairTopo) waitFollowing(n *pairNode, minState int32, timeout time.Duration) {
	p.t.Helper()
	waitFor(p.t, timeout, n.id+" following", func() (bool, string) {
		s, err := p.status(n)
		if err != nil {
			return false, err.Error()
		}
		return s.Role == "follower" && s.LeaderID != "" && s.SMState >= minState, s.String()
	})
}

// clientBoot is what a Debian NFS client runs at boot (rpcbind, then
// rpc-statd-notify.service's sm-notify, then rpc-statd.service's
// `rpc.statd --no-notify`): sm-notify tells every server in
// /var/lib/nfs/sm that this host rebooted.
const clientBoot = "rpcbind -w && sm-notify && rpc.statd --no-notify"
