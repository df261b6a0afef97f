package bench_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/bench"
	"github.com/nsmd/nsmd/bench/drill"
)

// TestBenchFailoverOwnClusterKill: without --admin each kill gets a fresh
// in-process cluster, so every asked run happens.
func TestBenchFailoverOwnClusterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two clusters")
	}
	t.Parallel()
	rep, err := bench.RunFailover(context.Background(), bench.FailoverOptions{
		Drill: drill.Options{Fault: drill.FaultKill, Runs: 2, Timeout: 10 * time.Second, Poll: 10 * time.Millisecond},
		Nodes: 3, VIP: "127.0.0.132", DataDir: t.TempDir(), LogLevel: "none", LogTo: io.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 2 || rep.Stopped != "" || rep.Failed() != 0 || rep.Failover.N != 2 {
		t.Fatalf("runs %+v stopped %q", rep.Runs, rep.Stopped)
	}
	for i, r := range rep.Runs {
		if r.Run != i+1 || r.NewLeader == r.OldLeader || r.NewState != r.OldState+2 {
			t.Errorf("run %+v", r)
		}
	}
	var table bytes.Buffer
	if err := bench.PrintFailover(&table, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "kill → VIP answers SM_STAT with the new state: p50 ") {
		t.Errorf("table:\n%s", table.String())
	}
}
