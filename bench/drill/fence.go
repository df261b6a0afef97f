package drill

// What a drill learns about fencing: which faults can run where, how the
// new leader had the old one proven stopped (its status's fence.last_wait)
// and what became of the old server (reset, restarted, kept running).

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/timeline"
)

// FenceOutcome is, for one run, how the new leader had the old leader
// proven stopped before it served and what became of the old server.
type FenceOutcome struct {
	// Mode is the new leader's fence mode (watchdog, agent,
	// watchdog+agent, off, none).
	Mode string `json:"mode,omitempty"`
	// By: clean (it said it stopped), agent (the fence agent reported it
	// off) or watchdog (its watchdog must have reset it); "" when the new
	// leader recorded no wait for it (Note says why).
	By      string  `json:"by,omitempty"`
	Seconds float64 `json:"seconds,omitempty"` // into the new leader's wait
	Detail  string  `json:"detail,omitempty"`
	Note    string  `json:"note,omitempty"`
	// Old is what became of the old server after the fault.
	Old OldServer `json:"old_server"`
}

// Old server outcomes.
const (
	OldReset      = "reset"        // another boot id: the machine was reset (or rebooted)
	OldRestarted  = "restarted"    // the same boot, another nsmd start
	OldKept       = "kept running" // the same boot and process
	OldNotBack    = "not back"     // no answer within the wait
	OldUnknown    = "back"         // answered; its status says nothing of its process
	oldAnswerWait = 2 * time.Second
)

// OldServer is the old leader as the drill found it after the fault.
type OldServer struct {
	Outcome string `json:"outcome"`
	// Unreachable: its admin API did not answer at first after the fault.
	Unreachable bool    `json:"unreachable,omitempty"`
	BackAfterMS float64 `json:"back_after_ms,omitempty"` // since the fault, when it answered again
	Role        string  `json:"role,omitempty"`          // its role then
	Serving     bool    `json:"serving,omitempty"`       // it still said it serves at the wait's end (fence.serving)
}

// FenceLine says how the old server was proven stopped.
func FenceLine(f *FenceOutcome) string {
	switch {
	case f == nil:
		return "-"
	case f.By != "":
		how := map[string]string{"clean": "clean (it said it stopped)", "agent": "agent (fenced off)", "watchdog": "watchdog (must have reset it)"}[f.By]
		if how == "" {
			how = f.By
		}
		line := fmt.Sprintf("%s after %s", how, FormatDuration(time.Duration(f.Seconds*float64(time.Second))))
		if f.Note != "" {
			line += " (" + f.Note + ")"
		}
		return line
	case f.Note != "":
		return f.Note
	}
	return "no fence wait recorded"
}

// OldLine says what became of the old server.
func OldLine(f *FenceOutcome) string {
	if f == nil || f.Old.Outcome == "" {
		return "-"
	}
	o := f.Old
	var s string
	switch o.Outcome {
	case OldNotBack:
		return "not back (its admin API did not answer)"
	case OldKept:
		s = "kept running (same boot, same process)"
		if f.By == "clean" {
			s = "stopped cleanly, kept running"
		}
	case OldRestarted:
		s = "nsmd restarted (same boot)"
	case OldReset:
		s = "reset (another boot)"
	default:
		s = "back"
	}
	if o.Unreachable && o.BackAfterMS > 0 {
		s += fmt.Sprintf(", unreachable, back after %s", FormatMS(o.BackAfterMS))
	}
	if o.Serving {
		s += ", SAYS IT SERVES"
	}
	return s
}

// crashes: the fault is the API's crash (POST /v1/drill/crash): --kill
// anywhere, and nsmd-kill on nsmd dev, whose nodes share one process.
func (d *runner) crashes() bool {
	return d.o.Fault == FaultKill || (d.o.Fault == FaultNSMDKill && d.inProcess)
}

