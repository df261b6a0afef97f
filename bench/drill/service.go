package drill

// A drill of one service (Options.Service, `nsmd drill --service S`): the
// fault hits the server the service runs on, not the raft leader, and the
// milestones are the service's: placed anew, its address answering, its
// new state there, its new server serving it. The other services are
// checked not to have moved unless they shared the faulted server.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/fsm"
)

// ServiceMilestoneDefs are a service drill's milestones, in order, at the
// indexes of MilestoneDefs.
func ServiceMilestoneDefs() [MilestoneCount]MilestoneDef {
	return [MilestoneCount]MilestoneDef{
		{"service_placed", "service placed anew"},
		{"service_answers", "service address answers NULL"},
		{"service_new_state", "service SM_STAT has new state"},
		{"service_serving", "new server serves it"},
	}
}

// Defs are the report's milestone definitions: a service drill's, or a
// leader drill's.
func (r *Report) Defs() [MilestoneCount]MilestoneDef {
	if r.Service != "" {
		return ServiceMilestoneDefs()
	}
	return MilestoneDefs()
}

// services reads GET /v1/services from the first node that answers
// (skip: a node not to ask), by id.
func (d *runner) services(ctx context.Context, skip string) (map[string]admin.ServiceStatus, string, error) {
	var errs []error
	for _, n := range d.nodes {
		if n.ID == skip || n.Admin == "" || d.down[n.ID] {
			continue
		}
		var list []admin.ServiceStatus
		if err := d.call(ctx, "GET", n.Admin, "/v1/services", statusTimeout*2, &list); err != nil {
			errs = append(errs, err)
			continue
		}
		out := make(map[string]admin.ServiceStatus, len(list))
		for _, s := range list {
			out[s.ID] = s
		}
		return out, n.ID, nil
	}
	return nil, "", fmt.Errorf("drill: no node answered GET /v1/services: %w", errors.Join(errs...))
}

// node is the drill's node id.
func (d *runner) node(id string) (Node, bool) {
	i := slices.IndexFunc(d.nodes, func(n Node) bool { return n.ID == id })
	if i < 0 {
		return Node{}, false
	}
	return d.nodes[i], true
}

// serviceAddr is the NSM address of service s: its address with the NSM
// port of node n.
func serviceAddr(s admin.ServiceStatus, n Node) (string, error) {
	p, err := netip.ParsePrefix(s.Address)
	if err != nil {
		return "", fmt.Errorf("drill: service %s has no address this node knows (%q)", s.ID, s.Address)
	}
	_, port, err := net.SplitHostPort(n.NSMAddr)
	if err != nil {
		return "", fmt.Errorf("drill: %s's nsm_addr %q: %w", n.ID, n.NSMAddr, err)
	}
	return net.JoinHostPort(p.Addr().String(), port), nil
}

// waitService waits until the cluster is healthy and the service runs:
// placed on a server that answers, its address answering SM_STAT with
// the state of its epoch. It returns the service and its server.
func (d *runner) waitService(ctx context.Context, run int) (admin.ServiceStatus, Node, map[string]admin.ServiceStatus, error) {
	if _, err := d.waitHealthy(ctx, run); err != nil {
		return admin.ServiceStatus{}, Node{}, nil, err
	}
	deadline := time.Now().Add(d.o.Timeout)
	why := ""
	for {
		all, _, err := d.services(ctx, "")
		switch s, ok := all[d.o.Service]; {
		case err != nil:
			why = err.Error()
		case !ok:
			return admin.ServiceStatus{}, Node{}, nil, fmt.Errorf("drill: the cluster has no service %q", d.o.Service)
		case s.Owner == "":
			why = fmt.Sprintf("service %s is %s, on no server", s.ID, s.State)
		default:
			owner, known := d.node(s.Owner)
			if !known {
				why = fmt.Sprintf("service %s runs on %s, a node the drill does not know", s.ID, s.Owner)
				break
			}
			addr, err := serviceAddr(s, owner)
			if err != nil {
				return admin.ServiceStatus{}, Node{}, nil, err
			}
			pctx, cancel := context.WithTimeout(ctx, rpcTimeout)
			st, err := vipStat(pctx, addr)
			cancel()
			if err == nil && st == fsm.ServiceSMState(s.Epoch) {
				d.vip = addr
				return s, owner, all, nil
			}
			why = fmt.Sprintf("service %s's address %s: state %d, %v (want %d)", s.ID, addr, st, err, fsm.ServiceSMState(s.Epoch))
		}
		if time.Now().After(deadline) {
			return admin.ServiceStatus{}, Node{}, nil, fmt.Errorf("drill: service %s not served within %v: %s", d.o.Service, d.o.Timeout, why)
		}
		select {
		case <-ctx.Done():
			return admin.ServiceStatus{}, Node{}, nil, ctx.Err()
		case <-time.After(healthPoll):
		}
	}
}

