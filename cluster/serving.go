package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/oncrpc"
)

// Serving and fencing: when this node may serve the shared storage (run
// on_leader: mount, start nfsd), how it proves to itself that it still may
// (its watchdog is fed only then), and when a new leader may start serving
// after another node served (cluster/DESIGN.md, "Fencing").
//
// The rule, in one place:
//   - A node serves from just before its on_leader hook until its
//     on_follower hook succeeded. It arms its watchdog before on_leader and
//     disarms it only after on_follower succeeded; while it serves it feeds
//     the watchdog only while raft says it leads and a quorum confirmed that
//     within the lease, and on_leader is within its timeout. Otherwise it
//     starves it (the kernel's reset deadline never moves past the last
//     proof + the fence timeout). A failed stop resets the node at once.
//   - A new leader runs on_leader only once every other serving voter is
//     proven not to serve: it answered so (servingAnswer), a fence agent
//     reported it off, or — with watchdogs and no agent — the time within
//     which its watchdog must have reset it has passed (fenceNotBefore).

// Watchdog is the node's self-fence; package fence's Watchdog is one.
// Arm opens and starts it (the machine resets unless it is fed within the
// fence timeout), FeedWithin pings it while a proof holds and starves it
// at once if the ping returned after the proof ended (feed.go), Starve keeps its deadline from moving
// later, ResetSoon makes it fire within a second, Disarm stops it, and
// Release stops it also when a previous process of this node died and
// left it running.
type Watchdog interface {
	Arm() error
	FeedWithin(proofEnd func() time.Time) error
	Starve() error
	ResetSoon() error
	Disarm() error
	Release() error
}

// fenceMargin covers the watchdog's whole-second timeout and the feed
// interval: a process that dies while starving pings the device once more
// (the kernel does that on an unclean close), which Starve keeps within a
// second of the deadline, plus the reset itself.
const fenceMargin = 2 * time.Second

// FenceWait is what a new leader waited for before it served.
type FenceWait struct {
	At      time.Time // when the wait ended
	Took    time.Duration
	Nodes   []FencedPeer // one per other serving voter
	Aborted string       // why it ended before every node was proven stopped
}

// FencedPeer says how one other serving voter was proven not to serve:
// By is "clean" (it answered that it does not serve), "agent" (the fence
// agent reported it off), "watchdog" (its watchdog must have reset it) or
// "off" (fencing is off: not proven).
type FencedPeer struct {
	Node   string
	By     string
	Took   time.Duration // from the start of the wait
	Detail string
}

// FenceStatus is this node's fencing state for the operator surface.
type FenceStatus struct {
	Watchdog   bool // this node arms a watchdog when it serves
	Agent      bool // a fence agent fences other nodes
	Timeout    time.Duration
	Serving    bool       // from before on_leader until on_follower succeeded, or while a service placed here is started (servicerun.go)
	Armed      bool       // the watchdog is armed now
	Starving   bool       // armed, but not fed for lack of proof
	LastFeed   time.Time  // zero: never
	StopFailed bool       // the last stop failed: the watchdog resets this node
	LastWait   *FenceWait // the last wait of this node before it served
	Waiting    bool       // a wait is running now
}

// fencing is the node's serving state (all of it guarded by mu, except
// the flags read on the RPC path).
type fencing struct {
	mu       sync.Mutex
	armed    bool
	starving bool
	lastFeed time.Time
	lastWait *FenceWait
	waiting  bool
	// hookUntil (mono ns): on_leader runs and may be fed until then; 0
	// when no on_leader runs.
	hookUntil int64
}

// fencingOn reports whether a new leader waits for the others to be
// proven stopped: some fence is configured cluster-wide.
func (n *Node) fencingOn() bool { return n.cfg.FenceTimeout > 0 || n.cfg.FenceAgent != nil }

// servingAnswer answers fwdProcServing: true ("do not start serving yet")
// while this node serves, stands down, failed to stop, or is raft's
// leader (it could be about to serve: two nodes that both think they lead
// each hold the other back until one learns it does not).
func (n *Node) servingAnswer() bool {
	return n.serving.Load() || n.standingDown.Load() || n.raft.State() == raft.Leader
}

// servingArgs is SERVING's argument: a nonce the asker chose, which the
// answer's MAC covers (a recorded answer cannot be replayed to it).
type servingArgs struct{ Nonce []byte }

// Nonce lengths SERVING takes.
const (
	servingNonceLen    = 16
	servingMaxNonceLen = 32
)

func (a *servingArgs) MarshalXDR(w *oncrpc.Writer) { w.Opaque(a.Nonce) }

func (a *servingArgs) UnmarshalXDR(r *oncrpc.Reader) error {
	a.Nonce = r.Opaque(servingMaxNonceLen)
	return r.Err()
}

// servingRes is SERVING's answer: the node's answer and, with a cluster
// key, servingMAC over it (empty without one).
type servingRes struct {
	Serving bool
	MAC     []byte
}

func (r *servingRes) MarshalXDR(w *oncrpc.Writer) {
	w.Bool(r.Serving)
	w.Opaque(r.MAC)
}

func (r *servingRes) UnmarshalXDR(rd *oncrpc.Reader) error {
	r.Serving = rd.Bool()
	r.MAC = rd.Opaque(sha256.Size)
	return rd.Err()
}

