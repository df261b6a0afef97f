// Package admin is nsmd's admin HTTP API, the one definition of it that
// every caller shares: the request and response types of /v1/* (the JSON
// of DESIGN.md's outside contract), the handlers that serve them, who may
// use the privileged ones (Guard), and a client (Auth, Client) for the
// CLI, the drill, the benches and the tests.
//
// The handlers read and act on a node through Store, a small interface
// declared here; the node (package agent) implements it, and this
// package's tests satisfy it with a fake. Nothing here knows raft or the
// cluster package.
//
//	mux := admin.NewHandler(store, admin.HandlerConfig{NodeID: "n1", Guard: g, Metrics: reg})
//	srv := &http.Server{Handler: mux}
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nsmd/nsmd/fsm"
)

// Store is what the admin API needs of a node.
type Store interface {
	// Status is this node's view (GET /v1/status).
	Status() Status
	// Members are the cluster's members as this node sees them.
	Members() []Member
	// Registrations lists at most limit registrations in key order,
	// starting after the given one (the zero MonID: from the first); only
	// those of monName when it is set.
	Registrations(after fsm.MonID, limit int, monName string) []fsm.Registration
	// ServiceRegistrations is Registrations of one service's own
	// registrations (with services:); an error wrapping ErrUnknownService
	// when the cluster knows no such service.
	ServiceRegistrations(service string, after fsm.MonID, limit int, monName string) ([]fsm.Registration, error)
	// NFSv4Clients is the NFSv4 client-tracking table.
	NFSv4Clients() V4ClientPage
	// LastTakeover is the cluster's last committed takeover (zero: none).
	LastTakeover() fsm.Takeover
	// TransferLeadership hands leadership to node to ("": any serving
	// voter) and returns the new leader once this node knows it. Errors:
	// ErrNotLeader, one marked with BadRequest (a target that cannot
	// lead), or any other.
	TransferLeadership(to string) (leader string, err error)
	// Import commits regs and raises sm_state above state; it returns the
	// new sm_state.
	Import(ctx context.Context, regs []fsm.Registration, state int32) (int32, error)
	// Ready returns nil once a leader is known, this node knows the
	// current incarnation's sm_state and has applied everything committed
	// when asked; otherwise, when ctx ends, why not.
	Ready(ctx context.Context) error
	// Crash ends the node abruptly, as SIGKILL would (crash drills).
	Crash()
	// Services is every NFS service of the cluster as this node sees it
	// (GET /v1/services); none without a services: configuration.
	Services() ([]ServiceStatus, error)
	// MoveService moves service to node to (POST /v1/services/move): the
	// planned move of one service. It returns once the move is recorded.
	// Errors: ErrNotLeader, ErrNoServices, ErrUnknownService, one marked
	// with BadRequest (a target that may not serve it), or any other.
	MoveService(ctx context.Context, service, to string) error
}

// ErrNotLeader is the answer of an endpoint that only the leader serves
// (409 Conflict). Wrap it with the leader's name.
var ErrNotLeader = errors.New("this node is not the leader")

// ErrBadRequest marks an error caused by the request (400). Use
// BadRequest to mark one without changing its text.
var ErrBadRequest = errors.New("bad request")

// BadRequest marks err as the request's fault: errors.Is(err,
// ErrBadRequest) holds, and its text stays err's.
func BadRequest(err error) error { return badRequest{err} }

type badRequest struct{ error }

func (b badRequest) Unwrap() []error { return []error{b.error, ErrBadRequest} }

// HandlerConfig is what the handlers need besides the Store.
type HandlerConfig struct {
	// NodeID owns imported registrations that name no node.
	NodeID string
	// DrillCrash lets POST /v1/drill/crash kill the node.
	DrillCrash bool
	// Guard decides who may use the privileged endpoints.
	Guard *Guard
	// Metrics is served on GET /metrics.
	Metrics prometheus.Gatherer
	Logger  *slog.Logger
}

// overviewRows caps the registrations the status page lists; the rest are
// counted.
const overviewRows = 50

// NewHandler serves the admin API of s:
//
//	GET  /v1/status, /v1/members, /v1/services, /v1/overview, /healthz,
//	     /readyz, /metrics
//	     (/v1/status, /v1/services and /v1/overview show client names
//	     and a failed hook's output to privileged callers only:
//	     Status.ForReader, ServicesForReader)
//	GET  /v1/registrations, /v1/nfsv4/clients          (privileged)
//	POST /v1/leadership/transfer, /v1/services/move, /v1/fence/confirm,
//	     /v1/drill/crash, /v1/import (privileged)
//
// The caller may add more routes (the status page) to the mux.
func NewHandler(s Store, c HandlerConfig) *http.ServeMux {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	h := &handler{s: s, c: c}
	p := c.Guard.Privileged
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		// Client names and a hook's output are for operators only
		// (Status.ForReader); counts are for everyone.
		writeJSON(w, s.Status().ForReader(c.Guard.Authorized(r)))
	})
	mux.HandleFunc("GET /v1/members", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.Members()) })
	// Registrations carry the lock managers' private cookies.
	mux.HandleFunc("GET /v1/registrations", p(h.registrations))
	mux.HandleFunc("GET /v1/nfsv4/clients", p(func(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.NFSv4Clients()) }))
	mux.HandleFunc("POST /v1/leadership/transfer", p(h.transfer))
	// Services name no client: every reader sees them.
	mux.HandleFunc("GET /v1/services", h.services)
	mux.HandleFunc("POST /v1/services/move", p(h.moveService))
	mux.HandleFunc("POST /v1/fence/confirm", p(h.confirmFence))
	mux.HandleFunc("POST /v1/drill/crash", p(h.crash))
	mux.HandleFunc("POST /v1/import", p(h.importRegs))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", h.ready)
	mux.HandleFunc("GET /v1/overview", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, h.overview(c.Guard.Authorized(r)))
	})
	if c.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(c.Metrics, promhttp.HandlerOpts{}))
	}
	return mux
}

