package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// serveOn makes node id the serving leader of fc (a planned transfer to
// it when another node took over first) and returns its takeover.
func (fc *fencedCluster) serveOn(t *testing.T, id string) takeoverEvent {
	t.Helper()
	ev := fc.waitTakeover(10 * time.Second)
	for ev.node != id {
		li := nodeIndex(fc.tcluster, ev.node)
		if err := fc.nodes[li].n.TransferLeadership(id); err != nil {
			t.Logf("transfer to %s: %v (retrying)", id, err)
		}
		ev = fc.waitTakeover(20 * time.Second)
	}
	m := fc.machines[id]
	testutil.WaitFor(t, 5*time.Second, id+" to feed its watchdog", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.armed && m.feeds > 0
	})
	return ev
}

// The old server promised an 8 s watchdog, its successors were set up
// with 2 s: a successor waits by the old server's promise, never by its
// own shorter one, so it serves only after the old host was reset. The
// negative control — successors waiting by their own 2 s, as before
// promises travelled — serves while the killed server's host still
// serves (two servers on one filesystem).
func TestSuccessorWaitsByTheOldServersLongerWatchdogPromise(t *testing.T) {
	for _, control := range []bool{false, true} {
		name := "promise"
		if control {
			name = "control: own settings only"
		}
		t.Run(name, func(t *testing.T) {
			timeouts := func(id string) time.Duration {
				if id == "n1" {
					return 8 * time.Second
				}
				return 2 * time.Second
			}
			fc := newFencedClusterEach(t, 3, timeouts, func(cfg *Config) { cfg.ownSettingsOnly = control })
			fc.serveOn(t, "n1")
			if r, ok := fc.nodes[1].n.fsm.ServingRecordOf("n1"); !ok || r.Promise.WatchdogTimeout != 8*time.Second {
				t.Fatalf("n2 sees n1's serving record %+v (%v), want its 8 s promise", r, ok)
			}
			fc.killNode(0)
			next := fc.waitTakeover(30 * time.Second)
			resetAt := fc.machines["n1"].servedUntil()
			if resetAt.IsZero() {
				t.Fatal("the killed n1's host was not serving")
			}
			overlap := resetAt.Sub(next.at)
			if control {
				if overlap <= 0 {
					t.Fatalf("the control would miss it: %s served %v after n1's reset", next.node, -overlap)
				}
				t.Logf("caught: %s served %v before the killed n1's 8 s watchdog reset it", next.node, overlap.Round(time.Millisecond))
				return
			}
			if overlap > 0 {
				t.Fatalf("%s served %v before the killed n1's watchdog reset it: two servers", next.node, overlap)
			}
			p := fencedBy(fc.nodes[nodeIndex(fc.tcluster, next.node)].n.FenceStatus().LastWait, "n1")
			if p.By != "watchdog" {
				t.Fatalf("n1 proven stopped by %+v, want its watchdog bound", p)
			}
			t.Logf("%s served %v after the killed n1 was reset (%s)", next.node, (-overlap).Round(time.Millisecond), p.Detail)
		})
	}
}

// A successor that runs with fence_watchdog off still waits for a killed
// server that promised a watchdog: by that server's bound. The control
// (own settings: off, nothing to wait for) serves beside it.
func TestSuccessorWithWatchdogOffWaitsByTheOldServersWatchdog(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "promise", true: "control: own settings only"}[control], func(t *testing.T) {
			timeouts := func(id string) time.Duration {
				if id == "n1" {
					return 3 * time.Second
				}
				return 0 // fence_watchdog: off
			}
			fc := newFencedClusterEach(t, 3, timeouts, func(cfg *Config) { cfg.ownSettingsOnly = control })
			fc.serveOn(t, "n1")
			fc.killNode(0)
			next := fc.waitTakeover(30 * time.Second)
			resetAt := fc.machines["n1"].servedUntil()
			if overlap := resetAt.Sub(next.at); control != (overlap > 0) {
				t.Fatalf("control=%v: %s served at %v, n1 reset at %v", control, next.node, next.at, resetAt)
			}
		})
	}
}

