package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
)

// The fencing drills' mismatch runs, in TestFencingNeverTwoServers (they
// share its VM boots, sampler and clients): the two servers disagree about
// what fencing promises. Configuration drift is ordinary (one machine
// without a watchdog, a value rolled out one node at a time); it must not
// turn into two servers on one disk.
//
//	(g) the serving server arms its watchdog with fence_timeout 15 s, its
//	    successor was set up with 4 s: kill -9 of the serving nsmd
//	(h) the same settings, the serving nsmd stopped (SIGSTOP) for 25 s:
//	    its watchdog, no longer fed, resets the VM at 15 s
//	(i) the successor runs fence_watchdog: off (and no fence agent) beside
//	    the watchdog-fenced serving server (15 s): kill -9
//
// Each runs like the other drills (the sampler never sees two servers
// holding, the survivor serves, every lock comes back, a new lock is
// granted, the old VM was reset by its watchdog); before the fault the
// successor's status says the promises differ, and after it the
// successor's fence wait for the old server was by its watchdog and at
// least the old server's 15 s: it waited by the old server's promise, not
// by its own.
//
// The controls (cg, ch, ci) run the same faults with the successor running
// the build NSMD_E2E_FENCECONTROL_BIN names: nsmd built with the tag
// fencecontrol, whose new leader waits by its own settings alone (make e2e
// builds it into out/nsmd-fencecontrol; any older nsmd behaves the same).
// The sampler must then see both servers with the filesystem mounted at
// once: this test can see what it asserts never happens. They run after
// the clean stop and e2fsck, with the clients gone: the overlap they
// provoke can damage the shared filesystem. Without that binary they skip
// and say so.

const (
	mismatchServeTimeout = 15 // seconds: the serving server's fence_timeout
	mismatchSuccTimeout  = 4  // seconds: its successor's, in (g) and (h) (2 s starves on a busy TCG guest)
	mismatchStop         = 25 * time.Second
	// fenceControlVMBin is where a server VM has the control build (on
	// its local disk: controlDiskDir).
	fenceControlVMBin = "/var/lib/nsmd/test/nsmd-fencecontrol"
	// mismatchControlWait bounds a control from the fault to the old VM's
	// watchdog reset and the successor holding the disk.
	mismatchControlWait = 90 * time.Second
)

// fenceControlBin is the control build on the host (NSMD_E2E_FENCECONTROL_BIN).
var fenceControlBin = os.Getenv("NSMD_E2E_FENCECONTROL_BIN")

// fenceControlMissing says why the controls cannot run ("" when they can).
func fenceControlMissing() string {
	if fenceControlBin == "" {
		return "NSMD_E2E_FENCECONTROL_BIN is not set (make e2e builds out/nsmd-fencecontrol and sets it)"
	}
	if _, err := os.Stat(fenceControlBin); err != nil {
		return "NSMD_E2E_FENCECONTROL_BIN: " + err.Error()
	}
	return ""
}

func mismatchDrill(name string) bool { return name == "g" || name == "h" || name == "i" }

// mismatch is who runs what in a mismatch drill: the serving server's
// flags, and its successor's flags and program.
type mismatch struct {
	serve, succ []string
	succBin     string
}

func mismatchSettings(name, succBin string) mismatch {
	m := mismatch{serve: []string{"--fence-timeout", fmt.Sprintf("%ds", mismatchServeTimeout)}, succBin: succBin}
	if name == "i" {
		m.succ = []string{"--fence-watchdog", "off"}
	} else {
		m.succ = []string{"--fence-timeout", fmt.Sprintf("%ds", mismatchSuccTimeout)}
	}
	return m
}

