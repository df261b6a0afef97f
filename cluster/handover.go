package cluster

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/nsmd/nsmd/internal/ctxtime"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/vip"
)

// The VIP hand-over: when a new leader may take the floating address from
// the previous holder (cluster/DESIGN.md, "The floating address"). It
// waits until the previous holder's address must have expired by itself
// (vipNotBefore), unless the previous leader says it released it or its
// process is gone (previousHolderReleased), and every node answers that
// question for itself (serveVIPHeld, vipheld.go: authenticated with the
// cluster key).

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

// awaitVIPFree waits out a previous holder's lifetime (at once when it
// says it released the VIP); false when leadership ended first.
func (n *Node) awaitVIPFree(ctx context.Context, lastContact, elected time.Time) bool {
	wait := time.Until(n.vipNotBefore(lastContact, elected))
	if wait > 0 {
		if prev, released := n.previousHolderReleased(ctx); released {
			n.log.Info("previous leader reports the VIP released; taking it at once", "previous", prev)
			wait = 0
		}
	}
	if wait > 0 {
		n.log.Info("waiting for a previous holder's VIP lifetime to run out", "wait", wait.Round(time.Millisecond))
	}
	return ctxtime.Sleep(ctx, wait)
}

// takeVIP takes the VIP (awaitVIPFree first), retrying until it works or
// leadership ends; quiet: unannounced until announceVIP.
func (n *Node) takeVIP(ctx context.Context, quiet bool) bool {
	for {
		// Renewed only while a quorum confirms the leadership
		// (vipNotBefore counts on it; see vip.WithRenewGate).
		actx := vip.WithRenewGate(ctx, n.leaderLeaseFresh)
		if quiet {
			actx = vip.WithQuietStart(actx)
		}
		err := n.cfg.VIP.Acquire(actx)
		if err == nil {
			return true
		}
		n.log.Error("cannot take the VIP; retrying", "err", err)
		n.fault("vip_acquire", err)
		if !ctxtime.Sleep(ctx, time.Second) {
			return false
		}
	}
}

// quietVIP reports whether this leader takes its VIP unannounced: it runs
// a hook before it serves, and its VIP can wait to be announced.
func (n *Node) quietVIP() bool {
	_, ok := n.cfg.VIP.(announcer)
	return ok && n.cfg.Server != nil
}

// announceVIP announces a VIP taken quietly, once the node serves.
func (n *Node) announceVIP() {
	if a, ok := n.cfg.VIP.(announcer); ok {
		a.Announce()
	}
}

// vipUnsure records that a term of this node, elected at elected, ended
// before it took the VIP. A previous holder (frozen, cut off) may still
// have the address until elected + lease + lifetime + margin — when it
// lost its quorum is before our election — and a next leader that asks
// this node (the last leader it saw) must not hear "not held" until then.
func (n *Node) vipUnsure(elected time.Time) {
	if n.cfg.VIP == nil || n.cfg.VIP.Lifetime() == 0 {
		return
	}
	until := elected.Add(n.cfg.LeaderLeaseTimeout + n.cfg.VIP.Lifetime() + vipMargin).UnixNano()
	if until > n.vipUnsureUntil.Load() {
		n.vipUnsureUntil.Store(until)
		n.log.Info("leadership ended before the VIP was taken: answering held until a previous holder's copy must have expired", "until", time.Unix(0, until).Format(time.RFC3339Nano))
	}
}

// vipVouchable reports whether this node may say it does not hold the VIP
// (see vipUnsure).
func (n *Node) vipVouchable() bool { return time.Now().UnixNano() >= n.vipUnsureUntil.Load() }

// boolRes decodes an XDR bool result.
type boolRes struct{ V bool }

func (b *boolRes) UnmarshalXDR(r *oncrpc.Reader) error {
	b.V = r.Bool()
	return r.Err()
}

// previousHolderReleased asks the last leader this node followed whether
// it still holds the VIP. Only a clear "no" from it counts: a leader that
// stepped down in a planned way (transfer, SIGTERM) deleted the address
// before it stopped leading, so the new one need not wait for its
// lifetime. A dead, stopped or cut-off one cannot answer, and then the
// caller waits as usual.
func (n *Node) previousHolderReleased(ctx context.Context) (string, bool) {
	prev := n.previousLeader()
	if prev == "" || prev == n.cfg.NodeID {
		return prev, false
	}
	addr := n.peerNSMAddr(prev)
	if addr == "" {
		return prev, false
	}
	// Right after a transfer the old leader may not have stepped down yet,
	// or still runs its on_follower hook (unmounting shared storage): ask
	// again, up to StandDownWait, while it still says "held".
	// A node that answers may take that long; one that does not must not
	// hold us up longer than a second (a dead host: no RST, only silence).
	ctx, cancel := context.WithTimeout(ctx, n.cfg.StandDownWait)
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, time.Second)
	defer dcancel()
	// Refused: the previous leader's host is up but nothing listens on its
	// NSM port: its nsmd process is gone, and a VIP bound to a process went
	// with it (the kernel deleted the device). A frozen process still
	// accepts connections; a dead or cut-off host does not answer at all:
	// both mean waiting.
	gone := func(err error) bool {
		if errors.Is(err, syscall.ECONNREFUSED) && n.vipDiesWithProcess() {
			n.log.Info("previous leader's NSM port refuses connections: its process, and with it its process-bound VIP, is gone", "previous", prev, "addr", addr)
			return true
		}
		return false
	}
	c, err := oncrpc.Dial(dctx, oncrpc.ClientConfig{Net: "tcp", Addr: addr, Timeout: 300 * time.Millisecond})
	if err != nil {
		return prev, gone(err)
	}
	defer c.Close()
	for {
		held, err := n.askVIPHeld(ctx, c, prev) // vipheld.go
		if errors.Is(err, errVIPHeldUnproven) {
			n.log.Warn("previous leader's \"VIP released\" is not authenticated with the cluster key: not believed, waiting out the VIP's lifetime", "previous", prev, "err", err)
			return prev, false
		}
		if err != nil {
			return prev, gone(err)
		}
		if !held {
			return prev, true
		}
		select {
		case <-ctx.Done():
			return prev, false
		case <-time.After(50 * time.Millisecond):
		}
	}
}
