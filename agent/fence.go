package agent

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/fence"
)

// fencing wires the node's fences (cluster/serving.go has the rule): a
// serving node's watchdog, the fence agent a new leader runs against
// another node that may still serve, and the stop at start. A serving node
// without any fence starts only when the operator said so
// (fence_watchdog: off and no fence_agent), and then says so in its log,
// status and metrics.
func (a *Agent) fencing(c *cluster.Config) error {
	cfg := a.cfg
	if cluster.FenceControlBuild() {
		a.log.Error("this nsmd was built with the fencecontrol tag, the fencing drills' negative control: as a new leader it waits by its own fence settings alone and may serve beside a server that still holds the storage; never run it in production")
	}
	if !cfg.Serves() {
		// A witness, or a node without an on_leader hook: it serves no
		// storage, and a cluster of such nodes has nothing to fence.
		return nil
	}
	if cfg.FenceAgent != "" {
		common, nodes, err := cfg.FenceArgs()
		if err != nil {
			return err
		}
		ag, err := fence.NewAgent(fence.AgentConfig{
			Path: cfg.FenceAgent, Args: common, NodeArgs: nodes, Timeout: cfg.FenceAgentTimeout,
			Logger: a.log.With("component", "fence_agent"),
		})
		if err != nil {
			return fmt.Errorf("fence_agent: %w", err)
		}
		a.fenceAgent = ag
		c.FenceAgent = ag.Fence
	}
	if cfg.OnFollower != "" {
		c.StopAtStart = true
	}
	if cfg.FenceWatchdog == config.FenceOff {
		if cfg.FenceAgent == "" {
			a.log.Warn("fencing is off (fence_watchdog: off, no fence_agent): if this node fails halfway while it serves, another node may serve the same storage beside it")
		}
		return nil
	}
	probe := fence.Probe
	if a.hostRoot != "" {
		probe = func(path string) error { return fence.ProbeAt(a.hostRoot, path) }
	}
	// A device another process holds (fence.ErrHeldByOther) or with
	// nowayout (fence.ErrNoWayOut) is refused here, at start: such a node
	// never claims it can serve, to fail only at its takeover.
	switch err := probe(cfg.FenceWatchdog); {
	case errors.Is(err, fence.ErrLeftRunning):
		// The stop at start runs first, then releases it (cluster's
		// stopAtStart); a stop that overruns that process's deadline
		// lets the watchdog reset the machine, as it should.
		a.log.Warn("a previous process of this node left the watchdog running (it died while it served): stopping what it served, then releasing the watchdog; if the stop overruns its deadline, the watchdog resets this machine", "device", cfg.FenceWatchdog)
	case err != nil:
		return fmt.Errorf("fence_watchdog: %w", err)
	}
	w, err := fence.NewWatchdog(fence.WatchdogConfig{
		Path: cfg.FenceWatchdog, Timeout: cfg.FenceTimeout, Logger: a.log.With("component", "watchdog"),
	})
	if err != nil {
		return fmt.Errorf("fence_watchdog: %w", err)
	}
	a.watchdog = w
	c.Watchdog = w
	return nil
}

// fenceMode names how a node is fenced (admin.Fence.Mode).
func fenceMode(cfg config.Config) string {
	switch {
	case !cfg.Serves():
		return "none"
	case cfg.FenceWatchdog != config.FenceOff && cfg.FenceAgent != "":
		return "watchdog+agent"
	case cfg.FenceWatchdog != config.FenceOff:
		return "watchdog"
	case cfg.FenceAgent != "":
		return "agent"
	}
	return "off"
}

