package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nsmd/nsmd/cluster/pki"
)

// Confirmer is what POST /v1/fence/confirm needs of a node besides Store:
// an operator's confirmation that node is off (by says who), recorded so
// that a new leader waiting for node treats it as stopped. Errors marked
// with BadRequest are the request's fault (this node, the leader, a node
// that answers that it serves).
type Confirmer interface {
	ConfirmOff(ctx context.Context, node, by string) error
}

// FenceConfirmRequest is the body of POST /v1/fence/confirm.
type FenceConfirmRequest struct {
	// Node is the node id the operator confirms is off (powered off, or
	// its storage and NFS server stopped by hand).
	Node string `json:"node"`
	// By names the operator (optional; recorded with the credential and
	// address the request came with).
	By string `json:"by,omitempty"`
}

// FenceConfirmResult is the answer of POST /v1/fence/confirm.
type FenceConfirmResult struct {
	Node   string `json:"node"`
	By     string `json:"by"`
	Result string `json:"result"` // "confirmed"
}

// confirmFence serves POST /v1/fence/confirm (privileged, like a
// leadership transfer: it lets a new leader serve).
func (h *handler) confirmFence(w http.ResponseWriter, r *http.Request) {
	c, ok := h.s.(Confirmer)
	if !ok {
		httpError(w, http.StatusNotImplemented, "this node takes no fence confirmations")
		return
	}
	var req FenceConfirmRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 8<<10)).Decode(&req); err != nil || req.Node == "" {
		httpError(w, http.StatusBadRequest, "want a JSON body {\"node\": NODE_ID}: %v", err)
		return
	}
	if len(req.By) > 128 {
		httpError(w, http.StatusBadRequest, "by is %d bytes (at most 128)", len(req.By))
		return
	}
	by := confirmedBy(r, req.By)
	err := c.ConfirmOff(r.Context(), req.Node, by)
	switch {
	case errors.Is(err, ErrBadRequest):
		httpError(w, http.StatusBadRequest, "fence confirm: %v", err)
		return
	case err != nil:
		httpError(w, http.StatusInternalServerError, "fence confirm: %v", err)
		return
	}
	h.c.Logger.Warn("an operator confirmed a node off", "node", req.Node, "by", by)
	writeJSON(w, FenceConfirmResult{Node: req.Node, By: by, Result: "confirmed"})
}

// confirmedBy names who confirmed: the name given, the credential (a
// certificate's role, or the token) and the address the request came from.
func confirmedBy(r *http.Request, name string) string {
	cred := "token"
	if role := pki.PeerRole(r.TLS); role != "" {
		cred = role + " certificate"
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if name == "" {
		return fmt.Sprintf("%s from %s", cred, host)
	}
	return fmt.Sprintf("%s (%s from %s)", name, cred, host)
}

// ConfirmFenced is POST /v1/fence/confirm: node is off (by names the
// operator, optional).
func (c *Client) ConfirmFenced(ctx context.Context, node, by string) (FenceConfirmResult, error) {
	var res FenceConfirmResult
	body, err := json.Marshal(FenceConfirmRequest{Node: node, By: by})
	if err != nil {
		return res, err
	}
	_, err = c.Do(ctx, http.MethodPost, "/v1/fence/confirm", bytes.NewReader(body), &res)
	return res, err
}

// FencePromises is what each serving node promises about how it is
// fenced, as this node sees it (GET /v1/status fence.promises).
type FencePromises struct {
	Servers []FencePromise `json:"servers"`
	// Mismatch: the servers promise differently (mode, watchdog timeout or
	// lease), or one's promise is unknown: a successor waits by the old
	// server's promise, so failover times differ by direction, and a
	// server that promised no watchdog is fenced only by its answer, a
	// fence agent or an operator's confirmation.
	Mismatch bool `json:"mismatch"`
	// Unproven: nodes this leader waits for that no watchdog promise
	// bounds: it serves only once each answers that it stopped, a fence
	// agent fences it, or an operator confirms it off (nsmd fence confirm).
	Unproven      []string            `json:"unproven,omitempty"`
	Confirmations []FenceConfirmation `json:"confirmations,omitempty"`
}

// FencePromise is one serving node's promise.
type FencePromise struct {
	Node string `json:"node"`
	// Mode: watchdog, agent (no watchdog: only a fence agent), off, or
	// unknown (an earlier release, or never seen).
	Mode               string  `json:"mode"`
	WatchdogSeconds    float64 `json:"watchdog_seconds,omitempty"`
	LeaseSeconds       float64 `json:"lease_seconds,omitempty"`
	HookTimeoutSeconds float64 `json:"hook_timeout_seconds,omitempty"`
	MarginSeconds      float64 `json:"margin_seconds,omitempty"`
	// Source: self, record (its serving record: it may serve now), gossip
	// (what it advertises), unknown.
	Source  string `json:"source"`
	Serving bool   `json:"serving,omitempty"` // it has a serving record
}

// FenceConfirmation is an operator's confirmation that a node is off,
// which holds until that node takes over again.
type FenceConfirmation struct {
	Node string    `json:"node"`
	By   string    `json:"by"`
	At   time.Time `json:"at"`
}

// Summary is the promises in one line (nsmd status).
func (p *FencePromises) Summary() string {
	if p == nil || len(p.Servers) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, s := range p.Servers {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", s.Node, s.Mode)
		if s.Mode == "watchdog" {
			fmt.Fprintf(&b, " %gs", s.WatchdogSeconds)
		}
		if s.Serving {
			b.WriteString(" (serving)")
		}
	}
	if p.Mismatch {
		b.WriteString("; MISMATCH: the servers promise different fencing")
	}
	if len(p.Unproven) > 0 {
		fmt.Fprintf(&b, "; WAITING for %s to answer, be fenced, or be confirmed off (nsmd fence confirm NODE)", strings.Join(p.Unproven, ", "))
	}
	for _, c := range p.Confirmations {
		fmt.Fprintf(&b, "; %s confirmed off by %s at %s", c.Node, c.By, c.At.Format(time.RFC3339))
	}
	return b.String()
}
