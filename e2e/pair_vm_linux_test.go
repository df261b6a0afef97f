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

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
)

// The HA NFS server pair with a witness, on real Linux kernels: the
// topology and its helpers (the drills are in nfs4_vm_linux_test.go).
//
//	s1, s2   server VMs: kernel nfsd + lockd, the real rpcbind, rpc.mountd,
//	         exportfs, rpc.nfsd, and nsmd as their only statd and NFSv4
//	         client-tracking daemon; one shared raw ext4 disk (/dev/vda)
//	         that only the leader mounts, through the shipped
//	         deploy/hooks/nfsd-ha; a local disk for /var/lib/nsmd
//	w        the witness: nsmd --witness in a namespace on the same bridge,
//	         started with the servers' flags (VIP and hooks included)
//	clients  client VMs: the kernel NFS client, the real rpcbind and
//	         rpc.statd (/var/lib/nfs on a disk of their own, so a reboot
//	         keeps it), mounting VIP:/srv/nfs

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
	pid   int // nsmd's pid in the VM
	// bin is the nsmd program the VM runs ("": the image's nsmd) and args
	// more flags for this node alone (after the topology's serverArgs),
	// from its next start; running says what it was last started with.
	bin     string
	args    []string
	running nodeSettings
}

// nodeSettings is what a server's nsmd was started with, beyond the flags
// every server gets.
type nodeSettings struct {
	bin  string
	args string // the flags, joined
}

func (n *pairNode) settings() nodeSettings {
	return nodeSettings{bin: n.bin, args: strings.Join(n.args, " ")}
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

	// grace, when set, is the grace the servers' nfsd-ha.conf says
	// (rewritten at every server start: /etc is on the initramfs).
	grace     int
	confExtra []string
	// serverArgs are more nsmd flags for the servers (from their next start).
	serverArgs []string
	// kernel is the VMs' kernel series ("6.1", "6.12"): every reported
	// figure names it.
	kernel string
	// witnessArgs are more nsmd flags for the witness.
	witnessArgs []string
	// svcConf, when set, is the witness's config file with `services:`
	// (the servers read the same list from vmSvcConf): every member then
	// gets --config instead of the VIP flags, and the servers serveEnv
	// instead of the single-service hook environment.
	svcConf  string
	serveEnv string
}

// vmSvcConf is where a server VM's services config file is written.
const vmSvcConf = "/etc/nsmd/nsmd.yaml"

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
		"--vip-mode", "netlink",
		"--grace-period", fmt.Sprintf("%ds", pairGrace),
		"--on-leader", "/usr/lib/nsmd/hooks/nfsd-ha",
		"--on-follower", "/usr/lib/nsmd/hooks/nfsd-ha",
		"--on-fault", "/usr/lib/nsmd/hooks/nfsd-ha",
		"--log-level", "debug",
		// The servers' data disks are image files on a host whose two
		// cores run every guest: their writes' median passes the 50 ms
		// default whenever the host is busy, and the slow-disk hand-off
		// (not what these drills test) would move leadership every few
		// seconds.
		"--disk-slow-threshold", "1s",
	}
	if prof := os.Getenv("NSMD_E2E_RAFT_PROFILE"); prof != "" {
		// nsmd's own profile, e.g. "default" (300 ms): what the lock
		// figures in BENCHMARKS.md run with. On these TCG guests a busy
		// guest can miss a 300 ms heartbeat, so CI runs the 1 s timings.
		args = append(args, "--raft-profile", prof)
	} else {
		args = append(args, "--heartbeat-timeout", pairHeartbeat, "--election-timeout", pairElection, "--leader-lease-timeout", pairLease)
	}
	switch {
	case p.svcConf == "":
		args = append(args, "--vip", fmt.Sprintf("%s/%d", pairVIP, topoBits), "--vip-interface", "eth0", "--notify-name", pairVIP)
	case n.vm == nil:
		args = append(args, "--config", p.svcConf)
	default:
		args = append(args, "--config", vmSvcConf)
	}
	if n.vm == nil {
		// Never a watchdog on the host: the witness runs here, not in a
		// VM (and never serves).
		args = append(args, p.pki.nodeArgs(n.id)...)
		return append(args, "--witness", "--rpcbind", "off", "--fence-watchdog", "off")
	}
	args = append(args, "--tls-ca", vmTLSDir+"/ca.pem", "--tls-cert", vmTLSDir+"/node.pem", "--tls-key", vmTLSDir+"/node-key.pem",
		"--gossip-key-file", vmTLSDir+"/gossip.key", "--admin-token-file", vmTLSDir+"/admin.token")
	return append(args, "--rpcbind", "register")
}

