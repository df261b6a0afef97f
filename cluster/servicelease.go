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

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// Leases on services (DESIGN.md, "Serving a service on any server"): a
// server serves a service at an epoch only while the leader confirms,
// within its own fence lease, that the service is placed there at that
// epoch. The owner asks (LEASE) every quarter lease and dates the lease
// from its question; the leader answers with what is left of its fence
// lease, so the owner's lease never outlives the leader's; and a leader
// revokes a pair before it proposes a placement that takes the service
// away, so every yes precedes the move's commit.

// fwdProcLease: leaseArgs → leaseRes. Authenticated like APPLY (the
// cluster key's HMAC, or a raft member's address); with a cluster key the
// answer carries an HMAC over the asker's nonce, the answering node's id
// and the answer (a forged or replayed yes is not believed). A release
// without it answers PROC_UNAVAIL.
const fwdProcLease uint32 = 7

// leaseItem is one (service, epoch) pair an owner asks about.
type leaseItem struct {
	Service string
	Epoch   uint64
}

// leaseArgs is LEASE's argument.
type leaseArgs struct {
	SentNS int64
	Node   string // the asker: the owner the placements must name
	Nonce  []byte
	Items  []leaseItem
	MAC    []byte
}

const (
	leaseNonceLen = 16
	leaseMaxItems = fsm.MaxServices
)

func (a *leaseArgs) MarshalXDR(w *oncrpc.Writer) {
	w.Int64(a.SentNS)
	w.String(a.Node)
	w.Opaque(a.Nonce)
	w.Uint32(uint32(len(a.Items)))
	for _, it := range a.Items {
		w.String(it.Service)
		w.Uint64(it.Epoch)
	}
	w.Opaque(a.MAC)
}

func (a *leaseArgs) UnmarshalXDR(r *oncrpc.Reader) error {
	a.SentNS = r.Int64()
	a.Node = r.String(fsm.MaxNameLen)
	a.Nonce = r.Opaque(servingMaxNonceLen)
	n := r.Uint32()
	if r.Err() == nil && n > leaseMaxItems {
		return fmt.Errorf("%d services (at most %d)", n, leaseMaxItems)
	}
	for i := uint32(0); i < n && r.Err() == nil; i++ {
		a.Items = append(a.Items, leaseItem{Service: r.String(fsm.MaxServiceIDLen), Epoch: r.Uint64()})
	}
	a.MAC = r.Opaque(sha256.Size)
	return r.Done()
}

// macInput is what the request's HMAC covers after the forward label and
// the time: the tag between NULs (no fsm encoding starts with one), the
// asker, the nonce and the pairs, each length-prefixed.
func (a *leaseArgs) macInput() []byte {
	b := []byte("\x00lease\x00")
	b = appendLP(b, []byte(a.Node))
	b = appendLP(b, a.Nonce)
	b = binary.BigEndian.AppendUint32(b, uint32(len(a.Items)))
	for _, it := range a.Items {
		b = appendLP(b, []byte(it.Service))
		b = binary.BigEndian.AppendUint64(b, it.Epoch)
	}
	return b
}

