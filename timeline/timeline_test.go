package timeline

import (
	"testing"
	"time"
)

// TestTheTableNamesEveryStepOnce: every step has a row, a name and a
// label, no name twice; ByName finds each.
func TestTheTableNamesEveryStepOnce(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Steps() {
		d := s.Def()
		if d.Name == "" || d.Label == "" {
			t.Errorf("step %d has no row: %+v", s, d)
		}
		if seen[d.Name] {
			t.Errorf("name %q twice", d.Name)
		}
		seen[d.Name] = true
		if got, ok := ByName(d.Name); !ok || got != s {
			t.Errorf("ByName(%q) = %v %v, want %v", d.Name, got, ok, s)
		}
	}
	if _, ok := ByName("sm_state"); ok {
		t.Error("sm_state is the timeline's, not a step")
	}
	Defs()[0].Name = "changed"
	if Defs()[0].Name == "changed" {
		t.Error("Defs hands out the table itself")
	}
}

// TestTimelineMarks: marks land on their step, MarkFirst keeps the first,
// the zero time clears, Reached lists the steps reached in table order,
// and a copy does not share its marks.
func TestTimelineMarks(t *testing.T) {
	t0 := time.Unix(100, 0)
	tl := Timeline{State: 3}
	tl.Mark(NotifyDone, t0.Add(3*time.Second))
	tl.Mark(Elected, t0)
	tl.MarkFirst(NLMFirstBack, t0.Add(time.Second))
	tl.MarkFirst(NLMFirstBack, t0.Add(2*time.Second))
	cp := tl
	cp.Mark(VIP, t0)
	tl.Mark(NotifyDone, time.Time{})
	got := tl.Reached()
	if len(got) != 2 || got[0] != (Mark{Elected, t0}) || got[1] != (Mark{NLMFirstBack, t0.Add(time.Second)}) {
		t.Fatalf("reached %v", got)
	}
	if !tl.At(VIP).IsZero() || cp.At(NotifyDone).IsZero() {
		t.Fatal("a copy shares its marks")
	}
	tl.Mark(Step(-1), t0)
	tl.Mark(numSteps, t0)
	if len(tl.Reached()) != 2 || !tl.At(numSteps).IsZero() {
		t.Fatal("a step out of range was marked")
	}
}
