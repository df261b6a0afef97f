// Package drill is the failover drill of `nsmd drill` and `nsmd bench
// failover`: it finds a cluster's nodes through their admin API, faults the
// leader (a planned transfer, a crash through POST /v1/drill/crash, an
// operator's kill command, or a node-level fault run on the leader's
// machine through the operator's --node-cmd: kill -9, SIGSTOP or a cut of
// the cluster links, or its hypervisor's pause: node.go) and times, from the fault, four milestones: a
// new leader elected, the VIP answering NSM NULL, SM_STAT on the VIP with
// the new sm_state, and the new leader's SM_NOTIFY fan-out complete; then
// it reads the new leader's own timeline of the takeover (VIP taken, hook
// started and done, notify sent and complete, the first and last client
// back, each kernel grace over) and places those steps on its axis,
// anchored on the VIP's new state (TakeoverSteps). It talks to the
// cluster only as an operator does — the admin HTTP API and
// NSM over UDP on the VIP — so it runs against any nsmd cluster. The
// report prints as a table, JSON, or a self-contained HTML page
// (report.go).
package drill

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/timeline"
)

// Fault kinds of a drill.
const (
	FaultTransfer = "transfer" // POST /v1/leadership/transfer on the leader
	FaultKill     = "kill"     // POST /v1/drill/crash on the leader
	FaultKillCmd  = "kill-cmd" // an operator's shell command
)

type MilestoneDef struct{ Name, Label string }

// MilestoneDefs are what a drill waits for after the fault, in order
// (indexed by MilestoneLeader…MilestoneNotify). Each is looked for only once the one
// before it was reached, so their times are ordered by construction.
func MilestoneDefs() [MilestoneCount]MilestoneDef {
	return [MilestoneCount]MilestoneDef{
		{"leader_elected", "new leader elected"},
		{"vip_answers", "VIP answers NULL"},
		{"new_sm_state", "VIP SM_STAT has new state"},
		{"notify_done", "notify fan-out complete"},
	}
}

const (
	MilestoneLeader = iota
	MilestoneVIP
	MilestoneState
	MilestoneNotify
	MilestoneCount
)

const (
	statusTimeout = 500 * time.Millisecond // one status poll of one node
	rpcTimeout    = 200 * time.Millisecond // one NULL or SM_STAT on the VIP
	rpcRetransmit = 50 * time.Millisecond
	healthPoll    = 100 * time.Millisecond
)

type Options struct {
	// Admins are admin API addresses (host:port or URL). Nodes not listed
	// are found from /v1/members: their nsm_addr host with each listed
	// admin port is probed (nsmd dev: node i's admin is 127.0.0.i:PORT).
	Admins []string
	VIP    string // host:port of NSM on the VIP; "" = status.vip + the leader's NSM port
	Fault  string // FaultTransfer | FaultKill | FaultKillCmd | FaultNSMDKill | FaultNSMDHang | FaultPartition | FaultFreeze
	// Service, when set, drills that service (service.go): the fault hits
	// the server it runs on (transfer: a planned move of the service to
	// another server), and the milestones are the service's.
	Service string
	KillCmd string
	// Node says how node-level faults reach the leader's machine.
	Node    NodeOptions
	Runs    int
	Timeout time.Duration // per run: the fault until the last milestone; also the wait between runs
	Poll    time.Duration // default 20ms

	Progress io.Writer   // progress lines; nil: none
	TTY      bool        // Progress is a terminal: rewrite one line
	Auth     *admin.Auth // TLS and token for the admin API; nil: plain HTTP
}

type Node struct {
	ID      string `json:"id"`
	Admin   string `json:"admin,omitempty"`
	NSMAddr string `json:"nsm_addr,omitempty"`
	Voter   bool   `json:"voter"`
}

type Milestone struct {
	Name    string        `json:"name"`
	Label   string        `json:"label"`
	Reached bool          `json:"reached"`
	After   time.Duration `json:"-"`
	AfterMS float64       `json:"after_ms,omitempty"` // since the fault
}

