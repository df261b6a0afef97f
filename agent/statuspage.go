package agent

import (
	"embed"
	"io/fs"
	"net/http"
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
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		pageHeaders(w)
		http.ServeFileFS(w, r, sub, "index.html")
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
