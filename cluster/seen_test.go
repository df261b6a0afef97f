package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	itest "github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

// TestFollowersLearnWhenTheLeadersClientsWereSeen: a follower learns the
// leader's last sample of its NFSv4 clients, dated on its own clock and
// the most recently seen first, bounded by what it asks for; a follower
// asked directly shares nothing, and a request without the cluster key is
// refused.
func TestFollowersLearnWhenTheLeadersClientsWereSeen(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.waitTakeover(5 * time.Second)
	li, ld := c.leader(5 * time.Second)
	f := c.nodes[(li+1)%3]
	ctx := context.Background()
	itest.WaitFor(t, 5*time.Second, "the follower to know the leader", func() bool { return f.n.Leader() == ld.id })

	if _, _, err := f.n.Hints().LeaderClientsSeen(ctx, 10); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("before the leader sampled: %v, want ErrNotLeader", err)
	}
	now := time.Now()
	ld.n.Hints().SetClientsSeen([]ClientSeen{
		{Name: "Linux NFSv4.2 gone", Seen: now.Add(-26 * time.Hour)},
		{Name: "Linux NFSv4.0 busy", Seen: now.Add(-2 * time.Second)},
		{Name: "Linux NFSv4.1 idle", Seen: now.Add(-40 * time.Second)},
	})
	from, cs, err := f.n.Hints().LeaderClientsSeen(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if from != ld.id || len(cs) != 3 {
		t.Fatalf("got %v from %s", cs, from)
	}
	for i, want := range []struct {
		name string
		ago  time.Duration
	}{{"Linux NFSv4.0 busy", 2 * time.Second}, {"Linux NFSv4.1 idle", 40 * time.Second}, {"Linux NFSv4.2 gone", 26 * time.Hour}} {
		d := cs[i].Seen.Sub(now.Add(-want.ago))
		if cs[i].Name != want.name || d < -50*time.Millisecond || d > time.Second {
			t.Errorf("client %d: %s seen %v, want %s seen %v ago (off by %v)", i, cs[i].Name, cs[i].Seen, want.name, want.ago, d)
		}
	}
	if _, cs, err := f.n.Hints().LeaderClientsSeen(ctx, 1); err != nil || len(cs) != 1 || cs[0].Name != "Linux NFSv4.0 busy" {
		t.Fatalf("bounded to 1: %v, %v", cs, err)
	}

	// Asked directly, a follower does not answer with a list of its own.
	lf := c.nodes[(li+2)%3]
	lf.n.Hints().SetClientsSeen([]ClientSeen{{Name: "stale", Seen: now}})
	cl, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "tcp", Addr: lf.nsmAddr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	args := hintArgs{SentNS: time.Now().UnixNano(), Max: 10}
	args.MAC = fwdMAC(f.n.cfg.ClusterKey, args.SentNS, args.macInput(tagSeen))
	res := seenRes{max: 10}
	if err := cl.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcSeen, &args, &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != fwdNotLeader {
		t.Fatalf("a follower answered status %d, want fwdNotLeader", res.Status)
	}
	// A CONNS MAC does not stand for SEEN.
	args = hintArgs{SentNS: time.Now().UnixNano(), Max: 10}
	args.MAC = fwdMAC(f.n.cfg.ClusterKey, args.SentNS, args.macInput(tagConns))
	cl2, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "tcp", Addr: ld.nsmAddr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl2.Close()
	res = seenRes{max: 10}
	if err := cl2.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcSeen, &args, &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != fwdDenied {
		t.Fatalf("SEEN with a CONNS MAC: status %d, want fwdDenied", res.Status)
	}

	f.n.cfg.ClusterKey = []byte("another key")
	if _, _, err := f.n.Hints().LeaderClientsSeen(ctx, 10); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("with another cluster key: %v, want a refusal", err)
	}
}

// TestSeenAnswerBounds: the leader answers the most recently seen first,
// at most the asked-for count and maxSeenNameBytes of names; a decoder
// refuses more clients than it asked for, and more name bytes.
func TestSeenAnswerBounds(t *testing.T) {
	now := time.Now()
	var cs []ClientSeen
	for i := range 1000 {
		cs = append(cs, ClientSeen{Name: fmt.Sprintf("%04d-%s", i, strings.Repeat("x", 1000)), Seen: now.Add(-time.Duration(i) * time.Second)})
	}
	out := seenAnswer(cs, MaxClientsSeen, now)
	total := 0
	for _, e := range out {
		total += len(e.Name)
	}
	if total > maxSeenNameBytes || len(out) == 0 || !strings.HasPrefix(out[0].Name, "0000-") {
		t.Fatalf("%d clients, %d name bytes, first %.8s", len(out), total, out[0].Name)
	}
	if got := seenAnswer(cs, 3, now); len(got) != 3 || got[2].AgoMS != 2000 {
		t.Fatalf("bounded to 3: %d, last %d ms ago", len(got), got[len(got)-1].AgoMS)
	}

	in := seenRes{Status: fwdOK, Clients: seenAnswer(cs[:5], 10, now)}
	var w oncrpc.Writer
	in.MarshalXDR(&w)
	if err := (&seenRes{max: 5}).UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err != nil {
		t.Fatalf("round trip: %v", err)
	}
	if err := (&seenRes{max: 4}).UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err == nil {
		t.Fatal("decoded 5 clients when asking for 4")
	}
	var big oncrpc.Writer
	(&seenRes{Status: fwdOK, Clients: func() []seenEntry {
		var es []seenEntry
		for i := range 600 {
			es = append(es, seenEntry{Name: fmt.Sprintf("%04d%s", i, strings.Repeat("y", 1000))})
		}
		return es
	}()}).MarshalXDR(&big)
	if err := (&seenRes{max: MaxClientsSeen}).UnmarshalXDR(oncrpc.NewReader(big.Bytes())); err == nil {
		t.Fatal("decoded more than maxSeenNameBytes of names")
	}
}

func FuzzSeenResult(f *testing.F) {
	var w oncrpc.Writer
	(&seenRes{Status: fwdOK, Clients: []seenEntry{{Name: "a", AgoMS: 5}}}).MarshalXDR(&w)
	f.Add(w.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		r := seenRes{max: 64}
		if err := r.UnmarshalXDR(oncrpc.NewReader(b)); err != nil {
			return
		}
		if len(r.Clients) > 64 {
			t.Fatalf("%d clients", len(r.Clients))
		}
		var w oncrpc.Writer
		r.MarshalXDR(&w)
		again := seenRes{max: 64}
		if err := again.UnmarshalXDR(oncrpc.NewReader(w.Bytes())); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
	})
}
