package agent_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/cluster/pki"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// TestDevClusterFailover is `make run` under test: three agents on
// 127.0.0.1-3 with a loopback VIP. An SM_MON sent to a follower over real
// TCP is forwarded to the leader (source-address authentication), the VIP
// answers SM_STAT, and after the leader is killed the VIP answers again
// with sm_state raised by 2, from the new leader.
func TestDevClusterFailover(t *testing.T) {
	d, o := agenttest.Dev(t, "127.0.0.101", 3)
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	vip := net.JoinHostPort(o.VIP, strconv.Itoa(o.NSMPort))
	before, err := agenttest.SMStat(context.Background(), "udp", vip)
	if err != nil || before.Res != nsm.StatSucc {
		t.Fatalf("SM_STAT on the VIP: %+v %v", before, err)
	}
	var follower *agent.Agent
	for _, a := range d.Agents() {
		if a != lead {
			follower = a
			break
		}
	}
	c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: follower.NSMAddr().String(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mon := nsm.Mon{ID: nsm.MonID{MonName: "127.0.0.80", My: nsm.MyID{MyName: "lockd-host", Prog: 100021, Vers: 3, Proc: 16}}}
	var res nsm.SMStatRes
	if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res); err != nil || res.Res != nsm.StatSucc {
		t.Fatalf("SM_MON via follower %s: %+v %v", follower.Config().NodeID, res, err)
	}
	if n := lead.Node().View().Count(); n != 1 {
		t.Fatalf("leader has %d registrations after a forwarded SM_MON, want 1", n)
	}

	checkMetrics(t, lead)
	took := failover(t, d, o, lead, before.State)
	t.Logf("leader kill → VIP answers SM_STAT with the new state: %v", took)
}

// failover kills lead and returns how long until the VIP answers SM_STAT
// with a state above old.
func failover(t testing.TB, d *agent.Dev, o agent.DevOptions, lead *agent.Agent, old int32) time.Duration {
	t.Helper()
	vip := net.JoinHostPort(o.VIP, strconv.Itoa(o.NSMPort))
	start := time.Now()
	lead.Kill()
	var got int32
	answered := testutil.WaitForTime(t, 10*time.Second, 5*time.Millisecond, "the VIP to answer with a new state", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		r, err := agenttest.SMStat(ctx, "udp", vip)
		got = r.State
		return err == nil && r.Res == nsm.StatSucc && r.State > old
	})
	if got != old+2 {
		t.Errorf("VIP answers state %d after failover, want %d", got, old+2)
	}
	return answered.Sub(start)
}

// TestMeasureDevFailover repeats the leader kill to report a distribution
// (closing-note numbers). It is a measurement, not a check: run it with
// NSMD_MEASURE=1 go test -run TestMeasureDevFailover -v ./agent
func TestMeasureDevFailover(t *testing.T) {
	if os.Getenv("NSMD_MEASURE") == "" {
		t.Skip("measurement; set NSMD_MEASURE=1 to run")
	}
	var times []time.Duration
	for run := range 12 {
		d, o := agenttest.Dev(t, fmt.Sprintf("127.0.0.%d", 110+run), 3)
		lead := agenttest.Leader(t, d, nil, 10*time.Second)
		r, err := agenttest.SMStat(context.Background(), "udp", net.JoinHostPort(o.VIP, strconv.Itoa(o.NSMPort)))
		if err != nil {
			t.Fatal(err)
		}
		times = append(times, failover(t, d, o, lead, r.State))
		d.Close()
	}
	slices.Sort(times)
	t.Logf("failover over %d runs: min %v median %v max %v all %v", len(times), times[0], times[len(times)/2], times[len(times)-1], times)
}

