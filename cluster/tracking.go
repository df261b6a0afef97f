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

// track commits one NFSv4 client-tracking command on the serving leader.
// It returns only once the command is committed on a quorum, so an
// answered upcall is durable.
func (n *Node) track(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	if n.cfg.Witness || !n.Leading() {
		return fsm.Result{}, ErrNotServing
	}
	res, err := n.applyLocal(ctx, cmd)
	if errors.Is(err, ErrNotLeader) {
		return res, fmt.Errorf("%w: %w", ErrNotServing, err)
	}
	return res, err
}

// TrackCreate records NFSv4 client name (and the hash of its Kerberos
// principal, if any) in the current epoch (cld Create).
func (n *Node) TrackCreate(ctx context.Context, name, princHash string) error {
	_, err := n.track(ctx, fsm.ClientCreate{Name: name, PrincHash: princHash})
	return err
}

// TrackRemove drops client name from the current epoch (cld Remove).
func (n *Node) TrackRemove(ctx context.Context, name string) error {
	_, err := n.track(ctx, fsm.ClientRemove{Name: name})
	return err
}

// TrackCheck says whether client name may reclaim (it is in the recovery
// epoch) and, if so, records it in the current one (cld Check, old kernels).
func (n *Node) TrackCheck(ctx context.Context, name string) (bool, error) {
	res, err := n.track(ctx, fsm.ClientCheck{Name: name})
	return res.Accepted, err
}

// TrackGraceStart opens a grace period in the tracking table (cld
// GraceStart: a new epoch, unless one is still open) and returns the
// clients that may reclaim: the records of the recovery epoch.
func (n *Node) TrackGraceStart(ctx context.Context) ([]fsm.V4Client, error) {
	if _, err := n.track(ctx, fsm.GraceStart{}); err != nil {
		return nil, err
	}
	// Committed and applied here (the leader applies before answering);
	// only GraceDone changes the recovery set, and the kernel sends it
	// after this GraceStart's answer.
	return n.fsm.V4Clients(true), nil
}

// TrackGraceDone closes the grace period in the tracking table (cld
// GraceDone): clients that did not reclaim can no longer.
func (n *Node) TrackGraceDone(ctx context.Context) error {
	_, err := n.track(ctx, fsm.GraceDone{})
	return err
}
