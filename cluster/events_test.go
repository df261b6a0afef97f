package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// appliedLog records what a node's Applied subscriber was told.
type appliedLog struct {
	mu  sync.Mutex
	evs []Applied
}

func (l *appliedLog) applied(ev Applied) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

func (l *appliedLog) take() []Applied {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.evs
	l.evs = nil
	return out
}

// TestSubscribersHearAppliedInLogOrderWithReplaysMarked: Applied gets
// every applied command in log order, and after a restart the entries
// that were already in the log are marked Replay (their side effects,
// the lock-manager callbacks, happened before the restart) while new ones
// are not. Serving is called once the term serves, with its state.
func TestSubscribersHearAppliedInLogOrderWithReplaysMarked(t *testing.T) {
	dir, addr := t.TempDir(), testutil.FreeAddr(t, "127.0.0.1")
	start := func(l *appliedLog, served chan int32) (*Node, *takeovers) {
		t.Helper()
		tk := newTakeovers()
		n, err := New(testDefaults(Config{
			NodeID: "n1", DataDir: dir, RaftBind: addr, Bootstrap: true,
			HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
			LeaderLeaseTimeout: 150 * time.Millisecond, Server: &funcServer{serve: tk.onLeader},
			// Raft may apply before Start: a subscriber given in Config hears it.
			Subscribers: []Subscriber{{Applied: l.applied, Serving: func(ctx context.Context, state int32) {
				served <- state
				<-ctx.Done()
			}}},
		}))
		if err != nil {
			t.Fatal(err)
		}
		n.Start()
		return n, tk
	}
	l, served := &appliedLog{}, make(chan int32, 4)
	n, tk := start(l, served)
	s1 := tk.wait(t)
	if got := <-served; got != s1 {
		t.Fatalf("Serving told sm_state %d, the takeover committed %d", got, s1)
	}
	ctx := context.Background()
	for i := range 5 {
		if _, err := n.Registry().Monitor(ctx, reg(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	first := l.take()
	var last uint64
	for _, ev := range first {
		if ev.Index <= last || ev.Replay {
			t.Fatalf("first run: %+v after index %d (want increasing, none a replay)", ev, last)
		}
		last = ev.Index
	}
	if len(first) < 6 { // the takeover and five registrations
		t.Fatalf("first run told %d commands, want at least 6", len(first))
	}

	l2 := &appliedLog{}
	n, tk = start(l2, served)
	t.Cleanup(func() { n.Kill() })
	s2 := tk.wait(t)
	if got := <-served; got != s2 {
		t.Fatalf("after the restart Serving told sm_state %d, the takeover committed %d", got, s2)
	}
	if _, err := n.Registry().Monitor(ctx, reg(9)); err != nil {
		t.Fatal(err)
	}
	var replays, fresh int
	for _, ev := range l2.take() {
		switch {
		case ev.Index <= last && !ev.Replay:
			t.Errorf("entry %d was in the log at the restart but is not marked a replay", ev.Index)
		case ev.Index > last && ev.Replay:
			t.Errorf("entry %d, new after the restart, is marked a replay", ev.Index)
		case ev.Replay:
			replays++
		default:
			fresh++
			if r, ok := ev.Cmd.(fsm.Register); ok && r.Reg.ID != reg(9).ID {
				t.Errorf("new entry %d registers %v, want only %v", ev.Index, r.Reg.ID, reg(9).ID)
			}
		}
	}
	if replays == 0 || fresh < 2 { // the new takeover and the new registration
		t.Errorf("after the restart: %d replays, %d new entries", replays, fresh)
	}
}