// TestMeasureDevMonThroughput drives SM_MON with distinct mon_names at the
// dev cluster's VIP and reports throughput, latency, process CPU
// per call (load generator included) and how many raft entries carried the
// calls. A measurement, not a check:
//
//	NSMD_MEASURE=1 go test -run TestMeasureDevMon -v ./agent
//
// Knobs: NSMD_MEASURE_NET (tcp | udp; a UDP "connection" is a socket, calls
// retransmitted after 1 s), NSMD_MEASURE_NODES (3), NSMD_MEASURE_CONNS (comma list, "1,8,64"),
// NSMD_MEASURE_CALLS (calls per phase, 20000), NSMD_MEASURE_DEPTH
// (outstanding calls per connection, 1), NSMD_MEASURE_INFLIGHT (group-commit
// entries in raft at once, cluster default), NSMD_MEASURE_STORE (auto | wal
// | bolt: raft's log store, default auto: wal in the fresh directories),
// NSMD_MEASURE_NOSYNC=1 (bolt without fsync: not durable, for comparison
// only).
func TestMeasureDevMonThroughput(t *testing.T) {
	if os.Getenv("NSMD_MEASURE") == "" {
		t.Skip("measurement; set NSMD_MEASURE=1 to run")
	}
	nodes := testutil.EnvInt(t, "NSMD_MEASURE_NODES", 3)
	total := testutil.EnvInt(t, "NSMD_MEASURE_CALLS", 20000)
	depth := testutil.EnvInt(t, "NSMD_MEASURE_DEPTH", 1)
	network := "tcp"
	if v := os.Getenv("NSMD_MEASURE_NET"); v != "" {
		network = v
	}
	connsList := []int{1, 8, 64}
	if v := os.Getenv("NSMD_MEASURE_CONNS"); v != "" {
		connsList = connsList[:0]
		for f := range strings.SplitSeq(v, ",") {
			c, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || c < 1 {
				t.Fatalf("NSMD_MEASURE_CONNS %q: bad count %q", v, f)
			}
			connsList = append(connsList, c)
		}
	}
	nosync := os.Getenv("NSMD_MEASURE_NOSYNC") != ""
	inflight := testutil.EnvInt(t, "NSMD_MEASURE_INFLIGHT", 0)
	// NSMD_MEASURE_TLS=1: raft over mutual TLS (certificates from nsmd
	// tls init), to compare with plaintext in the same run.
	tlsDir := ""
	if os.Getenv("NSMD_MEASURE_TLS") != "" {
		tlsDir = t.TempDir()
		agenttest.PKI(t, tlsDir, 3)
	}
	store := os.Getenv("NSMD_MEASURE_STORE")
	tune := func(c *cluster.Config) {
		c.NoSync = nosync
		if store != "" {
			c.LogStore = store
		}
		if inflight > 0 {
			c.MaxInflightEntries = inflight
		}
		if tlsDir != "" {
			st, err := pki.Load(pki.Files{CA: filepath.Join(tlsDir, "ca.pem"), Cert: filepath.Join(tlsDir, c.NodeID+".pem"), Key: filepath.Join(tlsDir, c.NodeID+"-key.pem")})
			if err != nil {
				t.Fatal(err)
			}
			c.RaftTLS = st
		}
	}
	o := agenttest.DevOptions(t, "127.0.0.102", nodes)
	d := agenttest.StartDev(t, o, agent.Options{TuneCluster: tune})
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	t.Logf("%d node(s), VIP %s over %s, depth %d, nosync %v, inflight entries %d (0: default), raft TLS %v, log store %s", nodes, o.VIP, network, depth, nosync, inflight, tlsDir != "", lead.Node().LogStore())
	vip := net.JoinHostPort(o.VIP, strconv.Itoa(o.NSMPort))
	next := 0
	for _, conns := range connsList {
		calls := max(total/(conns*depth), 1) // per caller
		callers := conns * depth
		lat := make([][]time.Duration, callers)
		errs := make(chan error, callers)
		clients := make([]*oncrpc.Client, conns)
		for ci := range clients {
			c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: network, Addr: vip, Timeout: 10 * time.Second, Retransmit: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			clients[ci] = c
		}
		idx0 := lead.Node().RaftStatus().LastIndex
		cpu0 := processCPU()
		start := time.Now()
		for gi := range callers {
			base := next + gi*calls
			c := clients[gi%conns]
			go func() {
				lat[gi] = make([]time.Duration, 0, calls)
				for i := range calls {
					n := base + i
					mon := nsm.Mon{ID: nsm.MonID{MonName: fmt.Sprintf("127.%d.%d.%d", n>>16&255, n>>8&255, n&255), My: nsm.MyID{MyName: "bench", Prog: 100021, Vers: 3, Proc: 16}}}
					var res nsm.SMStatRes
					t0 := time.Now()
					if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res); err != nil || res.Res != nsm.StatSucc {
						errs <- fmt.Errorf("SM_MON: %v %v", res, err)
						return
					}
					lat[gi] = append(lat[gi], time.Since(t0))
				}
				errs <- nil
			}()
		}
		for range callers {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		el := time.Since(start)
		cpu := processCPU() - cpu0
		entries := lead.Node().RaftStatus().LastIndex - idx0
		next += callers * calls
		var all []time.Duration
		for _, l := range lat {
			all = append(all, l...)
		}
		slices.Sort(all)
		q := func(p float64) time.Duration { return all[int(p*float64(len(all)-1))] }
		t.Logf("conns=%d depth=%d calls=%d: %.0f SM_MON/s  p50 %v  p90 %v  p99 %v  max %v  cpu %.0f%% (%v/call)  entries %d (%.1f calls/entry)",
			conns, depth, len(all), float64(len(all))/el.Seconds(), q(0.5), q(0.9), q(0.99), all[len(all)-1],
			100*cpu.Seconds()/el.Seconds(), (cpu / time.Duration(len(all))).Round(time.Microsecond),
			entries, float64(len(all))/float64(max(entries, 1)))
	}
}

