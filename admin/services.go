package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// A service's state (ServiceStatus.State).
const (
	// ServiceServing: placed on its owner, which serves it: what the
	// owner answers while its run of the service serves (Run).
	ServiceServing = "serving"
	// ServicePlaced: placed on its owner. The owner answers it while its
	// run has not served yet (Run says how far it is); every other node
	// answers it whatever the owner does (only the owner knows).
	ServicePlaced = "placed"
	// ServiceMoving: placed on a new owner that does not serve it yet (it
	// waits for the old one to stop, or runs its hook).
	ServiceMoving = "moving"
	// ServiceUnplaced: no server may take it now (none healthy, or none
	// that every rule allows).
	ServiceUnplaced = "unplaced"
	// ServiceConflict: the servers' specs of the service differ
	// (Conflict says how); it is not moved while they do.
	ServiceConflict = "conflict"
)

// ServiceStates lists every ServiceStatus.State.
func ServiceStates() []string {
	return []string{ServiceServing, ServicePlaced, ServiceMoving, ServiceUnplaced, ServiceConflict}
}

// ServiceStatus is one NFS service as the cluster sees it: an element of
// GET /v1/services and of the status page's overview. Every reader gets
// all of it but a failed hook's output and the names of the clients a
// service's grace waits for (ServicesForReader).
type ServiceStatus struct {
	ID string `json:"id"`
	// Address is the floating address with its prefix length (10.0.0.50/24).
	Address string `json:"address"`
	// Owner is the node the service is placed on ("": none).
	Owner string `json:"owner"`
	// Epoch numbers the service's placements: it rises at every move.
	Epoch uint64 `json:"epoch"`
	State string `json:"state"` // ServiceServing, ServicePlaced, ServiceMoving, ServiceUnplaced, ServiceConflict
	// Fingerprint is the digest of the service's spec as this node's
	// configuration has it ("": this node's configuration lacks it).
	Fingerprint string `json:"fingerprint"`
	// DeclaredBy is each member's fingerprint of the service (node id →
	// fingerprint; "" for a member whose configuration lacks it), so a
	// difference shows.
	DeclaredBy map[string]string `json:"declared_by"`
	// Conflict says, in a sentence, how the members' specs differ ("":
	// they agree).
	Conflict string       `json:"conflict"`
	LastMove *ServiceMove `json:"last_move,omitempty"`
	// Run is the answering node's run of the service: present on the
	// node that proves its previous server stopped, starts, serves or
	// stops it, absent elsewhere.
	Run *ServiceRun `json:"run,omitempty"`
	// Local is what the answering node holds of the service (its
	// address, its hooks' last results): present on a server that has
	// started or stopped it since nsmd started (every server stops each
	// service it declares once at start).
	Local *ServiceLocal `json:"local,omitempty"`
}

// The phases of a run (ServiceRun.Phase).
const (
	// RunProving: the server that held the service before is not proven
	// stopped yet; nothing of it is started here.
	RunProving = "proving"
	// RunStarting: its address is taken and its start hook runs.
	RunStarting = "starting"
	// RunServing: it is served here, under a lease from the leader.
	RunServing = "serving"
	// RunStopping: its stop hook runs; its address goes after it.
	RunStopping = "stopping"
)

// ServiceRun is a node's run of a service: from the placement that names
// the node until the service's stop there succeeded.
type ServiceRun struct {
	// Node is the node that runs it (the node that answered).
	Node  string `json:"node"`
	Phase string `json:"phase"` // RunProving, RunStarting, RunServing, RunStopping
	// Epoch is the placement's epoch the run serves.
	Epoch uint64 `json:"epoch"`
	// LeaseSeconds is how long the run's lease from the leader holds
	// still (0: lapsed, or none yet).
	LeaseSeconds float64 `json:"lease_seconds"`
	// Proof is how the server that held the service before was proven
	// stopped (nil: there was none to prove, or it is not proven yet).
	Proof *ServiceProof `json:"proof,omitempty"`
}

// ServiceProof says how a service's previous server was proven stopped
// before a new one started it.
type ServiceProof struct {
	Node string `json:"node"`
	// By is clean (it answered that it stopped), confirmed (an
	// operator's nsmd fence confirm), agent (the fence agent reported it
	// off) or watchdog (its watchdog must have reset it by now).
	By      string  `json:"by"`
	Seconds float64 `json:"seconds"` // how long the wait took
	Detail  string  `json:"detail,omitempty"`
}

// ServiceLocal is what one server holds of a service.
type ServiceLocal struct {
	// Node is the server (the node that answered).
	Node string `json:"node"`
	// Phase is stopped, starting, serving, stopping or failed (a start
	// or stop did not complete: it may be partly up until a stop
	// succeeds).
	Phase string `json:"phase"`
	// Epoch is the epoch of its last start or stop here (0: the stop at
	// nsmd's start).
	Epoch uint64 `json:"epoch"`
	// AddressHeld: the service's floating address is on this server.
	AddressHeld bool `json:"address_held"`
	// Namespace is the service's network namespace on this server while
	// it has one (service_namespaces; "": none now).
	Namespace string       `json:"namespace,omitempty"`
	LastHook  *ServiceHook `json:"last_hook,omitempty"`
	// LastFailure is the service's last hook run here that failed
	// (on_fault included); its output only to an operator
	// (ServicesForReader).
	LastFailure *HookFailure `json:"last_failure,omitempty"`
	// NFSv4 is the service's NFSv4 client tracking on this server, from
	// just before its start hook until its stop hook ran (only with
	// service namespaces: the service's own nfsd).
	NFSv4 *ServiceNFSv4 `json:"nfsv4,omitempty"`
	// Grace is the grace periods of the service's own lockd and nfsd
	// since its last start here, while NFSv4 is present: the names of
	// the clients it waits for only to an operator (ServicesForReader).
	Grace *Grace `json:"grace,omitempty"`
}