// startServer starts rpcbind and nsmd in server VM n (nsmd forks off; its
// log is /var/lib/nsmd/nsmd.log on the VM's local disk). The servers run
// with the default fencing, as users do: nsmd arms /dev/watchdog (the
// guest's softdog, loaded here) while it serves, with the default
// fence_timeout, unless serverArgs or the node's args say otherwise.
func (p *pairTopo) startServer(n *pairNode) {
	p.t.Helper()
	q := make([]string, 0, 64)
	args := append(p.nsmdArgs(n, "/var/lib/nsmd"), p.serverArgs...)
	for _, a := range append(args, n.args...) {
		q = append(q, shellQuote(a))
	}
	p.installTLS(n)
	if p.grace > 0 {
		p.writeConf(n)
	}
	if p.svcConf != "" { // the witness's copy of the services file (/etc is on the initramfs)
		body, err := os.ReadFile(p.svcConf)
		if err != nil {
			p.t.Fatal(err)
		}
		n.vm.sh(10*time.Second, "mkdir -p /etc/nsmd && printf '%s' "+shellQuote(string(body))+" > "+vmSvcConf)
	}
	n.vm.sh(20*time.Second, loadSoftdog("")+"; test -c /dev/watchdog || { ls -l /dev/watchdog*; lsmod; dmesg | tail; false; }")
	n.vm.sh(10*time.Second, "pidof rpcbind >/dev/null || rpcbind -w")
	bin := "nsmd"
	if n.bin != "" {
		bin = n.bin
	}
	n.running = n.settings()
	env := fmt.Sprintf("NFS_HA_DEVICE=/dev/vda NFS_HA_MOUNT=%s NFS_HA_GRACE=%d NFS_HA_CLIENTS=%s.0/24 NFS_HA_EXPORT_OPTIONS=%s", pairExport, pairGrace, topoNet, vmExportOptions)
	if os.Getenv("NSMD_E2E_NO_DELEGATIONS") == "1" {
		// The hook turns leases off, so nfsd hands out no NFSv4
		// delegations (6.12 hands NFSv4.1+ writers write delegations):
		// tells their part in a result apart.
		env += " NFS_HA_DELEGATIONS=no"
	}
	if p.svcConf != "" {
		env = p.serveEnv
	}
	_, n.pid = n.vm.start(5*time.Second, fmt.Sprintf("echo started; exec env %s %s %s >>/var/lib/nsmd/nsmd.log 2>&1", env, bin, strings.Join(q, " ")))
}

// stopServer stops nsmd in server VM n (SIGTERM: a leader hands
// leadership over first) and waits for it to exit.
func (p *pairTopo) stopServer(n *pairNode) {
	p.t.Helper()
	n.vm.sh(100*time.Second, fmt.Sprintf("kill %d; while kill -0 %d 2>/dev/null; do sleep 0.1; done", n.pid, n.pid))
}

// vmTLSDir holds a server VM's certificates, gossip key and admin token
// (on the initramfs: written again at every boot).
const vmTLSDir = "/etc/nsmd/tls"

// vmExportOptions are the VM tests' export options: the hook's default
// with no_root_squash, because the client VMs lock files as root.
const vmExportOptions = "rw,sync,no_subtree_check,no_root_squash,fsid=1"

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
	args = append(args, p.witnessArgs...)
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

// transferClient is p.http with room for a leadership transfer, which
// answers once the target leads (seconds on busy TCG guests).
func (p *pairTopo) transferClient() *http.Client {
	c := *p.http
	c.Timeout = 30 * time.Second
	return &c
}

// status is GET /v1/status of n ("" error when it does not answer).
func (p *pairTopo) status(n *pairNode) (admin.Status, error) {
	var s admin.Status
	return s, p.getStatus(n, &s)
}