type Failover struct {
	Run        int         `json:"run"`
	FaultAt    time.Time   `json:"fault_at"`
	OldLeader  string      `json:"old_leader"`
	NewLeader  string      `json:"new_leader,omitempty"`
	OldState   int32       `json:"old_sm_state"`
	NewState   int32       `json:"new_sm_state,omitempty"`
	Milestones []Milestone `json:"milestones"`
	FaultNote  string      `json:"fault_note,omitempty"` // e.g. the fault call's answer was lost
	// AlsoMoved: a service drill's other services that moved in the run
	// ("b n1→n2"; marked when they were not on the faulted server).
	AlsoMoved []string `json:"also_moved,omitempty"`
	// Grace is how the new leader's kernel grace periods ended (absent
	// when the run failed before; each manager "not running" on nodes
	// without kernel nfsd, like nsmd dev).
	Grace []GraceEnd `json:"grace,omitempty"`
	// Fence is how the new leader had the old one proven stopped before
	// it served, and what became of the old server (fence.go).
	Fence *FenceOutcome `json:"fence,omitempty"`
	// Steps are the new leader's takeover, step by step (its timeline in
	// GET /v1/status), in time order: see TakeoverSteps for the clock.
	Steps []Step `json:"steps,omitempty"`
	Err   string `json:"error,omitempty"`
}

// Step is one step of a takeover as the new leader recorded it, placed on
// the drill's time axis (ms after the fault).
type Step struct {
	Name    string  `json:"name"`
	Label   string  `json:"label"`
	AfterMS float64 `json:"after_ms"`
}

// StepDefs are a takeover's steps in their usual order: name, label
// (package timeline's table).
func StepDefs() []MilestoneDef {
	var out []MilestoneDef
	for _, d := range timeline.Defs() {
		out = append(out, MilestoneDef{d.Name, d.Label})
	}
	return out
}

// TakeoverSteps places timeline tl (on the new leader's clock) on the
// drill's axis: its "VIP taken" falls on vipAfter, when the drill (on its
// own clock) first got the new state from SM_STAT on the VIP, and every
// other step keeps its distance from it. Only differences of one clock are
// used, so the two machines' clocks need not agree; the anchor is late by
// up to one poll and one SM_STAT round trip. Unreached steps are left out;
// a step the drill does not know (a newer node's) is kept with its name.
func TakeoverSteps(tl *admin.Timeline, vipAfter time.Duration) []Step {
	if tl == nil {
		return nil
	}
	vip := tl.At(timeline.VIP.Name())
	if vip.IsZero() {
		return nil
	}
	var out []Step
	for _, s := range tl.Steps {
		if s.At.IsZero() {
			continue
		}
		after := vipAfter + s.At.Sub(vip)
		out = append(out, Step{Name: s.Name, Label: s.Label, AfterMS: float64(after.Microseconds()) / 1000})
	}
	slices.SortStableFunc(out, func(a, b Step) int { return cmp.Compare(a.AfterMS, b.AfterMS) })
	return out
}

// GraceEnd is one kernel lock manager's grace after a failover.
type GraceEnd struct {
	Manager string  `json:"manager"` // nlm (lockd) or nfsv4 (nfsd)
	Running bool    `json:"running"`
	Reason  string  `json:"reason,omitempty"`
	AfterMS float64 `json:"after_ms,omitempty"` // since the fault, as first seen
}

// complete: every milestone was reached.
func (r *Failover) Complete() bool {
	for _, m := range r.Milestones {
		if !m.Reached {
			return false
		}
	}
	return r.Err == ""
}

type Stat struct {
	Name  string  `json:"name"`
	Label string  `json:"label"`
	N     int     `json:"n"` // runs that reached it
	MinMS float64 `json:"min_ms"`
	P50MS float64 `json:"p50_ms"`
	P90MS float64 `json:"p90_ms"`
	MaxMS float64 `json:"max_ms"`
}

type Report struct {
	Date  time.Time `json:"date"`
	Fault string    `json:"fault"`
	// Service is the drilled service ("": a leader drill); then VIP is the
	// service's NSM address, and each run's leaders are its servers.
	Service string     `json:"service,omitempty"`
	VIP     string     `json:"vip"`
	Nodes   []Node     `json:"nodes"`
	Asked   int        `json:"runs_asked"`
	PollMS  float64    `json:"poll_ms"` // each time includes up to one interval
	Runs    []Failover `json:"runs"`
	Stats   []Stat     `json:"stats,omitempty"`
	// StepStats: the new leaders' takeover steps over the runs (StepStats).
	StepStats []Stat `json:"step_stats,omitempty"`
	Stopped   string `json:"stopped,omitempty"` // why fewer runs than asked
	// FaultDetail is how the fault was made (node-level faults: how long
	// and through which command prefix).
	FaultDetail string `json:"fault_detail,omitempty"`
}

