package grace

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/timeline"
)

// fsmCluster is a Cluster over a real state machine: each command is
// applied at once, as a lone node's leader applies it once committed, and
// the state machine's observer feeds the Service as the cluster's does.
type fsmCluster struct {
	t *testing.T
	f *fsm.FSM
	s *Service // observes applied commands once set

	mu       sync.Mutex
	index    uint64
	timeline timeline.Timeline
	commands []string // client-tracking commands committed, in order
}

func newFSMCluster(t *testing.T) *fsmCluster {
	c := &fsmCluster{t: t}
	c.f = fsm.New(fsm.Options{Observer: func(index uint64, cmd fsm.Command, res fsm.Result) {
		if c.s != nil {
			c.s.Observe(index, cmd, res)
		}
	}})
	return c
}

func (c *fsmCluster) apply(cmds ...fsm.Command) {
	c.t.Helper()
	b, err := fsm.Encode(cmds...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.index++
	i := c.index
	c.mu.Unlock()
	if err, ok := c.f.Apply(&raft.Log{Index: i, Type: raft.LogCommand, Data: b}).(error); ok {
		c.t.Fatalf("apply %T: %v", cmds[0], err)
	}
}

func (c *fsmCluster) record(s string) {
	c.mu.Lock()
	c.commands = append(c.commands, s)
	c.mu.Unlock()
}

// takeover commits a takeover and starts its timeline, as the leader
// loop does.
func (c *fsmCluster) takeover(at time.Time) int32 {
	c.apply(fsm.Takeover{Node: "n1", MinState: c.f.State() + 1, GraceUntil: at.Add(90 * time.Second), At: at})
	c.mu.Lock()
	c.timeline = timeline.Timeline{State: c.f.State()}
	c.timeline.Mark(timeline.Elected, at)
	c.mu.Unlock()
	return c.f.State()
}

func (c *fsmCluster) State() int32         { return c.f.State() }
func (c *fsmCluster) AppliedIndex() uint64 { return c.f.AppliedIndex() }
func (c *fsmCluster) MonitoredHosts() []string {
	var out []string
	for _, t := range c.f.Targets() {
		out = append(out, t.MonName)
	}
	return out
}
func (c *fsmCluster) Epochs() (uint64, uint64)               { return c.f.Epochs() }
func (c *fsmCluster) V4Clients(recovery bool) []fsm.V4Client { return c.f.V4Clients(recovery) }
func (c *fsmCluster) HasV4Client(name string) (bool, bool)   { return c.f.HasV4Client(name) }

func (c *fsmCluster) TrackCreate(_ context.Context, name, princ string) error {
	c.record("create " + name)
	c.apply(fsm.ClientCreate{Name: name, PrincHash: princ})
	return nil
}

func (c *fsmCluster) TrackRemove(_ context.Context, name string) error {
	c.record("remove " + name)
	c.apply(fsm.ClientRemove{Name: name})
	return nil
}

func (c *fsmCluster) TrackCheck(_ context.Context, name string) (bool, error) {
	c.record("check " + name)
	_, rec := c.f.HasV4Client(name)
	c.apply(fsm.ClientCheck{Name: name})
	return rec, nil
}

func (c *fsmCluster) TrackGraceStart(context.Context) ([]fsm.V4Client, error) {
	c.record("grace_start")
	c.apply(fsm.GraceStart{})
	return c.f.V4Clients(true), nil
}

func (c *fsmCluster) TrackGraceDone(context.Context) error {
	c.record("grace_done")
	c.apply(fsm.GraceDone{})
	return nil
}

func (c *fsmCluster) MarkTimeline(state int32, mark func(*timeline.Timeline)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timeline.State == state {
		mark(&c.timeline)
	}
}

func (c *fsmCluster) lastTimeline() timeline.Timeline {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timeline
}

// nfsdClient writes client id's info file as Linux writes it (see
// nfsdclients_test.go), or removes it for an empty status.
func nfsdClient(t *testing.T, proc, id, name string, minor int, status string) {
	t.Helper()
	d := filepath.Join(proc, "fs", "nfsd", "clients", id)
	if status == "" {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	info := fmt.Sprintf("clientid: 0x%s\naddress: \"10.77.0.23:833\"\nstatus: %s\nname: %q\nminor version: %d\n", id, status, name, minor)
	if err := os.WriteFile(filepath.Join(d, "info"), []byte(info), 0o644); err != nil {
		t.Fatal(err)
	}
}

func recoveryNames(recs []cld.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Name))
	}
	slices.Sort(out)
	return out
}

