package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
)

// The drills of TestServicesInNamespacesOnRealKernels
// (services_vm_linux_test.go).

// namespaces is the positive part: every service in its own namespace.
func (r *svcRig) namespaces(afterControl bool) {
	p := r.p
	t := p.t
	// The servers come from the control by a power cycle, started with
	// the namespaces' settings (powerCycle), or fresh (startNamespaced);
	// after the control a comes back to s1 (the control moved it to s2).
	if afterControl {
		r.move("a", "s1")
	}
	s1, s2 := p.servers[0], p.servers[1]
	st := r.waitPlaced(map[string]string{"a": "s1", "b": "s2"}, nsServing, 240*time.Second)
	for _, x := range []struct {
		n  *pairNode
		id string
	}{{s1, "a"}, {s2, "b"}} {
		out := x.n.vm.sh(10*time.Second, "ip netns list; echo host-nfsd-threads $(cat /proc/fs/nfsd/threads 2>/dev/null || echo none)")
		if !strings.Contains(out, "nsmd-"+x.id) || !strings.Contains(out, "host-nfsd-threads none") && !strings.Contains(out, "host-nfsd-threads 0") {
			t.Fatalf("%s serving %s: want its namespace nsmd-%s and the host's nfsd idle: %s", x.n.id, x.id, x.id, out)
		}
		r.waitNsGraceOver(x.n, x.id, 90*time.Second)
	}
	for _, c := range r.clients {
		c.vm.sh(20*time.Second, "pidof rpc.statd >/dev/null || { "+clientBoot+"; }")
	}
	r.mountAll("a", "b")
	r.hold(vmServices[0], s1)
	r.hold(vmServices[1], s2)
	r.checkHeld("a", s1, "at start")
	r.checkHeld("b", s2, "at start")
	// lockd's SM_MON for the NFSv3 client, sent from inside a's namespace
	// to 127.0.0.1 there, reached a's NSM (nsmd's, in that namespace).
	r.waitMonitored(s1, "a", r.clients[0].vm.ip.String())
	t.Logf("kernel %s at start: %s", p.kernel, graceLines(s1, s2))

	r.killDrill(st)
	// On 6.12 too: its lockd unmonitors every host as a's nfsd stops on
	// b's server, and waits for each answer (DESIGN.md, "A service's NSM
	// state is its own").
	r.moveDrill(st)
}

// waitNsGraceOver waits until service id's lockd and nfsd on n are out of grace.
func (r *svcRig) waitNsGraceOver(n *pairNode, id string, timeout time.Duration) {
	testutil.WaitForSeen(r.p.t, timeout, fmt.Sprintf("%s out of grace on %s", id, n.id), func() (bool, string) {
		g := nsGrace(n.vm, id)
		time.Sleep(drillPoll)
		return g == "YY", g
	})
}

// waitMonitored waits until service id's registrations (as n has them)
// hold host, monitored by a lockd (program 100021).
func (r *svcRig) waitMonitored(n *pairNode, id, host string) {
	testutil.WaitForSeen(r.p.t, 30*time.Second, fmt.Sprintf("%s monitored by service %s's lockd", host, id), func() (bool, string) {
		resp, err := r.p.http.Get("https://" + n.admin + "/v1/registrations?service=" + id)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var page admin.RegistrationPage
		if resp.StatusCode != http.StatusOK {
			return false, resp.Status
		}
		if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, g := range page.Registrations {
			seen = append(seen, fmt.Sprintf("%s by %s/%d", g.MonName, g.MyName, g.MyProg))
			if g.MonName == host && g.MyProg == 100021 {
				return true, ""
			}
		}
		return false, strings.Join(seen, ", ")
	})
}

// graceLines is nfsd's grace and tracking lines of each server's kernel
// log (each namespace's nfsd names its net).
func graceLines(ns ...*pairNode) string {
	var b strings.Builder
	for _, n := range ns {
		_, out, _ := n.vm.try(5*time.Second, "dmesg | grep -E 'grace period|tracking|reclaim' | tail -n 6")
		fmt.Fprintf(&b, "\n  %s: %s", n.id, strings.ReplaceAll(strings.TrimSpace(out), "\n", "\n  "+n.id+": "))
	}
	return b.String()
}

// bUntouched fails unless b is still where it was at epoch e0.
func (r *svcRig) bUntouched(before admin.ServiceStatus, when string) {
	st, err := r.p.services(r.p.witness)
	if err != nil {
		r.p.t.Fatal(err)
	}
	if b := st["b"]; b.Owner != before.Owner || b.Epoch != before.Epoch {
		r.p.t.Errorf("%s: service b moved: %s@%d → %s@%d", when, before.Owner, before.Epoch, b.Owner, b.Epoch)
	}
}

