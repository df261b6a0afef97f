// Package fsm is nsmd's replicated state machine: the monitored-host
// registrations (accepted SM_MON calls), the server's sm_state, the last
// state seen from each monitored peer and the NLM grace window; and the
// kernel's NFSv4 client-tracking database, kept with the semantics of
// nfs-utils' nfsdcld. *FSM implements raft.FSM.
//
// # Commands
//
// A state change is a Command: Register, Unregister, UnregisterAll,
// Takeover or PeerRebooted for NSM; ClientCreate, ClientRemove,
// ClientCheck, GraceStart or GraceDone (one per nfsdcld upcall) for NFSv4
// client tracking; ServingBegin, ServingEnd and FenceConfirm for who
// serves; ServicesDeclared, ServicePlaced and ServiceForgotten for where
// each NFS service runs (a placement applies only on the service's latest
// epoch, so a stale one is refused). One raft log entry carries a batch of commands
// (group commit), encoded by Encode in a compact, versioned binary format;
// Apply decodes the whole batch, applies it atomically and returns one
// Result per command. A malformed entry is rejected as a whole with an
// error wrapping ErrBadCommand and changes no replicated state.
//
// Apply is deterministic: it never reads the clock or does I/O and no map
// iteration order leaks into its results. The leader stamps times and
// names into commands before raft.Apply; the FSM itself computes the next
// sm_state at a Takeover (smallest odd number above the current one and at
// least Takeover.MinState), so sm_state is odd after the first takeover,
// strictly increasing and never reused.
//
// A registration belongs to the lock manager that made it: an Unregister
// or UnregisterAll with an Owner removes only the Owner's, and a guarded
// Register (an SM_MON) replaces an existing registration only for its
// lock manager or for the serving node's lockd (the node of the last
// Takeover), else it is Refused. Those kinds are proposed only once every
// member applies them (CommandLevel).
//
// # NFSv4 client tracking
//
// Two epochs: current (1 in a new FSM, never decreasing) and recovery (0
// when not in grace, else current-1); two record sets {name, principal
// hash}: the current epoch's and, during a grace period, the recovery
// epoch's. GraceStart opens a grace period: the current records become
// the recovery records and the current epoch advances with no records
// (already in grace, it only empties the current records). A client may
// reclaim iff the recovery epoch holds it; GraceDone drops the recovery
// records, so a client that did not reclaim, or was not created again,
// during the grace period is gone. The kinds of these commands extend
// the entry format compatibly, but nodes built before them refuse such
// entries: a cluster must finish upgrading before NFSv4 tracking is used.
//
// # Usage
//
//	f := fsm.New(fsm.Options{Observer: func(i uint64, c fsm.Command, r fsm.Result) { ... }})
//	r, _ := raft.NewRaft(conf, f, logs, stable, snaps, trans)
//	b, _ := fsm.Encode(fsm.Register{Reg: reg}, fsm.Unregister{ID: id})
//	fut := r.Apply(b, timeout)
//	if err := fut.Error(); err == nil {
//		switch res := fut.Response().(type) {
//		case []fsm.Result: // one per command
//		case error: // errors.Is(res, fsm.ErrBadCommand)
//		}
//	}
//
// Reads (State, TakeoverTerm, Get, Registrations, Targets, WouldAccept,
// Epochs, V4Clients, V4Counts, HasV4Client, Services, PlacementOf,
// Digest …) are safe to call
// concurrently with Apply. Snapshot is O(1): it
// takes a copy-on-write clone of the state; Persist streams it without
// holding any lock. See DESIGN.md in this directory for the reasoning and the
// snapshot format.
package fsm
