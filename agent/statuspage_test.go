package agent

import (
	"encoding/json"
	"html"
	"io/fs"
	"regexp"
	"strings"
	"testing"

	"github.com/nsmd/nsmd/timeline"
)

// TestStatusPageLoadsNothingFromElsewhere: the embedded files name no
// other origin (no CDN, no font, no analytics) and the script builds the
// page without innerHTML or other HTML-parsing sinks.
func TestStatusPageLoadsNothingFromElsewhere(t *testing.T) {
	external := regexp.MustCompile(`(?i)(https?:|//[a-z0-9.-]+\.[a-z]{2,}|@import)`)
	sinks := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function`)
	n := 0
	err := fs.WalkDir(statusPageFiles, "statuspage", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		n++
		b, err := statusPageFiles.ReadFile(path)
		if err != nil {
			return err
		}
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers to another origin: %q", path, m)
		}
		if strings.HasSuffix(path, ".js") {
			if m := sinks.Find(b); m != nil {
				t.Errorf("%s uses an HTML sink: %q", path, m)
			}
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("embedded files: %d (%v), want index.html, app.js, style.css", n, err)
	}
}

// TestStatusPageRendersTheStepTable: the page carries the takeover's step
// table (every step, in order, with its label) for the script, and the
// script names no step itself — a step added to the table shows up
// without a change here.
func TestStatusPageRendersTheStepTable(t *testing.T) {
	m := regexp.MustCompile(`data-steps="([^"]*)"`).FindSubmatch(statusPageIndex())
	if m == nil {
		t.Fatal("no data-steps attribute in the page")
	}
	var steps []struct {
		Name, Label string
		Always      bool
	}
	if err := json.Unmarshal([]byte(html.UnescapeString(string(m[1]))), &steps); err != nil {
		t.Fatal(err)
	}
	defs := timeline.Defs()
	if len(steps) != len(defs) {
		t.Fatalf("page has %d steps, the table %d", len(steps), len(defs))
	}
	for i, d := range defs {
		if steps[i].Name != d.Name || steps[i].Label != d.Label || steps[i].Always != d.Always {
			t.Errorf("step %d: page %+v, table %+v", i, steps[i], d)
		}
	}
	js, err := statusPageFiles.ReadFile("statuspage/app.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range defs {
		// (elected is the anchor of the "after election" column.)
		if d.Name != "elected" && strings.Contains(string(js), "tl."+d.Name) {
			t.Errorf("app.js names step %q itself", d.Name)
		}
	}
}
