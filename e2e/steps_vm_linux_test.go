package e2e

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/timeline"
)

// Per-step timings of a failover of the real-kernel pair: where the
// seconds from the fault to the reclaimed locks go.
//
// Two clocks, never compared directly: the VMs' clocks are their own (a
// TCG guest's wall clock is set once at boot and drifts), so a VM time
// minus a host time means nothing. The host measures, on its clock, the
// fault → the VIP answering SM_STAT with the new state (a watcher polls
// it every 20 ms from the witness's namespace) and what it sees in the
// VMs (locks in /proc/locks, the grace files, the first new lock). The
// new leader's timeline (GET /v1/status, takeover) gives every step of the
// takeover on its own clock; those are shifted so that the moment it
// announced the VIP falls on the host's "VIP answers": step = host(VIP
// answers) + (step − announced) on the agent's clock. A serving leader
// takes the VIP unannounced before its hook and announces it as the hook
// returns (cluster/leader.go), so "announced" is its "on_leader hook done"
// (its "VIP taken" when it has none). The error of that anchor is the
// watcher's poll (≤ 20 ms) plus one SM_STAT round trip, all on the late
// side.

const vipWatchPoll = 20 * time.Millisecond

// vipWatch polls SM_STAT on the VIP from namespace ns until it answers
// with a state above old.
type vipWatch struct {
	t0   time.Time
	stop chan struct{}
	once sync.Once // closes stop
	done chan struct{}

	mu    sync.Mutex
	at    time.Duration // since t0; 0 while not seen
	lo    time.Duration // the start of the look before, which did not see it
	state int32         // the new state it answered
}

// watchVIP starts polling at once; t0 is the fault's time (host clock).
// It stops at seen, or when the test ends.
func watchVIP(t *testing.T, ns, vip string, old int32, t0 time.Time) *vipWatch {
	w := &vipWatch{t0: t0, stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { w.seen() })
	addr := net.JoinHostPort(vip, strconv.Itoa(nsmPort))
	go func() {
		defer close(w.done)
		// The goroutine stays on a thread in ns: every socket it dials is ns's.
		inNetnsThread(ns, func() error {
			tick := time.NewTicker(vipWatchPoll)
			defer tick.Stop()
			var prev time.Duration
			for {
				start := time.Since(w.t0)
				if st, err := smStatOnce(addr); err == nil && st > old {
					w.mu.Lock()
					w.at, w.lo, w.state = time.Since(w.t0), prev, st
					w.mu.Unlock()
					return nil
				}
				prev = start
				select {
				case <-w.stop:
					return nil
				case <-tick.C:
				}
			}
		})
	}()
	return w
}

// smStatOnce calls SM_STAT over UDP with a fresh socket (a VIP that moved
// to another machine must not be asked through a stale one).
func smStatOnce(addr string) (int32, error) {
	// Short: while the VIP is dead a look times out, and one that spans
	// the VIP's move answers late (the anchor's error).
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "udp", Addr: addr, Timeout: 100 * time.Millisecond, Retransmit: 30 * time.Millisecond})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var res nsm.SMStatRes
	if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: "e2e-steps"}, &res); err != nil {
		return 0, err
	}
	if res.Res != nsm.StatSucc {
		return 0, fmt.Errorf("SM_STAT: %s", res.Res)
	}
	return res.State, nil
}

// seen stops the watcher and returns when the VIP answered with the new
// state, in seconds after the fault (false: never), and the start of the
// look before, which did not get it: the VIP moved between the two.
func (w *vipWatch) seen() (at, lo float64, ok bool) {
	at, lo, _, ok = w.seenState()
	return at, lo, ok
}

// seenState is seen, with the new state the VIP answered.
func (w *vipWatch) seenState() (at, lo float64, state int32, ok bool) {
	w.once.Do(func() { close(w.stop) })
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at.Seconds(), w.lo.Seconds(), w.state, w.at > 0
}

// hostSteps are the steps of a failover the test sees itself, on its
// clock, each listed after a step of the new leader's timeline (package
// timeline's table), in the order they usually happen.
var hostSteps = []struct{ key, label, after string }{
	{"vip_host", "VIP answers new state (host)", "on_leader_done"},
	{"lock_3", "NFSv3 lock on the survivor (host)", "nfsv4_all_back"},
	{"lock_4.0", "NFSv4.0 lock on the survivor (host)", "lock_3"},
	{"lock_4.2", "NFSv4.2 lock on the survivor (host)", "lock_4.0"},
	{"last_activity", "last reclaim activity", "lock_4.2"},
	{"new_lock", "first new lock granted (host)", "nfsv4_grace_end"},
	{"progress", "every workload client past it (host)", "new_lock"},
}

