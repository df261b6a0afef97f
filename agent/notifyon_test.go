package agent_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// sprayNotify sends n SM_NOTIFYs naming monName (states alternating, each
// new) to addr over UDP, as sm-notify sends them; a held-back one gets no
// reply and is not waited for long.
func sprayNotify(t *testing.T, addr, monName string, n int) {
	t.Helper()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "udp", Addr: addr, Timeout: 150 * time.Millisecond})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcNotify, &nsm.StatChge{MonName: monName, State: int32(3 + 2*(i%2))}, &oncrpc.Void{})
		c.Close()
		cancel()
	}
}

// notifyCluster starts a 3-node dev cluster, monitors monName through the
// leader, and returns it with its leader.
func notifyCluster(t *testing.T, vip, monName string, tune func(*config.Config)) (*agent.Dev, *agent.Agent) {
	t.Helper()
	o := agenttest.DevOptions(t, vip, 3)
	o.Tune = tune
	d := agenttest.StartDev(t, o, agent.Options{})
	var lead *agent.Agent
	testutil.WaitFor(t, 15*time.Second, "a leader that answers NSM", func() bool {
		for _, a := range d.Agents() {
			if a.Node().Leading() && a.Node().Ready() {
				lead = a
				return true
			}
		}
		return false
	})
	c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: lead.NSMAddr().String(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var res nsm.SMStatRes
	id := nsm.MonID{MonName: monName, My: nsm.MyID{MyName: "lockd", Prog: 100021, Vers: 3, Proc: 16}}
	if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &nsm.Mon{ID: id}, &res); err != nil || res.Res != nsm.StatSucc {
		t.Fatalf("SM_MON: %+v %v", res, err)
	}
	// Every node knows the host is monitored (SM_NOTIFY is pre-checked
	// against the local state).
	for _, a := range d.Agents() {
		agenttest.WaitApplied(t, a, lead.Node().View().AppliedIndex())
	}
	return d, lead
}

// notifyResults sums nsmd_notify_received_total{result} over d's nodes.
func notifyResults(t *testing.T, d *agent.Dev, result string) float64 {
	t.Helper()
	var n float64
	for _, a := range d.Agents() {
		n += testutil.GatheredValue(t, a.Registry(), "nsmd_notify_received_total", "result", result)
	}
	return n
}

// TestNotifyBudgetHoldsClusterWide: a sender that sprays SM_NOTIFY at
// every member's own address and at the VIP gets at most one node's
// budget (notify_accept_burst, 4) committed for the whole cluster: only
// the VIP takes SM_NOTIFY from the wire (what a rebooted client's
// sm-notify sends to, and is still committed from there); the members'
// own addresses answer it void and commit nothing (result="not_vip").
// The control: the same spray at a cluster without a VIP, where each
// node takes notifications with its own budget, commits more than one
// node's budget.
func TestNotifyBudgetHoldsClusterWide(t *testing.T) {
	const host, perAddr, burst = "127.0.0.81", 10, 4
	t.Run("VIP", func(t *testing.T) {
		d, lead := notifyCluster(t, "127.0.0.173", host, nil)
		port := strconv.Itoa(int(lead.NSMAddr().Port()))
		for _, a := range d.Agents() {
			sprayNotify(t, a.NSMAddr().String(), host, perAddr)
		}
		if got := notifyResults(t, d, "accepted"); got != 0 {
			t.Errorf("%v SM_NOTIFYs to the members' own addresses committed, want 0", got)
		}
		if got := notifyResults(t, d, "not_vip"); got != 3*perAddr {
			t.Errorf("not_vip = %v, want %d", got, 3*perAddr)
		}
		sprayNotify(t, net.JoinHostPort("127.0.0.173", port), host, perAddr)
		if got := notifyResults(t, d, "accepted"); got < 1 || got > burst {
			t.Errorf("%v SM_NOTIFYs committed in all, want 1 to %d (one node's budget)", got, burst)
		}
	})
	t.Run("control: no VIP, a budget per node", func(t *testing.T) {
		d, _ := notifyCluster(t, "127.0.0.174", host, func(c *config.Config) { c.VIPMode, c.VIP = config.VIPNone, "" })
		for _, a := range d.Agents() {
			sprayNotify(t, a.NSMAddr().String(), host, perAddr)
		}
		if got := notifyResults(t, d, "accepted"); got <= burst {
			t.Errorf("%v committed: the control does not show a budget per node (want more than %d)", got, burst)
		}
	})
}
