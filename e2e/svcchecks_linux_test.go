package e2e

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// The checks of the services schedules (svcsched_linux_test.go) and their
// negative controls.

// checkServiceHistories checks each service's history: unanswered calls
// ended, at the latest, when every service was served again (settled);
// no answered state is even or falls, each lies between the service's
// states before and after, and the history is linearizable. It returns
// the anomalies and a line per service.
func checkServiceHistories(t *testing.T, seed uint64, hs map[string]*history, settled int64, before, final map[string]admin.ServiceStatus, monLabels []string, sum *scheduleSummary) (anomalies, res []string) {
	t.Helper()
	for _, s := range drillServices {
		h := hs[s.id]
		for i := range h.ops {
			if h.ops[i].Return == unanswered {
				h.ops[i].Return = settled - 1
			}
		}
		countOps(sum, h.ops)
		var bad []string
		bad = append(bad, stateRegressions(h.ops)...)
		bad = append(bad, statesOutside(h.ops, fsm.ServiceSMState(before[s.id].Epoch), fsm.ServiceSMState(final[s.id].Epoch))...)
		model := nsmModel(monLabels, myNames)
		r, info := porcupine.CheckOperationsVerbose(model, h.ops, 60*time.Second)
		switch r {
		case porcupine.Ok:
		case porcupine.Illegal:
			bad = append(bad, "history not linearizable")
		default:
			bad = append(bad, "linearizability check did not finish within 60 s")
		}
		answered := 0
		for _, op := range h.ops {
			if op.Output.(nsmOutput).Known {
				answered++
			}
		}
		res = append(res, fmt.Sprintf("%s: %d ops (%d answered), %s@%d → %s@%d", s.id, len(h.ops), answered,
			before[s.id].Owner, before[s.id].Epoch, final[s.id].Owner, final[s.id].Epoch))
		if len(bad) == 0 {
			continue
		}
		path := saveHistory(t, model, info, fmt.Sprintf("seed-%d-service-%s.html", seed, s.id))
		for _, a := range bad {
			anomalies = append(anomalies, fmt.Sprintf("service %s: %s", s.id, a))
		}
		t.Errorf("seed %d: service %s's history (%d operations) saved as %s", seed, s.id, len(h.ops), path)
	}
	for _, a := range anomalies {
		t.Errorf("seed %d: %s", seed, a)
	}
	return anomalies, res
}

// negativeControls shows that the services checks can fail: a move no
// fault explains is reported by checkMoves (and the same move passes when
// its server was hit), and a second holder of a service's address by the
// overlap check.
func (sc *svcCluster) negativeControls(t *testing.T) {
	leader, _ := sc.restore(t)
	before := sc.rebalance(t, leader)
	b := drillServices[1]
	sc.move(t, leader, b.id, drillServices[0].prefer)
	want := maps.Clone(sc.home)
	want[b.id] = drillServices[0].prefer
	after := sc.waitServed(t, want, 120*time.Second)
	var unexplained, explained recorder
	sc.checkMoves(&unexplained, before, after, map[string][]string{}, map[string]bool{})
	sc.checkMoves(&explained, before, after, map[string][]string{b.prefer: {"kill-follower"}}, map[string]bool{})
	if !slices.ContainsFunc(unexplained.errs, func(e string) bool { return strings.Contains(e, "service "+b.id+" moved") }) {
		t.Errorf("checkMoves did not report service %s's move (%s@%d → %s@%d) that no fault explains: %v",
			b.id, before[b.id].Owner, before[b.id].Epoch, after[b.id].Owner, after[b.id].Epoch, unexplained.errs)
	}
	if len(explained.errs) > 0 {
		t.Errorf("checkMoves reported a move whose server was hit: %v", explained.errs)
	}

	// A second holder of a's address, for 300 ms.
	a := drillServices[0]
	marks := map[string]vipMark{}
	for id, w := range sc.watch {
		marks[id] = w.Mark()
	}
	other := sc.node(drillServices[2].prefer)
	addr := fmt.Sprintf("%s/%d", a.addr, topoBits)
	if out, err := exec.Command("ip", "-n", other.host.ns, "addr", "add", addr, "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("add %s on %s: %v %s", addr, other.id, err, out)
	}
	testutil.WaitForSeen(t, 5*time.Second, "two holders of "+a.addr, func() (bool, string) {
		h := sc.watch[a.id].Holders()
		return len(h) == 2, fmt.Sprint(h)
	})
	time.Sleep(3 * overlapSlack) // the overlap lasts this long
	if out, err := exec.Command("ip", "-n", other.host.ns, "addr", "del", addr, "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("delete %s on %s: %v %s", addr, other.id, err, out)
	}
	var overlap recorder
	sc.checkAddressOverlaps(&overlap, marks)
	if len(overlap.errs) != 1 || !strings.Contains(overlap.errs[0], "service "+a.id) {
		t.Errorf("the overlap check did not report %s holding service %s's address beside its owner: %v", other.id, a.id, overlap.errs)
	}
	t.Logf("negative controls: %q; %q", unexplained.errs, overlap.errs)
}

