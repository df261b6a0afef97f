package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
)

// servingHooks writes an on_leader and an on_follower script into dir;
// on_follower fails on node ID while dir/fail-ID exists (an unmount that
// finds the filesystem busy).
func servingHooks(t *testing.T, dir string) (leader, follower string) {
	t.Helper()
	leader, follower = filepath.Join(dir, "on-leader"), filepath.Join(dir, "on-follower")
	if err := os.WriteFile(leader, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf("#!/bin/sh\nif [ -e %q/fail-\"$NSMD_NODE_ID\" ]; then echo 'umount: target is busy' >&2; exit 32; fi\nexit 0\n", dir)
	if err := os.WriteFile(follower, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return leader, follower
}

type (
	agentServer = cluster.ServerPromise
	fencedPeer  = cluster.FencedPeer
)

func failStopOf(t *testing.T, dir, id string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "fail-"+id), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func servingAgent(d *agent.Dev, skip *agent.Agent) *agent.Agent {
	for _, a := range d.Agents() {
		if a != skip && a.Node().FenceStatus().Serving && a.Node().Leading() {
			return a
		}
	}
	return nil
}

// restart starts a's node again on its data directory (a rebooted
// server), retrying while its ports are still being released.
func restart(t *testing.T, a *agent.Agent) *agent.Agent {
	t.Helper()
	var b *agent.Agent
	testutil.WaitFor(t, 15*time.Second, "the node to start again", func() bool {
		var err error
		b, err = agent.Start(a.Config(), agent.Options{Logger: agenttest.Logger(slog.LevelWarn)})
		return err == nil
	})
	t.Cleanup(func() { b.Close() })
	return b
}

// A node whose stop fails at shutdown while the other server is cut off
// (down: no successor to hand over to) is still fenced by the next
// leader: it does not announce a leave, so it stays a voter, and its
// serving record — fencing off, so no watchdog bound — keeps the next
// leader from serving until an operator confirms it off. (Servers with
// fence_watchdog off and no agent; a witness gives the pair its quorum.)
func TestANodeWhoseStopFailedAtShutdownIsFencedByTheNextLeader(t *testing.T) {
	dir := t.TempDir()
	leader, follower := servingHooks(t, dir)
	o := agenttest.DevOptions(t, "127.0.0.153", 3)
	o.Tune = func(c *config.Config) {
		c.OnLeader, c.OnFollower, c.FenceWatchdog = leader, follower, config.FenceOff
		c.Witness = c.NodeID == "node3"
	}
	d := agenttest.StartDev(t, o, agent.Options{})
	var old *agent.Agent
	testutil.WaitFor(t, 15*time.Second, "a server to serve", func() bool { old = servingAgent(d, nil); return old != nil })
	oldID := old.Config().NodeID
	testutil.WaitFor(t, 5*time.Second, "its serving record on every node", func() bool {
		for _, a := range d.Agents() {
			if v := a.Node().Promises(); !slices.ContainsFunc(v.Servers, func(s agentServer) bool { return s.Node == oldID && s.Serving }) && a != old {
				return false
			}
		}
		return true
	})
	var other *agent.Agent
	for _, a := range d.Agents() {
		if a != old && !a.Config().Witness {
			other = a
		}
	}
	other.Kill() // the other server is cut off: nobody to hand over to
	failStopOf(t, dir, oldID)
	old.Close() // graceful: ends its term, on_follower fails
	if !old.Node().FenceStatus().StopFailed {
		t.Fatal("the old server's stop did not fail")
	}

	next := restart(t, other)
	testutil.WaitFor(t, 20*time.Second, "the restarted server to lead and wait", func() bool {
		return next.Node().Leading() && slices.Contains(next.Node().Promises().Unproven, oldID)
	})
	voters, err := next.Node().Voters()
	if err != nil || !slices.Contains(voters, oldID) {
		t.Fatalf("voters %v (%v): the node whose stop failed left the configuration", voters, err)
	}
	testutil.HoldsFor(t, 3*time.Second, 100*time.Millisecond, "the new leader not to serve", func() (bool, string) {
		return !next.Node().FenceStatus().Serving, "it serves beside a node whose stop failed"
	})
	if err := next.Node().ConfirmOff(context.Background(), oldID, "test operator"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the new leader to serve once the operator confirmed", func() bool {
		return next.Node().FenceStatus().Serving
	})
	if w := next.Node().FenceStatus().LastWait; w == nil || !slices.ContainsFunc(w.Nodes, func(p fencedPeer) bool { return p.Node == oldID && p.By == "confirmed" }) {
		t.Fatalf("last wait %+v: want %s proven stopped by the operator's confirmation", w, oldID)
	}
}

// The two-voter graceful leave: a pair without a witness, the serving
// node stops gracefully. When its stop succeeds it hands over, clears its
// serving record and leaves, and the survivor serves alone (the leaver
// removed from the configuration). When its stop fails it does not
// leave: it stays a voter, so the survivor can neither drop it from the
// configuration nor serve without it (no quorum, and its record stands).
func TestTwoVoterGracefulLeave(t *testing.T) {
	for _, stopFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("stop_fails=%v", stopFails), func(t *testing.T) {
			dir := t.TempDir()
			leader, follower := servingHooks(t, dir)
			o := agenttest.DevOptions(t, "127.0.0.154", 2)
			o.Tune = func(c *config.Config) {
				c.OnLeader, c.OnFollower, c.FenceWatchdog = leader, follower, config.FenceOff
			}
			d := agenttest.StartDev(t, o, agent.Options{})
			var old *agent.Agent
			testutil.WaitFor(t, 15*time.Second, "a server to serve", func() bool { old = servingAgent(d, nil); return old != nil })
			oldID := old.Config().NodeID
			var other *agent.Agent
			for _, a := range d.Agents() {
				if a != old {
					other = a
				}
			}
			if stopFails {
				failStopOf(t, dir, oldID)
			}
			old.Close()
			if !stopFails {
				testutil.WaitFor(t, 20*time.Second, "the survivor to serve alone", func() bool {
					v, _ := other.Node().Voters()
					return other.Node().FenceStatus().Serving && !slices.Contains(v, oldID)
				})
				if slices.ContainsFunc(other.Node().Promises().Servers, func(s agentServer) bool { return s.Node == oldID && s.Serving }) {
					t.Fatalf("%s still recorded as serving after its clean stop", oldID)
				}
				return
			}
			testutil.HoldsFor(t, 5*time.Second, 100*time.Millisecond, "the survivor neither to serve nor to drop the node whose stop failed", func() (bool, string) {
				v, _ := other.Node().Voters()
				if !slices.Contains(v, oldID) {
					return false, fmt.Sprintf("voters %v: %s was removed", v, oldID)
				}
				return !other.Node().FenceStatus().Serving, "the survivor serves"
			})
		})
	}
}
