package agent

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"
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