// saveLogs copies the nodes' logs of a failed schedule, the hooks' and
// the fence agent's beside its histories (the test's logs show only the
// tails).
func (sc *svcCluster) saveLogs(t *testing.T, seed uint64, marks map[string]int64) {
	dir := historyDir()
	for id, lines := range sc.logLinesSince(marks, "") {
		p := filepath.Join(dir, fmt.Sprintf("seed-%d-%s.log", seed, id))
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Logf("save %s's log: %v", id, err)
		}
	}
	for _, f := range []string{"hooks.log", "fence.log"} {
		if b, err := os.ReadFile(filepath.Join(sc.dir, f)); err == nil {
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d-%s", seed, f)), b, 0o644)
		}
	}
	t.Logf("logs of seed %d saved in %s", seed, dir)
}

// historyDir is where failed schedules leave their histories and logs.
func historyDir() string {
	dir := os.Getenv("NSMD_E2E_OUT")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "nsmd-e2e-histories")
	}
	os.MkdirAll(dir, 0o755)
	return dir
}

// checkMoves: a service moved (a new epoch) only if its server was hit,
// and then every client host got SM_NOTIFY from its address with its
// final state; one that did not move sent no newer state.
//
// A service restarted on its own unhit server because its lease lapsed
// there (its server's log says so: lapsed, service id → true) is an error
// like any other move, said so, and counted in the summary.
func (sc *svcCluster) checkMoves(t reporter, before, final map[string]admin.ServiceStatus, hit map[string][]string, lapsed map[string]bool) (lapseRestarts int) {
	t.Helper()
	for _, s := range drillServices {
		b, f := before[s.id], final[s.id]
		switch {
		case f.Epoch < b.Epoch:
			t.Errorf("service %s's epoch fell: %s@%d → %s@%d", s.id, b.Owner, b.Epoch, f.Owner, f.Epoch)
			continue
		case f.Epoch == b.Epoch:
			addr := netip.MustParseAddr(s.addr)
			for _, cl := range sc.clients {
				for _, n := range cl.Notices() {
					if n.from.Addr() == addr && n.state > fsm.ServiceSMState(b.Epoch) {
						t.Errorf("%s got SM_NOTIFY{%s, %d} from service %s, which did not move (%s@%d)", cl.host.name, n.monName, n.state, s.id, f.Owner, f.Epoch)
					}
				}
			}
			continue
		case len(hit[b.Owner]) == 0 && len(hit) >= 2 && f.Owner == b.Owner:
			// Two of the three servers hit: the cluster may have had no
			// quorum for longer than a lease, and then every server stops
			// what it serves (DESIGN.md, "Serving a service on any
			// server") and starts it again at a new epoch, where it was.
			t.Logf("service %s restarted on its server %s (epoch %d → %d), which no fault hit: two servers were hit (%v)", s.id, f.Owner, b.Epoch, f.Epoch, hit)
		case len(hit[b.Owner]) == 0:
			why := ""
			if lapsed[s.id] {
				lapseRestarts++
				why = " (its server's lease lapsed: an election outlasted the grace of a run without a watchdog)"
			}
			t.Errorf("service %s moved (%s@%d → %s@%d) though no fault hit its server %s (faults hit %v)%s: a fault of one node moves only its services",
				s.id, b.Owner, b.Epoch, f.Owner, f.Epoch, b.Owner, hit, why)
		}
		for _, cl := range sc.clients {
			if why := waitServiceNotified(cl, s.addr, fsm.ServiceSMState(f.Epoch), 30*time.Second); why != "" {
				t.Errorf("service %s moved (%s@%d → %s@%d): %s", s.id, b.Owner, b.Epoch, f.Owner, f.Epoch, why)
			}
		}
	}
	return lapseRestarts
}

// leaseLapses says which services' servers (before) logged, since marks,
// that they stopped the service at its epoch because its lease lapsed.
func (sc *svcCluster) leaseLapses(marks map[string]int64, before map[string]admin.ServiceStatus) map[string]bool {
	out := map[string]bool{}
	lines := sc.logLinesSince(marks, `why="lease lapsed"`)
	for _, s := range drillServices {
		b := before[s.id]
		want := fmt.Sprintf(" service=%s epoch=%d ", s.id, b.Epoch)
		out[s.id] = slices.ContainsFunc(lines[b.Owner], func(l string) bool {
			return strings.Contains(l, `msg="stopping a service"`) && strings.Contains(l, want)
		})
	}
	return out
}

