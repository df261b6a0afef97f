package agent_test

import (
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/tickle"
)

const tcpHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

// Two NFS clients (10.1.2.3:800, 10.1.2.4:801) connected to
// 127.0.0.150:2049, and one TIME_WAIT socket, as a little-endian host's
// /proc/net/tcp lists them.
const tcpWithClients = tcpHeader +
	"   0: 9600007F:0801 0302010A:0320 01 00000000:00000000 00:00000000 00000000     0        0 0 1\n" +
	"   1: 9600007F:0801 0402010A:0321 01 00000000:00000000 00:00000000 00000000     0        0 0 1\n" +
	"   2: 9600007F:0801 0502010A:0322 06 00000000:00000000 00:00000000 00000000     0        0 0 1\n"

type tickleSend struct {
	node  string
	conns []tickle.Conn
}

// TestTakeoverTicklesThePreviousHoldersConnections: the VIP holder
// samples its clients' connections, the other nodes fetch them from it,
// and after it is killed the new holder tickles exactly those, once its
// takeover's on_leader succeeded.
func TestTakeoverTicklesThePreviousHoldersConnections(t *testing.T) {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], 1)
	if b[0] != 1 {
		t.Skip("the fixture is a little-endian host's table")
	}
	var mu sync.Mutex
	roots := map[string]string{}
	sends := make(chan tickleSend, 16)
	write := func(root, table string) {
		if err := os.WriteFile(filepath.Join(root, "net", "tcp"), []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
	o := agenttest.DevOptions(t, "127.0.0.150", 3)
	d := agenttest.StartDev(t, o, agent.Options{TuneTickle: func(id string) (string, func(context.Context, []tickle.Conn, tickle.SendConfig) (int, error)) {
		mu.Lock()
		defer mu.Unlock()
		root := filepath.Join(o.DataDir, "proc-"+id)
		os.MkdirAll(filepath.Join(root, "net"), 0o755)
		write(root, tcpWithClients)
		roots[id] = root
		return root, func(_ context.Context, conns []tickle.Conn, _ tickle.SendConfig) (int, error) {
			sends <- tickleSend{id, conns}
			return len(conns), nil
		}
	}})
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	mu.Lock()
	for id, root := range roots {
		if id != lead.Config().NodeID {
			write(root, tcpHeader) // the others have no connections on the VIP
		}
	}
	mu.Unlock()
	for _, a := range d.Agents() {
		testutil.WaitFor(t, 10*time.Second, a.Config().NodeID+" knowing the two connections", func() bool {
			return testutil.GatheredValue(t, a.Registry(), "nsmd_tickle_connections") == 2
		})
	}

	lead.Kill()
	next := agenttest.Leader(t, d, lead, 10*time.Second)
	want := []tickle.Conn{
		{Local: netip.MustParseAddrPort("127.0.0.150:2049"), Remote: netip.MustParseAddrPort("10.1.2.3:800")},
		{Local: netip.MustParseAddrPort("127.0.0.150:2049"), Remote: netip.MustParseAddrPort("10.1.2.4:801")},
	}
	select {
	case s := <-sends:
		if s.node != next.Config().NodeID || !slices.Equal(s.conns, want) {
			t.Fatalf("%s tickled %v, want %s to tickle %v", s.node, s.conns, next.Config().NodeID, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the new VIP holder tickled nothing")
	}
	testutil.WaitFor(t, 5*time.Second, "the tickle ACKs counted", func() bool {
		return testutil.GatheredValue(t, next.Registry(), "nsmd_tickle_acks_sent_total") == 2
	})
	select {
	case s := <-sends:
		t.Fatalf("a second tickle: %+v", s)
	default:
	}
}
