package agent_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/internal/testutil"
)

// TestClientsSeenOutliveTheirServer: the leader reads when its nfsd's
// NFSv4 clients last renewed their leases (a courtesy client a day ago,
// an active one seconds ago), the other nodes learn it from the leader,
// and after the leader is killed the new leader still knows when each
// was last seen — what its grace status shows for a client it waits for.
func TestClientsSeenOutliveTheirServer(t *testing.T) {
	var mu sync.Mutex
	roots := map[string]string{}
	o := agenttest.DevOptions(t, "127.0.0.151", 3)
	d := agenttest.StartDev(t, o, agent.Options{ClientsSeenProc: func(id string) string {
		mu.Lock()
		defer mu.Unlock()
		roots[id] = filepath.Join(o.DataDir, "proc-"+id) // no nfsd there until written
		return roots[id]
	}})
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	sampled := time.Now()
	mu.Lock()
	root := roots[lead.Config().NodeID]
	mu.Unlock()
	for id, info := range map[string]string{
		"1": "clientid: 0x1\naddress: \"10.1.2.3:800\"\nstatus: courtesy\nseconds from last renew: 93600\nname: \"Linux NFSv4.2 gone\"\nminor version: 2\n",
		"2": "clientid: 0x2\naddress: \"10.1.2.4:800\"\nstatus: confirmed\nseconds from last renew: 3\nname: \"Linux NFSv4.1 busy\"\nminor version: 1\n",
	} {
		dir := filepath.Join(root, "fs", "nfsd", "clients", id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "info"), []byte(info), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range d.Agents() {
		testutil.WaitFor(t, 20*time.Second, a.Config().NodeID+" knowing when both clients were seen", func() bool {
			return testutil.GatheredValue(t, a.Registry(), "nsmd_nfsv4_clients_seen") == 2
		})
	}
	lead.Kill()
	next := agenttest.Leader(t, d, lead, 15*time.Second)
	got, ok := next.ClientLastSeen("Linux NFSv4.2 gone")
	want := sampled.Add(-26 * time.Hour)
	if !ok || got.Before(want.Add(-time.Second)) || got.After(want.Add(10*time.Second)) {
		t.Fatalf("new leader %s: the courtesy client last seen %v (known %v), want about %v", next.Config().NodeID, got, ok, want)
	}
	if got, ok := next.ClientLastSeen("Linux NFSv4.1 busy"); !ok || time.Since(got) > time.Minute {
		t.Fatalf("new leader: the active client last seen %v (known %v)", got, ok)
	}
	if _, ok := next.ClientLastSeen("Linux NFSv4.0 never"); ok {
		t.Fatal("a client nobody saw has a last-seen time")
	}
}