// reporter is what the checks report to: a test, or a negative control's
// recorder.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
}

// recorder collects what a check reports (negative controls).
type recorder struct {
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// waitServiceNotified waits until client host cl got SM_NOTIFY with state
// from addr; it returns why not ("" when it did).
func waitServiceNotified(cl *clientHost, addr string, state int32, timeout time.Duration) string {
	want := netip.MustParseAddr(addr)
	deadline := time.Now().Add(timeout)
	for {
		var got []string
		for _, n := range cl.Notices() {
			if n.from.Addr() == want && n.state == state {
				return ""
			}
			got = append(got, fmt.Sprintf("%s{%s,%d}", n.from, n.monName, n.state))
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("%s got no SM_NOTIFY with state %d from %s within %v (got %v)", cl.host.name, state, addr, timeout, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkAddressOverlaps fails for every time since marks that two servers
// held one service's address at once for longer than the slack.
func (sc *svcCluster) checkAddressOverlaps(t reporter, marks map[string]vipMark) {
	t.Helper()
	for _, s := range drillServices {
		for _, o := range sc.watch[s.id].OverlapsSince(marks[s.id]) {
			if o.dur > overlapSlack {
				t.Errorf("service %s: %v held its address %s at once for %v (from %s)", s.id, o.nodes, s.addr, o.dur.Round(time.Millisecond), o.from.Format("15:04:05.000"))
			}
		}
	}
}

// checkSameApplied waits until every node has applied the same index and
// holds as many (node) registrations.
func (c *e2eCluster) checkSameApplied(t *testing.T) {
	t.Helper()
	testutil.WaitForSeen(t, 10*time.Second, "every node to apply the same index", func() (bool, string) {
		var idx []uint64
		var regs []int
		var seen []string
		for _, n := range c.nodes {
			s, err := n.status()
			if err != nil {
				return false, err.Error()
			}
			idx, regs = append(idx, s.AppliedIndex), append(regs, s.Registrations)
			seen = append(seen, statusLine(s))
		}
		return slices.Min(idx) == slices.Max(idx) && slices.Min(regs) == slices.Max(regs), strings.Join(seen, "; ")
	})
}

// clearTables: every client host sends SM_UNMON_ALL for every my_name to
// every service, so that each history starts from the model's empty
// table as far as the workers' own registrations go (nothing reads a
// service's table to confirm it: see the comment at the top).
func (sc *svcCluster) clearTables(monLabels []string) {
	for _, s := range drillServices {
		for _, cl := range sc.clients {
			w := &worker{ns: cl.host.ns, addr: net.JoinHostPort(s.addr, strconv.Itoa(nsmPort)), via: cl.host.name + " at " + s.id}
			for my := range myNames {
				w.do(nsmInput{Kind: opUnmonAll, My: my, Via: w.via}, monLabels)
			}
		}
	}
}

// statesOutside finds answered states outside [lo, hi]: a service's
// state is 2·epoch+1 of an epoch it had during the schedule.
func statesOutside(h []porcupine.Operation, lo, hi int32) []string {
	var bad []string
	for _, op := range h {
		in, out := op.Input.(nsmInput), op.Output.(nsmOutput)
		if out.Known && in.Kind != opRead && (out.State < lo || out.State > hi) {
			bad = append(bad, fmt.Sprintf("%s via %s answered state %d, outside the service's %d…%d", in.Kind, in.Via, out.State, lo, hi))
		}
	}
	return bad
}

// countOps adds a history's calls to the summary.
func countOps(sum *scheduleSummary, h []porcupine.Operation) {
	sum.mu.Lock()
	defer sum.mu.Unlock()
	for _, op := range h {
		in, out := op.Input.(nsmInput), op.Output.(nsmOutput)
		if in.Kind == opRead {
			continue
		}
		outcome := "answered"
		if !out.Known {
			outcome = "unknown"
		}
		sum.ops[in.Kind.String()+" "+outcome]++
	}
}

// saveHistory writes porcupine's visualization of a failed check and
// returns its path.
func saveHistory(t *testing.T, model porcupine.Model, info porcupine.LinearizationInfo, name string) string {
	path := filepath.Join(historyDir(), name)
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Logf("visualization: %v", err)
	}
	return path
}

func describeServices(st map[string]admin.ServiceStatus) string {
	var s []string
	for _, d := range drillServices {
		s = append(s, fmt.Sprintf("%s=%s@%d", d.id, st[d.id].Owner, st[d.id].Epoch))
	}
	return strings.Join(s, " ")
}
