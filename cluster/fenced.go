package cluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// A new leader's wait before it serves: every node of fenceList proven
// not to serve (promise.go says who, and by whose promise).

// awaitFenced returns once every node that may still serve is proven not
// to (see fencePeer), with when the last proof came (zero when there was
// no node to prove stopped), or false when ctx ended first. A node that
// serves no storage waits for nothing.
func (n *Node) awaitFenced(ctx context.Context, elected time.Time) (bool, time.Time) {
	if !n.servesStorage() || (n.ownSettingsOnly() && !n.fencingOn()) {
		return true, time.Time{}
	}
	term := n.raft.CurrentTerm()
	start := time.Now()
	peers := n.fenceList()
	var unproven []string
	for _, p := range peers {
		if _, ok := n.peerBound(p); !ok && n.cfg.FenceAgent == nil {
			unproven = append(unproven, p.Node)
		}
	}
	n.fence.mu.Lock()
	n.fence.waiting = true
	n.fence.mu.Unlock()
	n.setUnproven(unproven)
	results := make([]FencedPeer, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = n.fencePeer(ctx, p, fenceFrom{at: elected, what: "elected", term: term}, func(ctx context.Context) (string, bool) { return n.askUntilClear(ctx, p.Node) })
			results[i].Took = time.Since(start)
			n.dropUnproven(p.Node)
		}()
	}
	wg.Wait()
	n.setUnproven(nil)
	w := &FenceWait{At: time.Now(), Nodes: results, Took: time.Since(start)}
	if ctx.Err() != nil {
		w.Aborted = "leadership ended"
	}
	n.fence.mu.Lock()
	n.fence.waiting, n.fence.lastWait = false, w
	n.fence.mu.Unlock()
	if ctx.Err() != nil {
		return false, time.Time{}
	}
	for _, r := range results {
		n.metrics.fenceWaits.WithLabelValues(r.By).Inc()
	}
	n.metrics.fenceWaitSeconds.Observe(w.Took.Seconds())
	if len(peers) > 0 {
		n.log.Info("every other serving node is proven stopped", "took", w.Took.Round(time.Millisecond), "nodes", results)
		return true, w.At
	}
	return true, time.Time{}
}

func (n *Node) setUnproven(ids []string) {
	n.prom.mu.Lock()
	n.prom.unproven = ids
	n.prom.mu.Unlock()
}

func (n *Node) dropUnproven(id string) {
	n.prom.mu.Lock()
	n.prom.unproven = slices.DeleteFunc(slices.Clone(n.prom.unproven), func(s string) bool { return s == id })
	n.prom.mu.Unlock()
}

// fencePeer proves that peer p does not serve: by its own answer (asked
// every 100 ms, whatever this node's fence mode), by an operator's
// confirmation, by the fence agent (when one is configured: at once when
// the peer cannot be asked, after it had its hook timeout to stand down
// when it keeps saying it serves), else by the watchdog bound p promised
// (never shorter than this node's own). A peer that promised no watchdog,
// or whose promise is unknown, has no bound: it waits for the others.
//
// ask asks the peer until it answers that it stopped; from is when the
// bound starts (a new leader's election; a new owner's sight of the
// placement: servicerun.go).
func (n *Node) fencePeer(ctx context.Context, p PeerPromise, from fenceFrom, ask func(context.Context) (string, bool)) FencedPeer {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	peer := p.Node
	promise := fmt.Sprintf("promise %s (%s)", p.Promise.Mode, p.Source)
	res := make(chan FencedPeer, 4)
	go func() { // its own answer
		if detail, ok := ask(ctx); ok {
			res <- FencedPeer{Node: peer, By: "clean", Detail: detail}
		}
	}()
	go func() { // an operator's word
		if c, ok := n.awaitConfirmed(ctx, peer, from.term); ok {
			res <- FencedPeer{Node: peer, By: "confirmed", Detail: fmt.Sprintf("confirmed off by %s at %s", c.By, c.At.Format(time.RFC3339))}
		}
	}()
	bound, bounded := n.peerBound(p)
	switch {
	case n.cfg.FenceAgent != nil:
		go func() {
			// Give a live peer that stands down its hook timeout to
			// finish; one that cannot be asked is fenced at once.
			if !n.peerUnreachable(ctx, peer) {
				t := time.NewTimer(n.peerStandDownWait(p))
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
			}
			n.log.Warn("fencing a node that may still serve", "node", peer)
			tries := 0
			err := n.cfg.FenceAgent(ctx, peer, func(try int, err error) {
				tries = try
				n.metrics.fenceAgentRuns.WithLabelValues("failed").Inc()
				n.log.Error("fence agent failed; retrying", "node", peer, "try", try, "err", err)
			})
			if err == nil {
				n.metrics.fenceAgentRuns.WithLabelValues("ok").Inc()
				n.log.Info("fence agent reports the node off", "node", peer, "failed_tries", tries)
				res <- FencedPeer{Node: peer, By: "agent"}
			}
		}()
	case bounded:
		go func() {
			until := from.at.Add(bound)
			n.log.Info("waiting until a node that may still serve must have been reset by its watchdog", "node", peer, "until", until.Format(time.RFC3339Nano), "promise", p.Source, "bound", bound)
			t := time.NewTimer(time.Until(until))
			defer t.Stop()
			select {
			case <-t.C:
				res <- FencedPeer{Node: peer, By: "watchdog", Detail: fmt.Sprintf("%s + %v passed (%s: lease + watchdog timeout + margin)", from.what, bound, promise)}
			case <-ctx.Done():
			}
		}()
	default:
		go func() { // said once it did not answer at once (a live peer answers within ms)
			t := time.NewTimer(unprovenWarnAfter)
			defer t.Stop()
			select {
			case <-t.C:
				n.log.Warn("a node that may still serve promised no watchdog, or its promise is unknown: not serving until it answers that it stopped or an operator confirms it is off (nsmd fence confirm "+peer+")",
					"node", peer, "promise", p.Promise.Mode.String(), "source", p.Source)
			case <-ctx.Done():
			}
		}()
	}
	select {
	case r := <-res:
		if r.By != "watchdog" {
			r.Detail = joinDetail(r.Detail, promise)
		}
		return r
	case <-ctx.Done():
		return FencedPeer{Node: peer, By: "aborted", Detail: promise}
	}
}

// fenceFrom is when a wait by a watchdog bound starts (what names it in
// the wait's detail), and the term whose local confirmations count.
type fenceFrom struct {
	at   time.Time
	what string
	term uint64
}

// unprovenWarnAfter is how long a new leader waits for an answer from a
// peer that no bound proves stopped before it logs that it waits for one.
const unprovenWarnAfter = 2 * time.Second

func joinDetail(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