type handler struct {
	s Store
	c HandlerConfig
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
	json.NewEncoder(w).Encode(ErrorBody{Error: fmt.Sprintf(format, a...)})
}

// registrations pages through registrations in key order:
// ?limit=N (default 100, max 10000) &mon_name=NAME &after=<next token>.
func (h *handler) registrations(w http.ResponseWriter, r *http.Request) {
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
	var regs []fsm.Registration
	if svc := q.Get("service"); svc != "" {
		var err error
		if regs, err = h.s.ServiceRegistrations(svc, after, limit+1, q.Get("mon_name")); err != nil {
			httpError(w, http.StatusNotFound, "registrations of service %q: %v", svc, err)
			return
		}
	} else {
		regs = h.s.Registrations(after, limit+1, q.Get("mon_name"))
	}
	page := RegistrationPage{Registrations: []RegistrationJSON{}}
	if len(regs) > limit {
		regs = regs[:limit]
		tok, _ := json.Marshal(regs[limit-1].ID)
		page.Next = string(tok)
	}
	for _, g := range regs {
		page.Registrations = append(page.Registrations, registrationRow(g))
	}
	writeJSON(w, page)
}

func (h *handler) transfer(w http.ResponseWriter, r *http.Request) {
	leader, err := h.s.TransferLeadership(r.URL.Query().Get("to"))
	switch {
	case errors.Is(err, ErrNotLeader):
		httpError(w, http.StatusConflict, "%v", err)
		return
	case errors.Is(err, ErrBadRequest):
		httpError(w, http.StatusBadRequest, "leadership transfer: %v", err)
		return
	case err != nil:
		httpError(w, http.StatusInternalServerError, "leadership transfer: %v", err)
		return
	}
	writeJSON(w, TransferResult{Result: "transferred", LeaderID: leader})
}

// ready is 200 once a leader is known and this node has applied
// everything committed at the time of the check.
func (h *handler) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := h.s.Ready(ctx); err != nil {
		httpError(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	fmt.Fprintln(w, "ready")
}

// crash kills this node as SIGKILL would, for failover drills; only with
// drill_crash enabled. The answer goes out first.
func (h *handler) crash(w http.ResponseWriter, r *http.Request) {
	if !h.c.DrillCrash {
		httpError(w, http.StatusForbidden, "crash drills are disabled on this node (drill_crash: false)")
		return
	}
	writeJSON(w, CrashResult{Result: "crashing", NodeID: h.c.NodeID})
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	h.c.Logger.Warn("crash drill: killing this node now")
	go h.s.Crash()
}

func (h *handler) importRegs(w http.ResponseWriter, r *http.Request) {
	var req ImportRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 256<<20)).Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, "bad import body: %v", err)
		return
	}
	if req.State < 0 || req.State > fsm.MaxImportedState {
		httpError(w, http.StatusBadRequest, "state %d is outside 0…%d: not a state an NSM server had (a statd adds 2 per reboot from 1)", req.State, fsm.MaxImportedState)
		return
	}
	owner := req.Node
	if owner == "" {
		owner = h.c.NodeID
	}
	now := time.Now().UTC()
	regs := make([]fsm.Registration, 0, len(req.Registrations))
	for i, rj := range req.Registrations {
		reg, err := rj.Registration(owner, now)
		if err != nil {
			httpError(w, http.StatusBadRequest, "registration %d: %v", i, err)
			return
		}
		regs = append(regs, reg)
	}
	state, err := h.s.Import(r.Context(), regs, req.State)
	if err != nil {
		httpError(w, http.StatusServiceUnavailable, "import: %v", err)
		return
	}
	writeJSON(w, ImportResult{Imported: len(regs), SMState: state})
}

// overview is what the status page shows. The page and the overview are
// reads like /v1/status (under TLS they need only the CA's trust); the
// registration rows follow /v1/registrations: an unauthorized reader gets
// the count alone.
func (h *handler) overview(privileged bool) Overview {
	o := Overview{
		Status:  h.s.Status().ForReader(privileged),
		Members: h.s.Members(),
		Now:     time.Now().UTC(),
	}
	if svcs, err := h.s.Services(); err == nil && len(svcs) > 0 {
		o.Services = ServicesForReader(svcs, privileged)
	}
	if t := h.s.LastTakeover(); !t.At.IsZero() {
		o.LastTakeover = &TakeoverJSON{Node: t.Node, Reason: t.Reason, At: t.At.UTC(), GraceUntil: t.GraceUntil.UTC()}
	}
	o.Registrations = OverviewRegs{Total: o.Status.Registrations, Rows: []OverviewReg{}}
	if !privileged {
		o.Registrations.Hidden = NamesHidden
		o.Registrations.More = o.Registrations.Total
		return o
	}
	for _, g := range h.s.Registrations(fsm.MonID{}, overviewRows, "") {
		o.Registrations.Rows = append(o.Registrations.Rows, OverviewReg{
			MonName: g.ID.MonName, MyName: g.ID.My.MyName, Node: g.Node, Added: g.Added.UTC(),
		})
	}
	// The count and the listing are two reads: a registration may come or
	// go between them.
	o.Registrations.More = max(0, o.Registrations.Total-len(o.Registrations.Rows))
	return o
}
