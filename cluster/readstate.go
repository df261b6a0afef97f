package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/oncrpc"
)

// readStateTimeout bounds a follower's question to the leader for SM_STAT.
const readStateTimeout = 500 * time.Millisecond

// ReadState (the NSM service's Registry): a ready leader answers its own state;
// a ready follower asks the leader (fwdProcState), so that a follower that
// has not yet heard of a new term — a leadership transfer elects within
// one round trip, long before followers' heartbeat timeouts — never
// answers the previous incarnation's state after the new one was seen.
func (r Registry) ReadState(ctx context.Context) (int32, error) {
	n := r.n
	if !n.Ready() {
		return 0, ErrNotReadyYet
	}
	if n.raft.State() == raft.Leader {
		return n.fsm.State(), nil
	}
	_, addr := n.leaderNSMAddr()
	if addr == "" {
		return 0, ErrNoLeader
	}
	ctx, cancel := context.WithTimeout(ctx, readStateTimeout)
	defer cancel()
	local, _ := netip.ParseAddrPort(n.cfg.RaftBind)
	c, err := n.fwd.get(ctx, addr, local.Addr())
	if err != nil {
		return 0, fmt.Errorf("cluster: ask leader %s for sm_state: %w", addr, err)
	}
	var res fwdRes
	if err := c.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcState, oncrpc.Void{}, &res); err != nil {
		n.fwd.drop(c)
		return 0, fmt.Errorf("cluster: ask leader %s for sm_state: %w", addr, err)
	}
	if res.Status != fwdOK {
		return 0, fmt.Errorf("cluster: %s did not confirm sm_state: %w", addr, ErrNotLeader)
	}
	return res.State, nil
}

// serveState answers fwdProcState: fwdOK with this node's sm_state from a
// leader that is Ready (its lease confirmed), fwdNotLeader from anyone else.
func (n *Node) serveState(res *oncrpc.Writer) {
	out := fwdRes{Status: fwdNotLeader}
	if n.raft.State() == raft.Leader && n.Ready() {
		out = fwdRes{Status: fwdOK, State: n.fsm.State()}
	}
	out.MarshalXDR(res)
}
