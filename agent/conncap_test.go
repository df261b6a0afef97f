package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
)

// TestNSMConnectionFloodLeavesRoomForLockManagers: a hostile peer opens
// far more NSM TCP connections than the caps allow — 300 from one address,
// then 8 from each of 6 others — and holds them idle; the node's lock
// manager (127.0.0.1) still gets its SM_STAT answered every time, the
// excess is refused or evicted, and the metric says which.
func TestNSMConnectionFloodLeavesRoomForLockManagers(t *testing.T) {
	o := agenttest.DevOptions(t, "127.0.0.45", 1)
	o.Tune = func(c *config.Config) { c.NSMMaxConns, c.NSMMaxConnsHost = 32, 8 }
	d := agenttest.StartDev(t, o, agent.Options{Logger: agenttest.Logger(slog.LevelError)})
	a := agenttest.Leader(t, d, nil, 10*time.Second)
	addr := a.NSMAddr().String()
	ctx := context.Background()
	stat := func(when string) {
		t.Helper()
		if _, err := agenttest.SMStat(ctx, "tcp", addr); err != nil {
			t.Fatalf("%s: SM_STAT over TCP from the lock manager: %v", when, err)
		}
	}
	stat("before the flood")

	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	dialFrom := func(src string, n int) {
		for range n {
			c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
	}
	dialFrom("127.0.0.66", 300)
	stat("after 300 connections from one address")
	for i := range 6 {
		dialFrom(fmt.Sprintf("127.0.0.%d", 70+i), 8)
	}
	stat("after 48 more from six addresses")

	// The accept loop counts before it serves the next connection, and
	// our last SM_STAT was answered on a later one: all counted.
	perHost := testutil.GatheredValue(t, a.Registry(), "nsmd_nsm_tcp_connections_total", "event", "refused_per_host")
	evicted := testutil.GatheredValue(t, a.Registry(), "nsmd_nsm_tcp_connections_total", "event", "evicted_idle")
	if perHost < 292 || evicted < 1 {
		t.Fatalf("refused_per_host %v (want ≥ 292), evicted_idle %v (want ≥ 1)", perHost, evicted)
	}
	if open := a.NSMConns(); open > 32 {
		t.Fatalf("%d connections open, cap 32", open)
	}
	t.Logf("flood of 348 connections: %v refused per host, %v idle ones evicted, %d open; every SM_STAT from the lock manager answered", perHost, evicted, a.NSMConns())
}