// A serving peer whose promise this node does not know — no serving
// record (the cluster cannot record them yet: a member below level 2)
// and no gossip (an earlier release advertises none) — is unproven even
// though this node's own settings have a watchdog bound: the successor
// serves only once an operator confirms it off. The confirmation is kept
// by the leader for its term (it cannot be committed yet).
func TestUnknownPromiseIsUnprovenUntilAnOperatorConfirms(t *testing.T) {
	fc := newFencedCluster(t, 3, 2*time.Second, func(cfg *Config) { cfg.staticRecords = false })
	first := fc.waitTakeover(10 * time.Second)
	fc.killNode(nodeIndex(fc.tcluster, first.node))
	_, ln := fc.leader(10 * time.Second)
	testutil.WaitFor(t, 5*time.Second, "the new leader to wait for the killed server", func() bool {
		return slices.Contains(ln.n.Promises().Unproven, first.node)
	})
	select {
	case ev := <-fc.takeovers:
		t.Fatalf("%s served although %s's promise is unknown and nobody confirmed it off", ev.node, first.node)
	case <-time.After(6 * time.Second): // well past its own 2 s bound
	}
	if err := ln.n.ConfirmOff(context.Background(), first.node, "op"); err != nil {
		t.Fatal(err)
	}
	next := fc.waitTakeover(10 * time.Second)
	if next.node != ln.id {
		t.Fatalf("%s served, want the waiting leader %s", next.node, ln.id)
	}
	if _, ok := ln.n.fsm.Confirmed(first.node); ok {
		t.Fatal("the confirmation was committed although the cluster cannot record one")
	}
	if v := ln.n.Promises(); len(v.Confirmations) != 1 || v.Confirmations[0].Node != first.node {
		t.Fatalf("status confirmations %+v, want the one kept for this term", v.Confirmations)
	}
}

// An operator cannot confirm off a node that is running: this node, the
// leader, or one that answers that it serves.
func TestConfirmOffRefusesARunningNode(t *testing.T) {
	fc := newFencedCluster(t, 3, 2*time.Second, nil)
	first := fc.waitTakeover(10 * time.Second)
	li := nodeIndex(fc.tcluster, first.node)
	other := fc.nodes[(li+1)%3]
	for _, node := range []string{other.id, first.node, ""} {
		if err := other.n.ConfirmOff(context.Background(), node, "op"); err == nil {
			t.Errorf("confirming %q off was accepted", node)
		}
	}
	if cs := fc.nodes[li].n.fsm.Confirmations(); len(cs) != 0 {
		t.Fatalf("confirmations %+v after refusals", cs)
	}
}

// The node that served is fenced even if it left the configuration: its
// stop failed (so it keeps its serving record), it was removed from the
// raft configuration, and the next leader still proves it stopped. The
// control — the fence list of serving voters only — does not name it.
func TestANodeThatLeftWhileRecordedAsServingIsStillFenced(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "promise", true: "control: serving voters only"}[control], func(t *testing.T) {
			fc := newFencedCluster(t, 3, 2*time.Second, func(cfg *Config) { cfg.ownSettingsOnly = control })
			fc.serveOn(t, "n1")
			m := fc.machines["n1"]
			m.mu.Lock()
			m.stopErr = errorString("umount: target is busy")
			m.mu.Unlock()
			if err := fc.nodes[0].n.TransferLeadership("n2"); err != nil {
				t.Fatal(err)
			}
			next := fc.waitTakeover(20 * time.Second)
			testutil.WaitFor(t, 5*time.Second, "n1's stop to fail", func() bool { return fc.nodes[0].n.FenceStatus().StopFailed })
			ni := nodeIndex(fc.tcluster, next.node)
			ln := fc.nodes[ni].n
			if err := ln.raft.RemoveServer("n1", 0, 5*time.Second).Error(); err != nil {
				t.Fatalf("remove n1: %v", err)
			}
			if _, ok := ln.fsm.ServingRecordOf("n1"); !ok {
				t.Fatal("n1's serving record is gone although its stop failed")
			}
			names := []string{}
			for _, p := range ln.fenceList() {
				names = append(names, p.Node)
			}
			if slices.Contains(names, "n1") == control {
				t.Fatalf("control=%v: fence list %v", control, names)
			}
		})
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// Kinds 15–17 are never proposed while a member does not apply them: a
// static cluster without recorded levels commits no serving record, and
// its leader still serves (waiting by what it can prove).
func TestNoServingRecordWhileAMemberCannotApplyIt(t *testing.T) {
	fc := newFencedCluster(t, 3, 2*time.Second, func(cfg *Config) { cfg.staticRecords = false })
	first := fc.waitTakeover(10 * time.Second)
	for _, tn := range fc.nodes {
		if recs := tn.n.fsm.ServingRecords(); len(recs) != 0 {
			t.Fatalf("%s applied serving records %+v although the gate is closed", tn.id, recs)
		}
	}
	// And with the gate open, the serving leader's record is there, with
	// its promise.
	fc2 := newFencedCluster(t, 3, 2*time.Second, nil)
	first = fc2.waitTakeover(10 * time.Second)
	li := nodeIndex(fc2.tcluster, first.node)
	testutil.WaitFor(t, 5*time.Second, "every node to apply the serving record", func() bool {
		for _, tn := range fc2.nodes {
			r, ok := tn.n.fsm.ServingRecordOf(first.node)
			if !ok || r.Promise.Mode != fsm.FenceWatchdog || r.Promise.WatchdogTimeout != 2*time.Second {
				return false
			}
		}
		return true
	})
	// A clean stop clears it.
	if err := fc2.nodes[li].n.TransferLeadership(""); err != nil {
		t.Fatal(err)
	}
	next := fc2.waitTakeover(10 * time.Second)
	testutil.WaitFor(t, 5*time.Second, "the old server's record to be cleared after its clean stop", func() bool {
		_, ok := fc2.nodes[nodeIndex(fc2.tcluster, next.node)].n.fsm.ServingRecordOf(first.node)
		return !ok
	})
}

