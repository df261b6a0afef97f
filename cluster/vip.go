package cluster

import (
	"context"
	"time"
)

// FloatingAddr is the address the leader holds (the VIP). The leader
// loop acquires it after its Takeover committed and releases it the moment
// leadership is lost, before anything else.
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

// vipNotBefore is when this new leader may take the VIP: only once a
// previous holder's address must have expired by itself. The previous
// leader renews it until its lease runs out after its last contact with a
// quorum, and the kernel keeps it for Lifetime after the last renewal.
// That last quorum contact is no later than the later of (a) our own last
// contact with it and (b) our election minus the heartbeat timeout: the
// voter that elected us had not heard from it for that long (with an
// asymmetric cut, (b) is the later one). A node that never heard from a
// leader counts from its own start.
func (n *Node) vipNotBefore(lastContact, elected time.Time) time.Time {
	life := n.cfg.VIP.Lifetime()
	if life == 0 {
		return time.Time{}
	}
	base := lastContact
	if v := elected.Add(-n.cfg.HeartbeatTimeout); v.After(base) {
		base = v
	}
	if base.IsZero() || base.Before(n.started) {
		base = n.started
	}
	return base.Add(n.cfg.LeaderLeaseTimeout + life + vipMargin)
}

// vipMargin covers the kernel's lifetime check: it removes expired IPv4
// addresses from a timer that runs about once a second, so an address can
// outlive its valid_lft by up to ~1 s plus timer slack (measured: an
// address change elsewhere on the host re-arms the check ≥1 s out; in a
// SIGSTOP drill a 250 ms margin left only 60 ms to spare).
const vipMargin = 1250 * time.Millisecond

// acquireVIP waits out a previous holder's lifetime, then takes the VIP,
// retrying until it works or leadership ends.
func (n *Node) acquireVIP(ctx context.Context, lastContact, elected time.Time) bool {
	wait := time.Until(n.vipNotBefore(lastContact, elected))
	if wait > 0 {
		if prev, released := n.previousHolderReleased(ctx); released {
			n.log.Info("previous leader reports the VIP released; taking it at once", "previous", prev)
			wait = 0
		}
	}
	if wait > 0 {
		n.log.Info("waiting for a previous holder's VIP lifetime to run out", "wait", wait.Round(time.Millisecond))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
	for {
		// Renewed only while a quorum confirms the leadership
		// (vipNotBefore counts on it; see WithRenewGate).
		err := n.cfg.VIP.Acquire(WithRenewGate(ctx, n.leaderLeaseFresh))
		if err == nil {
			return true
		}
		n.log.Error("cannot take the VIP; retrying", "err", err)
		n.fault("vip_acquire", err)
		t := time.NewTimer(time.Second)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// VIPHeld reports whether this node holds the VIP.
func (n *Node) VIPHeld() bool { return n.cfg.VIP != nil && n.cfg.VIP.Held() }

// fault reports a fault the node cannot fix by itself (OnFault hook).
func (n *Node) fault(reason string, err error) {
	if n.cfg.OnFault != nil {
		n.cfg.OnFault(reason, err)
	}
}

// vipDiesWithProcess reports whether this node's VIP is bound to its
// process; the cluster's nodes share their VIP configuration, so the
// previous holder's was too.
func (n *Node) vipDiesWithProcess() bool {
	pb, ok := n.cfg.VIP.(interface{ DiesWithProcess() bool })
	return ok && pb.DiesWithProcess()
}

// abandoner is a FloatingAddr that can stop renewing without deleting the
// address, as a crashed holder would (the kernel expires it).
type abandoner interface{ Abandon() }