// failoverScript runs three server incarnations against one table and one
// fake nfsd (a shared procfs root: the shipped hook's one server scope):
// the first records an NFSv4.0 client and an NFSv4.1 client; after the
// first failover both reclaim — the v4.1 one with RECLAIM_COMPLETE (a
// Create), the v4.0 one only by showing up confirmed in nfsd's client
// list — and grace ends; after the second failover the new nfsd's
// GraceStart must hand both back. It returns the clients that may reclaim
// at the second failover. carry chooses the carry-over rule in force.
func failoverScript(t *testing.T, carry func(context.Context, Cluster, string, *slog.Logger) error) []string {
	ctx := context.Background()
	proc := t.TempDir()
	c := newFSMCluster(t)
	now := time.Unix(10_000, 0)
	s, err := New(Config{Proc: proc, Now: func() time.Time { return now }, Auto: true}, c)
	if err != nil {
		t.Fatal(err)
	}
	s.carry = carry
	c.s = s
	store := s.Tracking()
	const v40, v41 = "Linux NFSv4.0 c40/10.77.0.12 tcp", "Linux NFSv4.1 c41"

	// The first incarnation: nfsd starts with nothing to reclaim; both
	// clients mount (the v4.0 client's OPEN_CONFIRM and the v4.1 client's
	// RECLAIM_COMPLETE each send a Create).
	s.Takeover(c.takeover(now))
	if recs, err := store.GraceStart(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("first GraceStart: %v %v", recs, err)
	}
	if err := store.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{v40, v41} {
		if err := store.Create(ctx, []byte(n), []byte("p:"+n[:13])); err != nil {
			t.Fatal(err)
		}
	}
	nfsdClient(t, proc, "1", v40, 0, "confirmed")
	nfsdClient(t, proc, "2", v41, 1, "confirmed")

	// The first failover: a new nfsd (its client list starts empty).
	nfsdClient(t, proc, "1", "", 0, "")
	nfsdClient(t, proc, "2", "", 0, "")
	s.Takeover(c.takeover(now))
	recs, err := store.GraceStart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := recoveryNames(recs), []string{v40, v41}; !slices.Equal(got, want) {
		t.Fatalf("first failover: GraceStart sent %q, want %q", got, want)
	}
	// Both reclaim: the v4.1 client ends with RECLAIM_COMPLETE, the v4.0
	// client is confirmed (its reclaimed opens need no OPEN_CONFIRM: no
	// Create). A client that is not of the recovery epoch and one not
	// confirmed yet are listed too.
	if err := store.Create(ctx, []byte(v41), []byte("p:"+v41[:13])); err != nil {
		t.Fatal(err)
	}
	nfsdClient(t, proc, "3", v40, 0, "confirmed")
	nfsdClient(t, proc, "4", v41, 1, "confirmed")
	nfsdClient(t, proc, "5", "Linux NFSv4.0 stranger", 0, "confirmed")
	nfsdClient(t, proc, "6", "Linux NFSv4.0 half-way", 0, "unconfirmed")
	if err := store.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}

	// The second failover.
	s.Takeover(c.takeover(now))
	recs, err = store.GraceStart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return recoveryNames(recs)
}

// TestNFSv40ClientThatReclaimedCanReclaimAfterTheNextFailover checks
// invariant 8 for the client whose reclaim leaves no trace in the table
// (NFSv4.0), and its negative control: without the carry-over rule the
// same script loses it.
func TestNFSv40ClientThatReclaimedCanReclaimAfterTheNextFailover(t *testing.T) {
	want := []string{"Linux NFSv4.0 c40/10.77.0.12 tcp", "Linux NFSv4.1 c41"}
	if got := failoverScript(t, CarryV40); !slices.Equal(got, want) {
		t.Fatalf("second failover: GraceStart sent %q, want %q", got, want)
	}
	// The negative control: the rule disabled, the check above catches
	// the lost client.
	noCarry := func(context.Context, Cluster, string, *slog.Logger) error { return nil }
	if got := failoverScript(t, noCarry); slices.Equal(got, want) {
		t.Fatalf("without the carry-over rule the second failover still sent %q: the script does not catch a lost NFSv4.0 client", got)
	}
}