// failed counts the runs that missed a milestone.
func (r *Report) Failed() int {
	n := 0
	for i := range r.Runs {
		if !r.Runs[i].Complete() {
			n++
		}
	}
	return n
}

// runner is one drill in progress.
type runner struct {
	o      Options
	hc     *http.Client
	nodes  []Node
	voters int
	vip    string
	// down are killed nodes that have not answered since.
	down map[string]bool
	// members as /v1/members listed them (a partition's addresses).
	members []admin.Member
	// inProcess: the nodes are nsmd dev's, all in one process.
	inProcess bool
	// unanswered are the nodes whose status did not answer since the
	// current run's fault (statuses records them).
	unanswered map[string]bool
}

// Run runs o.Runs failovers and returns what it measured. An error
// means the drill could not run (no cluster, no leader, the fault refused);
// runs that missed a milestone are in the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if len(o.Admins) == 0 {
		return nil, errors.New("drill: no admin address (--admin)")
	}
	if o.Runs < 1 {
		o.Runs = 1
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Poll <= 0 {
		o.Poll = 20 * time.Millisecond
	}
	switch o.Fault {
	case "":
		o.Fault = FaultTransfer
	case FaultTransfer, FaultKill:
	case FaultKillCmd:
		if o.KillCmd == "" {
			return nil, errors.New("drill: --kill-cmd is empty")
		}
	case FaultNSMDKill, FaultNSMDHang, FaultPartition:
	case FaultFreeze:
		if strings.TrimSpace(o.Node.FreezeCmd) == "" || strings.TrimSpace(o.Node.ThawCmd) == "" {
			return nil, errors.New("drill: --fault freeze pauses the leader's machine through its hypervisor: give --freeze-cmd and --thaw-cmd (e.g. 'virsh suspend {node}' and 'virsh resume {node}')")
		}
	default:
		return nil, fmt.Errorf("drill: unknown fault %q (one of %s)", o.Fault, strings.Join(Faults(), ", "))
	}
	if o.Auth == nil {
		o.Auth = &admin.Auth{}
	}
	tr, err := o.Auth.Transport()
	if err != nil {
		return nil, fmt.Errorf("drill: %w", err)
	}
	defer tr.CloseIdleConnections()
	d := &runner{o: o, hc: &http.Client{Transport: tr}, down: map[string]bool{}}
	if err := d.discover(ctx); err != nil {
		return nil, err
	}
	if err := d.checkFault(); err != nil {
		return nil, err
	}
	rep := &Report{Date: time.Now().UTC(), Fault: o.Fault, Nodes: d.nodes, Asked: o.Runs, PollMS: float64(o.Poll.Microseconds()) / 1000,
		FaultDetail: d.faultDetail(), Service: o.Service}
	if o.Service != "" {
		return d.runServices(ctx, rep)
	}
	var leader Node
	prepare := func(ctx context.Context, i int) error {
		var err error
		if leader, err = d.waitHealthy(ctx, i); err != nil || i > 1 {
			return err
		}
		if err := d.findVIP(ctx, leader); err != nil {
			return err
		}
		rep.VIP = d.vip
		return nil
	}
	if err := d.runAll(ctx, rep, prepare, func(ctx context.Context, i int) (Failover, error) { return d.run(ctx, i, leader) }); err != nil {
		return nil, err
	}
	rep.Stats = Stats(rep.Runs)
	rep.StepStats = StepStats(rep.Runs)
	return rep, nil
}

