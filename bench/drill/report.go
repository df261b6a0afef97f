package drill

import (
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"os"
	"strings"
	"time"
)

// WriteReportFile writes the drill's self-contained HTML report.
func WriteReportFile(path string, rep *Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("drill report: %w", err)
	}
	if err := WriteReport(f, rep); err != nil {
		f.Close()
		return fmt.Errorf("drill report %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("drill report %s: %w", path, err)
	}
	return nil
}

// WriteReport renders the report: cluster info, runs, the milestone
// table, the distribution and a timeline as inline SVG. No external assets.
func WriteReport(w io.Writer, rep *Report) error {
	t, err := template.New("drill").Funcs(template.FuncMap{
		"dur":   FormatDuration,
		"ms":    FormatMS,
		"fault": FaultLabel,
		"fence": FenceLine,
		"old":   OldLine,
		"date":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 MST") },
		"clock": func(t time.Time) string { return t.UTC().Format("15:04:05.000") },
		"step": func(r Failover, name string) string {
			if ms, ok := stepAfter(r, name); ok {
				return FormatMS(ms)
			}
			return "—"
		},
	}).Parse(reportHTML)
	if err != nil {
		return err
	}
	return t.Execute(w, struct {
		R        *Report
		Defs     [MilestoneCount]MilestoneDef
		Timeline template.HTML
	}{rep, rep.Defs(), template.HTML(TimelineSVG(rep))})
}

// Colors: one per milestone.
func Colors() [MilestoneCount]string {
	return [MilestoneCount]string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1"}
}

// NiceStep picks a 1/2/5×10^k axis step giving at most 10 ticks up to maxMS.
func NiceStep(maxMS float64) float64 {
	if maxMS <= 0 {
		return 1
	}
	raw := maxMS / 10
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// TimelineSVG draws the fault at 0 and each milestone's time. Up to 12
// runs get one lane per run and milestone (a bar from the fault); more get
// one lane per milestone with a dot per run and a mark at the median.
func TimelineSVG(rep *Report) string {
	const (
		width  = 960.0
		left   = 240.0
		right  = 90.0
		top    = 34.0
		laneH  = 22.0
		header = 20.0
		bottom = 30.0
	)
	colors := Colors()
	defs := rep.Defs()
	maxMS := 0.0
	for _, r := range rep.Runs {
		for _, m := range r.Milestones {
			if m.Reached {
				maxMS = max(maxMS, m.AfterMS)
			}
		}
	}
	if maxMS == 0 {
		maxMS = 1000
	}
	step := NiceStep(maxMS)
	axisMax := math.Ceil(maxMS/step) * step
	plotW := width - left - right
	x := func(ms float64) float64 { return left + ms/axisMax*plotW }

	perRun := len(rep.Runs) <= 12
	height := top + bottom
	if perRun {
		height += float64(len(rep.Runs)) * (header + MilestoneCount*laneH)
	} else {
		height += MilestoneCount * laneH
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12" role="img" aria-label="failover timeline">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="#fff"/>`+"\n", width, height)
	// Grid and axis labels (top and bottom).
	for v := 0.0; v <= axisMax+step/2; v += step {
		xx := x(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", xx, top-6, xx, height-bottom+4)
		label := html.EscapeString(FormatMS(v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`+"\n", xx, top-10, label)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`+"\n", xx, height-bottom+18, label)
	}
	// The fault.
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#d62728" stroke-width="2"/>`+"\n", x(0), top-6, x(0), height-bottom+4)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#d62728" font-weight="bold">fault (%s) ▸</text>`+"\n", x(0)-16, top-10, html.EscapeString(rep.Fault))

	y := top
	lane := func(label string, color string, bold bool) {
		weight := "normal"
		if bold {
			weight = "bold"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" font-weight="%s"><tspan fill="%s">■</tspan> %s</text>`+"\n", left-10, y+laneH/2+4, weight, color, html.EscapeString(label))
	}
	if perRun {
		for _, r := range rep.Runs {
			detail := fmt.Sprintf("leader %s → %s, sm_state %d → %d", r.OldLeader, dash(r.NewLeader), r.OldState, r.NewState)
			if r.Err != "" {
				detail += " — " + r.Err
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" font-weight="bold">run %d</text>`+"\n", left-10, y+14, r.Run)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#555">%s</text>`+"\n", x(0)+6, y+14, html.EscapeString(detail))
			y += header
			for i, m := range r.Milestones {
				lane(defs[i].Label, colors[i], false)
				if m.Reached {
					fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" opacity="0.85"><title>%s: %s</title></rect>`+"\n",
						x(0), y+4, max(x(m.AfterMS)-x(0), 1), laneH-8, colors[i], html.EscapeString(defs[i].Label), html.EscapeString(FormatDuration(m.After)))
					fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x(m.AfterMS)+5, y+laneH/2+4, html.EscapeString(FormatDuration(m.After)))
				} else {
					fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#999">not reached</text>`+"\n", x(0)+5, y+laneH/2+4)
				}
				y += laneH
			}
		}
	} else {
		for i, st := range rep.Stats {
			lane(defs[i].Label, colors[i], false)
			for _, r := range rep.Runs {
				if m := r.Milestones[i]; m.Reached {
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s" opacity="0.5"><title>run %d: %s</title></circle>`+"\n",
						x(m.AfterMS), y+laneH/2, colors[i], r.Run, html.EscapeString(FormatDuration(m.After)))
				}
			}
			if st.N > 0 {
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="2"><title>p50 %s</title></line>`+"\n",
					x(st.P50MS), y+2, x(st.P50MS), y+laneH-2, html.EscapeString(FormatMS(st.P50MS)))
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">p50 %s</text>`+"\n", x(st.MaxMS)+8, y+laneH/2+4, html.EscapeString(FormatMS(st.P50MS)))
			}
			y += laneH
		}
	}
	b.WriteString("</svg>")
	return b.String()
}

const reportHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>nsmd failover drill {{date .R.Date}}</title>
<style>
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.bad { color: #b00; font-weight: bold; }
.note { color: #555; }
</style>
</head>
<body>
<h1>nsmd failover drill</h1>
<p>{{date .R.Date}} — {{fault .R.Fault}}, {{len .R.Runs}} of {{.R.Asked}} run(s), VIP <code>{{.R.VIP}}</code>.</p>
{{with .R.FaultDetail}}<p>Fault: {{.}}</p>{{end}}
{{with .R.Stopped}}<p class="bad">Stopped early: {{.}}</p>{{end}}

<h2>Cluster</h2>
<table>
<tr><th>node</th><th>admin API</th><th>NSM address</th><th>voter</th></tr>
{{range .R.Nodes}}<tr><td>{{.ID}}</td><td>{{if .Admin}}{{.Admin}}{{else}}unknown{{end}}</td><td>{{.NSMAddr}}</td><td>{{if .Voter}}yes{{else}}no{{end}}</td></tr>
{{end}}</table>

<h2>Runs</h2>
<table>
<tr><th>run</th><th>fault at (UTC)</th><th>old leader</th><th>new leader</th><th>old sm_state</th><th>new sm_state</th><th>result</th><th>old server proven stopped</th><th>old server afterwards</th></tr>
{{range .R.Runs}}<tr><td class="num">{{.Run}}</td><td>{{clock .FaultAt}}</td><td>{{.OldLeader}}</td><td>{{.NewLeader}}</td><td class="num">{{.OldState}}</td><td class="num">{{.NewState}}</td>
<td>{{if .Err}}<span class="bad">{{.Err}}</span>{{else}}all milestones reached{{end}}{{with .FaultNote}} <span class="note">({{.}})</span>{{end}}</td>
<td>{{fence .Fence}}{{with .Fence}}{{with .Detail}} <span class="note">({{.}})</span>{{end}}{{end}}</td><td>{{old .Fence}}</td></tr>
{{end}}</table>
<p class="note">Proven stopped: what the new leader waited for before its on_leader hook (its status's fence.last_wait):
clean = the old server said its stop succeeded; agent = the fence agent reported it off; watchdog = its watchdog must have reset it by then.
Afterwards: the old server's status once it answered again — reset = another boot id, restarted = another nsmd start on the same boot,
kept running = the same process.</p>

<h2>Milestones (time since the fault)</h2>
<table>
<tr><th>milestone</th>{{range .R.Runs}}<th>run {{.Run}}</th>{{end}}</tr>
{{$runs := .R.Runs}}{{range $i, $d := .Defs}}<tr><td>{{$d.Label}} <span class="note">({{$d.Name}})</span></td>{{range $runs}}{{with index .Milestones $i}}<td class="num">{{if .Reached}}{{dur .After}}{{else}}<span class="bad">—</span>{{end}}</td>{{end}}{{end}}</tr>
{{end}}</table>

{{with .R.StepStats}}<h2>The new leader's steps (time since the fault)</h2>
<table>
<tr><th>step</th>{{range $.R.Runs}}<th>run {{.Run}}</th>{{end}}</tr>
{{range .}}{{$name := .Name}}<tr><td>{{.Label}} <span class="note">({{.Name}})</span></td>{{range $.R.Runs}}<td class="num">{{step . $name}}</td>{{end}}</tr>
{{end}}</table>
{{if gt (len $.R.Runs) 1}}<table>
<tr><th>step</th><th>runs</th><th>min</th><th>p50</th><th>p90</th><th>max</th></tr>
{{range .}}<tr><td>{{.Label}}</td><td class="num">{{.N}}</td><td class="num">{{ms .MinMS}}</td><td class="num">{{ms .P50MS}}</td><td class="num">{{ms .P90MS}}</td><td class="num">{{ms .MaxMS}}</td></tr>
{{end}}</table>{{end}}
<p class="note">Each new leader records its takeover's steps on its own clock (GET /v1/status, takeover).
They are placed on this page's axis through one shared event: the new leader's "VIP taken" is put at the time
this drill first got the new state from SM_STAT on the VIP, and every other step keeps its distance from it on the
leader's clock. No two clocks are compared; the anchor is late by up to one polling interval and one round trip,
so a step may show a few ms before the milestone that caused it.</p>
{{end}}
{{if gt (len .R.Runs) 1}}<h2>Distribution</h2>
<table>
<tr><th>milestone</th><th>runs</th><th>min</th><th>p50</th><th>p90</th><th>max</th></tr>
{{range .R.Stats}}<tr><td>{{.Label}}</td><td class="num">{{.N}}</td>{{if .N}}<td class="num">{{ms .MinMS}}</td><td class="num">{{ms .P50MS}}</td><td class="num">{{ms .P90MS}}</td><td class="num">{{ms .MaxMS}}</td>{{else}}<td colspan="4">never reached</td>{{end}}</tr>
{{end}}</table>
{{end}}
<h2>Timeline</h2>
{{.Timeline}}
<p class="note">Milestones: new leader elected = another node's /v1/status says role=leader;
VIP answers NULL = NSM NULL over UDP on the VIP answered by the new holder;
VIP SM_STAT has new state = SM_STAT on the VIP returns a state above the old one;
notify fan-out complete = the new leader's notify.pending is 0 after its takeover.
Each is polled only after the one before it; a time is when the answer arrived, so it includes up to one polling interval ({{ms .R.PollMS}}).</p>
</body>
</html>
`