// killDrill: a power cut of a's server (s1); a moves to s2, where b is.
func (r *svcRig) killDrill(before map[string]admin.ServiceStatus) {
	p := r.p
	t := p.t
	s1, s2 := p.servers[0], p.servers[1]
	t0 := time.Now()
	since := func() float64 { return time.Since(t0).Seconds() }
	r.fvms[0].powerOff("harness")

	// b's clients right after the cut: a is not on s2 yet.
	got, _ := r.probed("b", r.probe("b"), 60*time.Second, nil)
	r.row("namespaces: right after the power cut of a's server", got, "no (not started yet)")

	// As soon as a's nfsd is in grace on s2 (b's server): new locks on b,
	// and a's clients' first new lock.
	var aGrace string
	testutil.WaitForSeen(t, 150*time.Second, "a in grace on s2", func() (bool, string) {
		aGrace = nsGrace(s2.vm, "a")
		return strings.Contains(aGrace, "N"), aGrace
	})
	inGraceAt := since()
	bProbe, aProbe := r.probe("b"), r.probe("a")
	bSeen := ""
	during := func() bool {
		if g := nsGrace(s2.vm, "b"); g != "YY" && g != "" {
			bSeen += " " + g
		}
		return strings.Contains(nsGrace(s2.vm, "a"), "N")
	}
	got, throughout := r.probed("b", bProbe, 90*time.Second, during)
	inGrace := "yes, throughout"
	if !throughout {
		inGrace = "not throughout (a's grace ended before both grants)"
	}
	r.row("namespaces: a's takeover onto b's server (power cut), a in grace", got, inGrace)
	for v, s := range got {
		if s > svcNoWait {
			t.Errorf("kernel %s: b's NFS %s client waited %.1fs for a new lock during a's takeover (want < %.0fs: b is not in grace)", p.kernel, v, s, svcNoWait)
		}
	}
	if bSeen != "" {
		t.Errorf("kernel %s: b's grace on s2 during a's takeover:%s (want YY: b's nfsd and lockd untouched)", p.kernel, bSeen)
	}

	// a's clients: their locks back on s2, a new lock, a's grace over.
	back := map[string]float64{}
	testutil.WaitForSeen(t, 180*time.Second, "a's locks back on s2", func() (bool, string) {
		held := heldOn(s2.vm)
		for _, c := range r.clients {
			if _, ok := back[c.vers]; !ok && held[c.keys["a"]] > 0 {
				back[c.vers] = since()
			}
		}
		time.Sleep(drillPoll)
		return len(back) == len(r.clients), fmt.Sprintf("back %v; a's grace %s", back, nsGrace(s2.vm, "a"))
	})
	aNew, _ := r.probed("a", aProbe, 150*time.Second, nil)
	r.waitNsGraceOver(s2, "a", 120*time.Second)
	t.Logf("DRILL kernel %s: power cut of s1: a in grace on s2 at %.1fs; a's locks back (s after the cut) %v; a's new lock (s after a in grace) NFSv3 %.1f NFSv4.2 %.1f; a's grace over by %.1fs%s",
		p.kernel, inGraceAt, back, aNew["3"], aNew["4.2"], since(), graceLines(s2))
	r.checkHeld("a", s2, "after the power cut")
	r.checkHeld("b", s2, "after the power cut")
	r.bUntouched(before["b"], "power cut of a's server")

	// s1 boots again and follows.
	r.fvms[0].reboot(p)
	s1.vm.sh(10*time.Second, "sysctl -w fs.leases-enable=0 >/dev/null")
	p.waitFollowing(s1, 0, 120*time.Second)
}

