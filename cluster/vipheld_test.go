package cluster

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

// vipPeer answers fwdProcVIPHeld "not held" as a test says: with the MAC
// mac makes for the asker's nonce, or (bare) as a node of the previous
// release does, a bool and nothing else.
type vipPeer struct {
	mac  func(nonce []byte) []byte
	bare bool
}

func (p vipPeer) ServeRPC(_ context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	if c.Proc != fwdProcVIPHeld {
		return oncrpc.ErrProcUnavail
	}
	if p.bare {
		res.Bool(false)
		return nil
	}
	var args vipHeldArgs
	if err := args.UnmarshalXDR(c.Args); err != nil {
		return err
	}
	out := vipHeldRes{}
	if p.mac != nil {
		out.MAC = p.mac(args.Nonce)
	}
	out.MarshalXDR(res)
	return nil
}

// askPeer asks a vipPeer at a fresh address, as an asker with key would.
func askPeer(t *testing.T, p oncrpc.Handler, key []byte) (bool, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := oncrpc.NewServer(oncrpc.Programs{ForwardProgram: p}, oncrpc.ServerConfig{})
	go srv.ServeTCP(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: ln.Addr().String(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	asker := &Node{cfg: Config{NodeID: "n3", ClusterKey: key}}
	return asker.askVIPHeld(context.Background(), c, "n1")
}

// TestForgedVIPReleasedAnswersAreNotBelieved: a new leader takes the VIP
// at once when the previous leader answers that it released it, so with a
// cluster key that answer must come from that node, now. "Not held"
// without a MAC (a forgery, or a node of the previous release, which
// sends only the bool), with another key's, made for another nonce (a
// replay), by another node, saying "held", or SERVING's MAC for the same
// nonce (another question's answer) is not believed: the asker waits the
// VIP's lifetime out. The control, n1's own MAC, is believed; without a
// cluster key (insecure) the bare answer is too, as before.
func TestForgedVIPReleasedAnswersAreNotBelieved(t *testing.T) {
	key := []byte("test-cluster-key")
	recorded := make([]byte, servingNonceLen)
	for _, tc := range []struct {
		name    string
		peer    vipPeer
		believe bool
	}{
		{"no MAC", vipPeer{}, false},
		{"previous release: bare bool", vipPeer{bare: true}, false},
		{"another key", vipPeer{mac: func(n []byte) []byte { return answerMAC([]byte("other"), vipHeldMACLabel, "n1", n, false) }}, false},
		{"replayed", vipPeer{mac: func([]byte) []byte { return answerMAC(key, vipHeldMACLabel, "n1", recorded, false) }}, false},
		{"another node's", vipPeer{mac: func(n []byte) []byte { return answerMAC(key, vipHeldMACLabel, "n2", n, false) }}, false},
		{"MAC says held", vipPeer{mac: func(n []byte) []byte { return answerMAC(key, vipHeldMACLabel, "n1", n, true) }}, false},
		{"SERVING's answer", vipPeer{mac: func(n []byte) []byte { return servingMAC(key, "n1", n, false) }}, false},
		{"control: n1's own", vipPeer{mac: func(n []byte) []byte { return answerMAC(key, vipHeldMACLabel, "n1", n, false) }}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held, err := askPeer(t, tc.peer, key)
			switch {
			case tc.believe && (err != nil || held):
				t.Fatalf("n1's own answer: held %v, err %v; want believed: not held", held, err)
			case !tc.believe && (!errors.Is(err, errVIPHeldUnproven) || !held):
				t.Fatalf("a forged answer gave held %v, err %v; want errVIPHeldUnproven and held", held, err)
			}
		})
	}
	t.Run("insecure: no key, the bare answer is believed", func(t *testing.T) {
		if held, err := askPeer(t, vipPeer{bare: true}, nil); err != nil || held {
			t.Fatalf("held %v, err %v; want not held", held, err)
		}
	})
}

// TestAnswerMACIsServingsUnderItsLabel: the shared construction gives
// SERVING's MAC under SERVING's label, and another under the VIP
// question's (no answer to one stands for the other).
func TestAnswerMACIsServingsUnderItsLabel(t *testing.T) {
	key, nonce := []byte("k"), []byte("0123456789abcdef")
	for _, ans := range []bool{false, true} {
		if string(answerMAC(key, "nsmd-serving-v1", "n1", nonce, ans)) != string(servingMAC(key, "n1", nonce, ans)) {
			t.Fatalf("answerMAC with SERVING's label differs from servingMAC (answer %v)", ans)
		}
		if string(answerMAC(key, vipHeldMACLabel, "n1", nonce, ans)) == string(servingMAC(key, "n1", nonce, ans)) {
			t.Fatal("the VIP answer's MAC equals SERVING's")
		}
	}
}

// TestVIPQuestionOfThePreviousReleaseGetsTheBareBool: a leader of the
// previous release asks with no argument and reads one bool; a node of
// this release answers it exactly that (4 bytes), and a nonce too short
// to prove anything is refused as garbage.
func TestVIPQuestionOfThePreviousReleaseGetsTheBareBool(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.waitTakeover(10 * time.Second)
	_, lead := c.leader(5 * time.Second)
	for _, tc := range []struct {
		name string
		args oncrpc.Marshaler
		size int
		err  error
	}{
		{"void (previous release)", oncrpc.Void{}, 4, nil},
		{"nonce", &vipHeldArgs{Nonce: make([]byte, servingNonceLen)}, 4 + 4 + 32, nil},
		{"short nonce", &vipHeldArgs{Nonce: []byte("short")}, 0, oncrpc.ErrGarbageArgs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: lead.nsmAddr, Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			var raw rawRes
			err = cl.Call(context.Background(), ForwardProgram.Prog, ForwardProgram.Vers, fwdProcVIPHeld, tc.args, &raw)
			if !errors.Is(err, tc.err) || (tc.err == nil && len(raw.b) != tc.size) {
				t.Fatalf("reply %d bytes, err %v; want %d bytes, err %v", len(raw.b), err, tc.size, tc.err)
			}
		})
	}
	if !askVIPHeld(t, lead.nsmAddr) { // the previous release's question, read as it reads it
		t.Fatal("the leader answers the previous release's question: not held")
	}
}