// runAll makes rep's runs: before run i, prepare waits for the cluster
// to be ready for it (an error: the drill stops, "before run i"; on the
// first run it is the drill's error), then run makes it. It stops early
// when the context ends.
func (d *runner) runAll(ctx context.Context, rep *Report, prepare func(context.Context, int) error, run func(context.Context, int) (Failover, error)) error {
	for i := 1; i <= d.o.Runs; i++ {
		err := prepare(ctx, i)
		var stop *stopError
		if errors.As(err, &stop) {
			rep.Stopped = stop.reason
			d.progressf("%s\n", stop.reason)
			break
		}
		if err != nil {
			if i == 1 {
				return err
			}
			rep.Stopped = fmt.Sprintf("before run %d: %v", i, err)
			break
		}
		r, err := run(ctx, i)
		if err != nil {
			if i == 1 {
				return err
			}
			rep.Stopped = fmt.Sprintf("run %d: %v", i, err)
			break
		}
		rep.Runs = append(rep.Runs, r)
		if ctx.Err() != nil {
			rep.Stopped = "interrupted"
			break
		}
	}
	return nil
}

// stopError ends a drill early for a reason the operator should read.
type stopError struct{ reason string }

func (s *stopError) Error() string { return s.reason }

func (e *httpError) Error() string { return e.msg }

type faultResult struct {
	err        error
	definitive bool // the fault did not happen (refused), stop measuring
	note       string
}

// fault starts the fault against leader; its outcome arrives on the channel.
func (d *runner) fault(ctx context.Context, leader Node) <-chan faultResult {
	ch := make(chan faultResult, 1)
	go func() {
		crash := d.crashes()
		switch d.o.Fault {
		case FaultTransfer, FaultKill, FaultNSMDKill:
			path := "/v1/leadership/transfer"
			if crash {
				path = "/v1/drill/crash"
			}
			var res map[string]string
			err := d.call(ctx, "POST", leader.Admin, path, d.o.Timeout, &res)
			var he *httpError
			switch {
			case errors.As(err, &he):
				ch <- faultResult{err: err, definitive: true}
			case err != nil && crash:
				// The node may die before its answer gets out.
				ch <- faultResult{note: "crash call got no answer (node died first?): " + err.Error()}
			case err != nil:
				ch <- faultResult{err: err, note: err.Error()}
			default:
				ch <- faultResult{}
			}
		case FaultKillCmd:
			cctx, cancel := context.WithTimeout(ctx, d.o.Timeout)
			defer cancel()
			c := exec.CommandContext(cctx, "sh", "-c", d.o.KillCmd)
			c.Env = append(os.Environ(), "NSMD_LEADER_ID="+leader.ID, "NSMD_LEADER_ADMIN="+leader.Admin)
			out, err := c.CombinedOutput()
			if err != nil {
				ch <- faultResult{err: fmt.Errorf("--kill-cmd: %w: %s", err, strings.TrimSpace(string(out))), definitive: true}
				return
			}
			ch <- faultResult{note: strings.TrimSpace(string(out))}
		}
	}()
	return ch
}