// processCPU is this process's user + system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// checkMetrics scrapes the agent's /metrics and checks the cluster's
// metric families are there (on its own registry, not the global one).
func checkMetrics(t *testing.T, a *agent.Agent) {
	t.Helper()
	resp, err := http.Get(a.AdminURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, name := range []string{
		"nsmd_is_leader 1", "nsmd_raft_term", "nsmd_leader_changes_total", "nsmd_takeover_duration_seconds",
		"nsmd_sm_state", "nsmd_registrations 1", "nsmd_apply_duration_seconds", "nsmd_commit_batch_size",
		"nsmd_forwarded_writes_total{result=\"served\"} 1", "nsmd_grace_active 1", "nsmd_grace_remaining_seconds",
		"nsmd_members{state=\"alive\"} 3", "nsmd_rpc_requests_total", "nsmd_rpc_duration_seconds", "nsmd_notify_targets",
	} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
}

// TestMeasureStatThroughput: SM_STAT over UDP at the VIP with 64 callers
// (8 sockets × 8 outstanding). NSMD_MEASURE=1 go test -run TestMeasureStat -v ./agent
func TestMeasureStatThroughput(t *testing.T) {
	if os.Getenv("NSMD_MEASURE") == "" {
		t.Skip("measurement; set NSMD_MEASURE=1 to run")
	}
	d, o := agenttest.Dev(t, "127.0.0.103", 1)
	agenttest.Leader(t, d, nil, 10*time.Second)
	vip := net.JoinHostPort(o.VIP, strconv.Itoa(o.NSMPort))
	for _, network := range []string{"udp", "tcp"} {
		const sockets, per, calls = 8, 8, 5000
		done := make(chan error, sockets*per)
		start := time.Now()
		for range sockets {
			c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: network, Addr: vip, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for range per {
				go func() {
					for range calls {
						var res nsm.SMStatRes
						if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: "client"}, &res); err != nil {
							done <- err
							return
						}
					}
					done <- nil
				}()
			}
		}
		for range sockets * per {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("SM_STAT %s, 64 callers: %.0f/s", network, float64(sockets*per*calls)/time.Since(start).Seconds())
	}
}