// servingMAC authenticates node's SERVING answer to the asker's nonce.
func servingMAC(key []byte, node string, nonce []byte, serving bool) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("nsmd-serving-v1"))
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(len(node)))
	m.Write(b[:])
	m.Write([]byte(node))
	binary.BigEndian.PutUint32(b[:], uint32(len(nonce)))
	m.Write(b[:])
	m.Write(nonce)
	if serving {
		m.Write([]byte{1})
	} else {
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// serveServing answers SERVING (servingAnswer), with its MAC.
func (n *Node) serveServing(c *oncrpc.Call, res *oncrpc.Writer) error {
	var args servingArgs
	if err := args.UnmarshalXDR(c.Args); err != nil || len(args.Nonce) < servingNonceLen {
		return fmt.Errorf("%w: serving: want a nonce of %d…%d bytes", oncrpc.ErrGarbageArgs, servingNonceLen, servingMaxNonceLen)
	}
	out := servingRes{Serving: n.servingAnswer()}
	if len(n.cfg.ClusterKey) > 0 {
		out.MAC = servingMAC(n.cfg.ClusterKey, n.cfg.NodeID, args.Nonce, out.Serving)
	}
	out.MarshalXDR(res)
	return nil
}

// errServingUnproven: a SERVING answer whose MAC does not prove it came
// from that node for this question (a forgery, a replay, another key).
var errServingUnproven = errors.New("cluster: the serving answer is not authenticated")

// FenceStatus reports this node's fencing state. Serving is true while
// the node serves storage as the leader or any service placed on it.
func (n *Node) FenceStatus() FenceStatus {
	serving := n.serving.Load() || (n.runs != nil && n.runs.active()) // before fence.mu: the runs' lock is taken under it elsewhere
	n.fence.mu.Lock()
	defer n.fence.mu.Unlock()
	s := FenceStatus{
		Watchdog: n.cfg.Watchdog != nil, Agent: n.cfg.FenceAgent != nil, Timeout: n.cfg.FenceTimeout,
		Serving: serving, Armed: n.fence.armed, Starving: n.fence.starving, LastFeed: n.fence.lastFeed,
		StopFailed: n.stopFailed.Load(), Waiting: n.fence.waiting,
	}
	if n.fence.lastWait != nil {
		w := *n.fence.lastWait
		s.LastWait = &w
	}
	return s
}

// peerUnreachable asks peer once: true when it cannot be asked at all
// (dead host, refused port, no address).
func (n *Node) peerUnreachable(ctx context.Context, peer string) bool {
	_, err := n.askServing(ctx, peer)
	return err != nil && !errors.Is(err, context.Canceled)
}

// askUntilClear asks peer whether it serves every 100 ms until it answers
// no (true) or ctx ends (false).
func (n *Node) askUntilClear(ctx context.Context, peer string) (string, bool) {
	return askUntil(ctx, "answered: not serving", func() (bool, error) { return n.askServing(ctx, peer) })
}

// askUntil asks every 100 ms until ask answers not serving (true, with
// detail) or ctx ends (false).
func askUntil(ctx context.Context, detail string, ask func() (bool, error)) (string, bool) {
	for {
		serving, err := ask()
		if err == nil && !serving {
			return detail, true
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", false
		}
	}
}

// dialPeer dials peer's forward program (its NSM address); each call on
// the client may take timeout.
func (n *Node) dialPeer(ctx context.Context, peer string, timeout time.Duration) (*oncrpc.Client, string, error) {
	addr := n.peerNSMAddr(peer)
	if addr == "" {
		return nil, "", fmt.Errorf("no NSM address known for %s", peer)
	}
	// From the raft address: without a cluster key the peer knows a
	// member by it (authForward, and RELEASE's "only the leader asks").
	local, _ := netip.ParseAddrPort(n.cfg.RaftBind)
	c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "tcp", Addr: addr, Timeout: timeout, LocalAddr: local.Addr()})
	return c, addr, err
}

// askServing asks peer's forward program whether it serves (or might).
func (n *Node) askServing(ctx context.Context, peer string) (bool, error) {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, addr, err := n.dialPeer(dctx, peer, 500*time.Millisecond)
	if err != nil {
		return false, err
	}
	defer c.Close()
	args := servingArgs{Nonce: make([]byte, servingNonceLen)}
	if _, err := rand.Read(args.Nonce); err != nil {
		return false, fmt.Errorf("cluster: serving nonce: %w", err)
	}
	var res servingRes
	if err := c.Call(dctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcServing, &args, &res); err != nil {
		return false, err
	}
	if len(n.cfg.ClusterKey) > 0 && !hmac.Equal(res.MAC, servingMAC(n.cfg.ClusterKey, peer, args.Nonce, res.Serving)) {
		return false, fmt.Errorf("%w: %s at %s", errServingUnproven, peer, addr)
	}
	return res.Serving, nil
}

// peerNSMAddr is a member's NSM address: from gossip, else the static map.
func (n *Node) peerNSMAddr(id string) string {
	addr := ""
	if n.member != nil {
		addr, _ = n.member.nsmAddr(id)
	}
	if addr == "" {
		addr = n.cfg.PeerNSMAddrs[id]
	}
	if addr == "" { // gone from gossip: where it said it answers when it began serving
		if r, ok := n.fsm.ServingRecordOf(id); ok {
			addr = r.NSMAddr
		}
	}
	return addr
}
