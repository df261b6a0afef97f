package e2e

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestRollingUpgradeFromThePreviousRelease: a cluster of the previous
// release (NSMD_E2E_OLD_BIN; `make e2e` builds it) is upgraded the way
// operators do it, one node at a time — a follower, then the leader, so
// that leadership moves from an old node to a new one and back, and the
// last follower — with fake client hosts monitoring themselves before
// every step and a kill of the leader while the cluster is mixed. After
// each step: one leader, the VIP on it alone, sm_state odd and rising at
// every takeover, every acknowledged SM_MON registered, every node at the
// same applied index with as many registrations, and every client host
// notified of each new state from the VIP (invariants 1–4 and 6, checked
// by checkInvariants across releases).
func TestRollingUpgradeFromThePreviousRelease(t *testing.T) {
	if os.Getenv(clientHostEnv) != "" {
		t.Skip("inside a client host process")
	}
	old := os.Getenv("NSMD_E2E_OLD_BIN")
	if old == "" {
		t.Skip("NSMD_E2E_OLD_BIN (an nsmd of the previous release; make e2e builds it with make prev-release) not set")
	}
	if why := canNetns(); why != "" {
		t.Skip("skipping multi-host tests: " + why)
	}
	bins := map[string]string{}
	for i := 1; i <= clusterNodes; i++ {
		bins[fmt.Sprintf("n%d", i)] = old
	}
	c := startClusterWith(t, clusterSpec{clients: clusterClients, fakeClients: true, bins: bins})
	first := c.settle(t, 60*time.Second, 1)
	c.probeVIP(t, first.leader)
	m := c.watch.Mark()
	leader, st := c.restore(t)
	t.Logf("previous release formed: leader %s, sm_state %d", leader.id, st.SMState)
	c.monAll(t, leader, c.nextTag("old"))
	c.checkInvariants(t, m, false)

	// upgrade restarts n on this release, as a package upgrade does
	// (SIGTERM, then the new binary on the same data directory).
	upgrade := func(n *nsmNode, wasLeader bool) {
		t.Helper()
		m := c.watch.Mark()
		if !n.kill(syscall.SIGTERM, 30*time.Second) {
			t.Fatalf("%s did not stop on SIGTERM", n.id)
		}
		delete(c.spec.bins, n.id)
		n.start(t)
		leader, st := c.checkInvariants(t, m, wasLeader)
		t.Logf("%s upgraded (it led: %v): leader %s, sm_state %d, %d registrations", n.id, wasLeader, leader.id, st.SMState, st.Registrations)
		c.monAll(t, leader, c.nextTag("up-"+n.id))
		c.checkInvariants(t, m, false)
	}

	// A follower first: one new node beside two old ones.
	upgrade(c.others(leader)[0], false)
	if t.Failed() {
		return
	}
	// A mixed cluster survives a crash of its leader, whichever release
	// it runs and whichever wins.
	leader, st = c.restore(t)
	m = c.watch.Mark()
	c.monAll(t, leader, c.nextTag("mixed"))
	if !leader.kill(syscall.SIGKILL, 5*time.Second) {
		t.Fatalf("%s did not die of SIGKILL", leader.id)
	}
	state, _ := c.waitNewState(t, st.SMState, 30*time.Second, c.others(leader))
	t.Logf("mixed cluster: SIGKILL of leader %s (sm_state %d) → %d", leader.id, st.SMState, state)
	leader.start(t)
	c.checkInvariants(t, m, true)
	if t.Failed() {
		return
	}
	// Then the rest, the leader among them, in the order they stand.
	for _, n := range c.nodes {
		if c.spec.bins[n.id] == "" {
			continue
		}
		leader, _ := c.restore(t)
		upgrade(n, n == leader)
		if t.Failed() {
			return
		}
	}
	for _, n := range c.nodes {
		if b := c.spec.bins[n.id]; b != "" {
			t.Fatalf("%s still runs %s", n.id, b)
		}
	}
}