// arrange gives one server m's serving settings and the other the
// successor's, and makes the first one serve, with as few restarts as it
// can: a node already running its settings is left alone, the service
// moves by a transfer to a node that already runs the serving settings
// before the other is restarted (as a follower), and a follower is
// restarted before a leader (whose stop hands leadership over). A server
// with a short fence_timeout on a busy TCG guest may be reset by its
// watchdog while it stops (its stop overran the promise: safe, and the
// sampler checks it); the VM is then booted again with its new settings.
func (r *fenceRig) arrange(m mismatch) (serving, succ *pairNode) {
	t := r.t
	t.Helper()
	p := r.pairTopo
	leader, _ := r.waitServing()
	serving, succ = p.other(leader), leader
	if leader.running == (nodeSettings{args: strings.Join(m.serve, " ")}) {
		serving, succ = leader, p.other(leader)
	}
	serving.args, serving.bin = m.serve, ""
	succ.args, succ.bin = m.succ, m.succBin
	var did []string
	for step := 0; ; step++ {
		if step == 6 {
			t.Fatalf("arranging the servers' settings: still not done after %s", strings.Join(did, ", "))
		}
		leader, _ = r.waitServing()
		follower := p.other(leader)
		switch {
		case serving.running == serving.settings() && leader != serving:
			// A server that just booted may not be caught up yet: raft
			// refuses the transfer ("leadership transfer timeout"), so it
			// is asked again until leadership leaves.
			r.waitFollower(serving)
			var tried time.Time
			testutil.WaitForSeen(t, 120*time.Second, "leadership to leave "+leader.id+" (a transfer to "+serving.id+")", func() (bool, string) {
				if time.Since(tried) > 5*time.Second {
					tried = time.Now()
					if resp, err := p.transferClient().Post("https://"+leader.admin+"/v1/leadership/transfer?to="+serving.id, "", nil); err == nil {
						resp.Body.Close()
					}
				}
				s, err := r.status(leader)
				time.Sleep(300 * time.Millisecond)
				return r.vms[leader].isDown() || (err == nil && s.Role != "leader"), fmt.Sprint(err, " ", s.Role)
			})
			r.waitServing()
			did = append(did, "moved the service to "+serving.id)
		case follower.running != follower.settings():
			r.restartTolerant(follower)
			did = append(did, "restarted "+follower.id)
		case leader.running != leader.settings():
			r.restartTolerant(leader)
			did = append(did, "restarted "+leader.id)
		default:
			r.waitFollower(succ)
			bin := "nsmd"
			if succ.bin != "" {
				bin = succ.bin
			}
			if len(did) == 0 {
				did = append(did, "no restart")
			}
			t.Logf("MISMATCH settings: %s serves with %s; its successor %s runs %s with %s (%s)", serving.id, strings.Join(m.serve, " "), succ.id, bin, strings.Join(m.succ, " "), strings.Join(did, ", "))
			return serving, succ
		}
	}
}

// restartTolerant restarts n's nsmd with its settings (SIGTERM: a leader
// hands over first); if its VM is reset meanwhile, it boots it again,
// which starts nsmd with the new settings too.
func (r *fenceRig) restartTolerant(n *pairNode) {
	r.t.Helper()
	r.stopTolerant(n)
	if r.vms[n].isDown() {
		r.ensureUp("restarting " + n.id)
	} else {
		r.startServer(n)
	}
	r.waitFollower(n)
}

// waitServing waits for a serving server (pairTopo.waitServing), booting
// again a server VM that is reset meanwhile (ensureUp, which logs its
// nsmd's last words): on a busy TCG guest a node that just took over can
// lose its proof and be reset by its watchdog — safe (the sampler checks
// it), listed as an unexpected reset, and not what a drill is about.
func (r *fenceRig) waitServing() (*pairNode, admin.Status) {
	r.t.Helper()
	p := r.pairTopo
	var leader *pairNode
	var st admin.Status
	testutil.WaitForSeen(r.t, 240*time.Second, "a serving leader with the VIP and nfsd up (booting a reset server again)", func() (bool, string) {
		r.ensureUp("waiting for a serving server")
		var seen string
		leader, st, seen = p.servingNow(1, p.servers)
		if leader == nil {
			time.Sleep(500 * time.Millisecond)
		}
		return leader != nil, seen
	})
	return leader, st
}

// restartAllTolerant restarts both servers' nsmd with their settings,
// the follower first: a VM reset meanwhile (a stop that overran the
// watchdog on a busy guest, or the fence agent powering off a node that
// lost its proof) is booted again with the new settings. It returns when
// one server serves and the other follows.
func (r *fenceRig) restartAllTolerant() {
	r.t.Helper()
	p := r.pairTopo
	leader, _ := r.waitServing()
	for _, n := range []*pairNode{p.other(leader), leader} {
		r.stopTolerant(n)
		if r.vms[n].isDown() {
			r.ensureUp("restarting " + n.id)
		} else {
			r.startServer(n)
		}
	}
	leader, _ = r.waitServing()
	r.waitFollower(p.other(leader))
}

// stopTolerant stops n's nsmd (SIGTERM) and waits until it exited or its
// VM was reset.
func (r *fenceRig) stopTolerant(n *pairNode) {
	r.t.Helper()
	f := r.vms[n]
	n.vm.try(5*time.Second, fmt.Sprintf("kill %d", n.pid))
	testutil.WaitForSeen(r.t, 100*time.Second, n.id+"'s nsmd to exit (or its VM to reset)", func() (bool, string) {
		if f.isDown() {
			return true, ""
		}
		rc, _, err := n.vm.try(3*time.Second, fmt.Sprintf("kill -0 %d", n.pid))
		time.Sleep(200 * time.Millisecond)
		return err == nil && rc != 0, fmt.Sprint(rc, err)
	})
}

