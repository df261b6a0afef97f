package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
)

// A same-run comparison of two builds: the figures of one machine move
// by half or double from one day to the next, so a release is compared
// with the previous one only in runs taken on the same machine in the
// same minutes, alternated (this, previous, this, …), and the ratio is
// what a table carries. Compare reads the JSON reports of `bench mon`
// or `bench failover` of both builds and puts them side by side.

// Figure is one measured quantity of a report, with the direction that
// is better.
type Figure struct {
	Name         string
	Unit         string
	HigherBetter bool
	this, prev   []float64
}

// Comparison is every figure of one kind of report, this build beside
// the previous one.
type Comparison struct {
	Kind    string // "mon" or "failover"
	Runs    [2]int // reports read: this build's, the previous build's
	Figures []Figure
}

// FigureStats is a figure's median and worst over a build's runs.
type FigureStats struct{ Median, Worst float64 }

// Stats returns the figure's median and worst for this build (prev
// false) or the previous one.
func (f Figure) Stats(prev bool) FigureStats {
	v := f.this
	if prev {
		v = f.prev
	}
	if len(v) == 0 {
		return FigureStats{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	worst := s[len(s)-1]
	if f.HigherBetter {
		worst = s[0]
	}
	return FigureStats{Median: med, Worst: worst}
}

// Ratio is this build's median over the previous build's (0 when the
// previous one has none).
func (f Figure) Ratio() float64 {
	p := f.Stats(true).Median
	if p == 0 {
		return 0
	}
	return f.Stats(false).Median / p
}

// figureSet reads the figures a kind of report carries.
type figureSet struct {
	names []Figure
	read  func(b []byte) ([]float64, error) // in names' order
}

var errNoFigures = errors.New("bench compare: the report has no figures of that kind")

func figuresOf(kind string) (figureSet, error) {
	switch kind {
	case "mon":
		return figureSet{
			names: []Figure{
				{Name: "SM_MON answered", Unit: "/s", HigherBetter: true},
				{Name: "latency p50", Unit: "ms"},
				{Name: "latency p99", Unit: "ms"},
			},
			read: func(b []byte) ([]float64, error) {
				var r MonReport
				if err := json.Unmarshal(b, &r); err != nil {
					return nil, err
				}
				if r.OK == 0 {
					return nil, errNoFigures
				}
				return []float64{r.OKPS, r.Latency.P50MS, r.Latency.P99MS}, nil
			},
		}, nil
	case "failover":
		return figureSet{
			names: []Figure{
				{Name: "fault → VIP answers with the new state, p50", Unit: "ms"},
				{Name: "fault → VIP answers with the new state, max", Unit: "ms"},
			},
			read: func(b []byte) ([]float64, error) {
				var r FailoverReport
				if err := json.Unmarshal(b, &r); err != nil {
					return nil, err
				}
				if r.Failover.N == 0 {
					return nil, errNoFigures
				}
				return []float64{r.Failover.P50MS, r.Failover.MaxMS}, nil
			},
		}, nil
	}
	return figureSet{}, fmt.Errorf("bench compare: kind %q: want mon or failover", kind)
}

// Compare reads the reports of this build (this) and of the previous
// one (prev), each a JSON file written by `nsmd bench mon --json` or
// `nsmd bench failover --json` (kind "mon" or "failover").
func Compare(kind string, this, prev []string) (*Comparison, error) {
	set, err := figuresOf(kind)
	if err != nil {
		return nil, err
	}
	if len(this) == 0 || len(prev) == 0 {
		return nil, errors.New("bench compare: want at least one report of each build")
	}
	c := &Comparison{Kind: kind, Runs: [2]int{len(this), len(prev)}, Figures: set.names}
	for side, files := range [2][]string{this, prev} {
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("bench compare: %w", err)
			}
			vals, err := set.read(b)
			if err != nil {
				return nil, fmt.Errorf("bench compare: %s: %w", f, err)
			}
			for i, v := range vals {
				if side == 0 {
					c.Figures[i].this = append(c.Figures[i].this, v)
				} else {
					c.Figures[i].prev = append(c.Figures[i].prev, v)
				}
			}
		}
	}
	return c, nil
}

// WriteTable prints the comparison: per figure, each build's median and
// worst, and the ratio of the medians (this / previous).
func (c *Comparison) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "figure\tthis median\tthis worst\tprevious median\tprevious worst\tratio\t(%d and %d runs, alternated)\n", c.Runs[0], c.Runs[1])
	for _, f := range c.Figures {
		t, p := f.Stats(false), f.Stats(true)
		fmt.Fprintf(tw, "%s (%s)\t%s\t%s\t%s\t%s\t%.2f\t\n", f.Name, f.Unit, num(t.Median), num(t.Worst), num(p.Median), num(p.Worst), f.Ratio())
	}
	return tw.Flush()
}

func num(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