// TestCarryV40CarriesOnlyConfirmedV40ClientsOfTheRecoveryEpoch: which of
// nfsd's clients the rule records in the new epoch, and that it commits
// nothing without nfsd or when the list cannot be read.
func TestCarryV40CarriesOnlyConfirmedV40ClientsOfTheRecoveryEpoch(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	setup := func(t *testing.T) *fsmCluster {
		c := newFSMCluster(t)
		c.takeover(time.Unix(1, 0))
		for _, n := range []string{"v40 back", "v40 back already current", "v40 unconfirmed", "v40 courtesy", "v41 back", "v40 not back"} {
			c.apply(fsm.ClientCreate{Name: n, PrincHash: "p:" + n})
		}
		c.apply(fsm.GraceStart{})
		c.apply(fsm.ClientCreate{Name: "v40 back already current", PrincHash: "p"})
		return c
	}
	t.Run("kernel list", func(t *testing.T) {
		c := setup(t)
		proc := t.TempDir()
		nfsdClient(t, proc, "1", "v40 back", 0, "confirmed")
		nfsdClient(t, proc, "2", "v40 back already current", 0, "confirmed")
		nfsdClient(t, proc, "3", "v40 unconfirmed", 0, "unconfirmed")
		nfsdClient(t, proc, "4", "v40 courtesy", 0, "courtesy")
		nfsdClient(t, proc, "5", "v41 back", 1, "confirmed")
		nfsdClient(t, proc, "6", "v40 new client", 0, "confirmed")
		if err := CarryV40(ctx, c, proc, log); err != nil {
			t.Fatal(err)
		}
		if want := []string{"create v40 back"}; !slices.Equal(c.commands, want) {
			t.Fatalf("committed %q, want %q", c.commands, want)
		}
		for _, r := range c.f.V4Clients(false) {
			if r.Name == "v40 back" && r.PrincHash != "p:v40 back" {
				t.Fatalf("carried with principal hash %q, want the recovery record's", r.PrincHash)
			}
		}
	})
	t.Run("no nfsd", func(t *testing.T) {
		c := setup(t)
		if err := CarryV40(ctx, c, t.TempDir(), log); err != nil || len(c.commands) != 0 {
			t.Fatalf("no nfsd: %v, committed %q", err, c.commands)
		}
	})
	t.Run("unreadable list", func(t *testing.T) {
		c := setup(t)
		proc := t.TempDir()
		nfsdClient(t, proc, "1", "v40 back", 0, "confirmed")
		if err := os.WriteFile(filepath.Join(proc, "fs/nfsd/clients/1/info"), []byte("garbage\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		var logged bytes.Buffer
		err := CarryV40(ctx, c, proc, slog.New(slog.NewTextHandler(&logged, nil)))
		if err != nil || len(c.commands) != 0 || !strings.Contains(logged.String(), "not carried over") {
			t.Fatalf("unreadable list: %v, committed %q, logged %q", err, c.commands, logged.String())
		}
	})
}

// TestServiceMarksTheTimelineAndTheHookFile: a term's grace as the rest
// of the node sees it — the timeline's steps (a client back, the last
// one, nfsd's GraceStart, each grace's end), only commands applied after
// the takeover counting, status and the hook's file.
func TestServiceMarksTheTimelineAndTheHookFile(t *testing.T) {
	ctx := context.Background()
	proc := fakeProc(t, "N\n", "N\n")
	file := filepath.Join(t.TempDir(), "status")
	c := newFSMCluster(t)
	clk := &fakeClock{t: time.Unix(20_000, 0)}
	s, err := New(Config{Proc: proc, Now: clk.now, Settle: time.Second, Auto: true, StatusFile: file}, c)
	if err != nil {
		t.Fatal(err)
	}
	c.s = s
	s.PipeChanged("waiting", "")
	reg := func(host string) fsm.Command {
		return fsm.Register{Reg: fsm.Registration{ID: fsm.MonID{MonName: host, My: fsm.MyID{MyName: "srv", Prog: 100021, Vers: 4, Proc: 16}},
			Node: "n1", Callback: netip.MustParseAddr("127.0.0.1"), Added: clk.now()}}
	}
	c.apply(reg("h1"), reg("h2"))
	state := c.takeover(clk.now())
	s.Takeover(state)
	if st := s.Status(); st == nil || st.NLM.Expected != 2 || st.SMState != state {
		t.Fatalf("status after takeover: %+v", st)
	}

	clk.add(time.Second)
	if _, err := s.Tracking().GraceStart(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); string(b) != fmt.Sprintf("state=waiting\nerror=\ngrace_start_sm_state=%d\n", state) {
		t.Fatalf("hook file %q", b)
	}
	clk.add(time.Second)
	c.apply(reg("h1"))
	clk.add(time.Second)
	c.apply(reg("h2"))
	for k := s.keeper; !k.step(); clk.add(time.Second) {
	}
	tl := c.lastTimeline()
	for _, w := range []struct {
		s  timeline.Step
		at int
	}{{timeline.NFSdGraceStart, 1}, {timeline.NLMFirstBack, 2}, {timeline.NLMAllBack, 3}, {timeline.NFSv4GraceEnd, 3}, {timeline.NLMGraceEnd, 4}} {
		if got := tl.At(w.s); !got.Equal(time.Unix(20_000+int64(w.at), 0)) {
			t.Errorf("%s at %v, want +%ds", w.s, got, w.at)
		}
	}
	st := s.Status()
	if st.NLM.Ended == nil || st.NLM.Ended.Reason != ReasonAllReclaimed || st.NFSv4.Ended == nil || st.NFSv4.Ended.Reason != ReasonNothingToReclaim {
		t.Fatalf("status %+v", st)
	}
	if gs, at := s.LastGraceStart(); gs != state || !at.Equal(time.Unix(20_001, 0)) {
		t.Fatalf("last grace start %d %v", gs, at)
	}
}

// Only an SM_MON taken on this node, and not refused, is a client coming
// back to this node's lockd: one taken on another member (a local user
// there naming the host) or refused by the ownership rule does not count
// toward the end of lockd's grace; the serving node's own does. The
// control, a Service that does not know its node, counts the other
// member's.
func TestOnlyThisNodesSMMonIsAClientBack(t *testing.T) {
	for _, node := range []string{"n1", ""} {
		t.Run("node="+node, func(t *testing.T) {
			c := newFSMCluster(t)
			clk := &fakeClock{t: time.Unix(30_000, 0)}
			s, err := New(Config{Node: node, Proc: fakeProc(t, "Y\n", "Y\n"), Now: clk.now, Settle: time.Second, Auto: true}, c)
			if err != nil {
				t.Fatal(err)
			}
			c.s = s
			reg := func(host, by string, guarded bool) fsm.Command {
				return fsm.Register{Reg: fsm.Registration{ID: fsm.MonID{MonName: host, My: fsm.MyID{MyName: "srv", Prog: 100021, Vers: 4, Proc: 16}},
					Node: by, Callback: netip.MustParseAddr("127.0.0.1"), Added: clk.now()}, Guarded: guarded}
			}
			c.apply(reg("h1", "n1", true), reg("h2", "n1", true))
			s.Takeover(c.takeover(clk.now()))
			back := func() int { return s.Status().NLM.Back }
			c.apply(reg("h1", "witness", true)) // refused: n1's lockd made it
			c.apply(reg("h2", "n2", false))     // taken on n2, another member
			want := map[string]int{"n1": 0, "": 1}[node]
			if n := back(); n != want {
				t.Fatalf("%d clients back after SM_MONs taken on other members, want %d", n, want)
			}
			c.apply(reg("h1", "n1", true))
			if n := back(); n != want+1 {
				t.Fatalf("%d clients back after the serving node's lockd's SM_MON, want %d", n, want+1)
			}
		})
	}
}
