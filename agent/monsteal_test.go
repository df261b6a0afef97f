package agent_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// TestMonFromAnotherAgentTakesNothingOver: three agents (gossip, raft,
// forwarding, every member at the same command level, so SM_MON is
// committed as a guarded registration, kind 14, and Apply decides). The
// serving node's lockd monitors three clients; a local user on each other
// node sends SM_MON naming that lockd for each client, then SM_UNMON_ALL.
// Each SM_MON is answered stat_fail, nothing is checked by a proposer, and
// every node still has the serving node's three registrations with
// lockd's cookie. The cluster and FSM tests hold the negative control
// (the same attack unguarded removes them all).
func TestMonFromAnotherAgentTakesNothingOver(t *testing.T) {
	d, _ := agenttest.Dev(t, "127.0.0.153", 3)
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	call := func(a *agent.Agent, lockd bool, proc uint32, args oncrpc.Marshaler, res oncrpc.Unmarshaler) {
		t.Helper()
		c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: a.NSMAddr().String(),
			LocalAddr: netip.MustParseAddr("127.0.0.1"), Privileged: lockd, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, proc, args, res); err != nil {
			t.Fatal(err)
		}
	}
	my := nsm.MyID{MyName: "nfs-" + lead.Config().NodeID, Prog: 100021, Vers: 4, Proc: 16}
	hosts := []string{"10.66.0.1", "10.66.0.2", "10.66.0.3"}
	cookie := [16]byte{7, 7, 7}
	for _, h := range hosts {
		var res nsm.SMStatRes
		call(lead, true, nsm.ProcMon, &nsm.Mon{ID: nsm.MonID{MonName: h, My: my}, Priv: cookie}, &res)
		if res.Res != nsm.StatSucc {
			t.Fatalf("lockd's SM_MON %s: %+v", h, res)
		}
	}
	for _, a := range d.Agents() {
		if a == lead {
			continue
		}
		testutil.WaitFor(t, 10*time.Second, a.Config().NodeID+" ready", a.Node().Ready)
		for _, h := range hosts {
			var res nsm.SMStatRes
			call(a, false, nsm.ProcMon, &nsm.Mon{ID: nsm.MonID{MonName: h, My: my}, Priv: [16]byte{15: 0xee}}, &res)
			if res.Res != nsm.StatFail {
				t.Fatalf("SM_MON of %s through %s naming %s's lockd: %+v, want stat_fail", h, a.Config().NodeID, lead.Config().NodeID, res)
			}
		}
		var st nsm.SMStat
		call(a, false, nsm.ProcUnmonAll, &my, &st)
	}
	for _, a := range d.Agents() {
		mfs, err := a.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		lowered := -1.0
		for _, mf := range mfs {
			if mf.GetName() == "nsmd_mon_owner_checked_by_proposer_total" {
				lowered = mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		if lowered != 0 {
			t.Fatalf("%s: nsmd_mon_owner_checked_by_proposer_total = %v (-1: not exported), want 0: kind 14, decided by Apply", a.Config().NodeID, lowered)
		}
	}
	for _, a := range d.Agents() {
		want := float64(len(hosts))
		if a == lead {
			want = 0
		}
		if v := testutil.GatheredValue(t, a.Registry(), "nsmd_mon_refused_total", "reason", "owned_elsewhere"); v != want {
			t.Fatalf("%s: nsmd_mon_refused_total{reason=owned_elsewhere} = %v, want %v", a.Config().NodeID, v, want)
		}
	}
	idx := lead.Node().View().AppliedIndex()
	for _, a := range d.Agents() {
		agenttest.WaitApplied(t, a, idx)
		n := 0
		for _, g := range a.Node().View().Registrations(fsm.MonID{}, 0, "") {
			if g.Node == lead.Config().NodeID && g.Priv == cookie {
				n++
			}
		}
		if n != len(hosts) {
			t.Fatalf("%s: %d of the serving node's %d registrations left", a.Config().NodeID, n, len(hosts))
		}
	}
}