func appendLP(b, s []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// leaseRes is LEASE's answer: fwdOK with, per pair, whether it holds and
// RestNS, what is left of the leader's fence lease; fwdNotLeader from a
// node that does not lead with a committed takeover and a fresh lease.
type leaseRes struct {
	Status uint32
	Err    string
	RestNS int64
	OK     []bool
	MAC    []byte
	max    int // decoding: the most pairs accepted
}

func (r *leaseRes) MarshalXDR(w *oncrpc.Writer) {
	w.Uint32(r.Status)
	w.String(r.Err)
	w.Int64(r.RestNS)
	w.Uint32(uint32(len(r.OK)))
	for _, ok := range r.OK {
		w.Bool(ok)
	}
	w.Opaque(r.MAC)
}

func (r *leaseRes) UnmarshalXDR(rd *oncrpc.Reader) error {
	r.Status = rd.Uint32()
	r.Err = rd.String(256)
	r.RestNS = rd.Int64()
	n := rd.Uint32()
	if rd.Err() == nil && int(n) > r.max {
		return fmt.Errorf("lease: %d answers to %d questions", n, r.max)
	}
	for i := uint32(0); i < n && rd.Err() == nil; i++ {
		r.OK = append(r.OK, rd.Bool())
	}
	r.MAC = rd.Opaque(sha256.Size)
	return rd.Err()
}

// leaseMAC authenticates leader's LEASE answer to the asker's nonce.
func leaseMAC(key []byte, leader string, nonce []byte, status uint32, rest int64, ok []bool) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("nsmd-lease-v1"))
	m.Write(appendLP(nil, []byte(leader)))
	m.Write(appendLP(nil, nonce))
	var b [12]byte
	binary.BigEndian.PutUint32(b[:4], status)
	binary.BigEndian.PutUint64(b[4:], uint64(rest))
	m.Write(b[:])
	bits := make([]byte, len(ok))
	for i, v := range ok {
		if v {
			bits[i] = 1
		}
	}
	m.Write(appendLP(nil, bits))
	return m.Sum(nil)
}

// leaseKey names one revoked pair: service at epoch on node.
type leaseKey struct {
	service, node string
	epoch         uint64
}

// leases is the leader's side of the service leases: the pairs it
// revoked in its current term.
type leases struct {
	n       *Node
	mu      sync.Mutex
	term    uint64
	revoked map[leaseKey]bool
}

// termLocked drops revocations of an earlier term: a leader's state holds
// every placement committed before its term (its takeover committed
// after them), and an entry proposed in an earlier term either committed
// before this term's takeover or never will.
func (l *leases) termLocked() {
	if t := l.n.raft.CurrentTerm(); t != l.term {
		l.term, l.revoked = t, nil
	}
}

// revokeFor stops confirming the owner's lease when cmd is a placement
// that takes a service from its owner, before it is proposed; the
// returned undo (nil when nothing was revoked) confirms it again when the
// placement was refused (then nothing moved).
func (l *leases) revokeFor(cmd fsm.Command) (undo func()) {
	c, ok := cmd.(fsm.ServicePlaced)
	if !ok || c.From == "" || c.Epoch < 2 {
		return nil
	}
	k := leaseKey{service: c.Service, node: c.From, epoch: c.Epoch - 1}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.termLocked()
	if l.revoked[k] {
		return nil
	}
	if l.revoked == nil {
		l.revoked = map[leaseKey]bool{}
	}
	l.revoked[k] = true
	term := l.term
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.term == term {
			delete(l.revoked, k)
		}
	}
}

