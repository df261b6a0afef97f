package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
)

// TestFenceConfirmLetsAWaitingLeaderServe: servers with fence_watchdog:
// off promise nothing, so after the serving one is killed the new leader
// waits — nsmd status says for whom — until `nsmd fence confirm NODE`
// (here through the new leader's admin API) says it is off; the
// confirmation is shown with who gave it. A confirmation of a running
// node (the leader) is refused.
func TestFenceConfirmLetsAWaitingLeaderServe(t *testing.T) {
	hook := filepath.Join(t.TempDir(), "hook")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := agenttest.DevOptions(t, "127.0.0.155", 3)
	o.Tune = func(c *config.Config) {
		c.OnLeader, c.OnFollower, c.FenceWatchdog = hook, hook, config.FenceOff
		c.Witness = c.NodeID == "node3"
	}
	d := agenttest.StartDev(t, o, agent.Options{})
	old := agenttest.Leader(t, d, nil, 15*time.Second)
	testutil.WaitFor(t, 10*time.Second, "the leader to serve", func() bool { return old.Node().FenceStatus().Serving })
	oldID := old.Config().NodeID
	var next *agent.Agent
	for _, a := range d.Agents() {
		if a != old && !a.Config().Witness {
			next = a
		}
	}
	old.Kill()
	testutil.WaitFor(t, 20*time.Second, "the other server to lead and wait for the killed one", func() bool {
		return next.Node().Leading() && slices.Contains(next.Node().Promises().Unproven, oldID)
	})
	out, err := runCLI(t, "status", "--admin", next.AdminAddr())
	if err != nil || !strings.Contains(out, "fence promises") || !strings.Contains(out, "WAITING for "+oldID) {
		t.Fatalf("nsmd status while waiting: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "fence", "confirm", next.Config().NodeID, "--admin", next.AdminAddr()); err == nil {
		t.Fatalf("confirming the running leader off was accepted:\n%s", out)
	}
	out, err = runCLI(t, "fence", "confirm", oldID, "--by", "alice", "--admin", next.AdminAddr())
	if err != nil || !strings.Contains(out, oldID+" confirmed off by alice") {
		t.Fatalf("nsmd fence confirm: %v\n%s", err, out)
	}
	testutil.WaitFor(t, 10*time.Second, "the new leader to serve", func() bool { return next.Node().FenceStatus().Serving })
	out, err = runCLI(t, "status", "--admin", next.AdminAddr())
	if err != nil || !strings.Contains(out, oldID+" confirmed off by alice") {
		t.Fatalf("nsmd status after the confirmation: %v\n%s", err, out)
	}
}
