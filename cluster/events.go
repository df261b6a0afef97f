package cluster

import (
	"context"
	"sync"

	"github.com/nsmd/nsmd/fsm"
)

// Applied is one command applied to this node's state machine.
type Applied struct {
	Index  uint64
	Cmd    fsm.Command
	Result fsm.Result
	// Replay: the entry was already in the log when the node started. Its
	// side effects happened before the restart; doing them again (a
	// second lock-manager callback) could undo what clients did since.
	Replay bool
}

// Subscriber is told of a node's events. The node calls it; whatever
// goroutines a subscriber needs beyond those calls are its own. Either
// function may be nil.
type Subscriber struct {
	// Applied is called on every node for every applied command, in log
	// order, inside the state machine's Apply: it must not block.
	Applied func(Applied)
	// Serving runs in this node's leader loop each time it starts to
	// serve a term: its Takeover committed, the VIP is held, every other
	// serving node was proven stopped and Server.Serve succeeded — the moment
	// clients may be told to reclaim here (the SM_NOTIFY fan-out). state
	// is the sm_state to announce. ctx ends when leadership ends, after
	// the VIP was released and Server.Stop returned, or when a later
	// takeover of the same term (SM_SIMU_CRASH, an import) supersedes
	// state; Serving is then called again with the newer state. Serving
	// must return once ctx ends: the leader loop waits for it before the
	// next term starts.
	Serving func(ctx context.Context, state int32)
}

// applied hands one applied command to every subscriber, in the order
// they were given to New.
func (n *Node) applied(ev Applied) {
	n.scopedWaits.applied(ev)
	for _, s := range n.subs {
		if s.Applied != nil {
			s.Applied(ev)
		}
	}
}

// servingTerm runs every subscriber's Serving for state, each in its own
// goroutine, and returns once all have returned.
func (n *Node) servingTerm(ctx context.Context, state int32) {
	var wg sync.WaitGroup
	for _, s := range n.subs {
		if s.Serving == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Serving(ctx, state)
		}()
	}
	wg.Wait()
}
