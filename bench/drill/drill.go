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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
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
	for i := 1; i <= o.Runs; i++ {
		leader, err := d.waitHealthy(ctx, i)
		var stop *stopError
		if errors.As(err, &stop) {
			rep.Stopped = stop.reason
			d.progressf("%s\n", stop.reason)
			break
		}
		if err != nil {
			if i == 1 {
				return nil, err
			}
			rep.Stopped = fmt.Sprintf("before run %d: %v", i, err)
			break
		}
		if i == 1 {
			if err := d.findVIP(ctx, leader); err != nil {
				return nil, err
			}
			rep.VIP = d.vip
		}
		run, err := d.run(ctx, i, leader)
		if err != nil {
			if i == 1 {
				return nil, err
			}
			rep.Stopped = fmt.Sprintf("run %d: %v", i, err)
			break
		}
		rep.Runs = append(rep.Runs, run)
		if ctx.Err() != nil {
			rep.Stopped = "interrupted"
			break
		}
	}
	rep.Stats = Stats(rep.Runs)
	rep.StepStats = StepStats(rep.Runs)
	return rep, nil
}

// stopError ends a drill early for a reason the operator should read.
type stopError struct{ reason string }

func (s *stopError) Error() string { return s.reason }

// hostPort is an admin address without scheme (host:port, or the URL as
// given when it has a path).
func hostPort(addr string) string {
	_, rest, ok := strings.Cut(addr, "://")
	if !ok {
		return strings.TrimRight(addr, "/")
	}
	return strings.TrimRight(rest, "/")
}

// call is one admin API request bounded by timeout; out may be nil.
func (d *runner) call(ctx context.Context, method, adm, path string, timeout time.Duration, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, d.o.Auth.URL(adm)+path, nil)
	if err == nil {
		err = d.o.Auth.Authorize(req)
	}
	if err != nil {
		return fmt.Errorf("admin API %s: %w", adm, err)
	}
	resp, err := d.hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API %s: %w", adm, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("admin API %s: read %s: %w", adm, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e admin.ErrorBody
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return &httpError{fmt.Sprintf("%s %s on %s: %s", method, path, adm, e.Error)}
		}
		return &httpError{fmt.Sprintf("%s %s on %s: %s", method, path, adm, resp.Status)}
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("admin API %s: decode %s: %w", adm, path, err)
		}
	}
	return nil
}

// httpError is an answer the node gave (not a lost connection).
type httpError struct{ msg string }

func (e *httpError) Error() string { return e.msg }

// discover learns the nodes: the given admin addresses, then the members
// they report, whose admin API is probed at their NSM (or raft) host with
// each given admin port.
func (d *runner) discover(ctx context.Context) error {
	byID := map[string]*Node{}
	var order []string
	var ports []string
	var members []admin.Member
	var errs []error
	for _, adm := range d.o.Admins {
		var s admin.Status
		if err := d.call(ctx, "GET", adm, "/v1/status", 3*time.Second, &s); err != nil {
			errs = append(errs, err)
			continue
		}
		if s.Process != nil && s.Process.InProcess {
			d.inProcess = true
		}
		if _, ok := byID[s.NodeID]; !ok {
			byID[s.NodeID] = &Node{ID: s.NodeID, Admin: hostPort(adm), NSMAddr: s.NSMAddr}
			order = append(order, s.NodeID)
		}
		if u := hostPort(adm); !strings.Contains(u, "/") {
			if _, p, err := net.SplitHostPort(u); err == nil && !slices.Contains(ports, p) {
				ports = append(ports, p)
			}
		}
		if members == nil {
			if err := d.call(ctx, "GET", adm, "/v1/members", 3*time.Second, &members); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(byID) == 0 {
		return fmt.Errorf("drill: no admin API answered: %w", errors.Join(errs...))
	}
	d.members = members
	for _, m := range members {
		n, ok := byID[m.ID]
		if !ok {
			n = &Node{ID: m.ID, NSMAddr: m.NSMAddr}
			byID[m.ID] = n
			order = append(order, m.ID)
			n.Admin = d.probeAdmin(ctx, m, ports)
		}
		n.Voter = m.Suffrage == "Voter"
		if n.NSMAddr == "" {
			n.NSMAddr = m.NSMAddr
		}
	}
	for _, id := range order {
		n := byID[id]
		d.nodes = append(d.nodes, *n)
		if n.Voter {
			d.voters++
		}
	}
	if members == nil { // an old node without /v1/members: all given nodes vote
		d.voters = len(d.nodes)
		for i := range d.nodes {
			d.nodes[i].Voter = true
		}
	}
	if len(d.nodes) < 2 {
		return fmt.Errorf("drill: only one node known (%s); a failover needs two or more", d.nodes[0].ID)
	}
	return nil
}

// probeAdmin looks for member m's admin API at its hosts with the given
// ports; "" if none answers as m.
func (d *runner) probeAdmin(ctx context.Context, m admin.Member, ports []string) string {
	var hosts []string
	for _, a := range []string{m.NSMAddr, m.RaftAddr, m.GossipAddr} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" && !slices.Contains(hosts, h) {
			if ip, err := netip.ParseAddr(h); err == nil && ip.IsUnspecified() {
				continue
			}
			hosts = append(hosts, h)
		}
	}
	for _, h := range hosts {
		for _, p := range ports {
			addr := net.JoinHostPort(h, p)
			var s admin.Status
			if d.call(ctx, "GET", addr, "/v1/status", time.Second, &s) == nil && s.NodeID == m.ID {
				return addr
			}
		}
	}
	return ""
}

