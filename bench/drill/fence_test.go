package drill

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/timeline"
)

// TestFenceFrom: the new leader's wait for the old leader is taken only
// when it belongs to this run's takeover; otherwise the report says why
// there is none.
func TestFenceFrom(t *testing.T) {
	elected := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	wait := &admin.FenceWait{At: elected.Add(9 * time.Second), Seconds: 9.4, Nodes: []admin.FencedNode{
		{Node: "nfs2", By: "clean", Seconds: 0.01}, {Node: "nfs1", By: "watchdog", Seconds: 9.4, Detail: "no answer"}}}
	s := admin.Status{NodeID: "nfs2", Fence: admin.Fence{Mode: "watchdog", LastWait: wait},
		Takeover: takeoverAt(elected, 7)}
	for _, c := range []struct {
		name  string
		tune  func(*admin.Status)
		old   string
		state int32
		by    string
		note  string
	}{
		{"this takeover's", func(*admin.Status) {}, "nfs1", 7, "watchdog", ""},
		{"an earlier takeover's wait", func(s *admin.Status) {
			s.Fence.LastWait = &admin.FenceWait{At: elected.Add(-time.Hour), Nodes: wait.Nodes}
		}, "nfs1", 7, "", "no fence wait for this takeover"},
		{"an earlier takeover", func(*admin.Status) {}, "nfs1", 9, "", "no fence wait for this takeover"},
		{"a later takeover of the same leader", func(s *admin.Status) { s.Takeover = takeoverAt(elected, 9) }, "nfs1", 7, "watchdog", "its takeover at sm_state 9"},
		{"still waiting", func(s *admin.Status) { s.Fence.LastWait = nil; s.Fence.Waiting = true }, "nfs1", 7, "", "still waiting"},
		{"no serving node", func(s *admin.Status) { s.Fence = admin.Fence{Mode: "none"} }, "nfs1", 7, "", "serves no storage"},
		{"a witness", func(*admin.Status) {}, "w", 7, "", "not a serving voter"},
		{"the old leader again", func(*admin.Status) {}, "nfs2", 7, "", "won the new term after its restart"},
		{"the old leader again, serving nothing", func(s *admin.Status) { s.Fence = admin.Fence{Mode: "none"} }, "nfs2", 7, "", "serves no storage"},
		{"aborted", func(s *admin.Status) {
			s.Fence.LastWait = &admin.FenceWait{At: elected.Add(time.Second), Aborted: "lost leadership"}
		}, "nfs1", 7, "", "aborted: lost leadership"},
	} {
		st := s
		st.Fence.LastWait = wait
		c.tune(&st)
		var f FenceOutcome
		fenceFrom(&f, st, c.old, c.state)
		if f.By != c.by || !strings.Contains(f.Note, c.note) || (c.by == "" && f.Note == "") {
			t.Errorf("%s: %+v, want by %q note ~%q", c.name, f, c.by, c.note)
		}
		if c.by == "watchdog" && (f.Seconds != 9.4 || f.Detail != "no answer" || f.Mode != "watchdog") {
			t.Errorf("%s: %+v", c.name, f)
		}
	}
}

func TestOldOutcome(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	p := &admin.Process{PID: 10, Started: t0, BootID: "a"}
	for _, c := range []struct {
		now  *admin.Process
		want string
	}{
		{&admin.Process{PID: 10, Started: t0, BootID: "a"}, OldKept},
		{&admin.Process{PID: 11, Started: t0.Add(time.Minute), BootID: "a"}, OldRestarted},
		{&admin.Process{PID: 10, Started: t0.Add(time.Minute), BootID: "a"}, OldRestarted}, // nsmd dev: a node restarted in the process
		{&admin.Process{PID: 10, Started: t0.Add(time.Minute), BootID: "b"}, OldReset},
		{&admin.Process{PID: 10, Started: t0.Add(time.Minute)}, OldRestarted},
		{nil, OldUnknown},
	} {
		if got := oldOutcome(p, c.now); got != c.want {
			t.Errorf("%+v -> %+v: %q, want %q", p, c.now, got, c.want)
		}
	}
	if oldOutcome(nil, p) != OldUnknown {
		t.Error("no process before the fault")
	}
}

