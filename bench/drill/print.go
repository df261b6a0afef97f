package drill

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// How a drill's results are printed: labels, durations, the statistics over
// the runs and the summary table.

// graceLine describes how a run's kernel grace periods ended.
func graceLine(r Failover) string {
	var parts []string
	for _, g := range r.Grace {
		name := map[string]string{"nlm": "lockd", "nfsv4": "nfsd"}[g.Manager]
		switch {
		case !g.Running:
			parts = append(parts, name+" not running")
		case g.AfterMS > 0:
			parts = append(parts, fmt.Sprintf("%s ended %s after the fault (%s)", name, FormatMS(g.AfterMS), g.Reason))
		default:
			parts = append(parts, name+" "+g.Reason)
		}
	}
	return strings.Join(parts, ", ")
}

func FaultLabel(f string) string {
	switch f {
	case FaultKill:
		return "crash (POST /v1/drill/crash)"
	case FaultKillCmd:
		return "kill command"
	case FaultNSMDKill:
		return "kill -9 of nsmd"
	case FaultNSMDHang:
		return "nsmd hung (SIGSTOP)"
	case FaultPartition:
		return "cluster links cut"
	case FaultFreeze:
		return "machine frozen"
	}
	return "planned leadership transfer"
}

// FormatDuration prints a duration at millisecond resolution (µs below 10 ms).
func FormatDuration(d time.Duration) string {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// Stats is min/p50/p90/max (nearest rank) per milestone over the runs
// that reached it.
func Stats(runs []Failover) []Stat {
	var out []Stat
	defs := MilestoneDefs()
	if len(runs) > 0 && len(runs[0].Milestones) == MilestoneCount {
		for i, m := range runs[0].Milestones { // a service drill's are its own
			defs[i] = MilestoneDef{m.Name, m.Label}
		}
	}
	for i, def := range defs {
		var v []float64
		for _, r := range runs {
			if i < len(r.Milestones) && r.Milestones[i].Reached {
				v = append(v, r.Milestones[i].AfterMS)
			}
		}
		st := Stat{Name: def.Name, Label: def.Label, N: len(v)}
		if len(v) > 0 {
			slices.Sort(v)
			st.MinMS, st.P50MS, st.P90MS, st.MaxMS = v[0], Percentile(v, 0.5), Percentile(v, 0.9), v[len(v)-1]
		}
		out = append(out, st)
	}
	return out
}

// StepStats is min/p50/p90/max per takeover step over the runs that
// recorded it, in StepDefs order, then steps the table does not know (a
// newer node's) by name; steps no run recorded are left out.
func StepStats(runs []Failover) []Stat {
	defs := StepDefs()
	known := map[string]bool{}
	for _, d := range defs {
		known[d.Name] = true
	}
	var more []MilestoneDef
	for _, r := range runs {
		for _, s := range r.Steps {
			if !known[s.Name] {
				known[s.Name] = true
				more = append(more, MilestoneDef{s.Name, s.Label})
			}
		}
	}
	slices.SortFunc(more, func(a, b MilestoneDef) int { return strings.Compare(a.Name, b.Name) })
	var out []Stat
	for _, def := range append(defs, more...) {
		var v []float64
		for _, r := range runs {
			if ms, ok := stepAfter(r, def.Name); ok {
				v = append(v, ms)
			}
		}
		if len(v) == 0 {
			continue
		}
		slices.Sort(v)
		out = append(out, Stat{Name: def.Name, Label: def.Label, N: len(v),
			MinMS: v[0], P50MS: Percentile(v, 0.5), P90MS: Percentile(v, 0.9), MaxMS: v[len(v)-1]})
	}
	return out
}

// stepAfter is when run r's step name happened (ms after the fault).
func stepAfter(r Failover, name string) (float64, bool) {
	for _, s := range r.Steps {
		if s.Name == name {
			return s.AfterMS, true
		}
	}
	return 0, false
}

func Percentile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func FormatMS(ms float64) string {
	return FormatDuration(time.Duration(ms * float64(time.Millisecond)))
}

// Print writes the summary: cluster, each run, the milestone table
// and, for several runs, the distribution.
func Print(w io.Writer, rep *Report) error {
	var ids []string
	for _, n := range rep.Nodes {
		ids = append(ids, n.ID)
	}
	where, who := "VIP "+rep.VIP, "leader"
	if rep.Service != "" {
		where, who = "service "+rep.Service+" at "+rep.VIP, "server"
	}
	fmt.Fprintf(w, "\ndrill: %s, %d of %d runs, %s, nodes %s, polling every %s\n", FaultLabel(rep.Fault), len(rep.Runs), rep.Asked, where, strings.Join(ids, " "), FormatMS(rep.PollMS))
	if rep.FaultDetail != "" {
		fmt.Fprintf(w, "fault: %s\n", rep.FaultDetail)
	}
	for _, r := range rep.Runs {
		fmt.Fprintf(w, "run %d at %s: %s %s -> %s, sm_state %d -> %d", r.Run, r.FaultAt.Local().Format("15:04:05"), who, r.OldLeader, dash(r.NewLeader), r.OldState, r.NewState)
		if len(r.AlsoMoved) > 0 {
			fmt.Fprintf(w, "; also moved: %s", strings.Join(r.AlsoMoved, ", "))
		}
		if r.Err != "" {
			fmt.Fprintf(w, "  FAILED: %s", r.Err)
		}
		if len(r.Grace) > 0 {
			fmt.Fprintf(w, "; kernel grace: %s", graceLine(r))
		}
		fmt.Fprintln(w)
	}
	if len(rep.Runs) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprint(tw, "MILESTONE (since the fault)\t")
		for _, r := range rep.Runs {
			fmt.Fprintf(tw, "RUN %d\t", r.Run)
		}
		fmt.Fprintln(tw)
		for i, def := range rep.Defs() {
			fmt.Fprintf(tw, "%s\t", def.Label)
			for _, r := range rep.Runs {
				if m := r.Milestones[i]; m.Reached {
					fmt.Fprintf(tw, "%s\t", FormatDuration(m.After))
				} else {
					fmt.Fprint(tw, "-\t")
				}
			}
			fmt.Fprintln(tw)
		}
		fmt.Fprintln(w)
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if steps := StepStats(rep.Runs); len(steps) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprint(tw, "NEW LEADER'S STEP (since the fault)\t")
		for _, r := range rep.Runs {
			fmt.Fprintf(tw, "RUN %d\t", r.Run)
		}
		fmt.Fprintln(tw)
		for _, st := range steps {
			fmt.Fprintf(tw, "%s\t", st.Label)
			for _, r := range rep.Runs {
				if ms, ok := stepAfter(r, st.Name); ok {
					fmt.Fprintf(tw, "%s\t", FormatMS(ms))
				} else {
					fmt.Fprint(tw, "-\t")
				}
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Runs) > 1 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MILESTONE\tRUNS\tMIN\tP50\tP90\tMAX\t")
		for _, st := range rep.Stats {
			if st.N == 0 {
				fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t\n", st.Label)
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", st.Label, st.N, FormatMS(st.MinMS), FormatMS(st.P50MS), FormatMS(st.P90MS), FormatMS(st.MaxMS))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if err := printFence(w, rep); err != nil {
		return err
	}
	if rep.Stopped != "" {
		fmt.Fprintf(w, "\nstopped early: %s\n", rep.Stopped)
	}
	return nil
}

// dash is s, or "-" when empty.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
