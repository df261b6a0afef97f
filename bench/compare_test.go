package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nsmd/nsmd/bench/drill"
)

func writeJSON(t *testing.T, dir, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCompareMonTakesMediansWorstAndTheRatioOfMedians(t *testing.T) {
	dir := t.TempDir()
	mon := func(name string, perS, p99 float64) string {
		return writeJSON(t, dir, name, MonReport{OK: 100, OKPS: perS, Latency: Latency{P50MS: 1, P99MS: p99}})
	}
	this := []string{mon("t1", 12000, 9), mon("t2", 10000, 12), mon("t3", 14000, 8)}
	prev := []string{mon("p1", 8000, 10), mon("p2", 12000, 7)}
	c, err := Compare("mon", this, prev)
	if err != nil {
		t.Fatal(err)
	}
	rate, p99 := c.Figures[0], c.Figures[2]
	if s := rate.Stats(false); s.Median != 12000 || s.Worst != 10000 {
		t.Errorf("this build's rate: %+v, want median 12000, worst (lowest) 10000", s)
	}
	if s := rate.Stats(true); s.Median != 10000 || s.Worst != 8000 {
		t.Errorf("previous build's rate: %+v, want median 10000 (mean of two), worst 8000", s)
	}
	if r := rate.Ratio(); r != 1.2 {
		t.Errorf("rate ratio %v, want 1.2", r)
	}
	if s := p99.Stats(false); s.Median != 9 || s.Worst != 12 {
		t.Errorf("this build's p99: %+v, want median 9, worst (highest) 12", s)
	}
	var out strings.Builder
	if err := c.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "SM_MON answered (/s)  12000") || !strings.Contains(out.String(), "1.20") {
		t.Errorf("table:\n%s", out.String())
	}
}

func TestCompareFailoverReadsTheFailoverFigure(t *testing.T) {
	dir := t.TempDir()
	fo := func(name string, p50, max float64) string {
		return writeJSON(t, dir, name, FailoverReport{Report: &drill.Report{}, Failover: drill.Stat{N: 5, P50MS: p50, MaxMS: max}})
	}
	c, err := Compare("failover", []string{fo("t", 900, 1500)}, []string{fo("p", 1000, 1400)})
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Figures[0].Ratio(); r != 0.9 {
		t.Errorf("p50 ratio %v, want 0.9", r)
	}
}

func TestCompareRefusesWhatItCannotRead(t *testing.T) {
	dir := t.TempDir()
	good := writeJSON(t, dir, "good", MonReport{OK: 1, OKPS: 1})
	empty := writeJSON(t, dir, "empty", MonReport{})
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		kind       string
		this, prev []string
	}{
		"unknown kind":      {"notify", []string{good}, []string{good}},
		"no previous":       {"mon", []string{good}, nil},
		"missing file":      {"mon", []string{good}, []string{filepath.Join(dir, "nope")}},
		"not JSON":          {"mon", []string{bad}, []string{good}},
		"a report of none":  {"mon", []string{good}, []string{empty}},
		"a mon as failover": {"failover", []string{good}, []string{good}},
	} {
		if _, err := Compare(c.kind, c.this, c.prev); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
