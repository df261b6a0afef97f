package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/tickle"
)

// The clients' connections to the VIP, replicated so that the node that
// takes the VIP over can tickle them (package tickle): the leader's owner
// samples its own connections on the VIP and hands them to Hints.SetVIPConns;
// every other serving node asks the leader for them (Hints.LeaderVIPConns, the
// forward program's CONNS procedure) and keeps the last answer. The list
// is not in the FSM: it changes every second, it is only a hint, and a
// lost or stale one costs what having none costs (the clients reconnect
// by their own TCP timers), so it is not worth a log entry.

// fwdProcConns: hintArgs → connsRes, the connections on the VIP the
// leader's last sample found (fwdOK), fwdNotLeader from a node that does
// not lead with a committed takeover. Authenticated like APPLY (the
// cluster key's HMAC, or a raft member's address), over TCP only. A
// release without it answers PROC_UNAVAIL.
const fwdProcConns uint32 = 5

// MaxVIPConns bounds the connections one CONNS answer carries (~50 bytes
// each: 16,384 fit well within a client's 1 MiB record).
const MaxVIPConns = 16384

// ErrVIPConnsUnsupported means the leader does not answer the CONNS
// procedure (a release before it): ask again only once another node leads.
var ErrVIPConnsUnsupported = errors.New("cluster: the leader does not share its VIP connections (an older release)")

// VIPConns is a sample of the established TCP connections on the VIP.
type VIPConns struct {
	Conns []tickle.Conn
	// Total is how many connections matched: more than len(Conns) when
	// the sample was bounded.
	Total int
	// At is when the sample was taken, on this node's clock.
	At time.Time
}

// Hints are what the leader shares with the other serving nodes outside
// the FSM, over the forward program: the clients' connections on the VIP
// (CONNS, this file) and when each NFSv4 client was last seen (SEEN,
// seen.go). The leader's owner sets its samples; every other serving node
// asks the leader for them. They hold no state of their own: the samples
// are the node's.
type Hints struct{ n *Node }

// Hints is this node's side of the leader's hints.
func (n *Node) Hints() Hints { return Hints{n} }

// SetVIPConns records the leader's latest sample of its connections on
// the VIP, which it answers CONNS with while it leads.
func (h Hints) SetVIPConns(v VIPConns) { h.n.vipConns.Store(&v) }

// hintArgs is the argument of CONNS and SEEN (seen.go), the leader's
// hints: at most how many items the asker wants, its clock and an HMAC
// over both with the cluster key (empty without one).
type hintArgs struct {
	SentNS int64
	Max    uint32
	MAC    []byte
}

func (a *hintArgs) MarshalXDR(w *oncrpc.Writer) {
	w.Int64(a.SentNS)
	w.Uint32(a.Max)
	w.Opaque(a.MAC)
}

func (a *hintArgs) UnmarshalXDR(r *oncrpc.Reader) error {
	a.SentNS = r.Int64()
	a.Max = r.Uint32()
	a.MAC = r.Opaque(32)
	return r.Done()
}

// Tags of the hint procedures' MACs.
const (
	tagConns = "conns"
	tagSeen  = "seen"
)

// macInput is what the HMAC covers after the forward label and the time:
// the procedure's tag between NULs (no fsm encoding starts with one) and
// Max. APPLY's MAC, CONNS's and SEEN's cannot stand in for each other.
func (a *hintArgs) macInput(tag string) []byte {
	return binary.BigEndian.AppendUint32([]byte("\x00"+tag+"\x00"), a.Max)
}

// hintRes is a hint procedure's result as askLeader reads it.
type hintRes interface {
	oncrpc.Unmarshaler
	status() (uint32, string)
}

// authHint checks a hint request like APPLY (authForward), logging a
// refusal that names what was asked for.
func (n *Node) authHint(c *oncrpc.Call, tag, what string) (hintArgs, error) {
	var args hintArgs
	if err := args.UnmarshalXDR(c.Args); err != nil {
		return args, fmt.Errorf("%w: %s: %v", oncrpc.ErrGarbageArgs, tag, err)
	}
	from := c.Remote.Addr().Unmap()
	if err := n.authForward(from, &fwdArgs{SentNS: args.SentNS, Cmd: args.macInput(tag), MAC: args.MAC}); err != nil {
		n.fwdLog.warn(n.log, from, fmt.Errorf("a request for %s: %w", what, err))
		return args, errHintDenied{err}
	}
	return args, nil
}

// errHintDenied: the request failed authentication (answered fwdDenied).
type errHintDenied struct{ error }

// askLeader calls hint procedure proc (tag) on the leader for at most max
// items and decodes its answer into res; it returns the leader's id. A
// leader that answers PROC_UNAVAIL gives unsupported, one that no longer
// leads ErrNotLeader; what names the hint in errors.
func (n *Node) askLeader(ctx context.Context, proc uint32, tag string, max int, what string, unsupported error, res hintRes) (string, error) {
	id, addr := n.leaderNSMAddr()
	if addr == "" {
		return id, ErrNoLeader
	}
	args := hintArgs{SentNS: n.cfg.Now().UnixNano(), Max: uint32(max)}
	if len(n.cfg.ClusterKey) > 0 {
		args.MAC = fwdMAC(n.cfg.ClusterKey, args.SentNS, args.macInput(tag))
	}
	local, _ := netip.ParseAddrPort(n.cfg.RaftBind)
	c, err := n.fwd.get(ctx, addr, local.Addr())
	if err != nil {
		return id, fmt.Errorf("cluster: ask leader %s for %s: %w", addr, what, err)
	}
	if err := c.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, proc, &args, res); err != nil {
		if errors.Is(err, oncrpc.ErrProcUnavail) {
			return id, fmt.Errorf("%s: %w", id, unsupported)
		}
		n.fwd.drop(c)
		return id, fmt.Errorf("cluster: ask leader %s for %s: %w", addr, what, err)
	}
	switch st, why := res.status(); st {
	case fwdOK:
		return id, nil
	case fwdNotLeader:
		return id, fmt.Errorf("cluster: %s: %w", addr, ErrNotLeader)
	case fwdDenied:
		return id, fmt.Errorf("cluster: %s refused to share %s: %s", addr, what, why)
	default:
		return id, fmt.Errorf("cluster: %s: status %d: %s", addr, st, why)
	}
}