// run causes one failover and times its milestones.
func (d *runner) run(ctx context.Context, n int, leader Node) (Failover, error) {
	r := Failover{Run: n, OldLeader: leader.ID}
	for _, m := range MilestoneDefs() {
		r.Milestones = append(r.Milestones, Milestone{Name: m.Name, Label: m.Label})
	}
	var s admin.Status
	if err := d.call(ctx, "GET", leader.Admin, "/v1/status", 3*time.Second, &s); err != nil {
		return r, err
	}
	r.OldState = s.SMState
	oldTerm := s.Term
	oldProc := s.Process

	faultCh, t0, err := d.startFault(ctx, leader, s)
	if err != nil {
		return r, fmt.Errorf("drill: fault on %s: %w", leader.ID, err)
	}
	r.FaultAt = t0.UTC()
	d.unanswered = map[string]bool{}
	if d.o.Fault != FaultTransfer {
		d.down[leader.ID] = true
	}
	reach := func(i int, at time.Time) {
		r.Milestones[i].Reached = true
		r.Milestones[i].After = at.Sub(t0)
		r.Milestones[i].AfterMS = float64(r.Milestones[i].After.Microseconds()) / 1000
		if !d.o.TTY {
			d.progressf("run %d: %-26s %8s  (%s)\n", n, r.Milestones[i].Label, FormatDuration(r.Milestones[i].After), d.milestoneNote(&r, i))
		}
	}
	d.progressf("run %d/%d: %s on leader %s (sm_state %d)\n", n, d.o.Runs, d.faultLabel(), leader.ID, r.OldState)

	deadline := t0.Add(d.o.Timeout)
	vipGone := false
	stage, faultDone, err := d.pollMilestones(ctx, &r, t0, faultCh, leader.ID, func(stage int) (int, error) {
		switch stage {
		case MilestoneLeader, MilestoneNotify:
			newState := r.NewState
			// A leader of a newer term: the killed node itself may win it
			// once restarted (nsmd dev, systemd), with its log intact.
			newLeader := func(s admin.Status) bool { return s.Role == "leader" && s.Term > oldTerm }
			answers := d.statuses(ctx, "", func(s admin.Status) bool {
				return newLeader(s) && (stage == MilestoneLeader || notifyDone(s, newState))
			})
			for _, a := range answers {
				if a.err != nil || !newLeader(a.s) {
					continue
				}
				if stage == MilestoneLeader {
					r.NewLeader = a.s.NodeID
					reach(MilestoneLeader, a.at)
					stage = MilestoneVIP
				} else if notifyDone(a.s, newState) {
					r.NewLeader = a.s.NodeID
					reach(MilestoneNotify, a.at)
					stage = MilestoneCount
				}
				break
			}
		case MilestoneVIP:
			// The old leader may answer on the VIP until it lets go: credit
			// the VIP once it was seen down, or once it has the new state.
			pctx, pcancel := context.WithTimeout(ctx, rpcTimeout)
			err := vipNull(pctx, d.vip)
			atNull := time.Now()
			if err != nil {
				pcancel()
				vipGone = true
				break
			}
			state, err := vipStat(pctx, d.vip)
			atStat := time.Now()
			pcancel()
			if err == nil && state > r.OldState {
				reach(MilestoneVIP, atNull)
				r.NewState = state
				reach(MilestoneState, atStat)
				stage = MilestoneNotify
			} else if vipGone {
				reach(MilestoneVIP, atNull)
				stage = MilestoneState
			}
		case MilestoneState:
			pctx, pcancel := context.WithTimeout(ctx, rpcTimeout)
			state, err := vipStat(pctx, d.vip)
			at := time.Now()
			pcancel()
			if err == nil && state > r.OldState {
				r.NewState = state
				reach(MilestoneState, at)
				stage = MilestoneNotify
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
	if r.Err == "" {
		d.waitGrace(ctx, &r, t0, deadline)
		d.takeoverSteps(ctx, &r)
	}
	if r.NewLeader != "" {
		d.fenceWait(ctx, &r)
	}
	if r.Err != "" {
		d.progressf("run %d: %s\n", n, r.Err)
	}
	if !faultDone { // bounded by the timeout (node-level faults: by their hold)
		if fr := <-faultCh; fr.note != "" || fr.err != nil {
			r.FaultNote = fr.note
		}
	}
	if r.Fence == nil {
		r.Fence = &FenceOutcome{}
	}
	d.oldServer(ctx, &r, leader, oldProc, t0)
	d.progressf("run %d: old server %s: %s; %s\n", n, leader.ID, FenceLine(r.Fence), OldLine(r.Fence))
	return r, nil
}

// pollMilestones looks for r's milestones in order from the fault at t0
// until the last is reached, the drill's timeout passes (r.Err says
// which was not) or ctx ends: step looks for stage's milestone and
// returns the stage to look for next (stage itself: not reached yet);
// the next is looked for at once, the same one a poll interval later. It
// notes the fault's outcome when it arrives (a definitive refusal of the
// fault on target ends the run with an error) and returns the stage it
// stopped at and whether the outcome arrived.
func (d *runner) pollMilestones(ctx context.Context, r *Failover, t0 time.Time, faultCh <-chan faultResult, target string,
	step func(stage int) (int, error)) (stage int, faultDone bool, err error) {
	deadline := t0.Add(d.o.Timeout)
	tick := time.NewTicker(d.o.Poll)
	defer tick.Stop()
	for stage < MilestoneCount {
		if !faultDone {
			select {
			case fr := <-faultCh:
				faultDone = true
				r.FaultNote = fr.note
				if fr.err != nil && fr.definitive {
					return stage, faultDone, fmt.Errorf("drill: fault on %s: %w", target, fr.err)
				}
			default:
			}
		}
		before := stage
		if stage, err = step(stage); err != nil {
			return stage, faultDone, err
		}
		if stage == MilestoneCount {
			break
		}
		if d.o.TTY {
			d.progressf("\r\033[Krun %d/%d: %s  %s", r.Run, d.o.Runs, FormatDuration(time.Since(t0)), d.ttyLine(r, stage))
		}
		if time.Now().After(deadline) {
			r.Err = fmt.Sprintf("%s not reached within %v", r.Milestones[stage].Label, d.o.Timeout)
			break
		}
		if stage != before {
			continue // look for the next milestone at once, not a tick later
		}
		select {
		case <-ctx.Done():
			r.Err = ctx.Err().Error()
			return MilestoneCount, faultDone, nil
		case <-tick.C:
		}
	}
	return stage, faultDone, nil
}

// waitGrace polls the new leader until its kernel grace periods of the new
// incarnation are over (or do not run there), and records when and why
// each ended; past the deadline it records what it saw.
func (d *runner) waitGrace(ctx context.Context, r *Failover, t0, deadline time.Time) {
	tick := time.NewTicker(d.o.Poll)
	defer tick.Stop()
	seen := map[string]*GraceEnd{}
	for {
		for _, a := range d.statuses(ctx, "", func(s admin.Status) bool { return s.NodeID == r.NewLeader }) {
			g := a.s.Grace
			if a.err != nil || a.s.NodeID != r.NewLeader || g == nil || g.SMState < r.NewState {
				continue
			}
			for _, m := range admin.GraceManagers() {
				ms := g.Manager(m)
				if seen[m] != nil {
					continue
				}
				switch {
				case ms.Absent:
					seen[m] = &GraceEnd{Manager: m}
				case ms.Ended != nil:
					seen[m] = &GraceEnd{Manager: m, Running: true, Reason: ms.Ended.Reason,
						AfterMS: float64(a.at.Sub(t0).Microseconds()) / 1000}
				}
			}
		}
		if len(seen) == len(admin.GraceManagers()) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	for _, m := range admin.GraceManagers() {
		if e := seen[m]; e != nil {
			r.Grace = append(r.Grace, *e)
		} else {
			r.Grace = append(r.Grace, GraceEnd{Manager: m, Running: true, Reason: "still in grace at the timeout"})
		}
	}
}

// takeoverSteps reads the new leader's timeline of this run's takeover
// and records its steps, anchored on the VIP's new state.
func (d *runner) takeoverSteps(ctx context.Context, r *Failover) {
	m := r.Milestones[MilestoneState]
	if !m.Reached {
		return
	}
	for _, a := range d.statuses(ctx, "", func(s admin.Status) bool { return s.NodeID == r.NewLeader }) {
		if a.err == nil && a.s.NodeID == r.NewLeader && a.s.Takeover != nil && a.s.Takeover.State == r.NewState {
			r.Steps = TakeoverSteps(a.s.Takeover, m.After)
			return
		}
	}
}

// notifyDone: the leader's fan-out for the new state has settled every
// host it started with.
func notifyDone(s admin.Status, newState int32) bool {
	return s.Role == "leader" && s.Notify.State >= newState && s.Notify.Pending == 0 &&
		s.Notify.Done+s.Notify.Failed == s.Notify.Targets
}

func (d *runner) milestoneNote(r *Failover, i int) string {
	switch i {
	case MilestoneLeader:
		return "leader " + r.NewLeader
	case MilestoneVIP:
		return "on " + d.vip
	case MilestoneState:
		return fmt.Sprintf("sm_state %d -> %d", r.OldState, r.NewState)
	}
	return "notify.pending 0 on " + r.NewLeader
}

func (d *runner) ttyLine(r *Failover, stage int) string {
	var parts []string
	for i, m := range r.Milestones {
		switch {
		case m.Reached:
			parts = append(parts, fmt.Sprintf("%s %s", m.Name, FormatDuration(m.After)))
		case i == stage:
			parts = append(parts, "waiting for "+m.Name+"…")
		}
	}
	return strings.Join(parts, " | ")
}

func (d *runner) progressf(format string, a ...any) {
	if d.o.Progress != nil {
		fmt.Fprintf(d.o.Progress, format, a...)
	}
}