type answer struct {
	node Node
	s    admin.Status
	err  error
	at   time.Time
}

// statuses asks every node with a known admin API (except skip) for its
// status in parallel. With stop set it returns as soon as stop accepts an
// answer (the other requests are cancelled and waited for).
func (d *runner) statuses(ctx context.Context, skip string, stop func(admin.Status) bool) []answer {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan answer, len(d.nodes))
	var wg sync.WaitGroup
	n := 0
	for _, node := range d.nodes {
		if node.Admin == "" || node.ID == skip {
			continue
		}
		n++
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s admin.Status
			err := d.call(ctx, "GET", node.Admin, "/v1/status", statusTimeout, &s)
			ch <- answer{node: node, s: s, err: err, at: time.Now()}
		}()
	}
	var out []answer
	for range n {
		a := <-ch
		out = append(out, a)
		if a.err != nil && ctx.Err() == nil && d.unanswered != nil {
			d.unanswered[a.node.ID] = true
		}
		if a.err == nil && stop != nil && stop(a.s) {
			break
		}
	}
	cancel()
	wg.Wait()
	return out
}

// waitHealthy waits (up to the timeout) for one agreed leader that holds
// the VIP, and for killed nodes to come back — or, if one does not, for
// enough voters to survive another leader kill. It returns the leader.
func (d *runner) waitHealthy(ctx context.Context, run int) (Node, error) {
	deadline := time.Now().Add(d.o.Timeout)
	var why string
	for {
		answers := d.statuses(ctx, "", nil)
		leader, ok, reason := d.healthy(answers)
		why = reason
		if ok {
			if len(d.down) > 0 {
				var ids []string
				for id := range d.down {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				d.progressf("run %d: %s not back; %d of %d voters up, enough to lose another leader\n", run, strings.Join(ids, ", "), d.votersUp(), d.voters)
			}
			return leader, nil
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return Node{}, ctx.Err()
		case <-time.After(healthPoll):
		}
	}
	if len(d.down) > 0 && run > 1 {
		var ids []string
		for id := range d.down {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return Node{}, &stopError{fmt.Sprintf(
			"stopping after run %d: killed node %s did not come back within %v (nothing restarted it: nsmd dev does after --restart-after, a real node needs its supervisor), and killing another leader would leave %d of %d voters: no quorum",
			run-1, strings.Join(ids, ", "), d.o.Timeout, d.votersUp()-1, d.voters)}
	}
	return Node{}, fmt.Errorf("drill: cluster not healthy within %v: %s", d.o.Timeout, why)
}

// votersUp counts voters not known to be down.
func (d *runner) votersUp() int {
	n := 0
	for _, node := range d.nodes {
		if node.Voter && !d.down[node.ID] {
			n++
		}
	}
	return n
}

// healthy judges one round of status answers.
func (d *runner) healthy(answers []answer) (Node, bool, string) {
	var leaders []answer
	ids := map[string]bool{}
	for _, a := range answers {
		if a.err != nil {
			continue
		}
		delete(d.down, a.node.ID) // came back
		ids[a.s.LeaderID] = true
		if a.s.Role == "leader" {
			leaders = append(leaders, a)
		}
	}
	switch {
	case len(leaders) == 0:
		return Node{}, false, "no node reports role=leader"
	case len(leaders) > 1:
		return Node{}, false, fmt.Sprintf("%d nodes report role=leader", len(leaders))
	case len(ids) > 1:
		return Node{}, false, "nodes disagree on the leader"
	}
	l := leaders[0]
	if l.s.VIP != "" && !l.s.VIPHeld {
		return Node{}, false, fmt.Sprintf("leader %s does not hold the VIP yet", l.node.ID)
	}
	// Every node that answers has caught up: a node just restarted that
	// is still behind the leader's log cannot win the next election, and
	// killing the leader then tests a degraded cluster, not a failover.
	for _, a := range answers {
		if a.err == nil && a.s.AppliedIndex < l.s.AppliedIndex {
			return Node{}, false, fmt.Sprintf("%s has applied index %d, the leader %d: catching up", a.node.ID, a.s.AppliedIndex, l.s.AppliedIndex)
		}
	}
	if len(d.down) > 0 && d.votersUp()-1 <= d.voters/2 {
		return Node{}, false, "waiting for a killed node to come back"
	}
	return l.node, true, ""
}

// findVIP settles the VIP's NSM address and checks that it answers.
func (d *runner) findVIP(ctx context.Context, leader Node) error {
	if d.o.VIP == "" {
		var s admin.Status
		if err := d.call(ctx, "GET", leader.Admin, "/v1/status", 3*time.Second, &s); err != nil {
			return err
		}
		if s.VIP == "" {
			return errors.New("drill: the cluster has no VIP (vip_mode none?); pass --vip HOST:PORT")
		}
		host := s.VIP
		if p, err := netip.ParsePrefix(s.VIP); err == nil {
			host = p.Addr().String()
		}
		_, port, err := net.SplitHostPort(s.NSMAddr)
		if err != nil {
			return fmt.Errorf("drill: leader's nsm_addr %q: %w", s.NSMAddr, err)
		}
		d.o.VIP = net.JoinHostPort(host, port)
	}
	d.vip = d.o.VIP
	// A new holder may need a moment (a drill right after a failover):
	// retry up to the timeout before giving up.
	deadline := time.Now().Add(d.o.Timeout)
	for {
		_, err := vipStat(ctx, d.vip)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("drill: the VIP %s does not answer SM_STAT before the drill (use --vip): %w", d.vip, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(healthPoll):
		}
	}
}

func vipDial(ctx context.Context, addr string) (*oncrpc.Client, error) {
	return oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "udp", Addr: addr, Timeout: rpcTimeout, Retransmit: rpcRetransmit})
}

