package main

import (
	"embed"
	"io/fs"
	"net/http"
	"time"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/fsm"
)

// The status page (GET /) is static HTML, JS and CSS compiled into the
// binary; the script polls GET /v1/overview once a second and builds the
// page from it with DOM text nodes only. Nothing is loaded from elsewhere:
// the Content-Security-Policy allows this origin alone and no inline
// script, so even a rendering bug could not run a name a client sent.
//
//go:embed statuspage
var statusPageFiles embed.FS

// overviewRows caps the registrations the page lists; the rest are counted.
const overviewRows = 50

// pageCSP: scripts, styles and fetches from this origin only; no inline
// script or handler, no frames, no forms.
const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Overview is the body of GET /v1/overview: what the status page shows,
// in one read of this node.
type Overview struct {
	Status  Status                 `json:"status"`
	Members []cluster.MemberStatus `json:"members"`
	// LastTakeover is the cluster's last committed takeover, from the
	// replicated state (every node knows it, whoever took over).
	LastTakeover  *TakeoverJSON `json:"last_takeover,omitempty"`
	Registrations OverviewRegs  `json:"registrations"`
	Now           time.Time     `json:"now"` // this node's clock, for the grace countdown
}

// TakeoverJSON is a committed takeover.
type TakeoverJSON struct {
	Node       string    `json:"node"`
	Reason     string    `json:"reason,omitempty"`
	At         time.Time `json:"at"`
	GraceUntil time.Time `json:"grace_until"`
}

// OverviewRegs lists the first registrations in key order, without the
// lock managers' cookies. Rows is empty and Hidden says why when the
// reader may not see registrations (the rules of GET /v1/registrations).
type OverviewRegs struct {
	Total  int           `json:"total"`
	Rows   []OverviewReg `json:"rows"`
	More   int           `json:"more"` // registrations not listed
	Hidden string        `json:"hidden,omitempty"`
}

// OverviewReg is one listed registration: never priv.
type OverviewReg struct {
	MonName string    `json:"mon_name"`
	MyName  string    `json:"my_name"`
	Node    string    `json:"node"`
	Added   time.Time `json:"added"`
}

// registerStatusPage adds GET / (the page), GET /ui/ (its script and
// style) and GET /v1/overview (its data). The page and the overview are
// reads like /v1/status (under TLS they need only the CA's trust); the
// registration rows in the overview follow /v1/registrations: an
// unauthorized reader gets the count alone.
func (a *agent) registerStatusPage(mux *http.ServeMux) {
	sub, err := fs.Sub(statusPageFiles, "statuspage")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		pageHeaders(w)
		http.ServeFileFS(w, r, sub, "index.html")
	})
	mux.HandleFunc("GET /ui/", func(w http.ResponseWriter, r *http.Request) {
		pageHeaders(w)
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /v1/overview", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, a.overview(a.authorized(r)))
	})
}

func pageHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", pageCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-cache")
}

func (a *agent) overview(privileged bool) Overview {
	o := Overview{
		Status:  a.status(),
		Members: a.node.Members(),
		Now:     time.Now().UTC(),
	}
	if t := a.node.LastTakeover(); !t.At.IsZero() {
		o.LastTakeover = &TakeoverJSON{Node: t.Node, Reason: t.Reason, At: t.At.UTC(), GraceUntil: t.GraceUntil.UTC()}
	}
	f := a.node.FSM()
	o.Registrations = OverviewRegs{Total: f.Len(), Rows: []OverviewReg{}}
	if !privileged {
		o.Registrations.Hidden = "names are shown only to an operator: a client certificate of the cluster CA or the admin token"
		o.Registrations.More = o.Registrations.Total
		return o
	}
	for _, g := range f.Registrations(fsm.MonID{}, overviewRows, "") {
		o.Registrations.Rows = append(o.Registrations.Rows, OverviewReg{
			MonName: g.ID.MonName, MyName: g.ID.My.MyName, Node: g.Node, Added: g.Added.UTC(),
		})
	}
	// Len and the listing are two reads: a registration may come or go
	// between them.
	o.Registrations.More = max(0, o.Registrations.Total-len(o.Registrations.Rows))
	return o
}
