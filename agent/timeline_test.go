package agent_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/timeline"
)

// TestTakeoverTimelineRecordsEveryStepInOrder: a takeover's timeline, as
// GET /v1/status shows it, has the steps the agent sees beside the leader
// loop's — the on_leader script's start (which waited 300 ms before the
// hook returned) and the SM_NOTIFY fan-out's start and end — in the order
// they happen; a mark for an older takeover is dropped.
func TestTakeoverTimelineRecordsEveryStepInOrder(t *testing.T) {
	dir := t.TempDir()
	hook := filepath.Join(dir, "on-leader.sh")
	stop := filepath.Join(dir, "on-follower.sh")
	for path, body := range map[string]string{hook: "#!/bin/sh\nsleep 0.3\n", stop: "#!/bin/sh\nexit 0\n"} {
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	o := agenttest.DevOptions(t, "127.0.0.142", 1)
	o.Tune = func(c *config.Config) { c.OnLeader, c.OnFollower, c.FenceWatchdog = hook, stop, config.FenceOff }
	d := agenttest.StartDev(t, o, agent.Options{})
	a := agenttest.Leader(t, d, nil, 10*time.Second)

	var st = a.Status()
	testutil.WaitFor(t, 10*time.Second, "the takeover's fan-out done", func() bool {
		st = a.Status()
		return st.Takeover != nil && !st.Takeover.At(timeline.NotifyDone.Name()).IsZero()
	})
	tl := st.Takeover
	steps := []timeline.Step{timeline.Elected, timeline.Committed, timeline.VIP, timeline.HookStarted,
		timeline.OnLeaderDone, timeline.NotifyStarted, timeline.NotifyDone}
	for i, s := range steps {
		at := tl.At(s.Name())
		if at.IsZero() {
			t.Fatalf("step %s not recorded: %+v", s, tl)
		}
		if prev := steps[max(i-1, 0)]; at.Before(tl.At(prev.Name())) {
			t.Errorf("step %s (%v) before %s (%v)", s, at, prev, tl.At(prev.Name()))
		}
	}
	if took := tl.At("on_leader_done").Sub(tl.At("hook_started")); took < 300*time.Millisecond {
		t.Errorf("hook started %v before it returned, want ≥ 300 ms (the script's sleep)", took)
	}
	if tl.State != st.SMState {
		t.Errorf("timeline of sm_state %d, status says %d", tl.State, st.SMState)
	}

	// A late event of another takeover does not land in this one.
	a.Node().MarkTimeline(tl.State-2, func(x *timeline.Timeline) { x.Mark(timeline.NLMGraceEnd, time.Now()) })
	a.Node().MarkTimeline(tl.State, func(x *timeline.Timeline) { x.Mark(timeline.NFSv4GraceEnd, time.Now()) })
	if got := a.Status().Takeover; !got.At("nlm_grace_end").IsZero() || got.At("nfsv4_grace_end").IsZero() {
		t.Fatalf("marks: nlm_grace_end %v (older takeover's: want none), nfsv4_grace_end %v (want set)", got.At("nlm_grace_end"), got.At("nfsv4_grace_end"))
	}
}
