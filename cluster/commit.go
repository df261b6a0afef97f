package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/fsm"
)

// errLowerHere: commit's leader refuses the command's kind (lowerAt).
var errLowerHere = errors.New("cluster: the leader's release refuses this command")

// maxBatch caps how many writes share one raft log entry.
const maxBatch = 512

// applyTimeout bounds how long a batch may wait to enter raft's queue.
const applyTimeout = 5 * time.Second

// write is one command waiting for its commit.
type write struct {
	seq  uint64 // order of arrival (Node.writeSeq)
	cmd  fsm.Command
	res  fsm.Result
	err  error
	done chan struct{}
}

// batch is one raft log entry in flight.
type batch struct {
	f     raft.ApplyFuture
	ws    []*write
	start time.Time
}

// apply commits one command wherever this node stands: on the leader
// through the local group commit, on a follower by forwarding it to the
// leader. While no leader is known (an election), the write is held up to
// HoldTimeout, then fails with ErrNoLeader. Retries after a leader change
// are safe: every command is idempotent or, for SM_SIMU_CRASH, harmless.
func (n *Node) apply(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	return n.commit(ctx, cmd, nil)
}

// commit is apply; lowerAt, when set, is asked before each forward
// whether the leader it names refuses cmd's kind (an older release), and
// then — or when the leader answers that it cannot decode cmd — commit
// returns errLowerHere for its caller's fallback.
func (n *Node) commit(ctx context.Context, cmd fsm.Command, lowerAt func(leader string) bool) (fsm.Result, error) {
	deadline := time.Now().Add(n.cfg.HoldTimeout)
	backoff := 10 * time.Millisecond
	var lastErr error
	for {
		changed := n.leaderChanged()
		if n.Leading() { // leader whose takeover has committed
			res, err := n.applyLocal(ctx, cmd)
			if !errors.Is(err, ErrNotLeader) {
				return res, err
			}
			lastErr = err
		} else if id, addr := n.leaderNSMAddr(); addr != "" && id != n.cfg.NodeID {
			if lowerAt != nil && lowerAt(id) {
				return fsm.Result{}, errLowerHere
			}
			fctx, cancel := context.WithDeadline(ctx, deadline)
			st, err := n.forward(fctx, addr, cmd)
			cancel()
			if err == nil {
				return fsm.Result{State: st}, nil
			}
			if lowerAt != nil && errors.Is(err, errRefusedKind) {
				return fsm.Result{}, errLowerHere
			}
			if !errors.Is(err, errRetry) {
				return fsm.Result{}, err
			}
			lastErr = fmt.Errorf("leader %s: %w", id, err)
		} else if id == n.cfg.NodeID {
			lastErr = fmt.Errorf("%w: this node was elected and is still taking over", ErrNoLeader)
		} else if id != "" {
			lastErr = fmt.Errorf("%w: no NSM address known for leader %s", ErrNoLeader, id)
		} else {
			lastErr = ErrNoLeader
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return fsm.Result{}, fmt.Errorf("cluster: write held %v without success: %w", n.cfg.HoldTimeout, lastErr)
		}
		t := time.NewTimer(min(wait, backoff))
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fsm.Result{}, fmt.Errorf("cluster: %w (last: %v)", ctx.Err(), lastErr)
		case <-n.ctx.Done():
			t.Stop()
			return fsm.Result{}, ErrClosed
		}
		t.Stop()
		backoff = min(2*backoff, 250*time.Millisecond)
	}
}

// applyLocal commits one command on the leader. Concurrent calls are
// grouped into one log entry by commitLoop (group commit): a lone write
// goes out at once, and writes that arrive while an entry is being
// committed form the next one. Every caller still waits for its own commit.
func (n *Node) applyLocal(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	if n.raft.State() != raft.Leader {
		return fsm.Result{}, ErrNotLeader
	}
	if handled, err := n.gateServing(cmd); handled { // kinds 15 and 17 (promise.go)
		return fsm.Result{State: n.fsm.State()}, err
	}
	if err := n.placer.gate(cmd); err != nil { // kinds 18–21 (placer.go)
		return fsm.Result{State: n.fsm.State()}, err
	}
	// A placement that takes a service from its owner stops confirming
	// the owner's lease first (servicelease.go); refused, it confirms it
	// again (nothing moved).
	undo := n.leases.revokeFor(cmd)
	if res, lowered, err := n.lowerOnLeader(ctx, cmd); lowered {
		return res, err
	}
	w := &write{seq: n.writeSeq.Add(1), cmd: cmd, done: make(chan struct{})}
	select {
	case n.writes <- w:
	case <-ctx.Done():
		return fsm.Result{}, fmt.Errorf("cluster: queue write: %w", ctx.Err())
	case <-n.ctx.Done():
		return fsm.Result{}, ErrClosed
	}
	select {
	case <-w.done:
		if undo != nil && w.err == nil && w.res.Refused {
			undo()
		}
		if t, ok := cmd.(fsm.Takeover); ok && w.err == nil && (t.Reason == reasonSimuCrash || t.Reason == reasonImport) {
			n.signalCrash(w.res.State)
		}
		return w.res, w.err
	case <-ctx.Done():
		// The entry may still commit; NSM writes are idempotent, so the
		// caller's retry is safe.
		return fsm.Result{}, fmt.Errorf("cluster: wait for commit: %w", ctx.Err())
	case <-n.ctx.Done():
		return fsm.Result{}, ErrClosed
	}
}