// nodeLevel: the fault runs a command on the leader's machine or its
// hypervisor.
func (d *runner) nodeLevel() bool {
	switch d.o.Fault {
	case FaultNSMDHang, FaultPartition, FaultFreeze:
		return true
	case FaultNSMDKill:
		return !d.inProcess
	}
	return false
}

// DevRefusal is why fault cannot run on nsmd dev, and what to use ("" if
// it can).
func DevRefusal(fault string) string {
	var why string
	switch fault {
	case FaultNSMDHang:
		why = "its nodes share one process, so a SIGSTOP would stop all of them"
	case FaultPartition:
		why = "its nodes share one process and this machine's network, so a cut would be this machine's firewall"
	case FaultFreeze:
		why = "there is no machine of its own to pause"
	default:
		return ""
	}
	return fmt.Sprintf("--fault %s cannot run on nsmd dev: %s, and nodes without an on_leader hook serve no storage and do not fence. "+
		"Here use --fault transfer, kill or nsmd-kill (both the in-process crash); drill %s on a real cluster with --node-cmd (e.g. 'ssh root@{addr}'), "+
		"or see the real-kernel e2e tier, which drills every fault", fault, why, fault)
}

// checkFault refuses what cannot run against the cluster found.
func (d *runner) checkFault() error {
	if d.inProcess {
		if msg := DevRefusal(d.o.Fault); msg != "" {
			return fmt.Errorf("drill: %s", msg)
		}
		if d.o.Fault == FaultNSMDKill && strings.TrimSpace(d.o.Node.NodeCmd) != "" {
			return fmt.Errorf("drill: --node-cmd on nsmd dev: its nodes share one process, so nsmd-kill there is the in-process crash (POST /v1/drill/crash); drop --node-cmd")
		}
		return nil
	}
	if d.nodeLevel() && d.o.Fault != FaultFreeze && strings.TrimSpace(d.o.Node.NodeCmd) == "" {
		return fmt.Errorf("drill: --fault %s runs on the leader's machine: give --node-cmd, how to run a command there (e.g. 'ssh root@{addr}' or 'ssh root@{node}')", d.o.Fault)
	}
	return nil
}

// faultLabel is this drill's fault as the progress names it.
func (d *runner) faultLabel() string {
	if d.o.Fault == FaultNSMDKill && d.inProcess {
		return "kill of nsmd (nsmd dev: the in-process crash)"
	}
	return FaultLabel(d.o.Fault)
}

// faultDetail says how the fault is made, for the report.
func (d *runner) faultDetail() string {
	hold := func(v time.Duration) string {
		if v > 0 {
			return FormatDuration(v)
		}
		return "the leader's fence_timeout + 3s (8s without a watchdog)"
	}
	via := ""
	if d.o.Node.NodeCmd != "" {
		via = " through `" + d.o.Node.NodeCmd + "`"
	}
	switch {
	case d.o.Fault == FaultNSMDKill && d.inProcess:
		return "nsmd dev: the in-process crash (POST /v1/drill/crash: one node of the process stops as if killed -9)"
	case d.o.Fault == FaultNSMDKill:
		return "kill -9 of the leader's nsmd" + via
	case d.o.Fault == FaultNSMDHang:
		return "SIGSTOP of the leader's nsmd for " + hold(d.o.Node.HangFor) + ", then SIGCONT" + via
	case d.o.Fault == FaultPartition:
		return "the leader's raft, gossip and NSM traffic to and from the other members dropped (nft table inet " + NFTTable + ") for " + hold(d.o.Node.CutFor) + via + "; clients still reach it"
	case d.o.Fault == FaultFreeze:
		return "`" + d.o.Node.FreezeCmd + "`, " + hold(d.o.Node.FreezeFor) + ", then `" + d.o.Node.ThawCmd + "`"
	}
	return ""
}

