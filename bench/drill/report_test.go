package drill

import (
	"bytes"
	"strings"
	"testing"
	"time"
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
