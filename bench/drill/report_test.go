package drill

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/timeline"
)

// TestDrillReportManyRuns: more than 12 runs are drawn as one lane per
// milestone; unreached milestones and stops are shown.
func TestDrillReportManyRuns(t *testing.T) {
	rep := &Report{Date: time.Now(), Fault: FaultKillCmd, VIP: "127.0.0.100:6620", Asked: 20,
		Nodes:   []Node{{ID: "a<b>", Voter: true}, {ID: "node2"}},
		Stopped: "stopping after run 13: <no quorum>"}
	for i := range 13 {
		r := Failover{Run: i + 1, OldLeader: "a<b>", NewLeader: "node2", OldState: 3, NewState: 5}
		for j, def := range MilestoneDefs() {
			after := time.Duration(100*(i+1)+10*j) * time.Millisecond
			r.Milestones = append(r.Milestones, Milestone{Name: def.Name, Label: def.Label, Reached: i != 5 || j < 3, After: after, AfterMS: float64(after.Milliseconds())})
		}
		if i == 5 {
			r.Err = "notify fan-out complete not reached within 1s"
		}
		rep.Runs = append(rep.Runs, r)
	}
	rep.Stats = Stats(rep.Runs)
	if st := rep.Stats[MilestoneNotify]; st.N != 12 || st.MinMS != 130 || st.MaxMS != 1330 || st.P50MS != 730 {
		t.Errorf("notify stats %+v", st)
	}
	if rep.Failed() != 1 {
		t.Errorf("failed() = %d, want 1", rep.Failed())
	}
	var b bytes.Buffer
	if err := WriteReport(&b, rep); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if strings.Count(s, "<circle") != 13*4-1 || !strings.Contains(s, "p50 ") {
		t.Errorf("many-runs timeline: %d dots, want 51", strings.Count(s, "<circle"))
	}
	if strings.Contains(s, "a<b>") || strings.Contains(s, "<no quorum>") || !strings.Contains(s, "a&lt;b&gt;") {
		t.Error("names are not escaped")
	}
	var table bytes.Buffer
	if err := Print(&table, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "FAILED") || !strings.Contains(table.String(), "stopped early") {
		t.Errorf("summary:\n%s", table.String())
	}
}

func TestNiceStepAndPercentile(t *testing.T) {
	for _, c := range []struct{ max, step float64 }{{1000, 100}, {730, 100}, {1450, 200}, {95, 10}, {4.2, 0.5}, {0, 1}} {
		if got := NiceStep(c.max); got != c.step {
			t.Errorf("NiceStep(%v) = %v, want %v", c.max, got, c.step)
		}
	}
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if Percentile(v, 0.5) != 5 || Percentile(v, 0.9) != 9 || Percentile(v[:1], 0.9) != 1 {
		t.Error("Percentile")
	}
}

// TestTakeoverStepsAnchorOnTheVIP: the leader's steps keep their distances
// on its clock and land on the drill's axis with "VIP taken" at the time
// the drill saw the new state — however far the two clocks are apart;
// unreached steps are left out; a step of a newer node, which the drill
// does not know, is placed too; the report shows them per run.
func TestTakeoverStepsAnchorOnTheVIP(t *testing.T) {
	leaderClock := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC) // hours off the drill's clock
	at := func(ms int) time.Time { return leaderClock.Add(time.Duration(ms) * time.Millisecond) }
	lt := timeline.Timeline{State: 5}
	for s, ms := range map[timeline.Step]int{timeline.PrevLeaderContact: 0, timeline.Elected: 600, timeline.Committed: 610, timeline.VIP: 4000,
		timeline.HookStarted: 4001, timeline.OnLeaderDone: 6000, timeline.NotifyStarted: 6001, timeline.NotifyDone: 6100, timeline.NLMFirstBack: 5500} {
		lt.Mark(s, at(ms))
	}
	tl := admin.TimelineOf(lt)
	tl.Steps = append(tl.Steps, admin.TimelineStep{Name: "zz_newer_step", Label: "zz_newer_step", At: at(7000)})
	steps := TakeoverSteps(&tl, 4200*time.Millisecond)
	var got []string
	for _, s := range steps {
		got = append(got, fmt.Sprintf("%s=%g", s.Name, s.AfterMS))
	}
	want := "prev_leader_contact=200 elected=800 committed=810 vip=4200 hook_started=4201 nlm_first_back=5700 on_leader_done=6200 notify_started=6201 notify_done=6300 zz_newer_step=7200"
	if strings.Join(got, " ") != want {
		t.Fatalf("steps\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if TakeoverSteps(&admin.Timeline{Steps: []admin.TimelineStep{{Name: "elected", At: at(1)}}}, time.Second) != nil {
		t.Fatal("steps without a VIP step to anchor on")
	}

	rep := &Report{Date: time.Now(), Fault: FaultKill, Asked: 2}
	for i := range 2 {
		r := Failover{Run: i + 1, Steps: steps}
		for _, def := range MilestoneDefs() {
			r.Milestones = append(r.Milestones, Milestone{Name: def.Name, Label: def.Label, Reached: true, After: time.Second, AfterMS: 1000})
		}
		rep.Runs = append(rep.Runs, r)
	}
	rep.Runs[1].Steps = steps[:3]
	rep.StepStats = StepStats(rep.Runs)
	if st := rep.StepStats[0]; st.Name != "prev_leader_contact" || st.N != 2 || len(rep.StepStats) != len(steps) {
		t.Fatalf("step stats %+v", rep.StepStats)
	}
	var b bytes.Buffer
	if err := WriteReport(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"The new leader's steps", "first SM_MON (NLM reclaim)", "6.3s", "—"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("report lacks %q", w)
		}
	}
	var table bytes.Buffer
	if err := Print(&table, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "NEW LEADER'S STEP") || !strings.Contains(table.String(), "6.3s") {
		t.Errorf("summary:\n%s", table.String())
	}
}
