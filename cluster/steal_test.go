package cluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// serveNSM serves an NSM service of node tn (its Node as the Registry, as
// the agent wires it) on a fresh loopback TCP port and returns its address.
func serveNSM(t *testing.T, tn *tnode) string {
	t.Helper()
	svc, err := nsm.NewService(tn.n.Registry(), nsm.Config{NodeID: tn.id})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := oncrpc.NewServer(oncrpc.Programs{nsm.Program: svc}, oncrpc.ServerConfig{})
	go srv.ServeTCP(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return ln.Addr().String()
}

// nsmCall makes one NSM call to addr from loopback, from a privileged
// source port for lockd.
func nsmCall(t *testing.T, addr string, lockd bool, proc uint32, args oncrpc.Marshaler, res oncrpc.Unmarshaler) {
	t.Helper()
	c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: addr,
		LocalAddr: netip.MustParseAddr("127.0.0.1"), Privileged: lockd, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, proc, args, res); err != nil {
		t.Fatal(err)
	}
}

// TestMonThroughAnotherMemberStealsNothing replays the attack on a real
// cluster (raft, forwarding over TCP, the NSM service over each node): the
// serving node's lockd monitors five clients; a local user on each other
// member sends SM_MON naming the serving node's lockd for each client
// (forwarded to the leader), then SM_UNMON_ALL there. Every registration
// is left with the serving node and lockd's cookie, and each stolen SM_MON
// is answered stat_fail. This cluster has no gossip, so no member is known
// to apply kind 14 and the leader decides on its state (lowerRegister).
// The control — SM_MON unguarded, as the releases before — loses every
// one. Then the legitimate case: after a takeover, the new serving node's
// lockd re-monitors a client with the same my_name, and it must take the
// registration over (the callback must reach the lockd that holds the
// locks now), while the old server's lockd can no longer take it back.
func TestMonThroughAnotherMemberStealsNothing(t *testing.T) {
	hosts := []string{"10.9.0.1", "10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.5"}
	srv := nsm.MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}
	lockdCookie := [16]byte{1, 2, 3}
	for _, guarded := range []bool{true, false} {
		t.Run(fmt.Sprintf("guarded=%v", guarded), func(t *testing.T) {
			c := newTestCluster(t, 3, func(cfg *Config) { cfg.unguardedMonitor = !guarded })
			c.waitTakeover(10 * time.Second)
			li, ld := c.leader(10 * time.Second)
			addrs := make([]string, len(c.nodes))
			for i, tn := range c.nodes {
				addrs[i] = serveNSM(t, tn)
			}
			testutil.WaitFor(t, 10*time.Second, "every node ready", func() bool {
				for _, tn := range c.nodes {
					if !tn.n.Ready() {
						return false
					}
				}
				return true
			})
			for _, h := range hosts {
				var res nsm.SMStatRes
				nsmCall(t, addrs[li], true, nsm.ProcMon, &nsm.Mon{ID: nsm.MonID{MonName: h, My: srv}, Priv: lockdCookie}, &res)
				if res.Res != nsm.StatSucc {
					t.Fatalf("lockd's SM_MON %s: %+v", h, res)
				}
			}
			for i := range c.nodes {
				if i == li {
					continue
				}
				for _, h := range hosts {
					var res nsm.SMStatRes
					nsmCall(t, addrs[i], false, nsm.ProcMon, &nsm.Mon{ID: nsm.MonID{MonName: h, My: srv}, Priv: [16]byte{15: 0xee}}, &res)
					if guarded && res.Res != nsm.StatFail {
						t.Fatalf("SM_MON of %s through %s naming the serving node's lockd: %+v, want stat_fail", h, c.nodes[i].id, res)
					}
				}
				var st nsm.SMStat
				nsmCall(t, addrs[i], false, nsm.ProcUnmonAll, &srv, &st)
			}
			c.converge(10 * time.Second)
			kept := func(tn *tnode, owner string, cookie [16]byte) int {
				n := 0
				for _, g := range tn.n.fsm.Registrations(fsm.MonID{}, 0, "") {
					if g.Node == owner && g.Priv == cookie {
						n++
					}
				}
				return n
			}
			for _, tn := range c.nodes {
				got := kept(tn, ld.id, lockdCookie)
				if guarded && got != len(hosts) {
					t.Fatalf("%s: %d of %d of the serving node's registrations left", tn.id, got, len(hosts))
				}
				if !guarded && got != 0 {
					t.Fatalf("control: %s kept %d registrations; the unguarded attack must remove them all", tn.id, got)
				}
			}
			if !guarded {
				return
			}

			// A takeover; the new serving node's lockd re-monitors a host.
			fi := (li + 1) % len(c.nodes)
			if err := ld.n.TransferLeadership(c.nodes[fi].id); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, 10*time.Second, c.nodes[fi].id+" to serve", func() bool {
				return c.nodes[fi].n.Leading() && c.nodes[fi].n.View().LastTakeover().Node == c.nodes[fi].id
			})
			newCookie := [16]byte{4, 5, 6}
			var res nsm.SMStatRes
			nsmCall(t, addrs[fi], true, nsm.ProcMon, &nsm.Mon{ID: nsm.MonID{MonName: hosts[0], My: srv}, Priv: newCookie}, &res)
			if res.Res != nsm.StatSucc {
				t.Fatalf("the new serving node's lockd re-monitoring %s: %+v", hosts[0], res)
			}
			nsmCall(t, addrs[li], true, nsm.ProcMon, &nsm.Mon{ID: nsm.MonID{MonName: hosts[0], My: srv}, Priv: lockdCookie}, &res)
			if res.Res != nsm.StatFail {
				t.Fatalf("the old server's lockd took %s back: %+v", hosts[0], res)
			}
			c.converge(10 * time.Second)
			for _, tn := range c.nodes {
				if kept(tn, c.nodes[fi].id, newCookie) != 1 || kept(tn, ld.id, lockdCookie) != len(hosts)-1 {
					t.Fatalf("%s: registrations %v", tn.id, tn.n.fsm.Registrations(fsm.MonID{}, 0, ""))
				}
			}
		})
	}
}