// TestFenceColumn: the table, JSON and HTML reports say per run how the
// old server was proven stopped and what became of it.
func TestFenceColumn(t *testing.T) {
	rep := &Report{Date: time.Now(), Fault: FaultNSMDHang, Asked: 3, FaultDetail: "SIGSTOP of the leader's nsmd for 8s, then SIGCONT through `ip netns exec {node}`"}
	fences := []*FenceOutcome{
		{Mode: "agent", By: "agent", Seconds: 0.35, Detail: "fence_test <off>", Old: OldServer{Outcome: OldKept, Unreachable: true, BackAfterMS: 8100}},
		{Mode: "watchdog", By: "watchdog", Seconds: 9.4, Old: OldServer{Outcome: OldReset, Unreachable: true, BackAfterMS: 52000}},
		{Mode: "watchdog", By: "clean", Seconds: 0.02, Old: OldServer{Outcome: OldKept}},
	}
	for i, f := range fences {
		r := Failover{Run: i + 1, OldLeader: "n<1>", NewLeader: "n2", Fence: f}
		for _, def := range MilestoneDefs() {
			r.Milestones = append(r.Milestones, Milestone{Name: def.Name, Label: def.Label, Reached: true, After: time.Second, AfterMS: 1000})
		}
		rep.Runs = append(rep.Runs, r)
	}
	r4 := Failover{Run: 4, OldLeader: "n2", Err: "new leader elected not reached within 1s", Fence: &FenceOutcome{Mode: "none", Note: "no fence wait: the new leader serves no storage", Old: OldServer{Outcome: OldNotBack, Unreachable: true}}}
	for _, def := range MilestoneDefs() {
		r4.Milestones = append(r4.Milestones, Milestone{Name: def.Name, Label: def.Label})
	}
	rep.Runs = append(rep.Runs, r4)
	want := []string{"agent (fenced off) after 350ms", "kept running (same boot, same process), unreachable, back after 8.1s",
		"watchdog (must have reset it) after 9.4s", "reset (another boot), unreachable, back after 52s",
		"clean (it said it stopped) after 20ms", "stopped cleanly, kept running",
		"no fence wait: the new leader serves no storage", "not back"}

	var table bytes.Buffer
	if err := Print(&table, rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("table:\n%s", table.String())
	for _, w := range append(want, "PROVEN STOPPED", "fault: SIGSTOP") {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, table.String())
		}
	}
	var html bytes.Buffer
	if err := WriteReport(&html, rep); err != nil {
		t.Fatal(err)
	}
	for _, w := range append(want, "old server proven stopped", "old server afterwards", "fence_test &lt;off&gt;", "n&lt;1&gt;") {
		if !strings.Contains(html.String(), w) {
			t.Errorf("HTML lacks %q", w)
		}
	}
	if strings.Contains(html.String(), "<off>") || strings.Contains(html.String(), "n<1>") {
		t.Error("HTML does not escape")
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if f := back.Runs[1].Fence; f == nil || f.By != "watchdog" || f.Seconds != 9.4 || f.Old.Outcome != OldReset || f.Old.BackAfterMS != 52000 {
		t.Errorf("JSON round trip: %+v", back.Runs[1].Fence)
	}
	if !strings.Contains(string(b), `"by":"agent"`) || !strings.Contains(string(b), `"outcome":"kept running"`) {
		t.Errorf("JSON: %s", b)
	}
}

// TestDevRefusal: on nsmd dev the faults that need a machine of their own
// are refused saying why and what to use; the others run.
func TestDevRefusal(t *testing.T) {
	for _, f := range []string{FaultNSMDHang, FaultPartition, FaultFreeze} {
		msg := DevRefusal(f)
		for _, w := range []string{"--fault " + f + " cannot run on nsmd dev", "--node-cmd", "real cluster", "e2e", "nsmd-kill", "do not fence"} {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q lacks %q", f, msg, w)
			}
		}
		d := &runner{o: Options{Fault: f}, inProcess: true}
		if err := d.checkFault(); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s on dev: %v", f, err)
		}
	}
	for _, f := range []string{FaultTransfer, FaultKill, FaultNSMDKill, FaultKillCmd} {
		if DevRefusal(f) != "" {
			t.Errorf("%s refused on dev", f)
		}
		if err := (&runner{o: Options{Fault: f}, inProcess: true}).checkFault(); err != nil {
			t.Errorf("%s on dev: %v", f, err)
		}
	}
	d := &runner{o: Options{Fault: FaultNSMDKill, Node: NodeOptions{NodeCmd: "ssh {addr}"}}, inProcess: true}
	if err := d.checkFault(); err == nil || !strings.Contains(err.Error(), "in-process crash") {
		t.Errorf("nsmd-kill with --node-cmd on dev: %v", err)
	}
	if !d.crashes() || d.nodeLevel() {
		t.Error("nsmd-kill on dev is not the in-process crash")
	}
	// A real cluster: the node-level faults need --node-cmd.
	for _, f := range []string{FaultNSMDKill, FaultNSMDHang, FaultPartition} {
		d := &runner{o: Options{Fault: f}}
		if err := d.checkFault(); err == nil || !strings.Contains(err.Error(), "give --node-cmd") {
			t.Errorf("%s without --node-cmd: %v", f, err)
		}
		if d.crashes() || !d.nodeLevel() {
			t.Errorf("%s on a real cluster is not node-level", f)
		}
	}
}

func TestTarget(t *testing.T) {
	d := &runner{members: []admin.Member{{ID: "n1", RaftAddr: "10.77.0.1:7300"}}}
	for _, c := range []struct {
		n    Node
		want string
	}{
		{Node{ID: "n1", Admin: "10.77.0.1:8024"}, "10.77.0.1"},
		{Node{ID: "n1", Admin: "[fd00::1]:8024"}, "fd00::1"},
		{Node{ID: "n1", Admin: "0.0.0.0:8024", NSMAddr: "0.0.0.0:662"}, "10.77.0.1"},
		{Node{ID: "n1", NSMAddr: "10.77.0.9:662"}, "10.77.0.9"},
	} {
		if got := d.target(c.n); got.Addr != c.want || got.ID != "n1" {
			t.Errorf("%+v: %+v, want addr %s", c.n, got, c.want)
		}
	}
}

// takeoverAt is the timeline of a takeover at sm_state state elected at
// elected, as GET /v1/status gives it.
func takeoverAt(elected time.Time, state int32) *admin.Timeline {
	tl := timeline.Timeline{State: state}
	tl.Mark(timeline.Elected, elected)
	t := admin.TimelineOf(tl)
	return &t
}
