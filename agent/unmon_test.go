package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// TestUnmonOfANodeThatStoppedServingKeepsTheHost: on nodes that start the
// NFS server in on_leader, a node's lockd unmonitors its hosts as the
// server stops after leadership moved on — those hosts still hold locks
// that the new server must tell them to reclaim, so the registration
// stays (nsmd_unmon_kept_total counts it). The control: the same
// SM_UNMON once that node serves again removes it.
func TestUnmonOfANodeThatStoppedServingKeepsTheHost(t *testing.T) {
	script := filepath.Join(t.TempDir(), "on-leader")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := agenttest.DevOptions(t, "127.0.0.152", 3)
	o.Tune = func(c *config.Config) { c.OnLeader, c.OnFollower, c.FenceWatchdog = script, script, config.FenceOff }
	d := agenttest.StartDev(t, o, agent.Options{})
	lead := agenttest.Leader(t, d, nil, 10*time.Second)

	call := func(a *agent.Agent, proc uint32, args oncrpc.Marshaler, res oncrpc.Unmarshaler) {
		t.Helper()
		c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: a.NSMAddr().String(), Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, proc, args, res); err != nil {
			t.Fatal(err)
		}
	}
	id := nsm.MonID{MonName: "127.0.0.81", My: nsm.MyID{MyName: "lockd-host", Prog: 100021, Vers: 3, Proc: 16}}
	var mres nsm.SMStatRes
	call(lead, nsm.ProcMon, &nsm.Mon{ID: id}, &mres)
	if mres.Res != nsm.StatSucc {
		t.Fatalf("SM_MON: %+v", mres)
	}
	registrations := func(a *agent.Agent) int { return a.Node().View().Count() }

	// Leadership moves on; the old server's lockd, stopping, unmonitors.
	if err := lead.Node().TransferLeadership(""); err != nil {
		t.Fatal(err)
	}
	next := agenttest.Leader(t, d, lead, 10*time.Second)
	var sres nsm.SMStat
	call(lead, nsm.ProcUnmon, &id, &sres)
	testutil.HoldsFor(t, time.Second, 100*time.Millisecond, "the host to stay monitored", func() (bool, string) {
		return registrations(next) == 1, "registrations on the new leader"
	})
	if v := testutil.GatheredValue(t, lead.Registry(), "nsmd_unmon_kept_total"); v != 1 {
		t.Fatalf("nsmd_unmon_kept_total on %s = %v, want 1", lead.Config().NodeID, v)
	}

	// The control: once it serves again, its lockd's SM_UNMON counts.
	if err := next.Node().TransferLeadership(lead.Config().NodeID); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, lead.Config().NodeID+" to lead again", lead.Node().Leading)
	call(lead, nsm.ProcUnmon, &id, &sres)
	testutil.WaitFor(t, 5*time.Second, "the serving node's SM_UNMON to remove the host", func() bool { return registrations(lead) == 0 })
}
