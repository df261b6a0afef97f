package agent_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// statPoller asks one NSM address for SM_STAT over UDP as fast as answers
// come: one call outstanding, the next sent as soon as it is answered or
// after 1 ms without an answer (a node that is not ready answers nothing).
// Its socket is unconnected, so it can start before the node's socket
// exists (ICMP port unreachable does not reach it). Every answer is
// checked as it arrives:
//   - stat_succ with an odd state;
//   - not lower than any answer received before its call was sent;
//   - above the state given to requireAbove, for calls sent after it.
type statPoller struct {
	name string
	pc   net.PacketConn
	to   net.Addr

	mu        sync.Mutex
	xid       uint32           // last XID sent
	floor     map[uint32]int32 // per call: highest state answered before it was sent
	max       int32            // highest state answered so far
	above     int32            // calls from aboveFrom on must answer more than this
	aboveFrom uint32
	answers   []pollAnswer
	bad       []string
	answered  chan struct{} // a token after each answer, for the sender
	news      chan struct{} // a token after each answer, for waitAnswer

	done chan struct{}
	wg   sync.WaitGroup
}

type pollAnswer struct {
	xid   uint32
	state int32
	at    time.Time
}

func newStatPoller(t *testing.T, name, addr string) *statPoller {
	t.Helper()
	to, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &statPoller{name: name, pc: pc, to: to, floor: map[uint32]int32{}, max: -1, above: -1,
		answered: make(chan struct{}, 1), news: make(chan struct{}, 1), done: make(chan struct{})}
	p.wg.Go(p.receive)
	p.wg.Go(p.send)
	t.Cleanup(p.stop)
	return p
}

func (p *statPoller) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	p.pc.Close()
	p.wg.Wait()
}

// statCall encodes an SM_STAT call (RFC 5531, AUTH_NONE).
func statCall(xid uint32) []byte {
	w := oncrpc.NewWriter(make([]byte, 0, 64))
	oncrpc.CallHeader{XID: xid, Prog: nsm.Program.Prog, Vers: nsm.Program.Vers, Proc: nsm.ProcStat}.MarshalXDR(w)
	(&nsm.SMName{MonName: "ready-test"}).MarshalXDR(w)
	return w.Bytes()
}

// parseStatReply decodes an accepted, successful reply to SM_STAT.
func parseStatReply(b []byte) (uint32, nsm.SMStatRes, error) {
	r := oncrpc.NewReader(b)
	var h oncrpc.ReplyHeader
	var res nsm.SMStatRes
	if err := h.UnmarshalXDR(r); err != nil {
		return h.XID, res, err
	}
	if h.Stat != oncrpc.ReplyAccepted || h.AcceptStat != oncrpc.AcceptSuccess {
		return h.XID, res, fmt.Errorf("reply_stat %d, accept_stat %d", h.Stat, h.AcceptStat)
	}
	if err := res.UnmarshalXDR(r); err != nil {
		return h.XID, res, err
	}
	return h.XID, res, r.Done()
}

func (p *statPoller) send() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		p.mu.Lock()
		p.xid++
		xid := p.xid
		p.floor[xid] = p.max
		p.mu.Unlock()
		if _, err := p.pc.WriteTo(statCall(xid), p.to); err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
		t.Reset(time.Millisecond)
		select {
		case <-p.done:
			return
		case <-p.answered:
		case <-t.C:
		}
	}
}