// target is the leader as {node} and {addr} see it: its id and the host
// of its admin address (else its NSM or raft address).
func (d *runner) target(n Node) Target {
	t := Target{ID: n.ID}
	cands := []string{n.Admin, n.NSMAddr}
	for _, m := range d.members {
		if m.ID == n.ID {
			cands = append(cands, m.RaftAddr, m.GossipAddr)
		}
	}
	for _, a := range cands {
		h, _, err := net.SplitHostPort(a)
		if err != nil || h == "" {
			continue
		}
		if ip, err := netip.ParseAddr(h); err == nil && ip.IsUnspecified() {
			continue
		}
		t.Addr = h
		break
	}
	return t
}

// plan builds the node-level fault against leader, whose status is s.
func (d *runner) plan(leader Node, s admin.Status) (*faultPlan, error) {
	hold := map[string]time.Duration{FaultNSMDHang: d.o.Node.HangFor, FaultPartition: d.o.Node.CutFor, FaultFreeze: d.o.Node.FreezeFor}[d.o.Fault]
	if hold <= 0 {
		hold = defaultHoldFor(s)
	}
	var self Peer
	var peers []Peer
	for _, m := range d.members {
		p := Peer{ID: m.ID, RaftAddr: m.RaftAddr, GossipAddr: m.GossipAddr, NSMAddr: m.NSMAddr}
		if m.ID == leader.ID {
			self = p
		} else {
			peers = append(peers, p)
		}
	}
	if d.o.Fault == FaultPartition && self.ID == "" {
		return nil, fmt.Errorf("partition: %s is not in /v1/members", leader.ID)
	}
	return planNodeFault(d.o.Fault, d.o.Node, d.target(leader), hold, self, peers)
}

// startFault starts the fault against leader (status s) and returns once
// it is in place: for a node-level fault, when its command said so (or,
// freeze, returned); otherwise at once. The outcome arrives on the
// channel; the time is the drill's t0.
func (d *runner) startFault(ctx context.Context, leader Node, s admin.Status) (<-chan faultResult, time.Time, error) {
	if !d.nodeLevel() {
		t0 := time.Now()
		return d.fault(ctx, leader), t0, nil
	}
	p, err := d.plan(leader, s)
	if err != nil {
		return nil, time.Time{}, err
	}
	applied := make(chan error, 1)
	ch := make(chan faultResult, 1)
	env := []string{"NSMD_LEADER_ID=" + leader.ID, "NSMD_LEADER_ADMIN=" + leader.Admin}
	timeout := p.hold + d.o.Timeout
	d.progressf("%s on %s: %s\n", p.label, leader.ID, p.apply)
	go func() { ch <- runPlan(ctx, p, env, timeout, applied) }()
	if err := <-applied; err != nil {
		fr := <-ch // the goroutine ends: nothing was applied to hold
		if fr.note != "" {
			return nil, time.Time{}, fmt.Errorf("%w (output: %s)", err, fr.note)
		}
		return nil, time.Time{}, err
	}
	return ch, time.Now(), nil
}

// fenceWait reads the new leader's last fence wait and records how it
// had the old leader proven stopped, if the wait was this takeover's.
func (d *runner) fenceWait(ctx context.Context, r *Failover) {
	f := &FenceOutcome{}
	r.Fence = f
	for _, a := range d.statuses(ctx, "", func(s admin.Status) bool { return s.NodeID == r.NewLeader }) {
		if a.err != nil || a.s.NodeID != r.NewLeader {
			continue
		}
		fenceFrom(f, a.s, r.OldLeader, r.NewState)
		return
	}
	f.Note = "the new leader's status did not answer"
}

