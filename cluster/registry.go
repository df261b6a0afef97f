package cluster

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nsm"
)

var _ nsm.Registry = (*Node)(nil)

// Monitor commits a registration (SM_MON) and returns sm_state.
func (n *Node) Monitor(ctx context.Context, reg fsm.Registration) (int32, error) {
	res, err := n.apply(ctx, fsm.Register{Reg: reg})
	return res.State, err
}

// Unmonitor commits an SM_UNMON.
func (n *Node) Unmonitor(ctx context.Context, id fsm.MonID) (int32, error) {
	res, err := n.apply(ctx, fsm.Unregister{ID: id})
	return res.State, err
}

// UnmonitorAll commits an SM_UNMON_ALL.
func (n *Node) UnmonitorAll(ctx context.Context, my fsm.MyID) (int32, error) {
	res, err := n.apply(ctx, fsm.UnregisterAll{My: my})
	return res.State, err
}

// reasonSimuCrash marks the Takeover of an SM_SIMU_CRASH; the leader that
// commits it restarts the SM_NOTIFY fan-out with the new state.
const reasonSimuCrash = "simu_crash"

// SimuCrash acts as a failover: a takeover that raises sm_state and
// opens grace, then SM_NOTIFY to every monitored host with the new state.
// On a follower it is forwarded to the leader, which notifies.
func (n *Node) SimuCrash(ctx context.Context) error {
	_, err := n.apply(ctx, n.takeover(reasonSimuCrash))
	return err
}

// signalCrash hands the leader loop the newest SM_SIMU_CRASH state.
func (n *Node) signalCrash(state int32) {
	for {
		select {
		case n.crashCh <- state:
			return
		default:
		}
		select { // replace an older, unconsumed state
		case <-n.crashCh:
		default:
		}
	}
}

// PeerRebooted commits an accepted SM_NOTIFY from a monitored host.
func (n *Node) PeerRebooted(ctx context.Context, ev fsm.PeerRebooted) error {
	_, err := n.apply(ctx, ev)
	return err
}

// State is the local sm_state.
func (n *Node) State() int32 { return n.fsm.State() }

// WouldAccept pre-checks an SM_NOTIFY against local state.
func (n *Node) WouldAccept(monName string, from netip.Addr, state int32) bool {
	return n.fsm.WouldAccept(monName, from, state)
}

func (n *Node) takeover(reason string) fsm.Takeover {
	now := n.cfg.Now().UTC()
	return fsm.Takeover{Node: n.cfg.NodeID, GraceUntil: now.Add(n.cfg.GracePeriod), Reason: reason, At: now}
}

// reasonImport marks the Takeover that follows an import of another
// server's monitor list (nsmd import-statd).
const reasonImport = "import"

// Import commits registrations taken over from another NSM server (rpc.statd)
// and then a Takeover that lifts sm_state above minAbove, the state that
// server had, so its clients accept our SM_NOTIFY; the leader then notifies
// every monitored host with the new state. It returns the new sm_state.
func (n *Node) Import(ctx context.Context, regs []fsm.Registration, minAbove int32) (int32, error) {
	sem := make(chan struct{}, 64) // let group commit batch them
	errs := make(chan error, len(regs))
	for _, r := range regs {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			_, err := n.apply(ctx, fsm.Register{Reg: r})
			errs <- err
		}()
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, fmt.Errorf("cluster: import registration: %w", err)
		}
	}
	t := n.takeover(reasonImport)
	t.MinState = minAbove + 1
	res, err := n.apply(ctx, t)
	if err != nil {
		return 0, fmt.Errorf("cluster: import takeover: %w", err)
	}
	return res.State, nil
}