// connsRes is CONNS's result.
type connsRes struct {
	Status uint32
	Err    string
	Total  uint32
	AgeMS  uint32 // how old the sample is, so the asker dates it on its own clock
	Conns  []tickle.Conn
	max    int // decoding: the most connections accepted
}

func (r *connsRes) status() (uint32, string) { return r.Status, r.Err }

func (r *connsRes) MarshalXDR(w *oncrpc.Writer) {
	w.Uint32(r.Status)
	w.String(r.Err)
	w.Uint32(r.Total)
	w.Uint32(r.AgeMS)
	writeConns(w, r.Conns)
}

// writeConns encodes conns: their count, then each one's local and remote
// address (opaque) and port.
func writeConns(w *oncrpc.Writer, conns []tickle.Conn) {
	w.Uint32(uint32(len(conns)))
	for _, c := range conns {
		w.Opaque(c.Local.Addr().AsSlice())
		w.Uint32(uint32(c.Local.Port()))
		w.Opaque(c.Remote.Addr().AsSlice())
		w.Uint32(uint32(c.Remote.Port()))
	}
}

func (r *connsRes) UnmarshalXDR(rd *oncrpc.Reader) error {
	r.Status = rd.Uint32()
	r.Err = rd.String(256)
	r.Total = rd.Uint32()
	r.AgeMS = rd.Uint32()
	var err error
	if r.Conns, err = readConns(rd, r.max); err != nil {
		return err
	}
	return rd.Err()
}

// readConns decodes what writeConns encoded, refusing more than max
// connections.
func readConns(rd *oncrpc.Reader, max int) ([]tickle.Conn, error) {
	count := rd.Uint32()
	if rd.Err() != nil {
		return nil, rd.Err()
	}
	if int64(count) > int64(max) {
		return nil, fmt.Errorf("%d connections, more than the %d asked for", count, max)
	}
	conns := make([]tickle.Conn, 0, min(int(count), rd.Remaining()/16)) // 16: the least one takes
	for range count {
		var c tickle.Conn
		var err error
		if c.Local, err = readAddrPort(rd); err != nil {
			return nil, err
		}
		if c.Remote, err = readAddrPort(rd); err != nil {
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

func readAddrPort(rd *oncrpc.Reader) (netip.AddrPort, error) {
	b := rd.Opaque(16)
	port := rd.Uint32()
	if err := rd.Err(); err != nil {
		return netip.AddrPort{}, err
	}
	a, ok := netip.AddrFromSlice(b)
	if !ok || port > 0xffff {
		return netip.AddrPort{}, fmt.Errorf("bad address %x port %d", b, port)
	}
	return netip.AddrPortFrom(a, uint16(port)), nil
}

// serveConns answers CONNS.
func (n *Node) serveConns(c *oncrpc.Call, res *oncrpc.Writer) error {
	if c.Net == "udp" {
		out := connsRes{Status: fwdDenied, Err: "taken over TCP only"}
		out.MarshalXDR(res)
		return nil
	}
	args, err := n.authHint(c, tagConns, "the VIP's connections (CONNS)")
	var denied errHintDenied
	if errors.As(err, &denied) {
		out := connsRes{Status: fwdDenied, Err: denied.Error()}
		out.MarshalXDR(res)
		return nil
	}
	if err != nil {
		return err
	}
	out := connsRes{Status: fwdNotLeader}
	if v := n.vipConns.Load(); v != nil && n.Leading() {
		out = connsRes{Status: fwdOK, Total: uint32(v.Total), AgeMS: uint32(min(time.Since(v.At).Milliseconds(), 1<<31))}
		out.Conns = v.Conns[:min(len(v.Conns), int(args.Max), MaxVIPConns)]
	}
	out.MarshalXDR(res)
	return nil
}

// LeaderVIPConns asks the leader for its latest sample of the connections
// on the VIP, at most max of them, and says which node answered. A leader
// that does not answer CONNS is ErrVIPConnsUnsupported; one that no
// longer leads, ErrNotLeader.
func (h Hints) LeaderVIPConns(ctx context.Context, max int) (leader string, v VIPConns, err error) {
	max = min(max, MaxVIPConns)
	res := connsRes{max: max}
	id, err := h.n.askLeader(ctx, fwdProcConns, tagConns, max, "its VIP connections", ErrVIPConnsUnsupported, &res)
	if err != nil {
		return id, v, err
	}
	return id, VIPConns{Conns: res.Conns, Total: int(res.Total), At: time.Now().Add(-time.Duration(res.AgeMS) * time.Millisecond)}, nil
}
