package cluster

import (
	"context"
	"time"
)

// FloatingAddr is the address the leader holds (the VIP). The leader
// loop acquires it after its Takeover committed and releases it the moment
// leadership is lost, before anything else. Package vip has both kinds:
// vip.Netlink for vip_mode netlink, vip.Loopback for vip_mode loopback.
type FloatingAddr interface {
	// Acquire takes the address and keeps it (renewing, re-adding,
	// re-announcing) until Release. It returns once the address answers.
	Acquire(ctx context.Context) error
	// Release drops the address at once. Safe to call when not held.
	Release() error
	// Held reports whether this node holds the address now.
	Held() bool
	// Lifetime is how long the address outlives a holder that dies or
	// stops without releasing it (the kernel's valid_lft); 0 when it dies
	// with the process (a socket).
	Lifetime() time.Duration
}

// processBound is a FloatingAddr that may go with the process that holds
// it (vip.Netlink bound to a TUN device): then a previous holder whose
// process is gone no longer has it (previousHolderReleased).
type processBound interface{ DiesWithProcess() bool }

// abandoner is a FloatingAddr that can stop renewing without deleting the
// address, as a crashed holder would (the kernel expires it): Kill uses it.
type abandoner interface{ Abandon() }

// announcer is a FloatingAddr that can hold the address without telling
// the network (acquired under vip.WithQuietStart) until Announce. A
// serving leader takes the VIP before on_leader (the hook checks it holds
// it) and announces it once the hook returned: clients keep sending to
// the old holder's hardware address until nfsd listens, instead of
// reaching a node that refuses their reconnects (each refusal doubles the
// kernel RPC client's pause before the next: 3, 6, 12 s).
type announcer interface{ Announce() }

// VIPHeld reports whether this node holds the VIP.
func (n *Node) VIPHeld() bool { return n.cfg.VIP != nil && n.cfg.VIP.Held() }

// vipDiesWithProcess reports whether this node's VIP is bound to its
// process; the cluster's nodes share their VIP configuration, so the
// previous holder's was too.
func (n *Node) vipDiesWithProcess() bool {
	pb, ok := n.cfg.VIP.(processBound)
	return ok && pb.DiesWithProcess()
}
