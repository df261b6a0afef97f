package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// When each NFSv4 client was last seen, shared like the VIP's connections
// (conns.go): the leader's owner samples nfsd's client list (each client's
// time since its last lease renewal) and hands it to Hints.SetClientsSeen; every
// other serving node asks the leader for it (Hints.LeaderClientsSeen, the
// forward program's SEEN procedure) and keeps what it learns. After a
// failover the new server's grace may wait for a client that never comes
// back — a courtesy client, whose lease expired while it held state, is
// kept by nfsd and so stays in the client-tracking table — and its status
// then says when that client was last seen, by the old server's last
// sample. Not in the FSM: it is for people, it changes with every lease
// renewal, and a lost one costs only the hint.

// fwdProcSeen: hintArgs → seenRes, the NFSv4 clients the leader's last
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
func (h Hints) SetClientsSeen(cs []ClientSeen) {
	cs = slices.Clone(cs)
	h.n.clientsSeen.Store(&cs)
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

func (r *seenRes) status() (uint32, string) { return r.Status, r.Err }

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
	args, err := n.authHint(c, tagSeen, "when the NFSv4 clients were last seen (SEEN)")
	var denied errHintDenied
	if errors.As(err, &denied) {
		out := seenRes{Status: fwdDenied, Err: denied.Error()}
		out.MarshalXDR(res)
		return nil
	}
	if err != nil {
		return err
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
func (h Hints) LeaderClientsSeen(ctx context.Context, max int) (leader string, cs []ClientSeen, err error) {
	max = min(max, MaxClientsSeen)
	res := seenRes{max: max}
	id, err := h.n.askLeader(ctx, fwdProcSeen, tagSeen, max, "when its NFSv4 clients were seen", ErrClientsSeenUnsupported, &res)
	if err != nil {
		return id, nil, err
	}
	now := time.Now()
	cs = make([]ClientSeen, 0, len(res.Clients))
	for _, e := range res.Clients {
		ago := time.Duration(min(e.AgoMS, uint64(100*365*24*time.Hour/time.Millisecond))) * time.Millisecond
		cs = append(cs, ClientSeen{Name: e.Name, Seen: now.Add(-ago)})
	}
	return id, cs, nil
}