// moveDrill: `nsmd move a --to s1`, a planned move back; b untouched.
func (r *svcRig) moveDrill(before map[string]admin.ServiceStatus) {
	p := r.p
	t := p.t
	s1, s2 := p.servers[0], p.servers[1]
	t0 := time.Now()
	r.move("a", "s1")
	bProbe := r.probe("b")
	// a's stop on s2, watched from outside: a's namespace and disk gone
	// there, b's still there; what s2's nsmd logged of it is kept, so a
	// server that ends meanwhile (a failed stop resets it) leaves its
	// account behind.
	var s2log string
	testutil.WaitForSeen(t, 90*time.Second, "a stopped on s2", func() (bool, string) {
		if r.fvms[1].isDown() {
			t.Fatalf("kernel %s: s2 ended while a left it (b's server!): %v; its nsmd's last words of a:\n%s", p.kernel, r.fvms[1].exitsSince(t0), s2log)
		}
		rc, out, err := s2.vm.try(10*time.Second, "grep -E 'service=a|level=ERROR|watchdog|fence' /var/lib/nsmd/nsmd.log | grep -v component=gossip | tail -n 40; echo ==; ip netns list; grep -E '^/dev/vd[ab] ' /proc/mounts")
		if err == nil && rc == 0 {
			s2log = out
		}
		_, state, _ := strings.Cut(s2log, "\n==\n")
		time.Sleep(drillPoll)
		return err == nil && !strings.Contains(state, "nsmd-a") && !strings.Contains(state, "/dev/vda"), state
	})
	bSeen := ""
	got, _ := r.probed("b", bProbe, 60*time.Second, func() bool {
		if g := nsGrace(s2.vm, "b"); g != "YY" && g != "" {
			bSeen += " " + g
		}
		return true
	})
	r.row("namespaces: nsmd move a --to s1 (a leaves b's server)", got, "-")
	if bSeen != "" {
		t.Errorf("kernel %s: b's grace on s2 during a's move:%s", p.kernel, bSeen)
	}
	for v, s := range got {
		if s > svcNoWait {
			t.Errorf("kernel %s: b's NFS %s client waited %.1fs for a new lock during a's move", p.kernel, v, s)
		}
	}
	r.waitPlaced(map[string]string{"a": "s1", "b": "s2"}, nsServing, 120*time.Second)
	back := map[string]float64{}
	testutil.WaitForSeen(t, 180*time.Second, "a's locks back on s1", func() (bool, string) {
		held := heldOn(s1.vm)
		for _, c := range r.clients {
			if _, ok := back[c.vers]; !ok && held[c.keys["a"]] > 0 {
				back[c.vers] = time.Since(t0).Seconds()
			}
		}
		time.Sleep(drillPoll)
		return len(back) == len(r.clients), fmt.Sprintf("back %v", back)
	})
	aNew, _ := r.probed("a", r.probe("a"), 150*time.Second, nil)
	out := s2.vm.sh(10*time.Second, "ip netns list; grep -E '^/dev/vda ' /proc/mounts; true")
	if strings.Contains(out, "nsmd-a") || strings.Contains(out, "/dev/vda") {
		t.Errorf("s2 after a moved away: a's namespace or disk still there: %s", out)
	}
	t.Logf("DRILL kernel %s: nsmd move a --to s1: a's locks back (s after the move) %v, a's new lock NFSv3 %.1f NFSv4.2 %.1f (s from its attempt)", p.kernel, back, aNew["3"], aNew["4.2"])
	r.checkHeld("a", s1, "after the move")
	r.checkHeld("b", s2, "after the move")
	r.bUntouched(before["b"], "move of a")
}

// control: both services in the host's one nfsd (service_namespaces:
// off, the test's hook one-nfsd). a moved onto b's server restarts that
// nfsd: b's clients' new locks wait out the grace.
func (r *svcRig) control() {
	p := r.p
	t := p.t
	ns := ""
	if nsmdHasServiceNamespaces() {
		ns = "off"
	}
	r.writeConf(ns)
	p.serverArgs = append(slices.Clone(svcServe), "--on-leader", "/usr/local/bin/one-nfsd", "--on-follower", "/usr/local/bin/one-nfsd", "--on-fault", "/usr/local/bin/one-nfsd",
		"--nfsv4-tracking", "off", "--grace-end", "timer")
	for _, n := range p.servers {
		p.startServer(n)
	}
	s2 := p.servers[1]
	r.waitPlaced(map[string]string{"a": "s1", "b": "s2"}, hostServing, 240*time.Second)
	for _, c := range r.clients {
		c.vm.sh(20*time.Second, "pidof rpc.statd >/dev/null || { "+clientBoot+"; }")
	}
	r.mountAll("b")
	waitGraceOver(t, s2.vm, 120*time.Second)

	r.move("a", "s2")
	testutil.WaitForSeen(t, 120*time.Second, "s2's nfsd restarted for a (in grace)", func() (bool, string) {
		g := hostGrace(s2.vm)
		return strings.Contains(g, "N"), g
	})
	got, _ := r.probed("b", r.probe("b"), 150*time.Second, nil)
	r.row("control, one nfsd: nsmd move a --to s2 (a arrives on b's server)", got, "one grace for both")
	for v, s := range got {
		if s < svcWaited {
			t.Errorf("kernel %s control: b's NFS %s client got a new lock %.1fs after a arrived (want ≥ %.0fs: the shared nfsd in grace)", p.kernel, v, s, svcWaited)
		}
	}
	_, log, _ := s2.vm.try(5*time.Second, "cat /run/one-nfsd.log")
	t.Logf("control hook on s2:\n%s", log)
	r.release()
}

// startNamespaced starts both servers, booted and never started yet,
// with the namespaces' settings (service_namespaces: the default).
func (r *svcRig) startNamespaced() {
	p := r.p
	r.writeConf("")
	p.serverArgs = svcServe
	for _, f := range r.fvms {
		f.up(p)
	}
}

// powerCycle ends both server VMs (a power cut) and boots them again with
// service_namespaces the default and the shipped hook: the switch from the
// control to the namespaces part, on machines with nothing of the
// control's host nfsd left.
func (r *svcRig) powerCycle() {
	p := r.p
	r.writeConf("") // service_namespaces: the default (auto)
	p.serverArgs = svcServe
	for _, f := range r.fvms {
		f.powerOff("harness")
	}
	for _, f := range r.fvms {
		f.boot()
	}
	for _, f := range r.fvms {
		f.up(p)
		f.n.vm.sh(10*time.Second, "sysctl -w fs.leases-enable=0 >/dev/null")
	}
}