// checkMismatchSeen: before a mismatch drill's fault, the successor's
// status says the serving nodes' promises differ (what an operator sees).
func (r *fenceRig) checkMismatchSeen(name string, succ *pairNode) {
	r.t.Helper()
	var last string
	testutil.WaitForSeen(r.t, 30*time.Second, name+": "+succ.id+"'s status to show the promises' mismatch", func() (bool, string) {
		s, err := r.status(succ)
		if err != nil {
			return false, err.Error()
		}
		if s.Fence.Promises == nil {
			return false, "no fence.promises"
		}
		last = s.Fence.Promises.Summary()
		time.Sleep(500 * time.Millisecond)
		return s.Fence.Promises.Mismatch, last
	})
	r.t.Logf("%s: %s's fence promises before the fault: %s", name, succ.id, last)
}

// checkMismatchWait: the survivor of a mismatch drill waited for the old
// server by its watchdog, at least the old server's fence_timeout (its
// own settings alone would have waited 4 s, or nothing).
func (r *fenceRig) checkMismatchWait(name string, old, survivor *pairNode) {
	t := r.t
	t.Helper()
	if old.running != (nodeSettings{args: fmt.Sprintf("--fence-timeout %ds", mismatchServeTimeout)}) {
		t.Errorf("%s: the fault hit %s, which did not run the serving server's settings (%+v)", name, old.id, old.running)
		return
	}
	s, err := r.status(survivor)
	if err != nil {
		t.Errorf("%s: %s status: %v", name, survivor.id, err)
		return
	}
	var w *admin.FencedNode
	if s.Fence.LastWait != nil {
		for i, n := range s.Fence.LastWait.Nodes {
			if n.Node == old.id {
				w = &s.Fence.LastWait.Nodes[i]
			}
		}
	}
	switch {
	case w == nil:
		t.Errorf("%s: %s served without waiting for %s: fence.last_wait %+v", name, survivor.id, old.id, s.Fence.LastWait)
	case w.By != "watchdog" || w.Seconds < mismatchServeTimeout:
		t.Errorf("%s: %s waited for %s by %s for %.1fs, want by its watchdog for at least its %ds", name, survivor.id, old.id, w.By, w.Seconds, mismatchServeTimeout)
	}
}

// mismatchControls runs the controls of the mismatch drills that `only`
// selects (all when empty), as a subtest that skips when there is no
// control build. The servers' nsmds are stopped before and after.
func (r *fenceRig) mismatchControls(only map[string]bool) {
	var names []string
	for _, d := range fenceDrills {
		if mismatchDrill(d.name) && (len(only) == 0 || only["c"+d.name]) {
			names = append(names, d.name)
		}
	}
	if len(names) == 0 {
		return
	}
	parent, pt := r.t, r.pairTopo.t
	defer func() { r.t, r.pairTopo.t = parent, pt }()
	ok := parent.Run("mismatch-controls", func(t *testing.T) {
		if why := fenceControlMissing(); why != "" {
			t.Skipf("SKIPPED the mismatch drills' controls (the successor trusting its own settings must show the overlap): %s", why)
		}
		r.t, r.pairTopo.t = t, t
		p := r.pairTopo
		// The controls run as the drills g–i did, without the fence
		// agent that drill e added: with it, the control successor
		// fences the old server by agent and no overlap can show.
		p.serverArgs = fenceArgs(false)
		for _, n := range p.servers {
			// It runs there (the image has the libraries a cgo build links).
			if rc, out, err := n.vm.try(20*time.Second, fenceControlVMBin+" version 2>&1"); err != nil || rc != 0 {
				t.Fatalf("the control build on %s: rc %d %v: %s", n.id, rc, err, out)
			}
		}
		// Both nsmds were stopped by the clean stop: start both, each with
		// its settings (only the one stopped last, whose raft log is the
		// newest, could lead with the witness alone); arrange moves the
		// service to the serving server.
		m := mismatchSettings(names[0], fenceControlVMBin)
		s, o := p.servers[0], p.servers[1]
		s.args, s.bin = m.serve, ""
		o.args, o.bin = m.succ, m.succBin
		p.startServer(s)
		p.startServer(o)
		for _, name := range names {
			r.mismatchControl(name)
		}
		leader, _ := r.waitServing()
		r.stopTolerant(p.other(leader))
		r.stopTolerant(leader)
		for _, f := range r.vms {
			if f.isDown() { // reset at its stop: boot it for what follows
				f.boot()
				f.n.vm.waitReady()
			}
		}
		for _, n := range p.servers {
			n.args, n.bin = nil, ""
		}
	})
	if !ok {
		r.t, r.pairTopo.t = parent, pt
		parent.FailNow() // the servers' state is unknown: no negative control on top of it
	}
}

