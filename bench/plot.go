package bench

import (
	"fmt"
	"html"
	"math"
	"strings"

	"github.com/nsmd/nsmd/bench/drill"
)

// LatencySVG draws the latency histogram of a bench mon run: log
// buckets (10 per decade) on a logarithmic time axis, call counts on a
// linear one, and marks at p50, p90, p99 and the maximum. Styling, axis
// steps and labels are the drill timeline's (bench/drill/report.go).
func LatencySVG(rep *MonReport) string {
	const (
		width  = 960.0
		height = 420.0
		left   = 80.0
		right  = 30.0
		top    = 56.0
		bottom = 50.0
	)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12" role="img" aria-label="latency histogram">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="#fff"/>`+"\n", width, height)
	procs := "SM_MON"
	if rep.Unmon {
		procs = "SM_MON + SM_UNMON"
	}
	title := fmt.Sprintf("%s latency — %s %s, %d conn × depth %d, %d calls, %.0f ok/s, %d failed",
		procs, rep.Proto, rep.Target, rep.Conns, rep.Depth, rep.Calls, rep.OKPS, rep.Failed)
	fmt.Fprintf(&b, `<text x="%.1f" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	if len(rep.Hist) == 0 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#999">no answered calls</text>`+"\n", left, top+20)
		b.WriteString("</svg>")
		return b.String()
	}

	// Axes: time from the decade below the fastest bucket to the decade
	// above the slowest; counts from 0 in 1/2/5 steps.
	lo := math.Floor(math.Log10(rep.Hist[0].FromMS) + 1e-9)
	hi := math.Ceil(math.Log10(rep.Hist[len(rep.Hist)-1].ToMS) - 1e-9)
	if hi <= lo {
		hi = lo + 1
	}
	maxCount := 0
	for _, h := range rep.Hist {
		maxCount = max(maxCount, h.Count)
	}
	step := drill.NiceStep(float64(maxCount))
	yMax := math.Ceil(float64(maxCount)/step) * step
	plotW, plotH := width-left-right, height-top-bottom
	x := func(ms float64) float64 { return left + (math.Log10(ms)-lo)/(hi-lo)*plotW }
	y := func(n float64) float64 { return top + plotH - n/yMax*plotH }

	for v := 0.0; v <= yMax+step/2; v += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(v), width-right, y(v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#555">%.0f</text>`+"\n", left-6, y(v)+4, v)
	}
	for d := lo; d <= hi; d++ {
		for _, m := range []float64{1, 2, 5} {
			ms := m * math.Pow(10, d)
			if d == hi && m > 1 {
				break
			}
			xx := x(ms)
			stroke := "#eee"
			if m == 1 {
				stroke = "#ccc"
			}
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", xx, top, xx, top+plotH+4, stroke)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`+"\n", xx, top+plotH+18, html.EscapeString(drill.FormatMS(ms)))
		}
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">latency (log scale)</text>`+"\n", left+plotW/2, height-8)
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" fill="#555" transform="rotate(-90 16 %.1f)">calls</text>`+"\n", top+plotH/2, top+plotH/2)

	colors := drill.Colors()
	for _, h := range rep.Hist {
		x0, x1 := x(h.FromMS), x(h.ToMS)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" opacity="0.85"><title>%s–%s: %d calls</title></rect>`+"\n",
			x0+0.5, y(float64(h.Count)), max(x1-x0-1, 1), y(0)-y(float64(h.Count)), colors[0],
			html.EscapeString(drill.FormatMS(h.FromMS)), html.EscapeString(drill.FormatMS(h.ToMS)), h.Count)
	}
	marks := []struct {
		label string
		ms    float64
		color string
	}{{"p50", rep.Latency.P50MS, colors[1]}, {"p90", rep.Latency.P90MS, colors[2]}, {"p99", rep.Latency.P99MS, colors[3]}, {"max", rep.Latency.MaxMS, "#d62728"}}
	for i, m := range marks {
		xx := x(max(m.ms, math.Pow(10, lo)))
		color := m.color
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="4 3"/>`+"\n", xx, top-4, xx, top+plotH, color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="%s">%s %s</text>`+"\n", xx, top-8-float64(i%2)*12, color, m.label, html.EscapeString(drill.FormatMS(m.ms)))
	}
	b.WriteString("</svg>")
	return b.String()
}
