package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
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
	"github.com/nsmd/nsmd/nsm"
)

// The services topology of TestCheckedFaultSchedules (seed % 4 == 1):
// three servers and no VIP, three services a, b and c (the services
// drill's: 10.77.0.101–103, each preferring its own server, so each
// starts on one), hooks that log, no watchdog and a fence agent that
// stands in for a power switch — and, unlike the drill's, tells the
// truth: its off SIGKILLs the node's nsmd (found by its data directory),
// as a switch would power the machine off, so that a successor's proof
// that the old server stopped is real whatever fault hit it (a SIGSTOP, a
// cut); the harness starts a node it finds dead again, as systemd would.
//
// Before each schedule every service is moved back to its own server
// (nsmd's planned move; services do not fail back by themselves) and
// served there: its address on its server alone, SM_STAT at it answering
// 2·epoch+1; each client host was monitored at every service in the
// set-up (one registration per client host and service that no worker
// touches), so every client host must hear of every move of every
// service. The workers call as remote lock managers from the client hosts
// (--trusted-callers), each at one service's address: SM_MON / SM_UNMON /
// SM_UNMON_ALL / SM_STAT, each service's calls its own history. The
// nemesis draws from the same faults as on three nodes (a planned
// leadership transfer included: it must move no service).
//
// After healing, per service:
//   - its history is linearizable against the model (nsmmodel_test.go),
//     no answered state is even or falls, and every answered state lies
//     between the service's states before and after the schedule
//     (2·epoch+1);
//   - never two servers held its address at once (a watcher per service
//     address, as the VIP's), and after healing its owner alone holds it;
//   - it kept its epoch (did not move) unless its own server was hit:
//     killed, stopped, cut off — or given a full or slow disk, which can
//     make a server unhealthy, and an unhealthy owner's services move
//     (DESIGN.md, "Where services run"). A transfer or loss on the client
//     links moves nothing. One exception: when faults hit two of the
//     three servers (one after the other, but a fence agent's off of the
//     first can come late), the cluster may lose its quorum for longer
//     than a lease, and then a service may start again at a new epoch on
//     its own, unhit server — never elsewhere. And a known product issue:
//     with fence_watchdog off (as here: no watchdog device in this tier)
//     a server keeps serving only two fence leases past its lease's end,
//     less than a leader election takes, so a fault of the leader
//     restarts the other servers' services where they are; such a
//     restart (the server's log says its lease lapsed) is counted in the
//     summary, and an error with NSMD_E2E_SERVICES_STRICT=1;
//   - if it moved, every client host got SM_NOTIFY from its address with
//     its final state (its set-up registration was kept: a client host no
//     registration of the service names is not notified); if it did not,
//     no client host got a newer state from its address.
//
// What these schedules cannot check: the final registration table of a
// service. GET /v1/registrations is the node's own table, and nothing
// reads a service's scope (fsm.Scope) from outside; so the histories have
// no final read, and an acknowledged SM_MON's survival is seen only
// through the SM_NOTIFY of a move.

// svcCluster is the services topology: the cluster, and a watcher of each
// service's address.
type svcCluster struct {
	*e2eCluster
	dir   string                 // hook and fence logs
	watch map[string]*vipWatcher // service id → its address's watcher
	home  map[string]string      // service id → the server it prefers
}