// getStatus decodes GET /v1/status of n into out.
func (p *pairTopo) getStatus(n *pairNode, out any) error {
	resp, err := p.http.Get("https://" + n.admin + "/v1/status")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", n.id, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// waitServing waits until one of the live servers leads, holds the VIP and
// has the export up (its on_leader hook ran: nfsd threads), and returns it.
func (p *pairTopo) waitServing(timeout time.Duration, minState int32, live ...*pairNode) (*pairNode, admin.Status) {
	p.t.Helper()
	var leader *pairNode
	var st admin.Status
	testutil.WaitForSeen(p.t, timeout, "a serving leader with the VIP and nfsd up", func() (bool, string) {
		var seen string
		leader, st, seen = p.servingNow(minState, live)
		return leader != nil, seen
	})
	return leader, st
}

// servingNow is the node of live that leads with the VIP, nfsd threads
// and at least minState now (nil if none), and what each node said.
func (p *pairTopo) servingNow(minState int32, live []*pairNode) (*pairNode, admin.Status, string) {
	var seen []string
	for _, n := range live {
		s, err := p.status(n)
		if err != nil {
			seen = append(seen, n.id+": "+err.Error())
			continue
		}
		seen = append(seen, statusLine(s))
		if s.Role == "leader" && s.VIPHeld && s.SMState >= minState {
			rc, out, _ := n.vm.try(5*time.Second, "cat /proc/fs/nfsd/threads")
			if rc == 0 && strings.TrimSpace(out) != "0" {
				return n, s, ""
			}
			seen = append(seen, n.id+": nfsd threads "+strings.TrimSpace(out))
		}
	}
	return nil, admin.Status{}, strings.Join(seen, "; ")
}

// locksOn lists the write locks on the server VM's /proc/locks on files
// of the export, by inode: POSIX locks, and write delegations (DELEG: from
// 6.6 nfsd hands an NFSv4.1+ client that opened a file for writing a write
// delegation, and the client keeps its locks on that file to itself until
// the delegation is recalled — 6.12 does so for the NFSv4.2 client).
func locksOn(v *testVM) (map[string]int, error) {
	kinds, err := lockKindsOn(v)
	locks := map[string]int{}
	for ino, ks := range kinds {
		locks[ino] = len(ks)
	}
	return locks, err
}

// lockKindsOn is locksOn with each lock's kind (POSIX or DELEG), by inode.
func lockKindsOn(v *testVM) (map[string][]string, error) {
	rc, out, err := v.try(5*time.Second, "cat /proc/locks")
	if err != nil || rc != 0 {
		return nil, fmt.Errorf("%s /proc/locks: rc %d: %v", v.name, rc, err)
	}
	locks := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		// 1: POSIX  ADVISORY  WRITE 245 fe:00:12 0 EOF
		// 2: DELEG  ACTIVE    WRITE 245 fe:00:13 0 EOF
		if len(f) >= 6 && (f[1] == "POSIX" || f[1] == "DELEG") && f[3] == "WRITE" {
			dev := strings.Split(f[5], ":")
			ino := dev[len(dev)-1]
			locks[ino] = append(locks[ino], f[1])
		}
	}
	return locks, nil
}

// inode is the inode number of path on v.
func inode(t *testing.T, v *testVM, path string) string {
	t.Helper()
	return strings.TrimSpace(v.sh(5*time.Second, "stat -c %i "+path))
}

// registrations is GET /v1/registrations of n (mon_name → my_name).
func (p *pairTopo) registrations(n *pairNode) (map[string]string, error) {
	var page admin.RegistrationPage
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

// waitFollowing waits until n answers as a follower of a leader with
// sm_state ≥ minState.
func (p *pairTopo) waitFollowing(n *pairNode, minState int32, timeout time.Duration) {
	p.t.Helper()
	testutil.WaitForSeen(p.t, timeout, n.id+" following", func() (bool, string) {
		s, err := p.status(n)
		if err != nil {
			return false, err.Error()
		}
		return s.Role == "follower" && s.LeaderID != "" && s.SMState >= minState, statusLine(s)
	})
}

// clientBoot is what a Debian NFS client runs at boot (rpcbind, then
// rpc-statd-notify.service's sm-notify, then rpc-statd.service's
// `rpc.statd --no-notify`): sm-notify tells every server in
// /var/lib/nfs/sm that this host rebooted.
const clientBoot = "rpcbind -w && sm-notify && rpc.statd --no-notify"
