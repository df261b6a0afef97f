// Package placement decides which server each NFS service runs on. It is
// a pure function of its input — the servers and their health, what each
// node's configuration declares (each service's fingerprint and
// preferred servers, as replicated), and where each service is now —
// and it returns the moves to
// commit: the same input gives the same moves, whatever the order of
// its slices or maps (every tie is broken by id). It reads no clock,
// does no I/O and keeps no state; the caller (the raft leader) commits
// each move as an fsm.ServicePlaced with the epoch the move carries, so
// a move decided on a view that is no longer current is refused by the
// FSM, never applied over a newer one.
//
// # The rules, and why
//
// Who may own a service. Only a server (never a witness: it has no
// storage and runs no hook) that is healthy (the caller decides: alive in
// gossip, not draining, disk not slow, …) and declares the service with
// the agreed fingerprint. The fingerprint covers the whole specification
// (address, device, exports, grace, preferences): a server that takes a
// service over must serve exactly what the one before served.
//
// Conflict. The fingerprint is agreed when every member that declares
// the service declares the same one. If two differ, the service is in
// conflict: it is not placed anew and not moved — not even away from an
// owner that is down — because there is no right answer to which
// specification to serve, and the operator must fix the configuration.
// An owner it has keeps it: stopping a running service because a second
// server's configuration differs would turn a configuration mistake into
// an outage. Decide reports each conflict (Hold.Conflict) so the status
// can show it.
//
// Where a service goes. To the eligible server that comes first in the
// service's Prefer list; among servers it does not list, the one with
// the fewest services (counting the moves of this decision); then the
// smallest id. Preference wins over load because it is the operator's
// explicit word (a server closer to the disk, a bigger machine); load
// spreads the rest, so N services without preferences on N healthy
// servers get one each. Services with preferences are placed before
// those without, so the latter spread around them.
//
// No flapping. A service whose owner is healthy and still eligible stays
// where it is, always — a move costs its clients a grace period — unless
// Policy.Failback is set and a server earlier in its Prefer list is
// eligible (failback: the operator asked for it). So a server that comes
// back gets nothing back without Failback; only services with no owner
// go to it. A service whose owner is unhealthy or no longer a member
// moves to the best eligible server; with none, it stays recorded on its
// owner (taking it away would serve nobody and the owner may be serving
// it still). A service whose owner can no longer serve it at all (the
// owner is a witness, or its configuration no longer declares the
// service) moves to the best eligible server, or, with none, is taken
// away (placed on "").
//
// Nobody declares it. A service no member declares any more (it was
// removed from every configuration) is taken away from its owner.
//
// Settling. While Policy.Settling is set (the caller's settle period
// after the cluster starts, until the expected servers have joined),
// services without an owner wait: otherwise the first server up would
// take every service and, without Failback, keep them. A service whose
// owner is lost still moves at once.
//
// One move per service per decision; Policy.MaxMoves bounds the moves of
// one decision (the rest wait, reported as held): moves that restore a
// service (owner lost, owner cannot serve, nobody declares it) first,
// then placements, then failbacks, each by service order. Applying every
// move and deciding again gives no move (tested: idempotent).
//
// An operator's move (PlanMove) is checked by the same rule of who may
// own a service and gives one move; it is refused with a clear error
// otherwise.
//
// # Usage
//
// The leader builds the Input from the FSM's ServiceState (declarations
// and placements, EpochFloor) and its view of the members' health, and
// commits each move:
//
//	d := placement.Decide(in)
//	for _, m := range d.Moves {
//		cmd := fsm.ServicePlaced{Service: m.Service, Node: m.To, Epoch: m.Epoch,
//			From: m.From, Reason: m.Reason, At: now}
//		// commit cmd; a Result with Refused (fsm.ErrStaleEpoch) means the
//		// state moved on: decide again on the new one.
//	}
//	// d.Holds: what status shows (conflicts, services waiting, and why).
package placement
