package main

import (
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

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// Fault kinds of a drill.
const (
	drillTransfer = "transfer" // POST /v1/leadership/transfer on the leader
	drillKill     = "kill"     // POST /v1/drill/crash on the leader
	drillKillCmd  = "kill-cmd" // an operator's shell command
)

type drillMilestoneDef struct{ Name, Label string }

// drillMilestoneDefs are what a drill waits for after the fault, in order
// (indexed by msLeader…msNotify). Each is looked for only once the one
// before it was reached, so their times are ordered by construction.
func drillMilestoneDefs() [msCount]drillMilestoneDef {
	return [msCount]drillMilestoneDef{
		{"leader_elected", "new leader elected"},
		{"vip_answers", "VIP answers NULL"},
		{"new_sm_state", "VIP SM_STAT has new state"},
		{"notify_done", "notify fan-out complete"},
	}
}

const (
	msLeader = iota
	msVIP
	msState
	msNotify
	msCount
)

const (
	drillStatusTimeout = 500 * time.Millisecond // one status poll of one node
	drillRPCTimeout    = 200 * time.Millisecond // one NULL or SM_STAT on the VIP
	drillRPCRetransmit = 50 * time.Millisecond
	drillHealthPoll    = 100 * time.Millisecond
)

type drillOptions struct {
	// Admins are admin API addresses (host:port or URL). Nodes not listed
	// are found from /v1/members: their nsm_addr host with each listed
	// admin port is probed (nsmd dev: node i's admin is 127.0.0.i:PORT).
	Admins  []string
	VIP     string // host:port of NSM on the VIP; "" = status.vip + the leader's NSM port
	Fault   string // drillTransfer | drillKill | drillKillCmd
	KillCmd string
	Runs    int
	Timeout time.Duration // per run: the fault until the last milestone; also the wait between runs
	Poll    time.Duration // default 20ms

	Progress io.Writer // progress lines; nil: none
	TTY      bool      // Progress is a terminal: rewrite one line
	Auth     adminAuth // TLS and token for the admin API
}

type drillNode struct {
	ID      string `json:"id"`
	Admin   string `json:"admin,omitempty"`
	NSMAddr string `json:"nsm_addr,omitempty"`
	Voter   bool   `json:"voter"`
}

type drillMilestone struct {
	Name    string        `json:"name"`
	Label   string        `json:"label"`
	Reached bool          `json:"reached"`
	After   time.Duration `json:"-"`
	AfterMS float64       `json:"after_ms,omitempty"` // since the fault
}

type drillRun struct {
	Run        int              `json:"run"`
	FaultAt    time.Time        `json:"fault_at"`
	OldLeader  string           `json:"old_leader"`
	NewLeader  string           `json:"new_leader,omitempty"`
	OldState   int32            `json:"old_sm_state"`
	NewState   int32            `json:"new_sm_state,omitempty"`
	Milestones []drillMilestone `json:"milestones"`
	FaultNote  string           `json:"fault_note,omitempty"` // e.g. the fault call's answer was lost
	Err        string           `json:"error,omitempty"`
}

// complete: every milestone was reached.
func (r *drillRun) complete() bool {
	for _, m := range r.Milestones {
		if !m.Reached {
			return false
		}
	}
	return r.Err == ""
}

type drillStat struct {
	Name  string  `json:"name"`
	Label string  `json:"label"`
	N     int     `json:"n"` // runs that reached it
	MinMS float64 `json:"min_ms"`
	P50MS float64 `json:"p50_ms"`
	P90MS float64 `json:"p90_ms"`
	MaxMS float64 `json:"max_ms"`
}

type drillReport struct {
	Date    time.Time   `json:"date"`
	Fault   string      `json:"fault"`
	VIP     string      `json:"vip"`
	Nodes   []drillNode `json:"nodes"`
	Asked   int         `json:"runs_asked"`
	PollMS  float64     `json:"poll_ms"` // each time includes up to one interval
	Runs    []drillRun  `json:"runs"`
	Stats   []drillStat `json:"stats,omitempty"`
	Stopped string      `json:"stopped,omitempty"` // why fewer runs than asked
}

// failed counts the runs that missed a milestone.
func (r *drillReport) failed() int {
	n := 0
	for i := range r.Runs {
		if !r.Runs[i].complete() {
			n++
		}
	}
	return n
}

func drillCmd() *cobra.Command {
	var (
		admins, killCmd, report string
		o                       drillOptions
		kill, asJSON            bool
	)
	cmd := &cobra.Command{
		Use:   "drill",
		Short: "Run a failover drill against a live cluster and time it",
		Long: `drill finds the leader, causes a failover and times, from the fault:
  1. a new leader elected (another node's /v1/status says role=leader),
  2. the VIP answering NSM NULL over UDP (from the new holder),
  3. SM_STAT on the VIP returning the new sm_state,
  4. the new leader's SM_NOTIFY fan-out complete (notify.pending = 0).

The fault is a planned leadership transfer unless --kill (POST /v1/drill/crash
on the leader, which must run with drill_crash: true, as nsmd dev does) or
--kill-cmd (a shell command given NSMD_LEADER_ID and NSMD_LEADER_ADMIN).

--admin takes one or more admin addresses (comma separated). Nodes not given
are found from /v1/members by probing their NSM host with the given admin
ports, which finds every node of nsmd dev from one address; otherwise list
all admin addresses. Between runs the drill waits (up to --timeout) for the
cluster to be healthy and for a killed node to come back (nsmd dev restarts
it after --restart-after; systemd does with Restart=on-failure); if it does
not and another leader kill would leave no quorum, the drill stops early and
says so.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, a := range strings.Split(admins, ",") {
				if a = strings.TrimSpace(a); a != "" {
					o.Admins = append(o.Admins, a)
				}
			}
			switch {
			case kill:
				o.Fault = drillKill
			case killCmd != "":
				o.Fault, o.KillCmd = drillKillCmd, killCmd
			default:
				o.Fault = drillTransfer
			}
			o.Progress = cmd.ErrOrStderr()
			o.TTY = isTerminal(o.Progress)
			rep, err := runDrill(cmd.Context(), o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if err := printResult(out, asJSON, rep, func(w io.Writer) error { return printDrill(w, rep) }); err != nil {
				return err
			}
			if report != "" {
				if err := writeDrillReportFile(report, rep); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "report written to %s\n", report)
			}
			if n := rep.failed(); n > 0 {
				return fmt.Errorf("drill: %d of %d runs did not reach every milestone within %v", n, len(rep.Runs), o.Timeout)
			}
			return nil
		},
	}
	def := os.Getenv("NSMD_ADMIN")
	if def == "" {
		def = "127.0.0.1:8024"
	}
	f := cmd.Flags()
	f.StringVar(&admins, "admin", def, "admin API address(es) of the cluster's nodes, comma separated [env NSMD_ADMIN]")
	f.StringVar(&o.VIP, "vip", "", "NSM address on the VIP (host:port; default: status vip + the leader's NSM port)")
	f.BoolVar(&kill, "kill", false, "crash the leader (POST /v1/drill/crash; needs drill_crash: true) instead of a planned transfer")
	f.StringVar(&killCmd, "kill-cmd", "", "shell command that kills the leader (env NSMD_LEADER_ID, NSMD_LEADER_ADMIN)")
	f.IntVar(&o.Runs, "runs", 1, "number of failovers")
	f.DurationVar(&o.Timeout, "timeout", 30*time.Second, "per run: how long to wait for every milestone (and for health between runs)")
	f.DurationVar(&o.Poll, "poll", 20*time.Millisecond, "polling interval")
	f.StringVar(&report, "report", "", "write a self-contained HTML report to this file")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	o.Auth.flags(f)
	cmd.MarkFlagsMutuallyExclusive("kill", "kill-cmd")
	return cmd
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// drill is one drill in progress.
type drill struct {
	o      drillOptions
	hc     *http.Client
	nodes  []drillNode
	voters int
	vip    string
	// down are killed nodes that have not answered since.
	down map[string]bool
}

// runDrill runs o.Runs failovers and returns what it measured. An error
// means the drill could not run (no cluster, no leader, the fault refused);
// runs that missed a milestone are in the report.
func runDrill(ctx context.Context, o drillOptions) (*drillReport, error) {
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
		o.Fault = drillTransfer
	case drillTransfer, drillKill:
	case drillKillCmd:
		if o.KillCmd == "" {
			return nil, errors.New("drill: --kill-cmd is empty")
		}
	default:
		return nil, fmt.Errorf("drill: unknown fault %q", o.Fault)
	}
	tr, err := o.Auth.transport()
	if err != nil {
		return nil, fmt.Errorf("drill: %w", err)
	}
	defer tr.CloseIdleConnections()
	d := &drill{o: o, hc: &http.Client{Transport: tr}, down: map[string]bool{}}
	if err := d.discover(ctx); err != nil {
		return nil, err
	}
	rep := &drillReport{Date: time.Now().UTC(), Fault: o.Fault, Nodes: d.nodes, Asked: o.Runs, PollMS: float64(o.Poll.Microseconds()) / 1000}
	for i := 1; i <= o.Runs; i++ {
		leader, err := d.waitHealthy(ctx, i)
		var stop *drillStop
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
	rep.Stats = drillStats(rep.Runs)
	return rep, nil
}

// drillStop ends a drill early for a reason the operator should read.
type drillStop struct{ reason string }

func (s *drillStop) Error() string { return s.reason }

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
func (d *drill) call(ctx context.Context, method, admin, path string, timeout time.Duration, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, d.o.Auth.base(admin)+path, nil)
	if err == nil {
		err = d.o.Auth.authorize(req)
	}
	if err != nil {
		return fmt.Errorf("admin API %s: %w", admin, err)
	}
	resp, err := d.hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API %s: %w", admin, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("admin API %s: read %s: %w", admin, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return &drillHTTPError{fmt.Sprintf("%s %s on %s: %s", method, path, admin, e.Error)}
		}
		return &drillHTTPError{fmt.Sprintf("%s %s on %s: %s", method, path, admin, resp.Status)}
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("admin API %s: decode %s: %w", admin, path, err)
		}
	}
	return nil
}

// drillHTTPError is an answer the node gave (not a lost connection).
type drillHTTPError struct{ msg string }

func (e *drillHTTPError) Error() string { return e.msg }

// discover learns the nodes: the given admin addresses, then the members
// they report, whose admin API is probed at their NSM (or raft) host with
// each given admin port.
func (d *drill) discover(ctx context.Context) error {
	byID := map[string]*drillNode{}
	var order []string
	var ports []string
	var members []cluster.MemberStatus
	var errs []error
	for _, admin := range d.o.Admins {
		var s Status
		if err := d.call(ctx, "GET", admin, "/v1/status", 3*time.Second, &s); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, ok := byID[s.NodeID]; !ok {
			byID[s.NodeID] = &drillNode{ID: s.NodeID, Admin: hostPort(admin), NSMAddr: s.NSMAddr}
			order = append(order, s.NodeID)
		}
		if u := hostPort(admin); !strings.Contains(u, "/") {
			if _, p, err := net.SplitHostPort(u); err == nil && !slices.Contains(ports, p) {
				ports = append(ports, p)
			}
		}
		if members == nil {
			if err := d.call(ctx, "GET", admin, "/v1/members", 3*time.Second, &members); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(byID) == 0 {
		return fmt.Errorf("drill: no admin API answered: %w", errors.Join(errs...))
	}
	for _, m := range members {
		n, ok := byID[m.ID]
		if !ok {
			n = &drillNode{ID: m.ID, NSMAddr: m.NSMAddr}
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
func (d *drill) probeAdmin(ctx context.Context, m cluster.MemberStatus, ports []string) string {
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
			var s Status
			if d.call(ctx, "GET", addr, "/v1/status", time.Second, &s) == nil && s.NodeID == m.ID {
				return addr
			}
		}
	}
	return ""
}

type drillAnswer struct {
	node drillNode
	s    Status
	err  error
	at   time.Time
}

// statuses asks every node with a known admin API (except skip) for its
// status in parallel. With stop set it returns as soon as stop accepts an
// answer (the other requests are cancelled and waited for).
func (d *drill) statuses(ctx context.Context, skip string, stop func(Status) bool) []drillAnswer {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan drillAnswer, len(d.nodes))
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
			var s Status
			err := d.call(ctx, "GET", node.Admin, "/v1/status", drillStatusTimeout, &s)
			ch <- drillAnswer{node: node, s: s, err: err, at: time.Now()}
		}()
	}
	var out []drillAnswer
	for range n {
		a := <-ch
		out = append(out, a)
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
func (d *drill) waitHealthy(ctx context.Context, run int) (drillNode, error) {
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
			return drillNode{}, ctx.Err()
		case <-time.After(drillHealthPoll):
		}
	}
	if len(d.down) > 0 && run > 1 {
		var ids []string
		for id := range d.down {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return drillNode{}, &drillStop{fmt.Sprintf(
			"stopping after run %d: killed node %s did not come back within %v (nothing restarted it: nsmd dev does after --restart-after, a real node needs its supervisor), and killing another leader would leave %d of %d voters: no quorum",
			run-1, strings.Join(ids, ", "), d.o.Timeout, d.votersUp()-1, d.voters)}
	}
	return drillNode{}, fmt.Errorf("drill: cluster not healthy within %v: %s", d.o.Timeout, why)
}

// votersUp counts voters not known to be down.
func (d *drill) votersUp() int {
	n := 0
	for _, node := range d.nodes {
		if node.Voter && !d.down[node.ID] {
			n++
		}
	}
	return n
}

// healthy judges one round of status answers.
func (d *drill) healthy(answers []drillAnswer) (drillNode, bool, string) {
	var leaders []drillAnswer
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
		return drillNode{}, false, "no node reports role=leader"
	case len(leaders) > 1:
		return drillNode{}, false, fmt.Sprintf("%d nodes report role=leader", len(leaders))
	case len(ids) > 1:
		return drillNode{}, false, "nodes disagree on the leader"
	}
	l := leaders[0]
	if l.s.VIP != "" && !l.s.VIPHeld {
		return drillNode{}, false, fmt.Sprintf("leader %s does not hold the VIP yet", l.node.ID)
	}
	if len(d.down) > 0 && d.votersUp()-1 <= d.voters/2 {
		return drillNode{}, false, "waiting for a killed node to come back"
	}
	return l.node, true, ""
}

// findVIP settles the VIP's NSM address and checks that it answers.
func (d *drill) findVIP(ctx context.Context, leader drillNode) error {
	if d.o.VIP == "" {
		var s Status
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
	if _, err := vipStat(ctx, d.vip); err != nil {
		return fmt.Errorf("drill: the VIP %s does not answer SM_STAT before the drill (use --vip): %w", d.vip, err)
	}
	return nil
}

func vipDial(ctx context.Context, addr string) (*oncrpc.Client, error) {
	return oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "udp", Addr: addr, Timeout: drillRPCTimeout, Retransmit: drillRPCRetransmit})
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

type drillFaultResult struct {
	err        error
	definitive bool // the fault did not happen (refused), stop measuring
	note       string
}

// fault starts the fault against leader; its outcome arrives on the channel.
func (d *drill) fault(ctx context.Context, leader drillNode) <-chan drillFaultResult {
	ch := make(chan drillFaultResult, 1)
	go func() {
		switch d.o.Fault {
		case drillTransfer, drillKill:
			path := "/v1/leadership/transfer"
			if d.o.Fault == drillKill {
				path = "/v1/drill/crash"
			}
			var res map[string]string
			err := d.call(ctx, "POST", leader.Admin, path, d.o.Timeout, &res)
			var he *drillHTTPError
			switch {
			case errors.As(err, &he):
				ch <- drillFaultResult{err: err, definitive: true}
			case err != nil && d.o.Fault == drillKill:
				// The node may die before its answer gets out.
				ch <- drillFaultResult{note: "crash call got no answer (node died first?): " + err.Error()}
			case err != nil:
				ch <- drillFaultResult{err: err, note: err.Error()}
			default:
				ch <- drillFaultResult{}
			}
		case drillKillCmd:
			cctx, cancel := context.WithTimeout(ctx, d.o.Timeout)
			defer cancel()
			c := exec.CommandContext(cctx, "sh", "-c", d.o.KillCmd)
			c.Env = append(os.Environ(), "NSMD_LEADER_ID="+leader.ID, "NSMD_LEADER_ADMIN="+leader.Admin)
			out, err := c.CombinedOutput()
			if err != nil {
				ch <- drillFaultResult{err: fmt.Errorf("--kill-cmd: %w: %s", err, strings.TrimSpace(string(out))), definitive: true}
				return
			}
			ch <- drillFaultResult{note: strings.TrimSpace(string(out))}
		}
	}()
	return ch
}

// run causes one failover and times its milestones.
func (d *drill) run(ctx context.Context, n int, leader drillNode) (drillRun, error) {
	r := drillRun{Run: n, OldLeader: leader.ID}
	for _, m := range drillMilestoneDefs() {
		r.Milestones = append(r.Milestones, drillMilestone{Name: m.Name, Label: m.Label})
	}
	var s Status
	if err := d.call(ctx, "GET", leader.Admin, "/v1/status", 3*time.Second, &s); err != nil {
		return r, err
	}
	r.OldState = s.SMState

	t0 := time.Now()
	r.FaultAt = t0.UTC()
	faultCh := d.fault(ctx, leader)
	faultDone := false
	if d.o.Fault != drillTransfer {
		d.down[leader.ID] = true
	}
	reach := func(i int, at time.Time) {
		r.Milestones[i].Reached = true
		r.Milestones[i].After = at.Sub(t0)
		r.Milestones[i].AfterMS = float64(r.Milestones[i].After.Microseconds()) / 1000
		if !d.o.TTY {
			d.progressf("run %d: %-26s %8s  (%s)\n", n, r.Milestones[i].Label, fmtDur(r.Milestones[i].After), d.milestoneNote(&r, i))
		}
	}
	d.progressf("run %d/%d: %s on leader %s (sm_state %d)\n", n, d.o.Runs, faultLabel(d.o.Fault), leader.ID, r.OldState)

	deadline := t0.Add(d.o.Timeout)
	tick := time.NewTicker(d.o.Poll)
	defer tick.Stop()
	vipGone := false
	stage := msLeader
	for stage < msCount {
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
		case msLeader, msNotify:
			newState := r.NewState
			answers := d.statuses(ctx, leader.ID, func(s Status) bool {
				return s.Role == "leader" && (stage == msLeader || notifyDone(s, newState))
			})
			for _, a := range answers {
				if a.err != nil || a.s.Role != "leader" {
					continue
				}
				if stage == msLeader {
					r.NewLeader = a.s.NodeID
					reach(msLeader, a.at)
					stage = msVIP
				} else if notifyDone(a.s, newState) {
					r.NewLeader = a.s.NodeID
					reach(msNotify, a.at)
					stage = msCount
				}
				break
			}
		case msVIP:
			// The old leader may answer on the VIP until it lets go: credit
			// the VIP once it was seen down, or once it has the new state.
			pctx, pcancel := context.WithTimeout(ctx, drillRPCTimeout)
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
				reach(msVIP, atNull)
				r.NewState = state
				reach(msState, atStat)
				stage = msNotify
			} else if vipGone {
				reach(msVIP, atNull)
				stage = msState
			}
		case msState:
			pctx, pcancel := context.WithTimeout(ctx, drillRPCTimeout)
			state, err := vipStat(pctx, d.vip)
			at := time.Now()
			pcancel()
			if err == nil && state > r.OldState {
				r.NewState = state
				reach(msState, at)
				stage = msNotify
			}
		}
		if stage == msCount {
			break
		}
		if d.o.TTY {
			d.progressf("\r\033[Krun %d/%d: %s  %s", n, d.o.Runs, fmtDur(time.Since(t0)), d.ttyLine(&r, stage))
		}
		if time.Now().After(deadline) {
			r.Err = fmt.Sprintf("%s not reached within %v", drillMilestoneDefs()[stage].Label, d.o.Timeout)
			break
		}
		if stage != before {
			continue // look for the next milestone at once, not a tick later
		}
		select {
		case <-ctx.Done():
			r.Err = ctx.Err().Error()
			stage = msCount
		case <-tick.C:
		}
		if r.Err != "" {
			break
		}
	}
	if d.o.TTY {
		d.progressf("\r\033[Krun %d/%d: %s\n", n, d.o.Runs, d.ttyLine(&r, stage))
	}
	if r.Err != "" {
		d.progressf("run %d: %s\n", n, r.Err)
	}
	if !faultDone { // bounded by the timeout
		if fr := <-faultCh; fr.note != "" || fr.err != nil {
			r.FaultNote = fr.note
		}
	}
	return r, nil
}

// notifyDone: the leader's fan-out for the new state has settled every
// host it started with.
func notifyDone(s Status, newState int32) bool {
	return s.Role == "leader" && s.Notify.State >= newState && s.Notify.Pending == 0 &&
		s.Notify.Done+s.Notify.Failed == s.Notify.Targets
}

func (d *drill) milestoneNote(r *drillRun, i int) string {
	switch i {
	case msLeader:
		return "leader " + r.NewLeader
	case msVIP:
		return "on " + d.vip
	case msState:
		return fmt.Sprintf("sm_state %d -> %d", r.OldState, r.NewState)
	}
	return "notify.pending 0 on " + r.NewLeader
}

func (d *drill) ttyLine(r *drillRun, stage int) string {
	var parts []string
	for i, m := range r.Milestones {
		switch {
		case m.Reached:
			parts = append(parts, fmt.Sprintf("%s %s", m.Name, fmtDur(m.After)))
		case i == stage:
			parts = append(parts, "waiting for "+m.Name+"…")
		}
	}
	return strings.Join(parts, " | ")
}

func (d *drill) progressf(format string, a ...any) {
	if d.o.Progress != nil {
		fmt.Fprintf(d.o.Progress, format, a...)
	}
}

func faultLabel(f string) string {
	switch f {
	case drillKill:
		return "crash (POST /v1/drill/crash)"
	case drillKillCmd:
		return "kill command"
	}
	return "planned leadership transfer"
}

// fmtDur prints a duration at millisecond resolution (µs below 10 ms).
func fmtDur(d time.Duration) string {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// drillStats is min/p50/p90/max (nearest rank) per milestone over the runs
// that reached it.
func drillStats(runs []drillRun) []drillStat {
	var out []drillStat
	for i, def := range drillMilestoneDefs() {
		var v []float64
		for _, r := range runs {
			if i < len(r.Milestones) && r.Milestones[i].Reached {
				v = append(v, r.Milestones[i].AfterMS)
			}
		}
		st := drillStat{Name: def.Name, Label: def.Label, N: len(v)}
		if len(v) > 0 {
			slices.Sort(v)
			st.MinMS, st.P50MS, st.P90MS, st.MaxMS = v[0], percentile(v, 0.5), percentile(v, 0.9), v[len(v)-1]
		}
		out = append(out, st)
	}
	return out
}

func percentile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func fmtMS(ms float64) string {
	return fmtDur(time.Duration(ms * float64(time.Millisecond)))
}

// printDrill writes the summary: cluster, each run, the milestone table
// and, for several runs, the distribution.
func printDrill(w io.Writer, rep *drillReport) error {
	var ids []string
	for _, n := range rep.Nodes {
		ids = append(ids, n.ID)
	}
	fmt.Fprintf(w, "\ndrill: %s, %d of %d runs, VIP %s, nodes %s, polling every %s\n", faultLabel(rep.Fault), len(rep.Runs), rep.Asked, rep.VIP, strings.Join(ids, " "), fmtMS(rep.PollMS))
	for _, r := range rep.Runs {
		fmt.Fprintf(w, "run %d at %s: leader %s -> %s, sm_state %d -> %d", r.Run, r.FaultAt.Local().Format("15:04:05"), r.OldLeader, dash(r.NewLeader), r.OldState, r.NewState)
		if r.Err != "" {
			fmt.Fprintf(w, "  FAILED: %s", r.Err)
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
		for i, def := range drillMilestoneDefs() {
			fmt.Fprintf(tw, "%s\t", def.Label)
			for _, r := range rep.Runs {
				if m := r.Milestones[i]; m.Reached {
					fmt.Fprintf(tw, "%s\t", fmtDur(m.After))
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
	if len(rep.Runs) > 1 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MILESTONE\tRUNS\tMIN\tP50\tP90\tMAX\t")
		for _, st := range rep.Stats {
			if st.N == 0 {
				fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t\n", st.Label)
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", st.Label, st.N, fmtMS(st.MinMS), fmtMS(st.P50MS), fmtMS(st.P90MS), fmtMS(st.MaxMS))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if rep.Stopped != "" {
		fmt.Fprintf(w, "\nstopped early: %s\n", rep.Stopped)
	}
	return nil
}