// vipNull calls NSM NULL on addr over UDP.
func vipNull(ctx context.Context, addr string) error {
	c, err := vipDial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcNull, oncrpc.Void{}, nil)
}

// vipStat calls SM_STAT on addr over UDP and returns the state.
func vipStat(ctx context.Context, addr string) (int32, error) {
	c, err := vipDial(ctx, addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var res nsm.SMStatRes
	if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: "nsmd-drill"}, &res); err != nil {
		return 0, err
	}
	if res.Res != nsm.StatSucc {
		return 0, fmt.Errorf("SM_STAT: %s", res.Res)
	}
	return res.State, nil
}

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
	faultDone := false
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
	tick := time.NewTicker(d.o.Poll)
	defer tick.Stop()
	vipGone := false
	stage := MilestoneLeader
	for stage < MilestoneCount {
		if !faultDone {
			select {
			case fr := <-faultCh:
				faultDone = true
				r.FaultNote = fr.note
				if fr.err != nil && fr.definitive {
					return r, fmt.Errorf("drill: fault on %s: %w", leader.ID, fr.err)
				}
			default:
			}
		}
		before := stage
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
		if stage == MilestoneCount {
			break
		}
		if d.o.TTY {
			d.progressf("\r\033[Krun %d/%d: %s  %s", n, d.o.Runs, FormatDuration(time.Since(t0)), d.ttyLine(&r, stage))
		}
		if time.Now().After(deadline) {
			r.Err = fmt.Sprintf("%s not reached within %v", MilestoneDefs()[stage].Label, d.o.Timeout)
			break
		}
		if stage != before {
			continue // look for the next milestone at once, not a tick later
		}
		select {
		case <-ctx.Done():
			r.Err = ctx.Err().Error()
			stage = MilestoneCount
		case <-tick.C:
		}
		if r.Err != "" {
			break
		}
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

// graceLine describes how a run's kernel grace periods ended.
func graceLine(r Failover) string {
	var parts []string
	for _, g := range r.Grace {
		name := map[string]string{"nlm": "lockd", "nfsv4": "nfsd"}[g.Manager]
		switch {
		case !g.Running:
			parts = append(parts, name+" not running")
		case g.AfterMS > 0:
			parts = append(parts, fmt.Sprintf("%s ended %s after the fault (%s)", name, FormatMS(g.AfterMS), g.Reason))
		default:
			parts = append(parts, name+" "+g.Reason)
		}
	}
	return strings.Join(parts, ", ")
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

func FaultLabel(f string) string {
	switch f {
	case FaultKill:
		return "crash (POST /v1/drill/crash)"
	case FaultKillCmd:
		return "kill command"
	case FaultNSMDKill:
		return "kill -9 of nsmd"
	case FaultNSMDHang:
		return "nsmd hung (SIGSTOP)"
	case FaultPartition:
		return "cluster links cut"
	case FaultFreeze:
		return "machine frozen"
	}
	return "planned leadership transfer"
}

// FormatDuration prints a duration at millisecond resolution (µs below 10 ms).
func FormatDuration(d time.Duration) string {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// Stats is min/p50/p90/max (nearest rank) per milestone over the runs
// that reached it.
func Stats(runs []Failover) []Stat {
	var out []Stat
	defs := MilestoneDefs()
	if len(runs) > 0 && len(runs[0].Milestones) == MilestoneCount {
		for i, m := range runs[0].Milestones { // a service drill's are its own
			defs[i] = MilestoneDef{m.Name, m.Label}
		}
	}
	for i, def := range defs {
		var v []float64
		for _, r := range runs {
			if i < len(r.Milestones) && r.Milestones[i].Reached {
				v = append(v, r.Milestones[i].AfterMS)
			}
		}
		st := Stat{Name: def.Name, Label: def.Label, N: len(v)}
		if len(v) > 0 {
			slices.Sort(v)
			st.MinMS, st.P50MS, st.P90MS, st.MaxMS = v[0], Percentile(v, 0.5), Percentile(v, 0.9), v[len(v)-1]
		}
		out = append(out, st)
	}
	return out
}

// StepStats is min/p50/p90/max per takeover step over the runs that
// recorded it, in StepDefs order, then steps the table does not know (a
// newer node's) by name; steps no run recorded are left out.
func StepStats(runs []Failover) []Stat {
	defs := StepDefs()
	known := map[string]bool{}
	for _, d := range defs {
		known[d.Name] = true
	}
	var more []MilestoneDef
	for _, r := range runs {
		for _, s := range r.Steps {
			if !known[s.Name] {
				known[s.Name] = true
				more = append(more, MilestoneDef{s.Name, s.Label})
			}
		}
	}
	slices.SortFunc(more, func(a, b MilestoneDef) int { return strings.Compare(a.Name, b.Name) })
	var out []Stat
	for _, def := range append(defs, more...) {
		var v []float64
		for _, r := range runs {
			if ms, ok := stepAfter(r, def.Name); ok {
				v = append(v, ms)
			}
		}
		if len(v) == 0 {
			continue
		}
		slices.Sort(v)
		out = append(out, Stat{Name: def.Name, Label: def.Label, N: len(v),
			MinMS: v[0], P50MS: Percentile(v, 0.5), P90MS: Percentile(v, 0.9), MaxMS: v[len(v)-1]})
	}
	return out
}

// stepAfter is when run r's step name happened (ms after the fault).
func stepAfter(r Failover, name string) (float64, bool) {
	for _, s := range r.Steps {
		if s.Name == name {
			return s.AfterMS, true
		}
	}
	return 0, false
}

func Percentile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func FormatMS(ms float64) string {
	return FormatDuration(time.Duration(ms * float64(time.Millisecond)))
}

// Print writes the summary: cluster, each run, the milestone table
// and, for several runs, the distribution.
func Print(w io.Writer, rep *Report) error {
	var ids []string
	for _, n := range rep.Nodes {
		ids = append(ids, n.ID)
	}
	where, who := "VIP "+rep.VIP, "leader"
	if rep.Service != "" {
		where, who = "service "+rep.Service+" at "+rep.VIP, "server"
	}
	fmt.Fprintf(w, "\ndrill: %s, %d of %d runs, %s, nodes %s, polling every %s\n", FaultLabel(rep.Fault), len(rep.Runs), rep.Asked, where, strings.Join(ids, " "), FormatMS(rep.PollMS))
	if rep.FaultDetail != "" {
		fmt.Fprintf(w, "fault: %s\n", rep.FaultDetail)
	}
	for _, r := range rep.Runs {
		fmt.Fprintf(w, "run %d at %s: %s %s -> %s, sm_state %d -> %d", r.Run, r.FaultAt.Local().Format("15:04:05"), who, r.OldLeader, dash(r.NewLeader), r.OldState, r.NewState)
		if len(r.AlsoMoved) > 0 {
			fmt.Fprintf(w, "; also moved: %s", strings.Join(r.AlsoMoved, ", "))
		}
		if r.Err != "" {
			fmt.Fprintf(w, "  FAILED: %s", r.Err)
		}
		if len(r.Grace) > 0 {
			fmt.Fprintf(w, "; kernel grace: %s", graceLine(r))
		}
		fmt.Fprintln(w)
	}
	if len(rep.Runs) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprint(tw, "MILESTONE (since the fault)\t")
		for _, r := range rep.Runs {
			fmt.Fprintf(tw, "RUN %d\t", r.Run)
		}
		fmt.Fprintln(tw)
		for i, def := range rep.Defs() {
			fmt.Fprintf(tw, "%s\t", def.Label)
			for _, r := range rep.Runs {
				if m := r.Milestones[i]; m.Reached {
					fmt.Fprintf(tw, "%s\t", FormatDuration(m.After))
				} else {
					fmt.Fprint(tw, "-\t")
				}
			}
			fmt.Fprintln(tw)
		}
		fmt.Fprintln(w)
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if steps := StepStats(rep.Runs); len(steps) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprint(tw, "NEW LEADER'S STEP (since the fault)\t")
		for _, r := range rep.Runs {
			fmt.Fprintf(tw, "RUN %d\t", r.Run)
		}
		fmt.Fprintln(tw)
		for _, st := range steps {
			fmt.Fprintf(tw, "%s\t", st.Label)
			for _, r := range rep.Runs {
				if ms, ok := stepAfter(r, st.Name); ok {
					fmt.Fprintf(tw, "%s\t", FormatMS(ms))
				} else {
					fmt.Fprint(tw, "-\t")
				}
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Runs) > 1 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MILESTONE\tRUNS\tMIN\tP50\tP90\tMAX\t")
		for _, st := range rep.Stats {
			if st.N == 0 {
				fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t\n", st.Label)
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", st.Label, st.N, FormatMS(st.MinMS), FormatMS(st.P50MS), FormatMS(st.P90MS), FormatMS(st.MaxMS))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if err := printFence(w, rep); err != nil {
		return err
	}
	if rep.Stopped != "" {
		fmt.Fprintf(w, "\nstopped early: %s\n", rep.Stopped)
	}
	return nil
}

// dash is s, or "-" when empty.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