func (w *write) finish(res fsm.Result, err error) {
	w.res, w.err = res, err
	close(w.done)
}

// commitLoop takes whatever writes are queued, encodes them as one entry
// and hands it to raft. Batching comes from writes piling up while earlier
// entries commit, and from a short wait for the writers the previous
// entry just answered (awaitReturning); a lone writer never waits. At most
// Config.MaxInflightEntries entries are in raft at once (a slot is taken
// before the queue is drained and given back when the entry has been
// applied), so writes that arrive during a commit share the next entry
// instead of each paying for its own round of fsyncs on every node.
func (n *Node) commitLoop() {
	ws := make([]*write, 0, maxBatch)
	cmds := make([]fsm.Command, 0, maxBatch)
	for {
		ws, cmds = ws[:0], cmds[:0]
		select {
		case w := <-n.writes:
			ws = append(ws, w)
		case <-n.ctx.Done():
			return
		}
		select {
		case n.slots <- struct{}{}:
		case <-n.ctx.Done():
			return
		}
	drain:
		for len(ws) < maxBatch {
			select {
			case w := <-n.writes:
				ws = append(ws, w)
			default:
				break drain
			}
		}
		ws = n.awaitReturning(ws)
		for _, w := range ws {
			cmds = append(cmds, w.cmd)
		}
		data, err := fsm.Encode(cmds...)
		if err != nil {
			<-n.slots
			for _, w := range ws {
				w.finish(fsm.Result{}, fmt.Errorf("cluster: encode command: %w", err))
			}
			continue
		}
		b := &batch{ws: append([]*write(nil), ws...), start: time.Now()}
		b.f = n.raft.Apply(data, applyTimeout)
		n.metrics.batchSize.Observe(float64(len(ws)))
		select {
		case n.inflight <- b:
		case <-n.ctx.Done():
			return
		}
	}
}

// awaitReturning holds the next entry back briefly for the writers the
// previous entry just answered. Without it, callers that each keep one
// write outstanding split into two groups that take turns — one commits
// while the other queues — and every write waits about two commits. A
// write that arrived after the previous entry completed counts as one of
// its writers coming back; the wait ends when as many came back as that
// entry carried, or after half of its commit time (at most 1 ms), so a
// lone writer never waits and a writer that went away costs one short
// wait once.
func (n *Node) awaitReturning(ws []*write) []*write {
	prev, after := n.lastBatch.Load(), n.lastDoneSeq.Load()
	var got uint64
	for _, w := range ws {
		if w.seq > after {
			got++
		}
	}
	if prev <= 1 || got >= prev {
		return ws
	}
	wait := min(time.Duration(n.lastCommitNanos.Load())/2, time.Millisecond)
	if wait <= 0 {
		return ws
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for len(ws) < maxBatch && got < prev {
		select {
		case w := <-n.writes:
			ws = append(ws, w)
			if w.seq > after {
				got++
			}
		case <-t.C:
			return ws
		case <-n.ctx.Done():
			return ws
		}
	}
	return ws
}

// waitLoop completes batches in log order.
func (n *Node) waitLoop() {
	for {
		select {
		case b := <-n.inflight:
			b.f.Error() // committed (or failed); nobody answered yet
			n.lastCommitNanos.Store(int64(time.Since(b.start)))
			n.lastBatch.Store(uint64(len(b.ws)))
			n.lastDoneSeq.Store(n.writeSeq.Load())
			n.complete(b)
			<-n.slots
		case <-n.ctx.Done():
			return
		}
	}
}

func (n *Node) complete(b *batch) {
	err := b.f.Error()
	n.metrics.applyLatency.Observe(time.Since(b.start).Seconds())
	if err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			err = fmt.Errorf("%w: %w", ErrNotLeader, err)
		}
		for _, w := range b.ws {
			w.finish(fsm.Result{}, fmt.Errorf("cluster: commit: %w", err))
		}
		return
	}
	switch resp := b.f.Response().(type) {
	case []fsm.Result:
		if len(resp) != len(b.ws) {
			err = fmt.Errorf("cluster: %d results for %d commands", len(resp), len(b.ws))
			break
		}
		for i, w := range b.ws {
			w.finish(resp[i], nil)
		}
		return
	case error:
		err = fmt.Errorf("cluster: apply: %w", resp)
	default:
		err = fmt.Errorf("cluster: unexpected apply response %T", resp)
	}
	for _, w := range b.ws {
		w.finish(fsm.Result{}, err)
	}
}