// ServiceNFSv4 is a service's NFSv4 client tracking on the server that
// serves it: the cld pipe of the service's namespace and the service's
// own records (not the node's: Status.NFSv4).
type ServiceNFSv4 = NFSv4Tracking

// ServiceHook is a service's last start or stop hook run on a server.
type ServiceHook struct {
	Hook   string    `json:"hook"`   // on_leader, on_follower
	Reason string    `json:"reason"` // start, stop, start-of-process
	Epoch  uint64    `json:"epoch"`
	Err    string    `json:"error"` // "": it succeeded
	At     time.Time `json:"at"`
}

// ServicesForReader is list as a reader may see it: a hook's output (in
// Local.LastFailure) and the names of the clients a service's grace
// waits for (Local.Grace) only to an operator (privileged), as in
// Status.ForReader; the rest to everyone. list is not changed.
func ServicesForReader(list []ServiceStatus, privileged bool) []ServiceStatus {
	if privileged {
		return list
	}
	out := make([]ServiceStatus, len(list))
	for i, s := range list {
		if l := s.Local; l != nil {
			local := *l
			local.LastFailure = l.LastFailure.withoutOutput()
			local.Grace = l.Grace.withoutNames()
			s.Local = &local
		}
		out[i] = s
	}
	return out
}

// ServiceMove is a service's last move.
type ServiceMove struct {
	From   string    `json:"from"` // "": it was not placed before
	To     string    `json:"to"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	Epoch  uint64    `json:"epoch"` // the placement's epoch it began
}

// ServiceMoveResult is the answer of POST /v1/services/move.
type ServiceMoveResult struct {
	Result  string `json:"result"` // "moved"
	Service string `json:"service"`
	To      string `json:"to"`
}

// ErrNoServices is the answer of a services endpoint on a node whose
// configuration has no services: list (400 for a move).
var ErrNoServices = errors.New("services are not configured")

// ErrUnknownService marks a move of a service the configuration does not
// name (400).
var ErrUnknownService = errors.New("no such service")

// services serves GET /v1/services: every service, in the Store's order
// (an empty list without services).
func (h *handler) services(w http.ResponseWriter, r *http.Request) {
	list, err := h.s.Services()
	if err != nil {
		httpError(w, http.StatusServiceUnavailable, "services: %v", err)
		return
	}
	if list == nil {
		list = []ServiceStatus{}
	}
	writeJSON(w, ServicesForReader(list, h.c.Guard.Authorized(r)))
}

// moveService serves POST /v1/services/move?service=S&to=N (privileged).
func (h *handler) moveService(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	svc, to := strings.TrimSpace(q.Get("service")), strings.TrimSpace(q.Get("to"))
	if svc == "" || to == "" {
		httpError(w, http.StatusBadRequest, "move: both service and to are required (?service=S&to=NODE)")
		return
	}
	err := h.s.MoveService(r.Context(), svc, to)
	switch {
	case errors.Is(err, ErrNotLeader):
		httpError(w, http.StatusConflict, "move %s: %v", svc, err)
		return
	case errors.Is(err, ErrBadRequest), errors.Is(err, ErrNoServices), errors.Is(err, ErrUnknownService):
		httpError(w, http.StatusBadRequest, "move %s: %v", svc, err)
		return
	case err != nil:
		httpError(w, http.StatusInternalServerError, "move %s: %v", svc, err)
		return
	}
	writeJSON(w, ServiceMoveResult{Result: "moved", Service: svc, To: to})
}

// Services is GET /v1/services.
func (c *Client) Services(ctx context.Context) ([]ServiceStatus, error) {
	var list []ServiceStatus
	_, err := c.Get(ctx, "/v1/services", &list)
	return list, err
}

// MoveService is POST /v1/services/move: the planned move of service to
// node to.
func (c *Client) MoveService(ctx context.Context, service, to string) (ServiceMoveResult, error) {
	q := url.Values{}
	q.Set("service", service)
	q.Set("to", to)
	var res ServiceMoveResult
	_, err := c.Do(ctx, http.MethodPost, "/v1/services/move?"+q.Encode(), nil, &res)
	return res, err
}

// OwnerOrDash is s's owner for a table: "-" when it has none.
func (s ServiceStatus) OwnerOrDash() string {
	if s.Owner == "" {
		return "-"
	}
	return s.Owner
}

// MoveSummary is the one-line form of s's last move ("-": none).
func (s ServiceStatus) MoveSummary() string {
	m := s.LastMove
	if m == nil {
		return "-"
	}
	from := m.From
	if from == "" {
		from = "(unplaced)"
	}
	return fmt.Sprintf("%s → %s (%s) at %s, epoch %d", from, m.To, m.Reason, m.At.UTC().Format(time.RFC3339), m.Epoch)
}

// ServicesSummary is the services in one line (nsmd status): each one's
// owner, epoch and state, and a conflict's sentence.
func ServicesSummary(list []ServiceStatus) string {
	parts := make([]string, 0, len(list))
	for _, s := range list {
		p := fmt.Sprintf("%s on %s (epoch %d, %s)", s.ID, s.OwnerOrDash(), s.Epoch, s.State)
		if s.Conflict != "" {
			p += ": " + s.Conflict
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}