// answer is the leader's answer to node about items: false (not leading)
// unless raft says it leads, its takeover of the term committed and its
// fence lease is fresh; then each pair holds when the applied placement
// names node at that epoch and the pair is not revoked, and rest is what
// is left of the fence lease.
func (l *leases) answer(node string, items []leaseItem) (ok []bool, rest time.Duration, leading bool) {
	n := l.n
	if !n.Leading() || n.raft.State() != raft.Leader {
		return nil, 0, false
	}
	at := n.leaseAt.Load()
	rest = time.Duration(at + int64(n.fenceLease()) - n.mono())
	if at == 0 || rest <= 0 {
		return nil, 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.termLocked()
	ok = make([]bool, len(items))
	for i, it := range items {
		p, _ := n.fsm.PlacementOf(it.Service)
		ok[i] = node != "" && p.Node == node && p.Epoch == it.Epoch && !l.revoked[leaseKey{it.Service, node, it.Epoch}]
	}
	return ok, rest, true
}

// serveLease answers LEASE.
func (n *Node) serveLease(c *oncrpc.Call, res *oncrpc.Writer) error {
	var args leaseArgs
	if err := args.UnmarshalXDR(c.Args); err != nil || len(args.Nonce) < leaseNonceLen {
		return fmt.Errorf("%w: lease: want a nonce of %d…%d bytes and at most %d services", oncrpc.ErrGarbageArgs, leaseNonceLen, servingMaxNonceLen, leaseMaxItems)
	}
	var out leaseRes
	from := c.Remote.Addr().Unmap()
	if err := n.authForward(from, &fwdArgs{SentNS: args.SentNS, Cmd: args.macInput(), MAC: args.MAC}); err != nil {
		n.fwdLog.warn(n.log, from, fmt.Errorf("a lease request: %w", err))
		out = leaseRes{Status: fwdDenied, Err: err.Error()}
	} else if ok, rest, leading := n.leases.answer(args.Node, args.Items); leading {
		out = leaseRes{Status: fwdOK, RestNS: int64(rest), OK: ok}
	} else {
		out = leaseRes{Status: fwdNotLeader}
	}
	if len(n.cfg.ClusterKey) > 0 {
		out.MAC = leaseMAC(n.cfg.ClusterKey, n.cfg.NodeID, args.Nonce, out.Status, out.RestNS, out.OK)
	}
	out.MarshalXDR(res)
	return nil
}

// errLeaseUnproven: a LEASE answer whose MAC does not prove it came from
// the leader for this question.
var errLeaseUnproven = errors.New("cluster: the lease answer is not authenticated")

// verifyLease checks leader's answer to args (with a cluster key: its MAC).
func verifyLease(key []byte, leader string, args *leaseArgs, res *leaseRes) error {
	if len(key) > 0 && !hmac.Equal(res.MAC, leaseMAC(key, leader, args.Nonce, res.Status, res.RestNS, res.OK)) {
		return fmt.Errorf("%w: from %s", errLeaseUnproven, leader)
	}
	return nil
}

// askLease asks the leader (itself when it leads) about items; asked is
// when the question was put, on this node's monotonic clock: a pair that
// holds is leased until asked + rest.
func (n *Node) askLease(ctx context.Context, items []leaseItem) (ok []bool, asked int64, rest time.Duration, err error) {
	asked = n.mono()
	if n.raft.State() == raft.Leader {
		ok, rest, leading := n.leases.answer(n.cfg.NodeID, items)
		if !leading {
			return nil, asked, 0, ErrNotLeader
		}
		return ok, asked, rest, nil
	}
	id, addr := n.leaderNSMAddr()
	if addr == "" {
		return nil, asked, 0, ErrNoLeader
	}
	args := leaseArgs{SentNS: n.cfg.Now().UnixNano(), Node: n.cfg.NodeID, Nonce: make([]byte, leaseNonceLen), Items: items}
	if _, err := rand.Read(args.Nonce); err != nil {
		return nil, asked, 0, fmt.Errorf("cluster: lease nonce: %w", err)
	}
	if len(n.cfg.ClusterKey) > 0 {
		args.MAC = fwdMAC(n.cfg.ClusterKey, args.SentNS, args.macInput())
	}
	local, _ := netip.ParseAddrPort(n.cfg.RaftBind)
	c, err := n.fwd.get(ctx, addr, local.Addr())
	if err != nil {
		return nil, asked, 0, fmt.Errorf("cluster: ask leader %s for a lease: %w", id, err)
	}
	res := leaseRes{max: len(items)}
	if err := c.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcLease, &args, &res); err != nil {
		n.fwd.drop(c)
		return nil, asked, 0, fmt.Errorf("cluster: ask leader %s for a lease: %w", id, err)
	}
	if err := verifyLease(n.cfg.ClusterKey, id, &args, &res); err != nil {
		return nil, asked, 0, err
	}
	switch res.Status {
	case fwdOK:
	case fwdNotLeader:
		return nil, asked, 0, fmt.Errorf("cluster: %s: %w", id, ErrNotLeader)
	default:
		return nil, asked, 0, fmt.Errorf("cluster: %s refused a lease: status %d: %s", id, res.Status, res.Err)
	}
	if len(res.OK) != len(items) || res.RestNS <= 0 {
		return nil, asked, 0, fmt.Errorf("cluster: %s: a lease answer of %d pairs for %d, rest %v", id, len(res.OK), len(items), time.Duration(res.RestNS))
	}
	// Never longer than this node's own fence lease: its successors add
	// that to their wait (DESIGN.md).
	return res.OK, asked, min(time.Duration(res.RestNS), n.fenceLease()), nil
}