// moveTarget is where a planned move of s goes: the first other server,
// by id, that declares s as its owner does and is no witness.
func (d *runner) moveTarget(s admin.ServiceStatus) (string, error) {
	witness := map[string]bool{}
	for _, m := range d.members {
		witness[m.ID] = m.Witness
	}
	fp := s.DeclaredBy[s.Owner]
	var ids []string
	for id, f := range s.DeclaredBy {
		if id != s.Owner && f != "" && f == fp && !witness[id] && !d.down[id] {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return "", fmt.Errorf("drill: no other server declares service %s as %s does", s.ID, s.Owner)
	}
	slices.Sort(ids)
	return ids[0], nil
}

// serviceFault starts the fault against the service's server.
func (d *runner) serviceFault(ctx context.Context, s admin.ServiceStatus, owner Node) (<-chan faultResult, time.Time, error) {
	if d.o.Fault != FaultTransfer {
		var st admin.Status
		if err := d.call(ctx, "GET", owner.Admin, "/v1/status", 3*time.Second, &st); err != nil {
			return nil, time.Time{}, err
		}
		return d.startFault(ctx, owner, st)
	}
	to, err := d.moveTarget(s)
	if err != nil {
		return nil, time.Time{}, err
	}
	ch := make(chan faultResult, 1)
	t0 := time.Now()
	go func() {
		var res admin.ServiceMoveResult
		err := d.call(ctx, "POST", owner.Admin, "/v1/services/move?service="+s.ID+"&to="+to, d.o.Timeout, &res)
		var he *httpError
		ch <- faultResult{err: err, definitive: errors.As(err, &he)}
	}()
	return ch, t0, nil
}

// runService causes one move of the service and times its milestones.
func (d *runner) runService(ctx context.Context, n int, s admin.ServiceStatus, owner Node, before map[string]admin.ServiceStatus) (Failover, error) {
	r := Failover{Run: n, OldLeader: owner.ID, OldState: fsm.ServiceSMState(s.Epoch)}
	for _, m := range ServiceMilestoneDefs() {
		r.Milestones = append(r.Milestones, Milestone{Name: m.Name, Label: m.Label})
	}
	var oldProc *admin.Process
	var st admin.Status
	if err := d.call(ctx, "GET", owner.Admin, "/v1/status", 3*time.Second, &st); err == nil {
		oldProc = st.Process
	}
	d.progressf("run %d/%d: %s on %s, the server of service %s (epoch %d, sm_state %d)\n", n, d.o.Runs, d.faultLabel(), owner.ID, s.ID, s.Epoch, r.OldState)
	faultCh, t0, err := d.serviceFault(ctx, s, owner)
	if err != nil {
		return r, fmt.Errorf("drill: fault on %s: %w", owner.ID, err)
	}
	r.FaultAt = t0.UTC()
	d.unanswered = map[string]bool{}
	if d.o.Fault != FaultTransfer {
		d.down[owner.ID] = true
	}
	reach := func(i int, at time.Time) {
		r.Milestones[i].Reached = true
		r.Milestones[i].After = at.Sub(t0)
		r.Milestones[i].AfterMS = float64(r.Milestones[i].After.Microseconds()) / 1000
		if !d.o.TTY {
			d.progressf("run %d: %-32s %8s\n", n, r.Milestones[i].Label, FormatDuration(r.Milestones[i].After))
		}
	}
	var now admin.ServiceStatus
	var server Node
	stage, faultDone, err := d.pollMilestones(ctx, &r, t0, faultCh, owner.ID, func(stage int) (int, error) {
		switch stage {
		case 0:
			if all, _, err := d.services(ctx, owner.ID); err == nil && all[s.ID].Epoch > s.Epoch && all[s.ID].Owner != "" {
				now = all[s.ID]
				if server, _ = d.node(now.Owner); server.ID != "" {
					r.NewLeader, r.NewState = now.Owner, fsm.ServiceSMState(now.Epoch)
					reach(0, time.Now())
					stage++
				}
			}
		case 1, 2:
			addr, err := serviceAddr(now, server)
			if err != nil {
				return stage, err
			}
			pctx, cancel := context.WithTimeout(ctx, rpcTimeout)
			if stage == 1 {
				if vipNull(pctx, addr) == nil {
					reach(1, time.Now())
					stage++
				}
			} else if state, err := vipStat(pctx, addr); err == nil && state == r.NewState {
				reach(2, time.Now())
				stage++
			}
			cancel()
		case 3:
			var list []admin.ServiceStatus
			if err := d.call(ctx, "GET", server.Admin, "/v1/services", statusTimeout*2, &list); err == nil {
				for _, x := range list {
					if x.ID == s.ID && x.Owner == server.ID && x.Epoch == now.Epoch && x.State == admin.ServiceServing {
						reach(3, time.Now())
						stage++
					}
				}
			}
		}
		return stage, nil
	})
	if err != nil {
		return r, err
	}
	if d.o.TTY {
		d.progressf("\r\033[Krun %d/%d: %s\n", n, d.o.Runs, d.ttyLine(&r, stage))
	}
	if !faultDone {
		if fr := <-faultCh; fr.note != "" || fr.err != nil {
			r.FaultNote = fr.note
		}
	}
	if after, _, err := d.services(ctx, owner.ID); err == nil {
		r.AlsoMoved = alsoMoved(s.ID, owner.ID, before, after)
	}
	if r.Err != "" {
		d.progressf("run %d: %s\n", n, r.Err)
	}
	r.Fence = &FenceOutcome{}
	d.oldServer(ctx, &r, owner, oldProc, t0)
	if len(r.AlsoMoved) > 0 {
		d.progressf("run %d: also moved: %s\n", n, strings.Join(r.AlsoMoved, ", "))
	}
	return r, nil
}

// alsoMoved lists the services other than id that moved between before
// and after: "b n2→n3", each marked when it was not on the faulted server
// (a move the fault should not have caused).
func alsoMoved(id, faulted string, before, after map[string]admin.ServiceStatus) []string {
	var out []string
	for sid, b := range before {
		a, ok := after[sid]
		if sid == id || !ok || a.Epoch == b.Epoch {
			continue
		}
		line := fmt.Sprintf("%s %s→%s", sid, dash(b.Owner), dash(a.Owner))
		if b.Owner != faulted {
			line += " (not on the faulted server)"
		}
		out = append(out, line)
	}
	slices.Sort(out)
	return out
}

// runServices runs a service drill's runs into rep.
func (d *runner) runServices(ctx context.Context, rep *Report) (*Report, error) {
	var s admin.ServiceStatus
	var owner Node
	var all map[string]admin.ServiceStatus
	prepare := func(ctx context.Context, i int) error {
		var err error
		s, owner, all, err = d.waitService(ctx, i)
		rep.VIP = d.vip
		return err
	}
	if err := d.runAll(ctx, rep, prepare, func(ctx context.Context, i int) (Failover, error) { return d.runService(ctx, i, s, owner, all) }); err != nil {
		return nil, err
	}
	rep.Stats = Stats(rep.Runs)
	return rep, nil
}
