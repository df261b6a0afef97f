package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nlm"
)

// Status is the body of GET /v1/status (DESIGN.md, outside contract).
type Status struct {
	NodeID string `json:"node_id"`
	// ClusterID is the cluster this node belongs to (gossip members with
	// another one are refused); Version is this node's build.
	ClusterID string    `json:"cluster_id"`
	Version   BuildInfo `json:"version"`
	Role      string    `json:"role"`
	// RaftState is raft's own view (leader, follower, candidate): a
	// witness that briefly leads has role "witness" and raft_state "leader".
	RaftState string `json:"raft_state"`
	Witness   bool   `json:"witness,omitempty"`
	// WitnessHandoffs counts the times this witness won an election and
	// passed leadership to a serving node.
	WitnessHandoffs uint64         `json:"witness_handoffs,omitempty"`
	LeaderID        string         `json:"leader_id"`
	Term            uint64         `json:"term"`
	SMState         int32          `json:"sm_state"`
	Registrations   int            `json:"registrations"`
	VIP             string         `json:"vip"`
	VIPHeld         bool           `json:"vip_held"`
	NSMAddr         string         `json:"nsm_addr"`
	GraceUntil      *time.Time     `json:"grace_until"`
	AppliedIndex    uint64         `json:"applied_index"`
	Notify          NotifyProgress `json:"notify"`
	// Takeover is this node's last takeover, step by step (absent on a
	// node that never took over). on_leader_done − vip is the hook's time.
	Takeover *cluster.Timeline `json:"takeover,omitempty"`
	// TLS says raft and the admin API use mutual TLS; Insecure lists what
	// runs unprotected beyond loopback because insecure is set.
	TLS bool `json:"tls"`
	// Disk: whether the data directory takes writes (a node that cannot
	// write stays out of elections).
	Disk cluster.DiskStatus `json:"disk"`
	// Ready: this node knows the current incarnation's sm_state and
	// answers NSM (cluster.Node.Ready).
	Ready    bool     `json:"ready"`
	Insecure []string `json:"insecure,omitempty"`
	// LastHookFailure is the most recent failed hook script, if any.
	LastHookFailure *HookFailure `json:"last_hook_failure,omitempty"`
	// NFSv4 is the NFSv4 client-tracking table and pipe.
	NFSv4 NFSv4Status `json:"nfsv4"`
	// Grace is the kernel grace periods of this node's last takeover:
	// how many clients could reclaim, how many came back, when and why
	// each grace ended (absent on a node that never took over).
	Grace *nlm.GraceStatus `json:"grace,omitempty"`
}

// NotifyProgress is the SM_NOTIFY fan-out progress of the current leader term.
type NotifyProgress struct {
	Pending int   `json:"pending"`
	Done    int   `json:"done"`
	Failed  int   `json:"failed"`
	Targets int   `json:"targets"` // hosts the fan-out started with
	State   int32 `json:"state"`   // sm_state it sends
}

// RegistrationJSON is one row of GET /v1/registrations.
type RegistrationJSON struct {
	MonName  string    `json:"mon_name"`
	MyName   string    `json:"my_name"`
	MyProg   uint32    `json:"my_prog"`
	MyVers   uint32    `json:"my_vers"`
	MyProc   uint32    `json:"my_proc"`
	Priv     string    `json:"priv"`
	Node     string    `json:"node"`
	Callback string    `json:"callback"`
	Addrs    []string  `json:"addrs,omitempty"`
	Added    time.Time `json:"added"`
}

// RegistrationPage is the body of GET /v1/registrations.
type RegistrationPage struct {
	Registrations []RegistrationJSON `json:"registrations"`
	// Next, when set, is the `after` value for the next page.
	Next string `json:"next,omitempty"`
}

func (a *agent) status() Status {
	r := a.node.Raft()
	f := a.node.FSM()
	term, _ := strconv.ParseUint(r.Stats()["term"], 10, 64)
	_, leaderID := r.LeaderWithID()
	s := Status{
		NodeID:        a.cfg.NodeID,
		ClusterID:     a.cfg.ClusterID,
		Version:       readBuildInfo(),
		Role:          roleName(r.State()),
		RaftState:     roleName(r.State()),
		Witness:       a.cfg.Witness,
		LeaderID:      string(leaderID),
		Term:          term,
		SMState:       f.State(),
		Registrations: f.Len(),
		VIP:           a.cfg.VIP,
		VIPHeld:       a.VIPHeld(),
		NSMAddr:       a.NSMAddr().String(),
		AppliedIndex:  f.AppliedIndex(),
		TLS:           a.sec.tls != nil,
		Ready:         a.node.Ready(),
		Disk:          a.node.Disk(),
		Insecure:      a.sec.exposures,
	}
	if g := f.GraceUntil(); !g.IsZero() {
		g = g.UTC()
		s.GraceUntil = &g
	}
	s.Notify.Pending, s.Notify.Done, s.Notify.Failed = a.node.NotifyProgress()
	s.Notify.State, s.Notify.Targets = a.node.NotifyRun()
	s.LastHookFailure = a.hooks.lastFailure()
	s.NFSv4 = a.v4.status()
	s.Grace = a.v4.graceStatus()
	if tl := a.node.LastTimeline(); !tl.Elected.IsZero() {
		s.Takeover = &tl
	}
	if a.cfg.Witness {
		s.Role = "witness"
		s.WitnessHandoffs = a.node.Handoffs()
	}
	return s
}

