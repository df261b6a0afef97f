package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// When each NFSv4 client was last seen, shared like the VIP's connections
// (conns.go): the leader's owner samples nfsd's client list (each client's
// time since its last lease renewal) and hands it to SetClientsSeen; every
// other serving node asks the leader for it (LeaderClientsSeen, the
// forward program's SEEN procedure) and keeps what it learns. After a
// failover the new server's grace may wait for a client that never comes
// back — a courtesy client, whose lease expired while it held state, is
// kept by nfsd and so stays in the client-tracking table — and its status
// then says when that client was last seen, by the old server's last
// sample. Not in the FSM: it is for people, it changes with every lease
// renewal, and a lost one costs only the hint.

// fwdProcSeen: seenArgs → seenRes, the NFSv4 clients the leader's last
// sample found and how long before the answer each last renewed (fwdOK),
// fwdNotLeader from a node that does not lead with a committed takeover.
// Authenticated like APPLY, over TCP only. A release without it answers
// PROC_UNAVAIL.
const fwdProcSeen uint32 = 6

// Bounds of one SEEN answer: at most MaxClientsSeen clients and
// maxSeenNameBytes of names (the most recently seen first), well within a
// client's 1 MiB record.
const (
	MaxClientsSeen   = 4096
	maxSeenNameBytes = 512 << 10
)

// ErrClientsSeenUnsupported means the leader does not answer SEEN (a
// release before it).
var ErrClientsSeenUnsupported = errors.New("cluster: the leader does not share when its NFSv4 clients were last seen (an older release)")

// ClientSeen is one NFSv4 client and when it last renewed its lease.
type ClientSeen struct {
	Name string    // its long-form client id (the tracking record's name)
	Seen time.Time // on the clock of the node that holds the value
}

// SetClientsSeen records the leader's latest sample of its NFSv4 clients,
// which it answers SEEN with while it leads.
func (n *Node) SetClientsSeen(cs []ClientSeen) {
	cs = slices.Clone(cs)
	n.clientsSeen.Store(&cs)
}

// seenArgs is SEEN's argument, laid out as CONNS's: at most how many
// clients the asker wants, its clock and an HMAC over both.
type seenArgs connsArgs

func (a *seenArgs) MarshalXDR(w *oncrpc.Writer)         { (*connsArgs)(a).MarshalXDR(w) }
func (a *seenArgs) UnmarshalXDR(r *oncrpc.Reader) error { return (*connsArgs)(a).UnmarshalXDR(r) }

// macInput: a tag of its own, so that a CONNS MAC cannot stand for it.
func (a *seenArgs) macInput() []byte {
	return binary.BigEndian.AppendUint32([]byte("\x00seen\x00"), a.Max)
}

// seenRes is SEEN's result: each client with how many milliseconds
// before the answer it was last seen (the asker dates it on its clock).
type seenRes struct {
	Status  uint32
	Err     string
	Clients []seenEntry
	max     int // decoding: the most clients accepted
}

type seenEntry struct {
	Name  string
	AgoMS uint64
}

func (r *seenRes) MarshalXDR(w *oncrpc.Writer) {
	w.Uint32(r.Status)
	w.String(r.Err)
	w.Uint32(uint32(len(r.Clients)))
	for _, c := range r.Clients {
		w.Opaque([]byte(c.Name))
		w.Uint64(c.AgoMS)
	}
}

func (r *seenRes) UnmarshalXDR(rd *oncrpc.Reader) error {
	r.Status = rd.Uint32()
	r.Err = rd.String(256)
	count := rd.Uint32()
	if rd.Err() != nil {
		return rd.Err()
	}
	if int64(count) > int64(r.max) {
		return fmt.Errorf("%d clients, more than the %d asked for", count, r.max)
	}
	r.Clients = make([]seenEntry, 0, min(count, 1024))
	total := 0
	for range count {
		name := rd.Opaque(fsm.MaxClientNameLen)
		ago := rd.Uint64()
		if err := rd.Err(); err != nil {
			return err
		}
		if len(name) == 0 {
			return errors.New("an empty client name")
		}
		if total += len(name); total > maxSeenNameBytes {
			return fmt.Errorf("more than %d bytes of client names", maxSeenNameBytes)
		}
		r.Clients = append(r.Clients, seenEntry{Name: string(name), AgoMS: ago})
	}
	return rd.Done()
}

