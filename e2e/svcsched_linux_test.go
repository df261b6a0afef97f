package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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
//     its own, unhit server — never elsewhere. A restart of an unhit
//     server's service because its lease lapsed during an election is an
//     error like any other (a run without a watchdog rides out four
//     elections' lapse), said so and counted in the summary;
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
			// Namespaces off: the schedules check placement, NSM and
			// fencing under faults; the services drill and the VM tier
			// run services in namespaces of their own.
			return []string{"--service-namespaces", "off", "--mon-unprivileged-burst=-1", "--config", conf, "--on-leader", hook, "--on-follower", hook,
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
		case owner == nil || !owner.serving() || (cur.State != admin.ServicePlaced && cur.State != admin.ServiceServing):
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

// workers are n workers: worker i calls service i%3 from a client host;
// each service's lock managers are its client hosts (my: the index of its
// lock manager among the service's).
func (sc *svcCluster) workers(seed uint64, n int) ([]*worker, map[*worker]string) {
	var workers []*worker
	svcOf := map[*worker]string{}
	lockManagers := map[string]map[string]int{} // service → via → my
	for i := range n {
		s := drillServices[i%len(drillServices)]
		cl := sc.clients[(i/len(drillServices)+i)%len(sc.clients)]
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
	return workers, svcOf
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

	nWorkers := 4 + rng.IntN(9)
	workers, svcOf := sc.workers(seed, nWorkers)
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
		// A node the fence agent powered off (the stand-in's off kills its
		// nsmd) boots again before the next fault, as a fenced server
		// does: the next fault may pick a leader among all three.
		for _, n := range c.nodes {
			if !n.running() {
				t.Logf("%s was powered off by the fence agent: started again", n.id)
				n.start(t)
			}
		}
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

	anomalies, res := checkServiceHistories(t, seed, hs, settled, before, final, monLabels, sum)
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
