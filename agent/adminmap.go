package agent

import (
	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/grace"
	"time"
)

// The admin API's types are admin's own; these map the node's parts to
// them, field by field, so that a change inside a part never changes the
// API on the wire.

func memberJSON(m cluster.MemberStatus) admin.Member {
	return admin.Member{
		ID:         m.ID,
		GossipAddr: m.GossipAddr,
		RaftAddr:   m.RaftAddr,
		NSMAddr:    m.NSMAddr,
		Version:    m.Version,
		State:      m.State,
		Suffrage:   m.Suffrage,
		Leader:     m.Leader,
		Witness:    m.Witness,
		Role:       m.Role,
	}
}

func diskJSON(d cluster.DiskStatus) admin.Disk {
	return admin.Disk{
		Writable:  d.Writable,
		Since:     d.Since,
		Error:     d.Error,
		Failures:  d.Failures,
		Slow:      d.Slow,
		SlowSince: d.SlowSince,
		WriteP50:  d.WriteP50,
	}
}

func pipeJSON(st cld.Status) *admin.Pipe {
	return &admin.Pipe{
		Path:                  st.Pipe,
		State:                 st.State,
		Err:                   st.Err,
		Since:                 st.Since,
		Version:               st.Version,
		LastGraceStart:        st.LastGraceStart,
		LastGraceStartRecords: st.LastGraceStartRecords,
		Upcalls:               st.Upcalls,
		Failed:                st.Failed,
		Refused:               st.Refused,
	}
}

// graceJSON is g as GET /v1/status's "grace" (nil: no takeover yet);
// lastSeen (nil: none known) dates the NFSv4 clients it still waits for.
func graceJSON(g *grace.Status, lastSeen func(name string) (time.Time, bool)) *admin.Grace {
	if g == nil {
		return nil
	}
	manager := func(m grace.ManagerStatus) admin.GraceManager {
		out := admin.GraceManager{Expected: m.Expected, Back: m.Back, Missing: m.Missing, Absent: m.Absent}
		if e := m.Ended; e != nil {
			out.Ended = &admin.GraceEnd{At: e.At, Reason: e.Reason}
			out.Seconds = e.After.Seconds()
		}
		return out
	}
	v4 := manager(g.NFSv4)
	if lastSeen != nil {
		for _, name := range v4.Missing {
			if t, ok := lastSeen(name); ok {
				if v4.LastSeen == nil {
					v4.LastSeen = map[string]time.Time{}
				}
				v4.LastSeen[name] = t.UTC().Truncate(time.Second)
			}
		}
	}
	return &admin.Grace{
		SMState:      g.SMState,
		Started:      g.Started,
		Settle:       g.Settle.String(),
		NLM:          manager(g.NLM),
		NFSv4:        v4,
		Error:        g.Error,
		LastActivity: g.LastActivity,
	}
}

// serviceRunJSON is node's run of a service (cluster.ServiceRun) as
// GET /v1/services's "run"; a lapsed lease reads 0.
func serviceRunJSON(node string, r cluster.ServiceRun) *admin.ServiceRun {
	out := &admin.ServiceRun{Node: node, Phase: r.Phase, Epoch: r.Epoch,
		LeaseSeconds: max(r.LeaseLeft, 0).Round(time.Millisecond).Seconds()}
	if p := r.Proof; p.By != "" {
		out.Proof = &admin.ServiceProof{Node: p.Node, By: p.By, Seconds: p.Took.Round(time.Millisecond).Seconds(), Detail: p.Detail}
	}
	return out
}

// serviceLocalJSON is what node's service room holds of a service as
// GET /v1/services's "local".
func serviceLocalJSON(node string, st serviceRoomStatus) *admin.ServiceLocal {
	out := &admin.ServiceLocal{Node: node, Phase: st.Phase, Epoch: st.Epoch, AddressHeld: st.AddressHeld, Namespace: st.Namespace}
	if h := st.LastHook; h != nil {
		out.LastHook = &admin.ServiceHook{Hook: h.Hook, Reason: h.Reason, Epoch: h.Epoch, Err: h.Err, At: h.At}
	}
	if f := st.LastFailure; f != nil {
		c := *f
		out.LastFailure = &c
	}
	return out
}

// serviceNFSv4JSON is a service's NFSv4 tracking on this server as
// GET /v1/services's local "nfsv4".
func serviceNFSv4JSON(st serviceV4Status) *admin.ServiceNFSv4 {
	out := &admin.ServiceNFSv4{Tracking: st.Tracking, TrackingWhy: st.TrackingWhy,
		CurrentEpoch: st.CurrentEpoch, RecoveryEpoch: st.RecoveryEpoch,
		Clients: st.Clients, Reclaimable: st.Reclaimable, Reclaimed: st.Reclaimed,
		GraceStartSMState: st.GraceStartSMState}
	if st.Pipe != nil {
		out.Pipe = pipeJSON(*st.Pipe)
	}
	if !st.GraceStartAt.IsZero() {
		at := st.GraceStartAt.UTC()
		out.GraceStartAt = &at
	}
	return out
}