// fenceStatus is GET /v1/status's "fence".
func (a *Agent) fenceStatus() admin.Fence {
	fs := a.node.FenceStatus()
	out := admin.Fence{
		Mode: fenceMode(a.cfg), Serving: fs.Serving, Agent: a.cfg.FenceAgent,
		StopFailed: fs.StopFailed, Waiting: fs.Waiting,
		Hypervisor: a.hypervisor, PauseUncovered: pauseUncovered(fenceMode(a.cfg), a.hypervisor),
	}
	if a.watchdog != nil {
		ws := a.watchdog.Status()
		w := &admin.FenceWatchdog{Device: ws.Device, TimeoutSeconds: ws.Timeout.Seconds(), Armed: ws.Armed, Starving: ws.Starving}
		if !ws.LastFeed.IsZero() {
			t := ws.LastFeed.UTC()
			w.LastFeed = &t
		}
		if !ws.Deadline.IsZero() {
			t := ws.Deadline.UTC()
			w.Deadline = &t
		}
		out.Watchdog = w
	}
	out.Promises = a.fencePromises()
	if lw := fs.LastWait; lw != nil {
		w := &admin.FenceWait{At: lw.At.UTC(), Seconds: lw.Took.Seconds(), Aborted: lw.Aborted}
		for _, p := range lw.Nodes {
			w.Nodes = append(w.Nodes, admin.FencedNode{Node: p.Node, By: p.By, Seconds: p.Took.Seconds(), Detail: p.Detail})
		}
		out.LastWait = w
	}
	return out
}

// registerFenceMetrics exports nsmd_fence_off: 1 on a serving node that
// runs without any fence (the alert NsmdServingWithoutFence); and
// nsmd_fence_pause_uncovered: 1 on a serving node under a hypervisor
// fenced by its watchdog alone (NsmdWatchdogOnlyUnderHypervisor), which it
// also logs at start. hostRoot is where /proc and /sys are read.
func (a *Agent) registerFenceMetrics(hostRoot string) error {
	off := 0.0
	if fenceMode(a.cfg) == "off" {
		off = 1
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nsmd_fence_off",
		Help: "1 on a node that serves storage (an on_leader hook) without any fence (fence_watchdog: off and no fence_agent): if it fails halfway, another node may serve beside it.",
	})
	g.Set(off)
	if err := a.reg.Register(g); err != nil {
		return err
	}
	if a.cfg.Serves() {
		if hostRoot == "" {
			hostRoot = "/"
		}
		a.hypervisor = fence.Hypervisor(hostRoot)
	}
	p := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nsmd_fence_pause_uncovered",
		Help: "1 on a serving node that runs under a hypervisor with watchdog-only fencing: a pause of the VM pauses its watchdog too, and nothing resets it while it is paused (a fence agent, or ext4 multi-mount protection on the shared disk, covers that).",
	})
	if pauseUncovered(fenceMode(a.cfg), a.hypervisor) {
		p.Set(1)
		a.log.Warn("this serving node runs under a hypervisor and is fenced by its watchdog alone: a pause of the VM (migration, a stopped VM, an overloaded host) pauses its watchdog too, and when it resumes it may serve beside its successor until the watchdog fires; configure a fence_agent (fence_virsh, fence_vmware, fence_aws, …) or use ext4 multi-mount protection on the shared disk (the shipped hook checks it: NFS_HA_MMP)", "hypervisor", a.hypervisor)
	}
	return a.reg.Register(p)
}

// pauseUncovered: a node fenced by its watchdog alone (mode "watchdog")
// that runs under a hypervisor (hypervisor: what said so) has no fence
// that covers a pause of its VM.
func pauseUncovered(mode, hypervisor string) bool {
	return mode == "watchdog" && hypervisor != ""
}

// fencePromises is GET /v1/status's "fence.promises" (nil on a node that
// serves no storage).
func (a *Agent) fencePromises() *admin.FencePromises {
	if !a.cfg.Serves() {
		return nil
	}
	v := a.node.Promises()
	out := &admin.FencePromises{Mismatch: v.Mismatch, Unproven: v.Unproven, Servers: []admin.FencePromise{}}
	for _, s := range v.Servers {
		out.Servers = append(out.Servers, admin.FencePromise{
			Node: s.Node, Mode: s.Promise.Mode.String(), Source: s.Source, Serving: s.Serving,
			WatchdogSeconds: s.Promise.WatchdogTimeout.Seconds(), LeaseSeconds: s.Promise.Lease.Seconds(),
			HookTimeoutSeconds: s.Promise.HookTimeout.Seconds(), MarginSeconds: s.Promise.Margin.Seconds(),
		})
	}
	for _, c := range v.Confirmations {
		out.Confirmations = append(out.Confirmations, admin.FenceConfirmation{Node: c.Node, By: c.By, At: c.At.UTC()})
	}
	return out
}
