package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/placement"
	"github.com/nsmd/nsmd/service"
)

// services is where the cluster's NFS services run as this node sees
// them (GET /v1/services, the status page): every service this node's
// configuration or any member declares, or that has a placement record;
// with this node's run of each (run) and what its room holds (local).
// The owner says serving while its run of the current epoch serves.
func (a *Agent) services() []admin.ServiceStatus {
	out, _ := a.servicesHere()
	return out
}

// servicesHere is services, and this node's runs of them by id.
func (a *Agent) servicesHere() ([]admin.ServiceStatus, map[string]cluster.ServiceRun) {
	me := a.cfg.NodeID
	runs := map[string]cluster.ServiceRun{}
	for _, r := range a.node.Services().Runs() {
		runs[r.Service] = r
	}
	rooms := map[string]serviceRoomStatus{}
	for _, st := range a.rooms.status() {
		if st.Phase != roomStopped || st.LastHook != nil || st.LastFailure != nil || st.AddressHeld {
			rooms[st.Service] = st
		}
	}
	v := a.node.Services().View()
	own := map[string]service.Spec{}
	for _, sp := range a.cfg.Services {
		own[sp.ID] = sp
	}
	declared := map[string]map[string]string{} // service → node → fingerprint
	var nodes []string
	for _, d := range v.State.Declarations {
		nodes = append(nodes, d.Node)
		for _, sd := range d.Services {
			if declared[sd.ID] == nil {
				declared[sd.ID] = map[string]string{}
			}
			declared[sd.ID][d.Node] = sd.Fingerprint
		}
	}
	ids := map[string]bool{}
	for id := range own {
		ids[id] = true
	}
	for id := range declared {
		ids[id] = true
	}
	for _, p := range v.State.Placements {
		ids[p.Service] = true
	}
	holds := map[string]placement.Hold{}
	for _, h := range v.Holds {
		holds[h.Service] = h
	}
	out := make([]admin.ServiceStatus, 0, len(ids))
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		st := admin.ServiceStatus{ID: id, DeclaredBy: map[string]string{}}
		if sp, ok := own[id]; ok {
			st.Address, st.Fingerprint = sp.Address.String(), sp.Fingerprint()
		}
		for _, n := range nodes {
			st.DeclaredBy[n] = declared[id][n] // "": that member lacks it
		}
		if len(nodes) > 0 {
			if c := service.Disagreement(id, st.DeclaredBy); c != "" && holds[id].Conflict {
				st.Conflict = c
			}
		}
		p := v.State.Current(id)
		st.Owner, st.Epoch = p.Node, p.Epoch
		if p.Epoch > 0 && !p.At.IsZero() {
			st.LastMove = &admin.ServiceMove{From: p.From, To: p.Node, Reason: p.Reason, At: p.At, Epoch: p.Epoch}
		}
		switch {
		case holds[id].Conflict:
			st.State = admin.ServiceConflict
			if st.Conflict == "" {
				st.Conflict = holds[id].Reason
			}
		case p.Node == "":
			st.State = admin.ServiceUnplaced
		default:
			st.State = admin.ServicePlaced
			if r, ok := runs[id]; ok && p.Node == me && r.Epoch == p.Epoch && r.Phase == admin.RunServing {
				st.State = admin.ServiceServing
			}
		}
		if r, ok := runs[id]; ok {
			st.Run = serviceRunJSON(me, r)
		}
		if r, ok := rooms[id]; ok {
			st.Local = serviceLocalJSON(me, r)
			st.Local.NFSv4, st.Local.Grace = a.svcV4.status(id) // its own nfsd's, while open here
		}
		out = append(out, st)
	}
	return out, runs
}

// moveService is an operator's move of service to node `to`.
func (a *Agent) moveService(ctx context.Context, id, to string) error {
	if len(a.cfg.Services) == 0 {
		return admin.ErrNoServices
	}
	if !slices.ContainsFunc(a.cfg.Services, func(sp service.Spec) bool { return sp.ID == id }) {
		return fmt.Errorf("%w %q: this node's services: list does not name it", admin.ErrUnknownService, id)
	}
	err := a.node.Services().Move(ctx, id, to)
	switch {
	case errors.Is(err, placement.ErrUnknownService):
		return fmt.Errorf("%w: %v", admin.ErrUnknownService, err)
	case placement.IsRefusal(err), errors.Is(err, cluster.ErrRejected):
		// ErrRejected: the leader's own view refused it (a follower asked).
		return fmt.Errorf("%w: %v", admin.ErrBadRequest, err)
	}
	return err
}
