package cluster

import (
	"context"

	"github.com/nsmd/nsmd/fsm"
)

// Server is what a node serves: the leader loop (leader.go) calls it in a
// takeover's order (DESIGN.md, "Leadership"). Serve once the takeover
// committed, the VIP is held and every other serving node is proven
// stopped; Stop when leadership ends, on shutdown, after a failed Serve,
// and before the first term with Config.StopAtStart; Fault for what the
// node cannot fix by itself. The node never calls Serve and Stop at once.
type Server interface {
	// Serve starts serving the term's takeover t with sm_state state (the
	// agent: the grace keeper, the on_leader hook, tickle ACKs) and
	// returns once the service can take the clients' reclaims, bounded by
	// Config.HookTimeout. An error is a failed takeover: the node stops
	// again, tells no subscriber and hands leadership on. ctx ends with
	// the term.
	Serve(ctx context.Context, t fsm.Takeover, state int32) error
	// Stop stops what Serve started, or what a previous process of the
	// node may have left serving (why is StopStart), and returns once it
	// has (the on_follower hook: stop nfsd, unmount). An error means the
	// node may still hold the storage: its watchdog resets it.
	Stop(why StopReason) error
	// Fault is told of a fault the node cannot fix by itself (the VIP
	// cannot be taken, a takeover did not commit). It must not block.
	Fault(reason string, err error)
}

// StopReason says why Server.Stop runs.
type StopReason string

const (
	// StopLeadershipLost: the term ended (leadership lost or handed on, a
	// shutdown, a failed Serve).
	StopLeadershipLost StopReason = "leadership_lost"
	// StopStart: before this node's first term, what a previous process
	// that died while it served may have left mounted and running.
	StopStart StopReason = "start"
)