func startServicesCluster(t *testing.T) *svcCluster {
	t.Helper()
	sc := &svcCluster{dir: t.TempDir(), watch: map[string]*vipWatcher{}, home: map[string]string{}}
	hook := filepath.Join(sc.dir, "hook")
	agent := filepath.Join(sc.dir, "fence-agent")
	conf := filepath.Join(sc.dir, "nsmd.yaml")
	var yaml strings.Builder
	yaml.WriteString("services:\n")
	for _, s := range drillServices {
		fmt.Fprintf(&yaml, "  - id: %s\n    address: %s/%d\n    interface: eth0\n    prefer: [%s]\n", s.id, s.addr, topoBits, s.prefer)
		sc.home[s.id] = s.prefer
	}
	for path, body := range map[string]string{
		hook:  "#!/bin/sh\necho \"$(date +%T.%N) $NSMD_NODE_ID $NSMD_ROLE $NSMD_REASON $NSMD_SERVICE $NSMD_SERVICE_EPOCH $NSMD_SM_STATE\" >> " + sc.dir + "/hooks.log\nexit 0\n",
		agent: fenceStandIn(filepath.Join(sc.dir, "fence.log")),
		conf:  yaml.String(),
	} {
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c := startClusterWith(t, clusterSpec{clients: clusterClients, fakeClients: true, noVIP: true, diskMB: 256, slowDisks: true,
		extraArgs: func(n *nsmNode) []string {
			var plugs []string
			for _, o := range n.c.nodes {
				plugs = append(plugs, o.id+":plug="+o.dataDir)
			}
			return []string{"--mon-unprivileged-burst=-1", "--config", conf, "--on-leader", hook, "--on-follower", hook,
				"--fence-watchdog", "off", "--fence-agent", agent, "--fence-nodes", strings.Join(plugs, ","),
				"--nfsv4-tracking", "off", "--service-settle", "20s"}
		}})
	sc.e2eCluster = c
	for _, s := range drillServices {
		sc.watch[s.id] = startVIPWatcher(netip.MustParseAddr(s.addr), c.top.nodes)
	}
	// Registered after the cluster's cleanup, so it runs first: the
	// watchers stop before the namespaces go.
	t.Cleanup(func() {
		for _, s := range drillServices {
			w := sc.watch[s.id]
			w.Stop()
			over, _, errs := w.Summary()
			t.Logf("service %s's address: max overlap %v (the negative control adds one of about 300 ms on a), watcher errors %v", s.id, over, errs)
			if len(errs) > 0 {
				t.Errorf("service %s's address watcher: %v", s.id, errs)
			}
		}
		if t.Failed() {
			for _, f := range []string{"hooks.log", "fence.log"} {
				t.Logf("---- %s (tail) ----\n%s", f, tailFile(filepath.Join(sc.dir, f), 60))
			}
		}
	})
	c.settle(t, 60*time.Second, 1)
	st := sc.waitServed(t, sc.home, 90*time.Second)
	// The set-up: every client host monitored at every service, under a
	// my_name no worker uses (never removed).
	for _, s := range drillServices {
		for _, cl := range c.clients {
			var l clientLine
			testutil.WaitForSeen(t, 30*time.Second, cl.host.name+" monitored at service "+s.id, func() (bool, string) {
				var err error
				l, err = cl.do(clientCmd{Op: "mon", Addr: s.addr, MyName: cl.myName + "-init-" + s.id}, 10*time.Second)
				if err != nil {
					return false, err.Error()
				}
				return nsm.Res(l.Res) == nsm.StatSucc, fmt.Sprintf("res %d state %d", l.Res, l.State)
			})
			if want := fsm.ServiceSMState(st[s.id].Epoch); l.State != want {
				t.Fatalf("SM_MON of %s at service %s answered state %d, want the service's %d", cl.host.name, s.id, l.State, want)
			}
		}
	}
	return sc
}

// fenceStandIn is the fence agent's script: action=off SIGKILLs every
// nsmd whose command line holds plug (the node's data directory, made by
// this test) and waits until none is left; action=status exits 2 (off)
// when none runs; anything else succeeds. Each call is logged.
func fenceStandIn(log string) string {
	return `#!/bin/sh
action=; plug=
while IFS= read -r l; do
  case "$l" in action=*) action=${l#action=} ;; plug=*) plug=${l#plug=} ;; esac
done
pids() {
  for f in $(grep -lzxF -- "$plug" /proc/[0-9]*/cmdline 2>/dev/null); do
    d=${f%/cmdline}
    [ "$(cat "$d/comm" 2>/dev/null)" = nsmd ] && echo "${d#/proc/}"
  done
}
echo "$(date +%T.%N) $action $plug: nsmd $(pids | tr '\n' ' ')" >> ` + log + `
case "$action" in
off)
  for i in 1 2 3 4 5 6 7 8 9 10; do
    p=$(pids)
    [ -z "$p" ] && exit 0
    kill -9 $p 2>/dev/null
    sleep 0.1
  done
  echo "$(date +%T.%N) off $plug: still running" >> ` + log + `
  exit 1 ;;
status) [ -z "$(pids)" ] && exit 2; exit 0 ;;
*) exit 0 ;;
esac
`
}

// waitServed waits until every service is placed on a running server (on
// want's, if given) as every running node sees it, its address is held by
// that server alone, and SM_STAT at its address from a client host
// answers the service's state; it returns the services by id.
func (sc *svcCluster) waitServed(t *testing.T, want map[string]string, timeout time.Duration) map[string]admin.ServiceStatus {
	t.Helper()
	var st map[string]admin.ServiceStatus
	testutil.WaitForSeen(t, timeout, "every service served", func() (bool, string) {
		var ok bool
		var why string
		st, ok, why = sc.served(want)
		return ok, why
	})
	return st
}

func (sc *svcCluster) served(want map[string]string) (map[string]admin.ServiceStatus, bool, string) {
	var st map[string]admin.ServiceStatus
	for _, n := range sc.nodes {
		if !n.serving() {
			continue
		}
		var list []admin.ServiceStatus
		if err := n.get("/v1/services", &list); err != nil {
			return nil, false, err.Error()
		}
		seen := map[string]admin.ServiceStatus{}
		for _, s := range list {
			seen[s.ID] = s
		}
		if st == nil {
			st = seen
			continue
		}
		for id, s := range seen {
			if st[id].Owner != s.Owner || st[id].Epoch != s.Epoch {
				return st, false, fmt.Sprintf("%s sees %s on %s@%d, another node on %s@%d", n.id, id, s.Owner, s.Epoch, st[id].Owner, st[id].Epoch)
			}
		}
	}
	for _, s := range drillServices {
		cur := st[s.id]
		owner := sc.node(cur.Owner)
		desc := fmt.Sprintf("%s on %q@%d (%s)", s.id, cur.Owner, cur.Epoch, cur.State)
		switch {
		case owner == nil || !owner.serving() || cur.State != admin.ServicePlaced:
			return st, false, desc
		case want != nil && cur.Owner != want[s.id]:
			return st, false, desc + ", want on " + want[s.id]
		}
		if h := sc.watch[s.id].Holders(); !slices.Equal(h, []string{cur.Owner}) {
			return st, false, fmt.Sprintf("%s; its address held by %v", desc, h)
		}
		var got int32
		err := inNetnsThread(sc.clients[0].host.ns, func() error {
			var err error
			got, err = smStat(net.JoinHostPort(s.addr, strconv.Itoa(nsmPort)))
			return err
		})
		if err != nil {
			return st, false, fmt.Sprintf("%s; %v", desc, err)
		}
		if got != fsm.ServiceSMState(cur.Epoch) {
			return st, false, fmt.Sprintf("%s; SM_STAT at %s answers %d", desc, s.addr, got)
		}
	}
	return st, true, ""
}

func (sc *svcCluster) node(id string) *nsmNode {
	for _, n := range sc.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// rebalance moves every service that is not on its own server back there
// (a planned move), waits until each is served at home and every client
// host heard of each move, and returns the services.
func (sc *svcCluster) rebalance(t *testing.T, leader *nsmNode) map[string]admin.ServiceStatus {
	t.Helper()
	st := sc.waitServed(t, nil, 120*time.Second)
	for _, s := range drillServices {
		if st[s.id].Owner == s.prefer {
			continue
		}
		sc.move(t, leader, s.id, s.prefer)
	}
	home := sc.waitServed(t, sc.home, 120*time.Second)
	for _, s := range drillServices {
		if home[s.id].Epoch != st[s.id].Epoch {
			for _, cl := range sc.clients {
				checkServiceNotified(t, cl, s.addr, fsm.ServiceSMState(home[s.id].Epoch), 30*time.Second)
			}
			t.Logf("moved %s back to %s (epoch %d → %d)", s.id, s.prefer, st[s.id].Epoch, home[s.id].Epoch)
		}
	}
	return home
}

// move asks leader for the planned move of service id to node to, until
// it is accepted.
func (sc *svcCluster) move(t *testing.T, leader *nsmNode, id, to string) {
	t.Helper()
	path := "/v1/services/move?" + url.Values{"service": {id}, "to": {to}}.Encode()
	testutil.WaitForSeen(t, 60*time.Second, fmt.Sprintf("move %s to %s accepted", id, to), func() (bool, string) {
		resp, err := leader.http.Post("https://"+leader.admin+path, "", nil)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var e admin.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("%s %s", resp.Status, e.Error)
	})
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

// runServicesSchedule is one schedule on the services topology.
func runServicesSchedule(t *testing.T, sc *svcCluster, seed uint64, sum *scheduleSummary) {
	start := time.Now()
	c := sc.e2eCluster
	rng := rand.New(rand.NewPCG(seed, 0x6e736d64))
	leader, _ := c.restore(t)
	before := sc.rebalance(t, leader)
	marks := map[string]vipMark{}
	for id, w := range sc.watch {
		marks[id] = w.Mark()
	}
	logMarks := c.logMarks()
	monLabels := make([]string, monNames)
	for i := range monLabels {
		monLabels[i] = c.clients[i%len(c.clients)].host.ip.String()
	}

	// Workers: worker i calls service i%3 from a client host; each
	// service's lock managers are its client hosts.
	nWorkers := 4 + rng.IntN(9)
	var workers []*worker
	svcOf := map[*worker]string{}
	lockManagers := map[string]map[string]int{} // service → via → my
	for i := range nWorkers {
		s := drillServices[i%len(drillServices)]
		cl := c.clients[(i/len(drillServices)+i)%len(c.clients)]
		w := &worker{id: i, rng: rand.New(rand.NewPCG(seed, uint64(i)+1)), ns: cl.host.ns,
			addr: net.JoinHostPort(s.addr, strconv.Itoa(nsmPort)), via: cl.host.name + " at " + s.id}
		if lockManagers[s.id] == nil {
			lockManagers[s.id] = map[string]int{}
		}
		if _, ok := lockManagers[s.id][w.via]; !ok {
			lockManagers[s.id][w.via] = len(lockManagers[s.id])
		}
		w.my = lockManagers[s.id][w.via]
		workers, svcOf[w] = append(workers, w), s.id
	}
	sc.clearTables(monLabels)
	t0 := time.Now()
	hs := map[string]*history{}
	for _, s := range drillServices {
		hs[s.id] = &history{t0: t0}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, hs[svcOf[w]], monLabels)
		}()
	}
	stopWorkers := func() { cancel(); wg.Wait() }
	defer stopWorkers()

	// Nemesis.
	var plan []string
	for range 1 + rng.IntN(3) {
		plan = append(plan, faultKinds[rng.IntN(len(faultKinds))])
	}
	t.Logf("seed %d on %s: %d workers (%s), faults %v; services %s", seed, topoServices, nWorkers, describeWorkers(workers), plan, describeServices(before))
	time.Sleep(time.Duration(300+rng.IntN(500)) * time.Millisecond)
	hit := map[string][]string{} // node id → the faults that hit it
	for _, f := range plan {
		d := time.Duration(1000+rng.IntN(2000)) * time.Millisecond
		desc, n := c.inject(t, f, d, rng)
		if n != nil {
			hit[n.id] = append(hit[n.id], f)
		}
		t.Logf("fault %s: %s", f, desc)
		sum.mu.Lock()
		sum.faults[f]++
		sum.mu.Unlock()
		time.Sleep(time.Duration(200+rng.IntN(600)) * time.Millisecond)
	}
	stopWorkers()

	// Heal and settle: every service served again.
	c.restore(t)
	final := sc.waitServed(t, nil, 120*time.Second)
	settled := hs[drillServices[0].id].now()
	lapseRestarts := sc.checkMoves(t, before, final, hit, sc.leaseLapses(logMarks, before))
	sc.checkAddressOverlaps(t, marks)
	c.checkSameApplied(t)

	// The histories: unanswered calls ended, at the latest, when every
	// service was served again.
	var anomalies []string
	var res []string
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
	took := time.Since(start)
	sum.mu.Lock()
	sum.schedules++
	sum.anomalies += len(anomalies)
	sum.lapseRestarts += lapseRestarts
	sum.took = append(sum.took, took)
	slowFault := slices.ContainsFunc(plan, func(f string) bool { return strings.HasPrefix(f, "slow-disk-") })
	for id, lines := range c.logLinesSince(logMarks, "data directory slow: handing") {
		if !slowFault {
			sum.falseSlow += len(lines)
			t.Logf("%s judged its disk slow with no slow-disk fault: %v", id, lines)
		}
	}
	sum.mu.Unlock()
	if t.Failed() {
		sc.saveLogs(t, seed, logMarks)
		for _, n := range c.nodes {
			lines := c.logLinesSince(logMarks, "")[n.id]
			if len(lines) > 300 {
				lines = lines[len(lines)-300:]
			}
			t.Logf("---- %s log during seed %d (last %d lines) ----\n%s", n.id, seed, len(lines), strings.Join(lines, "\n"))
		}
	}
	t.Logf("seed %d: %s; hit %v; %v", seed, strings.Join(res, "; "), hit, took.Round(100*time.Millisecond))
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
// there (its server's log says so) while the cluster elected a leader is
// the known exception below (lapsed: service id → true): it is an error
// only with NSMD_E2E_SERVICES_STRICT=1, and counted in the summary.
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
		case len(hit[b.Owner]) == 0 && f.Owner == b.Owner && lapsed[s.id] && !servicesStrict():
			// Known: with fence_watchdog off a server keeps serving only
			// two fence leases (600 ms) past its lease's end, less than a
			// leader election takes (2–3 heartbeat timeouts, then the
			// takeover), so a fault of the leader alone restarts the
			// services of the servers it did not hit.
			lapseRestarts++
			t.Logf("KNOWN PRODUCT ISSUE: service %s restarted on its server %s (epoch %d → %d), which no fault hit: its lease lapsed during a leader election (faults hit %v; NSMD_E2E_SERVICES_STRICT=1 makes this an error)",
				s.id, f.Owner, b.Epoch, f.Epoch, hit)
		case len(hit[b.Owner]) == 0:
			t.Errorf("service %s moved (%s@%d → %s@%d) though no fault hit its server %s (faults hit %v): a fault of one node moves only its services",
				s.id, b.Owner, b.Epoch, f.Owner, f.Epoch, b.Owner, hit)
		}
		for _, cl := range sc.clients {
			if why := waitServiceNotified(cl, s.addr, fsm.ServiceSMState(f.Epoch), 30*time.Second); why != "" {
				t.Errorf("service %s moved (%s@%d → %s@%d): %s", s.id, b.Owner, b.Epoch, f.Owner, f.Epoch, why)
			}
		}
	}
	return lapseRestarts
}

// servicesStrict: NSMD_E2E_SERVICES_STRICT=1 fails a restart of an unhit
// server's service after a lapsed lease (see checkMoves).
func servicesStrict() bool { return os.Getenv("NSMD_E2E_SERVICES_STRICT") == "1" }

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