func (p *statPoller) receive() {
	buf := make([]byte, 1500)
	for {
		n, _, err := p.pc.ReadFrom(buf)
		if err != nil {
			return // closed by stop
		}
		xid, res, err := parseStatReply(buf[:n])
		now := time.Now()
		p.mu.Lock()
		floor, sent := p.floor[xid]
		delete(p.floor, xid)
		switch {
		case err != nil:
			p.bad = append(p.bad, fmt.Sprintf("XID %d: bad reply: %v", xid, err))
		case !sent:
			p.bad = append(p.bad, fmt.Sprintf("reply to XID %d, not sent or answered twice", xid))
		case res.Res != nsm.StatSucc || res.State%2 != 1:
			p.bad = append(p.bad, fmt.Sprintf("XID %d: answered %+v: not stat_succ with an odd state", xid, res))
		case res.State < floor:
			p.bad = append(p.bad, fmt.Sprintf("XID %d: answered state %d after %d had been answered", xid, res.State, floor))
		case xid >= p.aboveFrom && res.State <= p.above:
			p.bad = append(p.bad, fmt.Sprintf("XID %d: answered state %d, the previous incarnation's (a newer one exists)", xid, res.State))
		}
		if err == nil {
			p.answers = append(p.answers, pollAnswer{xid: xid, state: res.State, at: now})
			p.max = max(p.max, res.State)
		}
		p.mu.Unlock()
		for _, ch := range []chan struct{}{p.answered, p.news} {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// requireAbove makes every call sent from now on fail the test if it is
// answered with state old or lower: the node serving old is gone and a
// newer incarnation exists (or is about to).
func (p *statPoller) requireAbove(old int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.above, p.aboveFrom = old, p.xid+1
}

// waitAnswer waits until a call sent after it started is answered with
// state want, and says after how many calls since it started.
func (p *statPoller) waitAnswer(t *testing.T, want int32, timeout time.Duration) (calls uint32) {
	t.Helper()
	p.mu.Lock()
	from := p.xid + 1
	p.mu.Unlock()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		for _, a := range p.answers {
			if a.xid >= from && a.state == want {
				p.mu.Unlock()
				return a.xid - from + 1
			}
		}
		last := int32(-1)
		if len(p.answers) > 0 {
			last = p.answers[len(p.answers)-1].state
		}
		p.mu.Unlock()
		select {
		case <-p.news:
		case <-deadline.C:
			t.Fatalf("%s: no SM_STAT answer with state %d within %v (last answer %d)", p.name, want, timeout, last)
		}
	}
}

// check fails the test for every bad answer seen and returns the counts.
func (p *statPoller) check(t *testing.T) (sent uint32, answered int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, b := range p.bad {
		if i == 10 {
			t.Errorf("%s: and %d more", p.name, len(p.bad)-i)
			break
		}
		t.Errorf("%s: %s", p.name, b)
	}
	return p.xid, len(p.answers)
}

// readyDev returns dev-cluster options for nodes on fresh ports, without
// admin API; the caller starts polling before agent.StartDev.
func readyDev(t *testing.T, vip string, nodes int) agent.DevOptions {
	t.Helper()
	ips := []string{vip}
	for i := range nodes {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", i+1))
	}
	return agent.DevOptions{
		Nodes: nodes, DataDir: t.TempDir(), VIP: vip, LogLevel: "warn",
		NSMPort: testutil.FreePort(t, ips...), RaftPort: testutil.FreePort(t, ips...), GossipPort: testutil.FreePort(t, ips...),
	}
}

func readyAgentOptions() agent.Options {
	return agent.Options{Logger: agenttest.Logger(slog.LevelWarn), Crash: func(a *agent.Agent) { a.Kill() }}
}

// restartAgent kills d's agent i as SIGKILL would and starts it again on
// the same configuration and data directory.
func restartAgent(t *testing.T, d *agent.Dev, i int, between func()) *agent.Agent {
	t.Helper()
	old := d.Agent(i)
	old.Kill()
	old.Close() // what kill left: the hook runner
	if between != nil {
		between()
	}
	a, err := agent.Start(old.Config(), readyAgentOptions())
	if err != nil {
		t.Fatalf("restart %s: %v", old.Config().NodeID, err)
	}
	d.SetAgent(i, a)
	return a
}

// The readiness rule end to end: SM_STAT polled over UDP from before the node's
// socket exists, during a fresh single node's start and during its kill
// and restart on the same data directory. Every answer is an odd state,
// never lower than one answered before, after the restart never the
// previous incarnation's; and answers do come once the node is ready.
func TestReadySingleNodeStartAndRestartAnswerOnlyTheCurrentState(t *testing.T) {
	o := readyDev(t, "127.0.0.140", 1)
	p := newStatPoller(t, "node1", fmt.Sprintf("127.0.0.1:%d", o.NSMPort))
	d, err := agent.StartDev(o, readyAgentOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	calls := p.waitAnswer(t, 1, 10*time.Second)
	a := d.Agent(0)
	if !a.Node().Ready() || a.Node().View().State() != 1 {
		t.Fatalf("answered 1 while ready %v, sm_state %d", a.Node().Ready(), a.Node().View().State())
	}
	t.Logf("fresh node: first answer after %d calls", calls)

	// With a snapshot, the restarted node holds sm_state 1 from its first
	// instant, not only once it replayed its log.
	if err := a.Node().Snapshot(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	restartAgent(t, d, 0, func() { p.requireAbove(1) })
	calls = p.waitAnswer(t, 3, 10*time.Second)
	t.Logf("restarted node: first answer after %d calls", calls)
	sent, answered := p.check(t)
	if answered == 0 || int(sent) == answered {
		t.Fatalf("%d calls, %d answered: the poll proves nothing", sent, answered)
	}
	t.Logf("%d SM_STAT calls, %d answered", sent, answered)
}

// The same for every node of a three-node cluster from its start, and for
// a follower killed and restarted twice: once into the same incarnation,
// once after the other two moved on to a new one (leadership transfer)
// while it was down, so that its log replays the previous incarnation's
// state before the current one.
func TestReadyRestartedFollowerAnswersOnlyTheCurrentState(t *testing.T) {
	o := readyDev(t, "127.0.0.141", 3)
	polls := make([]*statPoller, 3)
	for i := range polls {
		polls[i] = newStatPoller(t, fmt.Sprintf("node%d", i+1), fmt.Sprintf("127.0.0.%d:%d", i+1, o.NSMPort))
	}
	d, err := agent.StartDev(o, readyAgentOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	s1 := lead.Node().View().State()
	for _, p := range polls {
		p.waitAnswer(t, s1, 10*time.Second)
	}
	fi := slices.IndexFunc(d.Agents(), func(a *agent.Agent) bool { return a != lead })
	oi := slices.IndexFunc(d.Agents(), func(a *agent.Agent) bool { return a != lead && a != d.Agent(fi) })
	fp := polls[fi]

	// Same incarnation: the follower answers s1 again once it caught up.
	restartAgent(t, d, fi, nil)
	t.Logf("%s restarted, same incarnation: answered after %d calls", fp.name, fp.waitAnswer(t, s1, 10*time.Second))

	// A new incarnation while it is down. Its snapshot holds the previous
	// one, which it has from its first instant and until it has caught up.
	if err := d.Agent(fi).Node().Snapshot(); err != nil {
		t.Fatalf("snapshot on %s: %v", fp.name, err)
	}
	restartAgent(t, d, fi, func() {
		fp.requireAbove(s1)
		if err := lead.Node().TransferLeadership(d.Agent(oi).Config().NodeID); err != nil {
			t.Fatalf("transfer to %s: %v", d.Agent(oi).Config().NodeID, err)
		}
		nl := agenttest.Leader(t, d, lead, 10*time.Second)
		if st := nl.Node().View().State(); st != s1+2 {
			t.Fatalf("sm_state after the transfer %d, want %d", st, s1+2)
		}
	})
	t.Logf("%s restarted into a new incarnation: answered after %d calls", fp.name, fp.waitAnswer(t, s1+2, 10*time.Second))
	for i, p := range polls {
		p.waitAnswer(t, s1+2, 10*time.Second)
		sent, answered := p.check(t)
		t.Logf("%s: %d SM_STAT calls, %d answered", p.name, sent, answered)
		if i == fi && int(sent) == answered {
			t.Errorf("every call to the restarted follower was answered: the poll proves nothing")
		}
	}
}
