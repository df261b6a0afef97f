package agent

import (
	"bytes"
	"embed"
	"encoding/json"
	"html"
	"io/fs"
	"net/http"
	"time"

	"github.com/nsmd/nsmd/timeline"
)

// The status page (GET /) is static HTML, JS and CSS compiled into the
// binary; the script polls GET /v1/overview (package admin) once a second
// and builds the page from it with DOM text nodes only. Nothing is loaded
// from elsewhere: the Content-Security-Policy allows this origin alone and
// no inline script, so even a rendering bug could not run a name a client
// sent.
//
//go:embed statuspage
var statusPageFiles embed.FS

// pageCSP: scripts, styles and fetches from this origin only; no inline
// script or handler, no frames, no forms.
const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// registerStatusPage adds GET / (the page) and GET /ui/ (its script and
// style) to the admin API's mux. They are reads like /v1/status (under
// TLS they need only the CA's trust).
func registerStatusPage(mux *http.ServeMux) {
	sub, err := fs.Sub(statusPageFiles, "statuspage")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	index := statusPageIndex()
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		pageHeaders(w)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		http.ServeContent(w, r, "index.html", time.Time{}, bytes.NewReader(index))
	})
	mux.HandleFunc("GET /ui/", func(w http.ResponseWriter, r *http.Request) {
		pageHeaders(w)
		files.ServeHTTP(w, r)
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

// statusPageIndex is the page with the takeover's step table (package
// timeline: name, label, always shown) in the timeline table's data-steps
// attribute, where the script reads it: the page renders whatever steps
// the table has.
func statusPageIndex() []byte {
	page, err := statusPageFiles.ReadFile("statuspage/index.html")
	if err != nil {
		panic(err) // the embedded file is part of the binary
	}
	type step struct {
		Name   string `json:"name"`
		Label  string `json:"label"`
		Always bool   `json:"always,omitempty"`
	}
	var steps []step
	for _, d := range timeline.Defs() {
		steps = append(steps, step{d.Name, d.Label, d.Always})
	}
	js, err := json.Marshal(steps)
	if err != nil {
		panic(err) // strings and bools
	}
	attr := `data-steps="` + html.EscapeString(string(js)) + `"`
	return bytes.Replace(page, []byte(`data-steps=""`), []byte(attr), 1)
}
