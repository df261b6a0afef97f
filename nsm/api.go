// Package nsm implements the Network Status Monitor program (ONC RPC
// program 100024 version 1, X/Open XNFS "NSM") as nfs-utils rpc.statd
// behaves, on top of package oncrpc, over a Registry that may be one node
// or a cluster.
//
// The parts:
//
//   - wire types mirroring sm_inter.x (types.go), each with MarshalXDR and
//     UnmarshalXDR that enforce every maximum;
//   - Service, the oncrpc.Handler for Program, one file per procedure
//     (null.go … notify.go), with rpc.statd's access rules (access.go);
//   - Deliverer, which calls the lock manager back (nlm.Status) when a
//     monitored peer reboots, retrying as rpc.statd does;
//   - Notifier, which sends SM_NOTIFY to every monitored host after a
//     takeover, as sm-notify does but over one socket for thousands of
//     hosts;
//   - Metrics, optional Prometheus metrics for all of the above.
//
// Wiring:
//
//	m := nsm.NewMetrics(promRegistry)
//	svc, err := nsm.NewService(registry, nsm.Config{NodeID: id, Trusted: prefixes, Metrics: m})
//	srv := oncrpc.NewServer(oncrpc.Programs{nsm.Program: svc}, oncrpc.ServerConfig{Observe: m.ObserveRPC})
//	d := nsm.NewDeliverer(nsm.DelivererConfig{Metrics: m}) // go d.Run(ctx); d.Enqueue(cb)
//	n, err := nsm.NewNotifier(nsm.NotifierConfig{Name: notifyName, Source: vip, Metrics: m})
//	summary := n.Run(ctx, state, targets)
package nsm

import (
	"context"
	"net/netip"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// Program is NSM version 1.
var Program = oncrpc.ProgVers{Prog: 100024, Vers: 1}

// Registry is the state NSM reads and writes. Writes return only after the
// change is committed (replicated); they return the sm_state after it. A
// refused request never reaches a write method.
type Registry interface {
	// Monitor adds or replaces (same MonID) a registration (SM_MON).
	Monitor(ctx context.Context, reg fsm.Registration) (int32, error)
	// Unmonitor removes the registration with this MonID (SM_UNMON) if
	// owner made it (fsm.Owner.Owns): the Service passes the caller as
	// this node saw it, so a lock manager removes only its own.
	Unmonitor(ctx context.Context, id fsm.MonID, owner fsm.Owner) (int32, error)
	// UnmonitorAll removes every registration of a lock manager
	// (SM_UNMON_ALL) that owner made.
	UnmonitorAll(ctx context.Context, my fsm.MyID, owner fsm.Owner) (int32, error)
	// SimuCrash acts as a failover: new state, notify every host (SM_SIMU_CRASH).
	SimuCrash(ctx context.Context) error
	// PeerRebooted records an accepted SM_NOTIFY; the owners of matching
	// registrations then call their lock managers back.
	PeerRebooted(ctx context.Context, ev fsm.PeerRebooted) error
	// State is the local sm_state (a local read).
	State() int32
	// ReadState is the sm_state to answer SM_STAT with: the current
	// incarnation's, as the leader confirms it (a follower asks it), so
	// that no client sees the state go back after another saw it rise.
	// An error means: no answer now (the caller retransmits).
	ReadState(ctx context.Context) (int32, error)
	// Ready reports whether this node knows the current incarnation's
	// sm_state: State is odd and no older than the current leader's
	// takeover. Until then SM_STAT, SM_MON, SM_UNMON, SM_UNMON_ALL and
	// SM_SIMU_CRASH get no reply (over TCP they wait for it, up to
	// Config.ReadyWait). It is called for every such call, so it must be
	// cheap.
	Ready() bool
	// WouldAccept pre-checks an SM_NOTIFY against local state: monName or
	// from matches a monitored host and state differs from the last seen.
	WouldAccept(monName string, from netip.Addr, state int32) bool
}

// SenderChecker is what a Registry may offer so that SM_NOTIFY can tell a
// notification sent by the host it names from one sent by anyone else
// (Config.NotifyStrictSender, and the separate budgets of the limiter).
type SenderChecker interface {
	// SenderIsHost reports whether from is one of the addresses monName's
	// registrations were resolved to.
	SenderIsHost(monName string, from netip.Addr) bool
}