func roleName(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Candidate:
		return "candidate"
	case raft.Follower:
		return "follower"
	}
	return "shutdown"
}

func (a *agent) startAdmin() error {
	ln, err := net.Listen("tcp", a.cfg.AdminAddr)
	if err != nil {
		return fmt.Errorf("admin API on %s: %w", a.cfg.AdminAddr, err)
	}
	a.adminLn = ln
	ln = a.adminListener(ln)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, a.status()) })
	mux.HandleFunc("GET /v1/members", a.handleMembers)
	// Registrations carry the lock managers' private cookies.
	mux.HandleFunc("GET /v1/registrations", a.privileged(a.handleRegistrations))
	mux.HandleFunc("GET /v1/nfsv4/clients", a.privileged(func(w http.ResponseWriter, r *http.Request) { writeJSON(w, a.v4.clients()) }))
	mux.HandleFunc("POST /v1/leadership/transfer", a.privileged(a.handleTransfer))
	mux.HandleFunc("POST /v1/drill/crash", a.privileged(a.handleCrash))
	mux.HandleFunc("POST /v1/import", a.privileged(a.handleImport))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", a.handleReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	a.registerStatusPage(mux)
	a.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: a.adminErrorLog()}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("admin API stopped", "err", err)
		}
	}()
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func httpError(w http.ResponseWriter, code int, format string, a ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": fmt.Sprintf(format, a...)})
}

func (a *agent) handleMembers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, a.node.Members())
}

// handleRegistrations pages through registrations in key order:
// ?limit=N (default 100, max 10000) &mon_name=NAME &after=<next token>.
func (a *agent) handleRegistrations(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 10000 {
			httpError(w, http.StatusBadRequest, "limit must be 1..10000")
			return
		}
		limit = n
	}
	var after fsm.MonID
	if s := q.Get("after"); s != "" {
		if err := json.Unmarshal([]byte(s), &after); err != nil {
			httpError(w, http.StatusBadRequest, "bad after token: %v", err)
			return
		}
	}
	regs := a.node.FSM().Registrations(after, limit+1, q.Get("mon_name"))
	page := RegistrationPage{Registrations: []RegistrationJSON{}}
	if len(regs) > limit {
		regs = regs[:limit]
		tok, _ := json.Marshal(regs[limit-1].ID)
		page.Next = string(tok)
	}
	for _, g := range regs {
		rj := RegistrationJSON{
			MonName: g.ID.MonName, MyName: g.ID.My.MyName, MyProg: g.ID.My.Prog, MyVers: g.ID.My.Vers, MyProc: g.ID.My.Proc,
			Priv: hex.EncodeToString(g.Priv[:]), Node: g.Node, Callback: g.Callback.String(), Added: g.Added.UTC(),
		}
		for _, ad := range g.Addrs {
			rj.Addrs = append(rj.Addrs, ad.String())
		}
		page.Registrations = append(page.Registrations, rj)
	}
	writeJSON(w, page)
}

func (a *agent) handleTransfer(w http.ResponseWriter, r *http.Request) {
	rf := a.node.Raft()
	if rf.State() != raft.Leader {
		_, leader := rf.LeaderWithID()
		httpError(w, http.StatusConflict, "this node is not the leader (leader: %q)", leader)
		return
	}
	to := r.URL.Query().Get("to")
	if err := a.node.TransferLeadership(to); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, cluster.ErrWitnessTarget) || errors.Is(err, cluster.ErrUnknownTarget) {
			code = http.StatusBadRequest
		}
		httpError(w, code, "leadership transfer: %v", err)
		return
	}
	// The transfer returns once the target started its election; wait
	// (bounded) until this node has heard of the new leader.
	var leader raft.ServerID
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, leader = rf.LeaderWithID(); leader != "" && string(leader) != a.cfg.NodeID {
			break
		}
	}
	writeJSON(w, map[string]string{"result": "transferred", "leader_id": string(leader)})
}

// handleReady is 200 once a leader is known and this node has applied
// everything committed at the time of the check.
func (a *agent) handleReady(w http.ResponseWriter, r *http.Request) {
	rf := a.node.Raft()
	if _, id := rf.LeaderWithID(); id == "" {
		httpError(w, http.StatusServiceUnavailable, "no leader known")
		return
	}
	commit := rf.CommitIndex()
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	for a.node.FSM().AppliedIndex() < commit || !a.node.Ready() {
		select {
		case <-ctx.Done():
			if !a.node.Ready() {
				httpError(w, http.StatusServiceUnavailable, "current sm_state not known yet (this term's takeover not applied here); NSM calls get no answer")
				return
			}
			httpError(w, http.StatusServiceUnavailable, "applied %d < commit %d", a.node.FSM().AppliedIndex(), commit)
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	fmt.Fprintln(w, "ready")
}

// handleCrash kills this node as SIGKILL would, for failover drills; only
// with drill_crash enabled. The answer goes out first.
func (a *agent) handleCrash(w http.ResponseWriter, r *http.Request) {
	if !a.cfg.DrillCrash {
		httpError(w, http.StatusForbidden, "crash drills are disabled on this node (drill_crash: false)")
		return
	}
	writeJSON(w, map[string]string{"result": "crashing", "node_id": a.cfg.NodeID})
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	a.log.Warn("crash drill: killing this node now")
	go a.crash()
}