// Rolling upgrade: in a gossip cluster whose members all advertise
// fsm.CommandLevel 2, the serving leader's record (kind 15) is committed,
// with the promise every member also reads from its gossip metadata; with
// one member advertising level 0 (an earlier release) no kind 15–17 entry
// is ever proposed — the leader still serves, waiting by the promises
// gossip carries — and an operator's confirmation is kept by the leader
// instead of committed.
func TestServingRecordsOnlyOnceEveryMemberAppliesThem(t *testing.T) {
	for _, older := range []bool{false, true} {
		t.Run(map[bool]string{false: "every member at level 2", true: "one member at level 0"}[older], func(t *testing.T) {
			served := make(chan string, 8)
			_, nodes := formGossipClusterTuned(t, func(id string, cfg *Config) {
				cfg.olderFSM = older && id == "r3"
				cfg.ServesStorage = true
				// A fake watchdog device (fence/fencetest's kernel is not
				// needed here: nothing is killed).
				cfg.Watchdog, cfg.FenceTimeout = &machine{timeout: 2 * time.Second}, 2*time.Second
				serverOf(cfg).serve = func(context.Context, fsm.Takeover, int32) error { served <- id; return nil }
			}, "r1", "r2", "r3")
			var who string
			select {
			case who = <-served:
			case <-time.After(20 * time.Second):
				t.Fatal("nobody served")
			}
			var leader *Node
			for _, n := range nodes {
				if n.ID() == who {
					leader = n
				}
			}
			for _, n := range nodes {
				if n == leader {
					continue
				}
				if p := n.peerPromise(who); p.Promise.Mode != fsm.FenceWatchdog || p.Promise.WatchdogTimeout != 2*time.Second {
					t.Errorf("%s knows %s's promise as %+v, want a 2 s watchdog", n.ID(), who, p)
				}
			}
			if older {
				testutil.HoldsFor(t, time.Second, 100*time.Millisecond, "no serving record", func() (bool, string) {
					for _, n := range nodes {
						if recs := n.fsm.ServingRecords(); len(recs) > 0 {
							return false, fmt.Sprintf("%s applied %+v", n.ID(), recs)
						}
					}
					return true, ""
				})
				if err := leader.ConfirmOff(context.Background(), "gone", "op"); err != nil {
					t.Fatal(err)
				}
				if _, ok := leader.fsm.Confirmed("gone"); ok {
					t.Fatal("a confirmation was committed although a member cannot apply it")
				}
				return
			}
			testutil.WaitFor(t, 5*time.Second, "every member to apply the leader's serving record", func() bool {
				for _, n := range nodes {
					if r, ok := n.fsm.ServingRecordOf(who); !ok || r.Promise.WatchdogTimeout != 2*time.Second {
						return false
					}
				}
				return true
			})
		})
	}
}
