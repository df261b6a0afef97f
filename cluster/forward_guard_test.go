package cluster

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

// sendForward calls APPLY on the node at addr with args as given.
func sendForward(t *testing.T, addr string, args *fwdArgs) fwdRes {
	t.Helper()
	cl, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: "tcp", Addr: addr, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var res fwdRes
	if err := cl.Call(context.Background(), ForwardProgram.Prog, ForwardProgram.Vers, fwdProcApply, args, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// keyed is a forwarded write of cmd, sent at sent, with the test
// cluster's key.
func keyed(t *testing.T, cmd fsm.Command, sent time.Time) *fwdArgs {
	t.Helper()
	data, err := fsm.Encode(cmd)
	if err != nil {
		t.Fatal(err)
	}
	a := &fwdArgs{SentNS: sent.UnixNano(), Cmd: data}
	a.MAC = fwdMAC([]byte("test-cluster-key"), a.SentNS, data)
	return a
}

// The forwarding program takes from a follower only what a follower
// forwards, once, and only when fresh: a captured write replayed is
// refused, as is one whose timestamp is outside the window, and the
// commands a follower never forwards (NFSv4 tracking, a leader's
// takeover, a takeover at the end of the state range) are refused even
// with a valid MAC. Read-only queries still answer.
func TestForwardingTakesOnlyFreshFollowerWrites(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	_, leader := c.leader(5 * time.Second)
	before := leader.n.View().State()

	reg := fsm.Register{Reg: testReg("10.77.1.1", "n2", 1)}
	captured := keyed(t, reg, time.Now())
	if res := sendForward(t, leader.nsmAddr, captured); res.Status != fwdOK {
		t.Fatalf("a fresh forwarded SM_MON: %+v", res)
	}
	if res := sendForward(t, leader.nsmAddr, captured); res.Status != fwdDenied || !strings.Contains(res.Err, "replayed") {
		t.Fatalf("the same write replayed: %+v, want denied as replayed", res)
	}
	if res := sendForward(t, leader.nsmAddr, keyed(t, reg, time.Now().Add(-time.Minute))); res.Status != fwdDenied || !strings.Contains(res.Err, "timestamp off") {
		t.Fatalf("a write a minute old: %+v, want denied", res)
	}
	for _, cmd := range []fsm.Command{
		fsm.GraceDone{},
		fsm.ClientRemove{Name: "client"},
		fsm.Takeover{Node: "n2", Reason: "leader_elected"},
		fsm.Takeover{Node: "n2", Reason: reasonSimuCrash, MinState: math.MaxInt32},
	} {
		if res := sendForward(t, leader.nsmAddr, keyed(t, cmd, time.Now())); res.Status != fwdDenied {
			t.Fatalf("forwarded %#v: %+v, want denied", cmd, res)
		}
	}
	if st := leader.n.View().State(); st != before {
		t.Fatalf("sm_state %d after refused forwards, was %d", st, before)
	}
	// A forwarded SM_SIMU_CRASH is taken, with the leader's own grace window.
	far := time.Now().Add(100 * 24 * time.Hour)
	sc := fsm.Takeover{Node: "n2", Reason: reasonSimuCrash, GraceUntil: far, At: far}
	if res := sendForward(t, leader.nsmAddr, keyed(t, sc, time.Now())); res.Status != fwdOK || res.State != before+2 {
		t.Fatalf("a forwarded SM_SIMU_CRASH: %+v, want sm_state %d", res, before+2)
	}
	if g := leader.n.fsm.GraceUntil(); g.After(time.Now().Add(time.Hour)) {
		t.Fatalf("the forwarded takeover's grace window (until %v) was taken as sent", g)
	}
	if askVIPHeld(t, leader.nsmAddr) != leader.n.IsLeader() {
		t.Fatal("the read-only VIP query changed its answer")
	}
}

// The replay cache forgets a MAC once its timestamp can no longer pass,
// and refuses new ones while full.
func TestReplayCacheExpiresAndBounds(t *testing.T) {
	var c replayCache
	mac := func(i int) []byte {
		b := make([]byte, 32)
		b[0], b[1], b[2] = byte(i), byte(i>>8), byte(i>>16)
		return b
	}
	t0 := time.Unix(1e9, 0)
	if err := c.add(mac(1), t0); err != nil {
		t.Fatal(err)
	}
	if err := c.add(mac(1), t0.Add(2*fwdMaxSkew-time.Second)); err != errReplayed {
		t.Fatalf("replay within the window: %v", err)
	}
	if err := c.add(mac(1), t0.Add(2*fwdMaxSkew+time.Second)); err != nil {
		t.Fatalf("after the window (the timestamp check refuses it then): %v", err)
	}
	t1 := t0.Add(time.Hour)
	for i := range fwdReplayMax {
		if err := c.add(mac(i+10), t1); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	if err := c.add(mac(1<<20), t1); err != errReplayFull {
		t.Fatalf("full cache: %v", err)
	}
	if err := c.add(mac(1<<20), t1.Add(2*fwdMaxSkew+time.Second)); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if len(c.seen) != 1 {
		t.Fatalf("%d entries kept after expiry, want 1", len(c.seen))
	}
}

// A forwarded UnregisterAll with an Owner (kind 12) reaching a leader that
// does not see every member apply it is lowered there: only the owner's
// registrations go, as owner-less Unregisters every member applies.
func TestLeaderLowersAForwardedOwnerCommand(t *testing.T) {
	logs := map[string]*unregLog{}
	c := newTestCluster(t, 3, func(cfg *Config) {
		l := &unregLog{}
		logs[cfg.NodeID] = l
		cfg.Subscribers = append(cfg.Subscribers, Subscriber{Applied: l.observe})
	})
	_, leader := c.leader(5 * time.Second)
	ownedRegs(t, leader.n, "lead", 3)
	my := fsm.MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}
	for _, owner := range []string{"someone-else", leader.id} {
		cmd := fsm.UnregisterAll{My: my, Owner: lockdOn(owner)}
		if res := sendForward(t, leader.nsmAddr, keyed(t, cmd, time.Now())); res.Status != fwdOK {
			t.Fatalf("forwarded %+v: %+v", cmd, res)
		}
		want := 3
		if owner == leader.id {
			want = 0
		}
		if n := leader.n.fsm.Len(); n != want {
			t.Fatalf("after a forwarded SM_UNMON_ALL of %s's lockd: %d registrations, want %d", owner, n, want)
		}
	}
	for _, cmd := range logs[leader.id].take() {
		if u, ok := cmd.(fsm.Unregister); !ok || !u.Owner.IsZero() {
			t.Fatalf("the leader applied %#v without every member at level 1", cmd)
		}
	}
}

// Denied forwarded writes are logged at most once a minute per sender
// address: anyone may call the forwarding program on the NSM port, and a
// flood of forgeries must not write the journal full.
func TestForwardDenialsLoggedOncePerMinutePerSender(t *testing.T) {
	var buf testutil.LockedBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var d denialLog
	for range 100 {
		d.warn(log, netip.MustParseAddr("192.0.2.1"), errors.New("bad MAC"))
	}
	d.warn(log, netip.MustParseAddr("192.0.2.2"), errors.New("bad MAC"))
	if n := len(buf.Lines("forwarded write denied")); n != 2 {
		t.Fatalf("%d log lines for 101 denials from two senders, want 2:\n%s", n, buf.String())
	}
}

// answeringLeader answers every forwarded write with one failure text.
type answeringLeader struct{ err string }

func (a answeringLeader) ServeRPC(_ context.Context, _ *oncrpc.Call, res *oncrpc.Writer) error {
	out := fwdRes{Status: fwdFailed, Err: a.err}
	out.MarshalXDR(res)
	return nil
}

// TestForwardTellsALeaderThatCannotDecodeTheCommand: a leader of a
// release that predates a command's kind answers that it cannot decode it
// (the previous release's words below); forward reports errRefusedKind, so
// an owner command is lowered on the follower. Any other failure of the
// leader is worth a retry, never a lowering.
func TestForwardTellsALeaderThatCannotDecodeTheCommand(t *testing.T) {
	c := newTestCluster(t, 1, nil)
	n := c.nodes[0].n
	cmd := fsm.UnregisterAll{My: fsm.MyID{MyName: "srv", Prog: 100021, Vers: 3, Proc: 16}, Owner: lockdOn("n1")}
	for _, tc := range []struct {
		answer string
		want   error
	}{
		{"want one command: fsm: malformed command: unknown command kind 12", errRefusedKind},
		{"raft: leadership lost while committing log", errRetry},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := oncrpc.NewServer(oncrpc.Programs{ForwardProgram: answeringLeader{tc.answer}}, oncrpc.ServerConfig{})
		go srv.ServeTCP(ln)
		_, err = n.forward(context.Background(), ln.Addr().String(), cmd)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		srv.Shutdown(ctx)
		cancel()
		if !errors.Is(err, tc.want) {
			t.Errorf("leader answering %q: forward gave %v, want %v", tc.answer, err, tc.want)
		}
		if tc.want == errRetry && errors.Is(err, errRefusedKind) {
			t.Errorf("leader answering %q: taken as a refusal of the kind", tc.answer)
		}
	}
}
