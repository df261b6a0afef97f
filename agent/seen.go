package agent

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/grace"
)

// seenInterval is how often the leader samples nfsd's client list and the
// other serving nodes fetch the sample: a last-seen time is at most this
// much older than the truth (a lease renews every 2/3 of it anyway).
const seenInterval = 5 * time.Second

// maxSeenKept bounds how many clients a node remembers; beyond it the
// least recently seen are forgotten.
const maxSeenKept = 2 * cluster.MaxClientsSeen

// clientsSeen remembers when each NFSv4 client was last seen renewing its
// lease on a server of this cluster (cluster/seen.go carries it between
// nodes). While this node leads it samples its own nfsd's client list
// every seenInterval and shares what it knows; otherwise it fetches the
// leader's. A grace that waits for a client then says when that client
// was last seen (graceJSON), which is how an operator tells a client that
// will come back from a courtesy client that left for good.
type clientsSeen struct {
	log      *slog.Logger
	procRoot string
	node     func() *cluster.Node

	mu          sync.Mutex
	seen        map[string]time.Time
	unsupported string  // a leader that answered PROC_UNAVAIL: not asked again
	readErr     errOnce // the last error reading nfsd's clients, logged once
}

func newClientsSeen(log *slog.Logger, procRoot string, node func() *cluster.Node) *clientsSeen {
	if procRoot == "" {
		procRoot = "/proc"
	}
	return &clientsSeen{log: log.With("component", "clients-seen"), procRoot: procRoot, node: node, seen: map[string]time.Time{}}
}

// run samples or fetches every seenInterval until ctx ends.
func (s *clientsSeen) run(ctx context.Context) {
	tk := time.NewTicker(seenInterval)
	defer tk.Stop()
	for {
		s.tick(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
	}
}

func (s *clientsSeen) tick(ctx context.Context, now time.Time) {
	n := s.node()
	if n.Leading() {
		s.sample(n, now)
		return
	}
	n.Hints().SetClientsSeen(nil) // a former leader shares nothing
	s.fetch(ctx, n)
}

// sample reads this nfsd's clients, merges them and shares what it knows.
func (s *clientsSeen) sample(n *cluster.Node, now time.Time) {
	cs, err := grace.NFSdClients(s.procRoot)
	switch {
	case errors.Is(err, grace.ErrNoManager):
		// No nfsd running (not serving yet, or a plain statd replacement).
	case err != nil:
		s.readErr.log(s.log, "cannot read nfsd's clients", err)
	default:
		s.readErr.log(s.log, "", nil)
		var fresh []cluster.ClientSeen
		for _, c := range cs {
			switch {
			case c.SinceRenew >= 0:
				fresh = append(fresh, cluster.ClientSeen{Name: c.Name, Seen: now.Add(-c.SinceRenew)})
			case c.Confirmed():
				// A kernel without the renewal age: a confirmed client's
				// lease is current, so it was seen within a lease.
				fresh = append(fresh, cluster.ClientSeen{Name: c.Name, Seen: now})
			}
		}
		s.merge(fresh)
	}
	n.Hints().SetClientsSeen(s.list())
}

// fetch asks the leader for its list and merges it. A failed ask keeps
// what is known: a leader that just died is the one whose list matters.
func (s *clientsSeen) fetch(ctx context.Context, n *cluster.Node) {
	leader := n.Leader()
	s.mu.Lock()
	skip := leader != "" && leader == s.unsupported
	s.mu.Unlock()
	if skip {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	from, cs, err := n.Hints().LeaderClientsSeen(ctx, cluster.MaxClientsSeen)
	switch {
	case errors.Is(err, cluster.ErrClientsSeenUnsupported):
		s.mu.Lock()
		s.unsupported = from
		s.mu.Unlock()
		s.log.Info("the leader runs a release that does not share when its NFSv4 clients were seen", "leader", from)
	case errors.Is(err, cluster.ErrNotLeader), errors.Is(err, cluster.ErrNoLeader), errors.Is(err, context.Canceled):
	case err != nil:
		s.log.Debug("cannot fetch when the leader's NFSv4 clients were seen; keeping what is known", "leader", from, "err", err)
	default:
		s.merge(cs)
	}
}

// merge keeps, for each client, the latest time it was seen, and forgets
// the least recently seen beyond maxSeenKept.
func (s *clientsSeen) merge(cs []cluster.ClientSeen) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		if t, ok := s.seen[c.Name]; !ok || c.Seen.After(t) {
			s.seen[c.Name] = c.Seen
		}
	}
	if over := len(s.seen) - maxSeenKept; over > 0 {
		all := s.listLocked()
		for _, c := range all[len(all)-over:] {
			delete(s.seen, c.Name)
		}
	}
}

// list is what this node knows, the most recently seen first.
func (s *clientsSeen) list() []cluster.ClientSeen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listLocked()
}

func (s *clientsSeen) listLocked() []cluster.ClientSeen {
	out := make([]cluster.ClientSeen, 0, len(s.seen))
	for name, t := range s.seen {
		out = append(out, cluster.ClientSeen{Name: name, Seen: t})
	}
	slices.SortFunc(out, func(a, b cluster.ClientSeen) int {
		if c := b.Seen.Compare(a.Seen); c != 0 {
			return c
		}
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return out
}

// known is how many clients this node knows when they were last seen.
func (s *clientsSeen) known() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// lastSeen says when client name was last seen, if known.
func (s *clientsSeen) lastSeen(name string) (time.Time, bool) {
	if s == nil {
		return time.Time{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.seen[name]
	return t, ok
}
