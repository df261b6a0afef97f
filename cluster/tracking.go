package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/nsmd/nsmd/fsm"
)

// ErrNotServing means this node may not answer the kernel's NFSv4
// client-tracking upcalls: it is a witness, it does not lead, or its
// takeover has not committed yet. Only the serving leader runs nfsd, and a
// node that lost leadership must not answer from a table that has moved on
// without it, so these writes are never forwarded.
var ErrNotServing = errors.New("cluster: not serving NFSv4 client tracking (not the leader with a committed takeover)")

// ApplyServing commits a write that only the serving node may make: one
// NFSv4 client-tracking command (fsm.ClientCreate, ClientRemove,
// ClientCheck, GraceStart, GraceDone: the cld upcalls, which the agent
// adapts to). It is never forwarded: on a witness, on a node that does
// not lead, or before its takeover committed, it is ErrNotServing. It
// returns only once the command is committed on a quorum and applied
// here, so an answered upcall is durable and View reads its effect.
func (n *Node) ApplyServing(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	switch cmd.(type) {
	case fsm.ClientCreate, fsm.ClientRemove, fsm.ClientCheck, fsm.GraceStart, fsm.GraceDone:
	default:
		return fsm.Result{}, fmt.Errorf("cluster: %T is not a write of the serving node", cmd)
	}
	if n.cfg.Witness || !n.Leading() {
		return fsm.Result{}, ErrNotServing
	}
	res, err := n.applyLocal(ctx, cmd)
	if errors.Is(err, ErrNotLeader) {
		return res, fmt.Errorf("%w: %w", ErrNotServing, err)
	}
	return res, err
}