// rawRes keeps a reply's result bytes.
type rawRes struct{ b []byte }

func (r *rawRes) UnmarshalXDR(rd *oncrpc.Reader) error {
	r.b = make([]byte, rd.Remaining())
	rd.FixedOpaque(r.b)
	return rd.Err()
}

// TestPlannedHandOverTakesTheVIPAtOnceWithTheAuthenticatedAnswer: with a
// cluster key and a VIP whose copy would outlive its holder by a minute,
// a planned transfer still hands the VIP over at once: the old leader's
// authenticated "not held" is believed.
func TestPlannedHandOverTakesTheVIPAtOnceWithTheAuthenticatedAnswer(t *testing.T) {
	vips := map[string]*lifeVIP{}
	var mu sync.Mutex
	c := newTestCluster(t, 3, func(cfg *Config) {
		mu.Lock()
		defer mu.Unlock()
		if vips[cfg.NodeID] == nil {
			vips[cfg.NodeID] = &lifeVIP{}
		}
		cfg.VIP = vips[cfg.NodeID]
	})
	c.waitTakeover(10 * time.Second)
	li, _ := c.leader(5 * time.Second)
	mu.Lock()
	for _, v := range vips {
		v.life.Store(int64(time.Minute))
	}
	mu.Unlock()
	if err := c.nodes[li].n.TransferLeadership(""); err != nil {
		t.Fatal(err)
	}
	_, next := c.leader(10 * time.Second)
	testutil.WaitFor(t, 15*time.Second, next.id+" to take the VIP (well before the minute a lost copy would live)", next.n.VIPHeld)
}

// TestUnprovenVIPReleaseMeansWaiting: the hand-over itself
// (previousHolderReleased) skips the VIP's lifetime only on the previous
// leader's authenticated "not held"; the bare answer of a previous-release
// node (or of anyone speaking for it) means waiting. The control: the
// same peer with its MAC is believed.
func TestUnprovenVIPReleaseMeansWaiting(t *testing.T) {
	key := []byte("test-cluster-key")
	for _, tc := range []struct {
		name     string
		peer     vipPeer
		released bool
	}{
		{"previous release: bare bool", vipPeer{bare: true}, false},
		{"forged MAC", vipPeer{mac: func(n []byte) []byte { return answerMAC([]byte("other"), vipHeldMACLabel, "n1", n, false) }}, false},
		{"control: n1's own", vipPeer{mac: func(n []byte) []byte { return answerMAC(key, vipHeldMACLabel, "n1", n, false) }}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := oncrpc.NewServer(oncrpc.Programs{ForwardProgram: tc.peer}, oncrpc.ServerConfig{})
			go srv.ServeTCP(ln)
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				srv.Shutdown(ctx)
			}()
			n := &Node{log: slog.New(slog.DiscardHandler), prevLeader: "n1", cfg: Config{NodeID: "n3", ClusterKey: key,
				PeerNSMAddrs: map[string]string{"n1": ln.Addr().String()}, StandDownWait: time.Second}}
			prev, released := n.previousHolderReleased(context.Background())
			if prev != "n1" || released != tc.released {
				t.Fatalf("previousHolderReleased = %s, %v; want n1, %v", prev, released, tc.released)
			}
		})
	}
}