// seenAnswer is what this leader answers: its last sample, the most
// recently seen first, within limit and the bounds.
func seenAnswer(cs []ClientSeen, limit int, now time.Time) []seenEntry {
	cs = slices.Clone(cs)
	slices.SortStableFunc(cs, func(a, b ClientSeen) int { return b.Seen.Compare(a.Seen) })
	var out []seenEntry
	total := 0
	for _, c := range cs {
		if len(out) >= min(limit, MaxClientsSeen) {
			break
		}
		if c.Name == "" || len(c.Name) > fsm.MaxClientNameLen || total+len(c.Name) > maxSeenNameBytes {
			continue
		}
		total += len(c.Name)
		ago := max(now.Sub(c.Seen).Milliseconds(), 0)
		out = append(out, seenEntry{Name: c.Name, AgoMS: uint64(ago)})
	}
	return out
}

// serveSeen answers SEEN.
func (n *Node) serveSeen(c *oncrpc.Call, res *oncrpc.Writer) error {
	if c.Net == "udp" {
		out := seenRes{Status: fwdDenied, Err: "taken over TCP only"}
		out.MarshalXDR(res)
		return nil
	}
	var args seenArgs
	if err := args.UnmarshalXDR(c.Args); err != nil {
		return fmt.Errorf("%w: seen: %v", oncrpc.ErrGarbageArgs, err)
	}
	from := c.Remote.Addr().Unmap()
	if err := n.authForward(from, &fwdArgs{SentNS: args.SentNS, Cmd: args.macInput(), MAC: args.MAC}); err != nil {
		n.fwdLog.warn(n.log, from, fmt.Errorf("a request for when the NFSv4 clients were last seen (SEEN): %w", err))
		out := seenRes{Status: fwdDenied, Err: err.Error()}
		out.MarshalXDR(res)
		return nil
	}
	out := seenRes{Status: fwdNotLeader}
	if cs := n.clientsSeen.Load(); cs != nil && n.Leading() {
		out = seenRes{Status: fwdOK, Clients: seenAnswer(*cs, int(args.Max), time.Now())}
	}
	out.MarshalXDR(res)
	return nil
}

// LeaderClientsSeen asks the leader for its latest sample of when its
// NFSv4 clients were last seen, at most max of them, dated on this
// node's clock, and says which node answered. A leader that does not
// answer SEEN is ErrClientsSeenUnsupported; one that no longer leads (or
// has sampled nothing yet), ErrNotLeader.
func (n *Node) LeaderClientsSeen(ctx context.Context, max int) (leader string, cs []ClientSeen, err error) {
	max = min(max, MaxClientsSeen)
	id, addr := n.leaderNSMAddr()
	if addr == "" {
		return id, nil, ErrNoLeader
	}
	args := seenArgs{SentNS: n.cfg.Now().UnixNano(), Max: uint32(max)}
	if len(n.cfg.ClusterKey) > 0 {
		args.MAC = fwdMAC(n.cfg.ClusterKey, args.SentNS, args.macInput())
	}
	local, _ := netip.ParseAddrPort(n.cfg.RaftBind)
	c, err := n.fwd.get(ctx, addr, local.Addr())
	if err != nil {
		return id, nil, fmt.Errorf("cluster: ask leader %s when its NFSv4 clients were seen: %w", addr, err)
	}
	res := seenRes{max: max}
	if err := c.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcSeen, &args, &res); err != nil {
		if errors.Is(err, oncrpc.ErrProcUnavail) {
			return id, nil, fmt.Errorf("%s: %w", id, ErrClientsSeenUnsupported)
		}
		n.fwd.drop(c)
		return id, nil, fmt.Errorf("cluster: ask leader %s when its NFSv4 clients were seen: %w", addr, err)
	}
	switch res.Status {
	case fwdOK:
	case fwdNotLeader:
		return id, nil, fmt.Errorf("cluster: %s: %w", addr, ErrNotLeader)
	case fwdDenied:
		return id, nil, fmt.Errorf("cluster: %s refused to say when its NFSv4 clients were seen: %s", addr, res.Err)
	default:
		return id, nil, fmt.Errorf("cluster: %s: status %d: %s", addr, res.Status, res.Err)
	}
	now := time.Now()
	cs = make([]ClientSeen, 0, len(res.Clients))
	for _, e := range res.Clients {
		ago := time.Duration(min(e.AgoMS, uint64(100*365*24*time.Hour/time.Millisecond))) * time.Millisecond
		cs = append(cs, ClientSeen{Name: e.Name, Seen: now.Add(-ago)})
	}
	return id, cs, nil
}