// fenceFrom fills f from the new leader's status s: its wait for old, if
// that wait belongs to the takeover of state newState.
func fenceFrom(f *FenceOutcome, s admin.Status, old string, newState int32) {
	f.Mode = s.Fence.Mode
	if f.Mode == "none" || f.Mode == "" { // whoever won: nothing to fence
		f.Note = "no fence wait: the new leader serves no storage (no on_leader hook), so it waits for nobody"
		return
	}
	if s.NodeID == old {
		f.Note = "the old leader itself won the new term after its restart: it stopped what it served at its start first"
		return
	}
	lw := s.Fence.LastWait
	tl := s.Takeover
	switch {
	case lw == nil || tl == nil || tl.State < newState || lw.At.Before(tl.At(timeline.Elected.Name())):
		if s.Fence.Waiting {
			f.Note = "the new leader is still waiting for proof"
		} else {
			f.Note = "the new leader recorded no fence wait for this takeover"
		}
		return
	}
	if tl.State > newState {
		// Elected again before it served (a repeated election): the wait
		// of the takeover that served is the one that counts.
		f.Note = fmt.Sprintf("its takeover at sm_state %d, after a further election", tl.State)
	}
	for _, n := range lw.Nodes {
		if n.Node == old {
			f.By, f.Seconds, f.Detail = n.By, n.Seconds, n.Detail
			return
		}
	}
	if lw.Aborted != "" {
		f.Note = "the new leader's wait was aborted: " + lw.Aborted
		return
	}
	f.Note = strings.TrimPrefix(f.Note+"; ", "; ") + "the new leader did not wait for it (not a serving voter)"
}

// oldServer waits (up to the timeout after the fault ended) for the old
// leader to answer again and records what became of it, against its
// process before the fault (prev).
func (d *runner) oldServer(ctx context.Context, r *Failover, old Node, prev *admin.Process, t0 time.Time) {
	o := &r.Fence.Old
	o.Unreachable = d.unanswered[old.ID]
	if old.Admin == "" {
		o.Outcome = OldUnknown
		return
	}
	deadline := time.Now().Add(d.o.Timeout)
	tick := time.NewTicker(d.o.Poll)
	defer tick.Stop()
	for {
		var s admin.Status
		err := d.call(ctx, "GET", old.Admin, "/v1/status", min(statusTimeout*4, oldAnswerWait), &s)
		at := time.Now()
		if err == nil && s.NodeID == old.ID {
			serving := s.Fence.Serving && s.NodeID != r.NewLeader
			if o.Outcome == "" {
				o.Outcome = oldOutcome(prev, s.Process)
				if o.Unreachable || o.Outcome != OldKept {
					o.BackAfterMS = float64(at.Sub(t0).Microseconds()) / 1000
				}
				delete(d.down, old.ID)
			}
			o.Role, o.Serving = s.Role, serving
			// A restarted nsmd says it serves until its stop at start (its
			// on_follower) succeeded: ask again until it says it stopped,
			// and report "serves" only if it still does at the deadline.
			if !serving || at.After(deadline) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			continue
		}
		if o.Outcome != "" { // it answered before: keep what it said
			return
		}
		o.Unreachable = true
		if at.After(deadline) {
			o.Outcome = OldNotBack
			return
		}
		select {
		case <-ctx.Done():
			o.Outcome = OldNotBack
			return
		case <-tick.C:
		}
	}
}

// oldOutcome compares a node's process before and after a fault.
func oldOutcome(prev, now *admin.Process) string {
	switch {
	case prev == nil || now == nil:
		return OldUnknown
	case prev.BootID != "" && now.BootID != "" && prev.BootID != now.BootID:
		return OldReset
	case !prev.Started.Equal(now.Started) || prev.PID != now.PID:
		return OldRestarted
	}
	return OldKept
}

// printFence writes the runs' fence table: how the old server was proven
// stopped and what became of it.
func printFence(w io.Writer, rep *Report) error {
	seen := false
	for _, r := range rep.Runs {
		seen = seen || r.Fence != nil
	}
	if !seen {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tOLD SERVER\tPROVEN STOPPED (new leader's fence wait)\tAFTERWARDS\t")
	for _, r := range rep.Runs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t\n", r.Run, r.OldLeader, FenceLine(r.Fence), OldLine(r.Fence))
	}
	return tw.Flush()
}