// failoverSteps are a failover's steps, in the order they usually
// happen: the takeover's (its timeline's table) with the host's among them.
func failoverSteps() []struct{ key, label string } {
	var out []struct{ key, label string }
	for _, d := range timeline.Defs() {
		out = append(out, struct{ key, label string }{d.Name, d.Label})
	}
	for _, h := range hostSteps {
		i := slices.IndexFunc(out, func(s struct{ key, label string }) bool { return s.key == h.after })
		out = slices.Insert(out, i+1, struct{ key, label string }{h.key, h.label})
	}
	return out
}

// failoverStepsOf places the new leader's timeline tl (and its grace's
// last activity) on the host's time axis, anchored at vipHost (seconds
// after the fault when the VIP answered with the new state).
func failoverStepsOf(tl *admin.Timeline, g *admin.Status, vipHost float64) map[string]float64 {
	out := map[string]float64{"vip_host": vipHost}
	announced := time.Time{}
	if tl != nil {
		if announced = tl.At(timeline.OnLeaderDone.Name()); announced.IsZero() || announced.Year() <= 1 {
			announced = tl.At(timeline.VIP.Name())
		}
	}
	if announced.IsZero() {
		return out
	}
	put := func(key string, at time.Time) {
		if !at.IsZero() && at.Year() > 1 {
			out[key] = vipHost + at.Sub(announced).Seconds()
		}
	}
	for _, s := range tl.Steps {
		put(s.Name, s.At)
	}
	if g != nil && g.Grace != nil && g.Grace.SMState == tl.State {
		put("last_activity", g.Grace.LastActivity)
	}
	return out
}

// stepsTable is one failover's steps, in time order, with the gap to the
// step before: the rows a slow failover is read from.
// notBefore gives, for steps the host saw by polling, the time of its
// previous look.
func stepsTable(steps, notBefore map[string]float64) string {
	type row struct {
		label string
		at    float64
	}
	var rows []row
	for _, s := range failoverSteps() {
		if at, ok := steps[s.key]; ok {
			label := s.label
			if nb, ok := notBefore[s.key]; ok {
				label += fmt.Sprintf(" (> %.2f)", nb)
			}
			rows = append(rows, row{label, at})
		}
	}
	slices.SortStableFunc(rows, func(a, b row) int { return cmp.Compare(a.at, b.at) })
	var b strings.Builder
	b.WriteString("| step | s after the fault | since the step before |\n|---|---|---|\n")
	for i, r := range rows {
		gap := ""
		if i > 0 {
			gap = fmt.Sprintf("+%.2f", r.at-rows[i-1].at)
		}
		fmt.Fprintf(&b, "| %s | %6.2f | %s |\n", r.label, r.at, gap)
	}
	return b.String()
}

// stepsMatrix is every failover's steps side by side (a column per run),
// in the steps' usual order.
func stepsMatrix(names []string, runs []map[string]float64) string {
	var b strings.Builder
	b.WriteString("| step |")
	for _, n := range names {
		fmt.Fprintf(&b, " %s |", n)
	}
	b.WriteString("\n|---|")
	for range names {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, s := range failoverSteps() {
		any := false
		for _, r := range runs {
			if _, ok := r[s.key]; ok {
				any = true
			}
		}
		if !any {
			continue
		}
		fmt.Fprintf(&b, "| %s |", s.label)
		for _, r := range runs {
			if at, ok := r[s.key]; ok {
				fmt.Fprintf(&b, " %.2f |", at)
			} else {
				b.WriteString(" – |")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// takeoverSteps fetches new leader n's timeline of the takeover whose
// state the VIP watcher w saw first and places it on the host's axis. A
// node that took over again since has another timeline: no steps then.
func (p *pairTopo) takeoverSteps(n *pairNode, w *vipWatch) (map[string]float64, error) {
	vipHost, _, state, ok := w.seenState()
	if !ok {
		return nil, fmt.Errorf("the VIP watcher never saw a new state")
	}
	s, err := p.status(n)
	if err != nil {
		return nil, err
	}
	if s.Takeover == nil || s.Takeover.State != state {
		got := int32(0)
		if s.Takeover != nil {
			got = s.Takeover.State
		}
		return nil, fmt.Errorf("%s: its last takeover is of sm_state %d, the VIP first answered %d (another takeover followed): no steps", n.id, got, state)
	}
	return failoverStepsOf(s.Takeover, &s, vipHost), nil
}
