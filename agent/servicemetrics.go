package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
)

// servicesCollector exports each service as this node sees it, every
// series with a service label:
//   - everywhere, for every service the node knows: its placement
//     (nsmd_service_epoch, nsmd_service_owned: 1 on the node it is placed
//     on, nsmd_service_state: 1 for the state it is in), whether this node
//     serves it (nsmd_service_serving), how many servers declare it
//     (nsmd_service_declared_servers) and its registrations
//     (nsmd_service_registrations);
//   - on a node that runs it (proves, starts, serves or stops it): its
//     lease (nsmd_service_lease_seconds);
//   - on a server that started or stopped it: whether it holds its
//     address (nsmd_service_address_held) and whether its last start or
//     stop hook failed (nsmd_service_hook_failed);
//   - on the node that serves it: its SM_NOTIFY fan-out
//     (nsmd_service_notify_targets{state}).
//
// Without services: it exports nothing.
type servicesCollector struct{ a *Agent }

var (
	svcEpochDesc   = prometheus.NewDesc("nsmd_service_epoch", "The service's placement epoch: it rises at every move of the service.", []string{"service"}, nil)
	svcOwnedDesc   = prometheus.NewDesc("nsmd_service_owned", "1 on the node the service is placed on, 0 elsewhere.", []string{"service"}, nil)
	svcStateDesc   = prometheus.NewDesc("nsmd_service_state", "1 for the service's state as this node sees it (serving on its owner while it serves; placed, unplaced, conflict, …), 0 for the others.", []string{"service", "state"}, nil)
	svcServingDesc = prometheus.NewDesc("nsmd_service_serving",
		"1 while this node serves the service (its run serves, under a lease), 0 otherwise: summed over a cluster's nodes, exactly 1 for a served service.", []string{"service"}, nil)
	svcLeaseDesc = prometheus.NewDesc("nsmd_service_lease_seconds",
		"Seconds left of this node's lease on the service from the leader (0: lapsed or none yet); only on a node that runs the service.", []string{"service"}, nil)
	svcDeclaredDesc = prometheus.NewDesc("nsmd_service_declared_servers",
		"How many servers (members that are not witnesses) declare the service in their configuration, as the replicated declarations say.", []string{"service"}, nil)
	svcRegsDesc = prometheus.NewDesc("nsmd_service_registrations",
		"Registrations (SM_MON) in the service's own NSM state.", []string{"service"}, nil)
	svcAddrDesc = prometheus.NewDesc("nsmd_service_address_held",
		"1 while this server holds the service's floating address; only on a server that started or stopped the service.", []string{"service"}, nil)
	svcHookFailedDesc = prometheus.NewDesc("nsmd_service_hook_failed",
		"1 when the service's last start or stop hook on this server failed, 0 when it succeeded; only once one ran.", []string{"service"}, nil)
	svcNotifyDesc = prometheus.NewDesc("nsmd_service_notify_targets",
		"Hosts of the service's current or last SM_NOTIFY fan-out from this node, by state (pending, done, failed); only on the node that serves it.", []string{"service", "state"}, nil)
)

func (c servicesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{svcEpochDesc, svcOwnedDesc, svcStateDesc, svcServingDesc, svcLeaseDesc,
		svcDeclaredDesc, svcRegsDesc, svcAddrDesc, svcHookFailedDesc, svcNotifyDesc} {
		ch <- d
	}
}

func (c servicesCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	if a.node == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	list, runs := a.servicesHere()
	servers := a.declaringServers()
	for _, s := range list {
		gauge(svcEpochDesc, float64(s.Epoch), s.ID)
		gauge(svcOwnedDesc, b2f(s.Owner == a.cfg.NodeID), s.ID)
		for _, st := range admin.ServiceStates() {
			gauge(svcStateDesc, b2f(st == s.State), s.ID, st)
		}
		r, runsHere := runs[s.ID]
		gauge(svcServingDesc, b2f(runsHere && r.Phase == admin.RunServing), s.ID)
		if runsHere {
			gauge(svcLeaseDesc, max(r.LeaseLeft, 0).Seconds(), s.ID)
		}
		gauge(svcDeclaredDesc, float64(servers[s.ID]), s.ID)
		gauge(svcRegsDesc, float64(a.node.Services().Registry(s.ID).Count()), s.ID)
		if l := s.Local; l != nil {
			gauge(svcAddrDesc, b2f(l.AddressHeld), s.ID)
			if l.LastHook != nil {
				gauge(svcHookFailedDesc, b2f(l.LastHook.Err != ""), s.ID)
			}
		}
		if pending, done, failed, ok := a.svcNSM.progress(s.ID); ok {
			gauge(svcNotifyDesc, float64(pending), s.ID, "pending")
			gauge(svcNotifyDesc, float64(done), s.ID, "done")
			gauge(svcNotifyDesc, float64(failed), s.ID, "failed")
		}
	}
}

// declaringServers counts, per service, the members that are not
// witnesses whose replicated declaration names it.
func (a *Agent) declaringServers() map[string]int {
	witness := map[string]bool{}
	for _, m := range a.node.Members() {
		witness[m.ID] = m.Witness || a.node.IsWitness(m.ID)
	}
	out := map[string]int{}
	for _, d := range a.node.Services().View().State.Declarations {
		if witness[d.Node] {
			continue
		}
		for _, sd := range d.Services {
			out[sd.ID]++
		}
	}
	return out
}

// progress is service id's SM_NOTIFY fan-out on this node (its current
// or last run's hosts pending, done and failed); ok is false when this
// node does not serve it.
func (s *serviceNSMs) progress(id string) (pending, done, failed int, ok bool) {
	if s == nil {
		return 0, 0, 0, false
	}
	s.mu.Lock()
	m := s.byID[id]
	s.mu.Unlock()
	if m == nil || m.notifier == nil {
		return 0, 0, 0, false
	}
	pending, done, failed = m.notifier.Progress()
	return pending, done, failed, true
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
