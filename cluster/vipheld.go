package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/oncrpc"
)

// The VIP question (fwdProcVIPHeld): "do you still hold the VIP?", which a
// new leader asks the last leader it followed before it waits out the
// VIP's lifetime (handover.go). A clear "no" lets it take the VIP at once,
// so with a cluster key the "no" counts only when it is proven, as the
// SERVING answer is (serving.go): an HMAC with the cluster key over a
// nonce the asker chose, the answering node's id and the answer, under
// its own label so that no other answer of the program can stand in for
// it (cluster/DESIGN.md, "The floating address").
//
// The wire form stays what the previous release speaks:
//
//	call:  void | vipHeldArgs{opaque nonce<32>}
//	reply: bool | vipHeldRes{bool held; opaque mac<32>}
//
// A previous-release asker sends no argument and gets the bare bool it
// reads. A previous-release node ignores the nonce and answers the bare
// bool: an asker with a cluster key holds that answer unproven — its
// "not held" is not believed, and the asker waits the VIP's lifetime out
// as for a node that cannot answer. A rolling upgrade thus costs the
// planned hand-over's fast path while old and new meet, nothing else.

// vipHeldMACLabel separates the VIP answer's MAC from every other MAC
// made with the cluster key (SERVING's is "nsmd-serving-v1").
const vipHeldMACLabel = "nsmd-vip-held-v1"

// errVIPHeldUnproven: a "not held" answer whose MAC does not prove it came
// from that node for this question (an older release, a forgery, a
// replay, another key).
var errVIPHeldUnproven = errors.New("cluster: the VIP answer is not authenticated")

// vipHeldArgs is the question's argument: the asker's nonce. Empty (a
// previous-release asker) asks for the bare bool.
type vipHeldArgs struct{ Nonce []byte }

func (a *vipHeldArgs) MarshalXDR(w *oncrpc.Writer) { w.Opaque(a.Nonce) }

func (a *vipHeldArgs) UnmarshalXDR(r *oncrpc.Reader) error {
	if r.Remaining() == 0 {
		a.Nonce = nil
		return nil
	}
	a.Nonce = r.Opaque(servingMaxNonceLen)
	if r.Err() == nil && len(a.Nonce) < servingNonceLen {
		return fmt.Errorf("vip held: want a nonce of %d…%d bytes", servingNonceLen, servingMaxNonceLen)
	}
	return r.Err()
}

// vipHeldRes is the answer; MAC is empty without a cluster key and from a
// previous-release node (which sends only the bool).
type vipHeldRes struct {
	Held bool
	MAC  []byte
}

func (r *vipHeldRes) MarshalXDR(w *oncrpc.Writer) {
	w.Bool(r.Held)
	w.Opaque(r.MAC)
}

func (r *vipHeldRes) UnmarshalXDR(rd *oncrpc.Reader) error {
	r.Held = rd.Bool()
	r.MAC = nil
	if rd.Err() == nil && rd.Remaining() > 0 {
		r.MAC = rd.Opaque(sha256.Size)
	}
	return rd.Err()
}

// answerMAC authenticates node's yes/no answer to the asker's nonce, under
// label: HMAC-SHA256(key, label ‖ len(node) ‖ node ‖ len(nonce) ‖ nonce ‖
// answer), lengths as 32-bit big-endian. With label "nsmd-serving-v1" it
// is SERVING's servingMAC.
func answerMAC(key []byte, label, node string, nonce []byte, answer bool) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(len(node)))
	m.Write(b[:])
	m.Write([]byte(node))
	binary.BigEndian.PutUint32(b[:], uint32(len(nonce)))
	m.Write(b[:])
	m.Write(nonce)
	if answer {
		m.Write([]byte{1})
	} else {
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// vipHeldAnswer is true while this node holds the VIP (the kernel's view
// for a netlink VIP), still believes it leads (it could be about to take
// it), is standing down (Server.Stop still running) or cannot vouch for it
// (a term of it ended before it took the VIP: vipUnsure).
func (n *Node) vipHeldAnswer() bool {
	return n.VIPHeld() || n.raft.State() == raft.Leader || n.standingDown.Load() || !n.vipVouchable()
}

// serveVIPHeld answers fwdProcVIPHeld: the bare bool to a question
// without a nonce (a previous-release asker), else the bool and, with a
// cluster key, its MAC.
func (n *Node) serveVIPHeld(c *oncrpc.Call, res *oncrpc.Writer) error {
	var args vipHeldArgs
	if err := args.UnmarshalXDR(c.Args); err != nil {
		return fmt.Errorf("%w: %w", oncrpc.ErrGarbageArgs, err)
	}
	held := n.vipHeldAnswer()
	if args.Nonce == nil {
		res.Bool(held)
		return nil
	}
	out := vipHeldRes{Held: held}
	if len(n.cfg.ClusterKey) > 0 {
		out.MAC = answerMAC(n.cfg.ClusterKey, vipHeldMACLabel, n.cfg.NodeID, args.Nonce, held)
	}
	out.MarshalXDR(res)
	return nil
}

// askVIPHeld asks peer, over c, whether it holds the VIP. "Held" is
// believed as it comes (it only makes the asker wait); with a cluster key
// "not held" is believed only with peer's MAC over this question's fresh
// nonce, else the error wraps errVIPHeldUnproven.
func (n *Node) askVIPHeld(ctx context.Context, c *oncrpc.Client, peer string) (bool, error) {
	args := vipHeldArgs{Nonce: make([]byte, servingNonceLen)}
	if _, err := rand.Read(args.Nonce); err != nil {
		return true, fmt.Errorf("cluster: vip held nonce: %w", err)
	}
	var res vipHeldRes
	if err := c.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcVIPHeld, &args, &res); err != nil {
		return true, err
	}
	if res.Held || len(n.cfg.ClusterKey) == 0 {
		return res.Held, nil
	}
	if !hmac.Equal(res.MAC, answerMAC(n.cfg.ClusterKey, vipHeldMACLabel, peer, args.Nonce, false)) {
		if len(res.MAC) == 0 {
			return true, fmt.Errorf("%w: %s sent no MAC (a node of an earlier release?)", errVIPHeldUnproven, peer)
		}
		return true, fmt.Errorf("%w: %s", errVIPHeldUnproven, peer)
	}
	return false, nil
}