// mismatchControl runs mismatch drill name's fault with the successor
// running the control build: the sampler must see both servers with the
// shared filesystem mounted at once.
func (r *fenceRig) mismatchControl(name string) {
	t := r.t
	t.Helper()
	p := r.pairTopo
	m := mismatchSettings(name, fenceControlVMBin)
	s, o := r.arrange(m)
	fs, fo := r.vms[s], r.vms[o]
	testutil.WaitForSeen(t, 60*time.Second, s.id+" seen holding by the sampler, "+o.id+" free", func() (bool, string) {
		time.Sleep(fenceSamplePeriod)
		return fs.latest().mounted && fo.latest().src == 's' && !fo.latest().holds(), fs.latest().code() + " " + fo.latest().code()
	})
	fault := ""
	for _, d := range fenceDrills {
		if d.name == name {
			fault = d.fault
		}
	}
	t0 := time.Now()
	if name == "h" {
		s.vm.sh(5*time.Second, fmt.Sprintf("kill -STOP %d", s.pid))
		go func() {
			time.Sleep(mismatchStop)
			if !fs.isDown() {
				s.vm.try(5*time.Second, fmt.Sprintf("kill -CONT %d", s.pid))
			}
		}()
	} else {
		s.vm.sh(5*time.Second, fmt.Sprintf("kill -9 %d", s.pid))
	}
	testutil.WaitForSeen(t, mismatchControlWait, name+" control: "+s.id+" reset by its watchdog, "+o.id+" holding the disk", func() (bool, string) {
		time.Sleep(fenceSamplePeriod)
		return fs.isDown() && fo.latest().mounted, fmt.Sprintf("%s %s, %s %s", s.id, fs.latest().code(), o.id, fo.latest().code())
	})
	seen := r.sampler.overlaps(heldMounted, t0, t0)
	wait := lastWait(p.fenceStatus(o))
	from := t0.Add(-2 * time.Second)
	ex := fs.exitsSince(t0)
	t.Logf("MISMATCH CONTROL c%s (%s; %s runs the control build at %s UTC): %s ended (%s) at %+.1fs; overlap of the mounts: %s; %s's fence wait: %s\n  %s: %s\n  %s: %s",
		name, fault, o.id, t0.UTC().Format("15:04:05.000"), s.id, ex[0].how, ex[0].at.Sub(t0).Seconds(), overlapText(seen), o.id, wait,
		s.id, fs.timeline(t0, from), o.id, fo.timeline(t0, from))
	if len(seen) == 0 {
		t.Errorf("control c%s: the successor trusting its own settings did not mount beside the old server: this run cannot show that the drill's check would catch it", name)
	}
	// The old server back (it follows the control build now serving).
	tb := time.Now()
	fs.reboot(p)
	t.Logf("%s booted again and nsmd started in %.1fs", s.id, time.Since(tb).Seconds())
	r.waitFollower(s)
}

// waitFollower waits until n follows, booting its VM again (ensureUp)
// if it is reset meanwhile: a server with a short fence_timeout on a busy
// TCG guest can starve its watchdog while it serves, which is safe (the
// sampler checks that) but not what a drill is about.
func (r *fenceRig) waitFollower(n *pairNode) {
	r.t.Helper()
	testutil.WaitForSeen(r.t, 240*time.Second, n.id+" following", func() (bool, string) {
		if r.vms[n].isDown() {
			r.ensureUp("waiting for " + n.id + " to follow")
		}
		s, err := r.status(n)
		if err != nil {
			time.Sleep(500 * time.Millisecond)
			return false, err.Error()
		}
		time.Sleep(500 * time.Millisecond)
		return s.Role == "follower" && s.LeaderID != "", statusLine(s)
	})
}

// controlDiskDir is a directory for mkfs.ext4 -d: the server's local
// disk (its /var/lib/nsmd) then holds the control build as
// test/nsmd-fencecontrol, on disk rather than in the image every VM keeps
// in memory. Empty when there is no control build.
func controlDiskDir(t *testing.T) string {
	t.Helper()
	if fenceControlMissing() != "" {
		return ""
	}
	dir := filepath.Join(t.TempDir(), "local")
	if err := os.MkdirAll(filepath.Join(dir, "test"), 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(fenceControlBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test", "nsmd-fencecontrol"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func overlapText(seen []string) string {
	if len(seen) == 0 {
		return "none"
	}
	return strings.Join(seen, "; ")
}
