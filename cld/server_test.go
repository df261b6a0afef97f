//go:build linux

package cld_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cld/cldtest"
	"github.com/nsmd/nsmd/internal/testutil"
)

var princA = bytes.Repeat([]byte{0xa5}, 32)

// TestNfsdStartNegotiatesV2AndReplaysTheRecoveryEpoch: the kernel's start
// sequence (open, GetVersion in v1, GraceStart in v2) against the server,
// then a restart of nfsd: GraceStart returns the clients of the previous
// run, with their principal hashes.
func TestNfsdStartNegotiatesV2AndReplaysTheRecoveryEpoch(t *testing.T) {
	h := newHarness(t, nil, nil)
	ctx := testCtx(t)
	recs, err := h.k.Start(ctx)
	if err != nil || len(recs) != 0 {
		t.Fatalf("first Start: %v, %v; want no records", names(recs), err)
	}
	if v := h.k.Version(); v != 2 {
		t.Fatalf("kernel at version %d after GetVersion, want 2", v)
	}
	for _, c := range []struct {
		name  string
		princ []byte
	}{{"a", princA}, {"b", nil}, {"c", nil}} {
		if err := h.k.Create(ctx, []byte(c.name), c.princ); err != nil {
			t.Fatalf("Create %s: %v", c.name, err)
		}
	}
	if err := h.k.Remove(ctx, []byte("c")); err != nil {
		t.Fatal(err)
	}
	if err := h.k.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}
	st := h.srv.Status()
	if st.State != cld.StateOpen || st.Version != 2 || st.Pipe != h.k.PipePath() {
		t.Fatalf("status %+v", st)
	}
	if got := testutil.GatheredValue(t, h.reg, "nsmd_cld_pipe_open"); got != 1 {
		t.Fatalf("nsmd_cld_pipe_open %v while open", got)
	}

	h.k.Stop()
	waitStatus(t, h.srv, "waiting after nfsd stopped", inState(cld.StateWaiting))
	if got := testutil.GatheredValue(t, h.reg, "nsmd_cld_pipe_open"); got != 0 {
		t.Fatalf("nsmd_cld_pipe_open %v after nfsd stopped", got)
	}

	recs, err = h.k.Start(ctx)
	if err != nil {
		t.Fatalf("second Start: %v", err)
	}
	if got := names(recs); got != "a,b" {
		t.Fatalf("records %q, want a,b", got)
	}
	for _, r := range recs {
		want := []byte(nil)
		if string(r.Name) == "a" {
			want = princA
		}
		if !bytes.Equal(r.PrincHash, want) {
			t.Fatalf("record %s: principal hash %x, want %x", r.Name, r.PrincHash, want)
		}
	}
	st = h.srv.Status()
	if st.LastGraceStartRecords != 2 || st.LastGraceStart.IsZero() || st.Upcalls["create"] != 3 {
		t.Fatalf("status %+v", st)
	}
	for _, c := range []struct {
		cmd  string
		want float64
	}{{"get_version", 2}, {"grace_start", 2}, {"create", 3}, {"remove", 1}, {"grace_done", 1}} {
		if got := testutil.GatheredValue(t, h.reg, "nsmd_cld_upcalls_total", "command", c.cmd, "result", "ok"); got != c.want {
			t.Errorf("upcalls_total{%s,ok} = %v, want %v", c.cmd, got, c.want)
		}
	}
}

// TestEpochsAcrossRestartsFollowNfsdcld: a restart of nfsd during grace
// keeps the recovery epoch (the clients that did not reclaim yet may still
// do so); a grace period that ends forgets those that did not reclaim.
func TestEpochsAcrossRestartsFollowNfsdcld(t *testing.T) {
	h := newHarness(t, nil, nil)
	ctx := testCtx(t)
	boot := func(want string) {
		t.Helper()
		recs, err := h.k.Start(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := names(recs); got != want {
			t.Fatalf("GraceStart records %q, want %q", got, want)
		}
	}
	boot("")
	for _, n := range []string{"a", "b"} {
		if err := h.k.Create(ctx, []byte(n), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.k.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.k.Remove(ctx, []byte("b")); err != nil {
		t.Fatal(err)
	}
	h.k.Stop()
	boot("a") // a may reclaim
	if err := h.k.Create(ctx, []byte("a"), nil); err != nil {
		t.Fatal(err)
	}
	h.k.Stop() // crash during grace
	boot("a")  // still in grace: a may still reclaim
	if err := h.k.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}
	h.k.Stop()
	boot("") // a did not reclaim in the last grace period
}

// TestVersion1KernelGetsVersion1Messages: a kernel whose highest version
// is 1 takes our 2 as 1; every downcall then has 1034 bytes (the fake
// rejects others), and records lose their principal hash.
func TestVersion1KernelGetsVersion1Messages(t *testing.T) {
	h := newHarness(t, nil, nil)
	ctx := testCtx(t)
	if _, err := h.k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.k.Create(ctx, []byte("a"), princA); err != nil {
		t.Fatal(err)
	}
	if err := h.k.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}
	h.k.Stop()
	h.k.SetMaxVersion(1)
	recs, err := h.k.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.k.Version() != 1 || len(recs) != 1 || string(recs[0].Name) != "a" || recs[0].PrincHash != nil {
		t.Fatalf("version %d, records %+v", h.k.Version(), recs)
	}
	if err := h.k.Create(ctx, []byte("b"), nil); err != nil {
		t.Fatal(err)
	}
	if st := h.srv.Status(); st.Version != 1 {
		t.Fatalf("status version %d, want 1", st.Version)
	}
}

// TestOldestKernelOpsCheckAndGraceTime: kernels using the oldest ops
// send neither GetVersion nor GraceStart: Check decides reclaims (0 or
// -EACCES) and GraceDone carries cm_gracetime.
func TestOldestKernelOpsCheckAndGraceTime(t *testing.T) {
	h := newHarness(t, nil, nil)
	ctx := testCtx(t)
	open := func() {
		t.Helper()
		if err := h.k.CreatePipe(); err != nil {
			t.Fatal(err)
		}
		if err := h.k.WaitOpen(ctx); err != nil {
			t.Fatal(err)
		}
	}
	open()
	c, err := h.k.Send(cld.Msg{Cmd: cld.GraceDone, GraceTime: 1700000000})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.Wait(ctx); err != nil || r.Status != 0 || len(r.Raw) != cld.MsgSizeV1 {
		t.Fatalf("GraceDone: %d bytes, status %d, %v", len(r.Raw), r.Status, err)
	}
	if err := h.k.Create(ctx, []byte("a"), nil); err != nil {
		t.Fatal(err)
	}
	h.k.Stop()
	open()
	if s := statusOf(t, h.k.Check(ctx, []byte("a"))); s != 0 {
		t.Fatalf("Check a (recorded before the restart) = %d, want 0", s)
	}
	if s := statusOf(t, h.k.Check(ctx, []byte("z"))); s != cld.StatusAccessDenied {
		t.Fatalf("Check z (never recorded) = %d, want -EACCES", s)
	}
}

// TestMalformedUpcallsGetAnErrorDowncallAndNoStoreCall: each malformed
// upcall is answered at once with the bytes read and an error status
// (same length, same xid), counted as refused, and never reaches the
// store; the server goes on serving.
func TestMalformedUpcallsGetAnErrorDowncallAndNoStoreCall(t *testing.T) {
	h := newHarness(t, nil, nil)
	h.openV2(t)
	ctx := testCtx(t)
	le := binary.NativeEndian
	valid := func(cmd cld.Command, xid uint32) []byte {
		m := cld.Msg{Version: 2, Cmd: cmd, XID: xid}
		if cmd == cld.Create || cmd == cld.Remove {
			m.Name = []byte("a")
		}
		b, err := cld.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name   string
		b      []byte
		status int16
	}{
		{"short: header and 100 bytes", valid(cld.Create, 1001)[:108], cld.StatusInvalid},
		{"a v1 length in version 2", valid(cld.Create, 1002)[:cld.MsgSizeV1], cld.StatusInvalid},
		{"oversized", append(valid(cld.Create, 1003), make([]byte, 100)...), cld.StatusInvalid},
		{"cn_len 1025", func() []byte { b := valid(cld.Create, 1004); le.PutUint16(b[8:], 1025); return b }(), cld.StatusInvalid},
		{"cn_len 0", func() []byte { b := valid(cld.Remove, 1005); le.PutUint16(b[8:], 0); return b }(), cld.StatusInvalid},
		{"cp_len 33", func() []byte { b := valid(cld.Create, 1006); b[1034] = 33; return b }(), cld.StatusInvalid},
		{"unknown version 3", func() []byte { b := valid(cld.GraceDone, 1007); b[0] = 3; return b }(), cld.StatusInvalid},
		{"version 0", func() []byte { b := valid(cld.GraceDone, 1008)[:cld.MsgSizeV1]; b[0] = 0; return b }(), cld.StatusInvalid},
		{"unknown command 6", func() []byte { b := valid(cld.GraceDone, 1009); b[1] = 6; return b }(), cld.StatusNotSupported},
		{"unknown command 200", func() []byte { b := valid(cld.GraceDone, 1010); b[1] = 200; return b }(), cld.StatusNotSupported},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := h.k.SendRaw(tc.b)
			if err != nil {
				t.Fatal(err)
			}
			r, err := c.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := bytes.Clone(tc.b)
			le.PutUint16(want[2:4], uint16(tc.status))
			if !bytes.Equal(r.Raw, want) {
				t.Fatalf("answer: %d bytes, status %d; want the %d bytes read with status %d", len(r.Raw), r.Status, len(tc.b), tc.status)
			}
		})
	}
	// Too short to carry an xid: nothing can be answered. The GetVersion
	// after it is answered, so the short one was read and dropped.
	if c, err := h.k.SendRaw([]byte{2, 0, 0, 0, 9}); err != nil || c != nil {
		t.Fatalf("SendRaw(5 bytes) = %v, %v", c, err)
	}
	if _, err := h.k.GetVersion(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.store.callCount(); n != 0 {
		t.Fatalf("malformed upcalls reached the store: %d calls %q", n, h.store.eventLog())
	}
	var refused float64
	for _, c := range []string{"create", "remove", "grace_done", "unknown"} {
		refused += testutil.GatheredValue(t, h.reg, "nsmd_cld_upcalls_total", "command", c, "result", "refused")
	}
	if want := float64(len(cases) + 1); refused != want {
		t.Fatalf("refused upcalls counted %v, want %v", refused, want)
	}
	if st := h.srv.Status(); st.Refused != uint64(len(cases)+1) || st.State != cld.StateOpen {
		t.Fatalf("status %+v", st)
	}
	// Still serving.
	if err := h.k.Create(ctx, []byte("after"), nil); err != nil {
		t.Fatal(err)
	}
}

// TestStoreFailuresNeverAnswerZero: whatever the store's error, the
// kernel gets an error status (-EREMOTEIO; Check: -EACCES), never 0, and
// a GraceStart that failed sends no record.
func TestStoreFailuresNeverAnswerZero(t *testing.T) {
	notServing := fmt.Errorf("follower: %w", cld.ErrNotServing)
	for _, storeErr := range []error{notServing, errors.New("disk on fire")} {
		t.Run(storeErr.Error(), func(t *testing.T) {
			h := newHarness(t, nil, nil)
			ctx := testCtx(t)
			if _, err := h.k.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := h.k.Create(ctx, []byte("kept"), nil); err != nil {
				t.Fatal(err)
			}
			h.k.Stop()
			h.store.setHook(func(context.Context, string, string) error { return storeErr })
			// The kernel gives up on a daemon whose GraceStart fails, so
			// test it first, then serve the rest on a pipe without it.
			if recs, err := h.k.Start(ctx); statusOf(t, err) != cld.StatusRemoteIO || len(recs) != 0 {
				t.Fatalf("GraceStart: records %q, %v; want none, -EREMOTEIO", names(recs), err)
			}
			h.openV2(t)
			for _, c := range []struct {
				name string
				err  error
				want int16
			}{
				{"create", h.k.Create(ctx, []byte("x"), princA), cld.StatusRemoteIO},
				{"remove", h.k.Remove(ctx, []byte("kept")), cld.StatusRemoteIO},
				{"check", h.k.Check(ctx, []byte("kept")), cld.StatusAccessDenied},
				{"grace_done", h.k.GraceDone(ctx), cld.StatusRemoteIO},
			} {
				if got := statusOf(t, c.err); got != c.want {
					t.Errorf("%s: status %d, want %d", c.name, got, c.want)
				}
			}
			result := "error"
			if errors.Is(storeErr, cld.ErrNotServing) {
				result = "not_serving"
			}
			for _, c := range []string{"create", "remove", "check", "grace_done", "grace_start"} {
				if got := testutil.GatheredValue(t, h.reg, "nsmd_cld_upcalls_total", "command", c, "result", result); got != 1 {
					t.Errorf("upcalls_total{%s,%s} = %v, want 1", c, result, got)
				}
			}
			if st := h.srv.Status(); st.Failed != 5 {
				t.Errorf("status: %d failed, want 5", st.Failed)
			}
		})
	}
}

// badRecordStore returns a record the kernel cannot take.
type badRecordStore struct{ *memStore }

func (badRecordStore) GraceStart(context.Context) ([]cld.Record, error) {
	return []cld.Record{{Name: []byte("ok")}, {Name: nil}}, nil
}

// TestUnsendableRecordFailsGraceStart: a record that cannot be encoded
// (an empty name) fails GraceStart with -EREMOTEIO instead of telling
// the kernel that the list is complete.
func TestUnsendableRecordFailsGraceStart(t *testing.T) {
	k, err := cldtest.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k.SetOpenWait(10 * time.Second)
	srv, _ := newServer(t, k, badRecordStore{newMemStore()}, nil)
	stop := run(t, srv)
	defer k.Close()
	defer stop()
	_, err = k.Start(testCtx(t))
	if s := statusOf(t, err); s != cld.StatusRemoteIO {
		t.Fatalf("GraceStart status %d, want -EREMOTEIO", s)
	}
}

// TestOpTimeoutAnswersInTimeAndKeepsTheOrder: a store call that outlives
// OpTimeout (here one that ignores its context) gets -EREMOTEIO at the
// timeout; a later upcall on the same name does not reach the store
// before it returned (it times out waiting, answered -EREMOTEIO too).
func TestOpTimeoutAnswersInTimeAndKeepsTheOrder(t *testing.T) {
	const timeout = 200 * time.Millisecond
	h := newHarness(t, func(c *cld.Config) { c.OpTimeout = timeout }, nil)
	h.openV2(t)
	ctx := testCtx(t)
	release := make(chan struct{})
	entered := make(chan struct{})
	h.store.setHook(func(_ context.Context, op, name string) error {
		if op == "create" && name == "a" {
			close(entered)
			<-release // ignores its context
		}
		return nil
	})
	sent := time.Now()
	if s := statusOf(t, h.k.Create(ctx, []byte("a"), nil)); s != cld.StatusRemoteIO {
		t.Fatalf("Create a: status %d, want -EREMOTEIO", s)
	}
	if d := time.Since(sent); d < timeout || d > timeout+5*time.Second {
		t.Fatalf("answered after %v, OpTimeout %v", d, timeout)
	}
	<-entered
	if s := statusOf(t, h.k.Remove(ctx, []byte("a"))); s != cld.StatusRemoteIO {
		t.Fatalf("Remove a while Create a is in the store: status %d, want -EREMOTEIO", s)
	}
	if ev := h.store.eventLog(); strings.Contains(strings.Join(ev, "|"), "remove a") {
		t.Fatalf("Remove a reached the store while Create a was there: %q", ev)
	}
	close(release)
	if err := h.k.Remove(ctx, []byte("a")); err != nil {
		t.Fatalf("Remove a after Create a returned: %v", err)
	}
	if ev := h.store.eventLog(); !before(t, ev, "end create a", "start remove a") {
		t.Fatalf("order: %q", ev)
	}
}

// concurrentCreates sends n Creates at once; the store holds the first
// one until a second one is in the store too (so serial handling stalls
// until OpTimeout). It returns how many were answered 0.
func concurrentCreates(t *testing.T, h *harness, n int) (ok int) {
	t.Helper()
	var mu sync.Mutex
	inStore := 0
	two := make(chan struct{})
	var once sync.Once
	h.store.setHook(func(ctx context.Context, op, name string) error {
		mu.Lock()
		inStore++
		if inStore == 2 {
			once.Do(func() { close(two) })
		}
		mu.Unlock()
		defer func() { mu.Lock(); inStore--; mu.Unlock() }()
		select {
		case <-two:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	ctx := testCtx(t)
	calls := make([]*cldtest.Call, n)
	for i := range calls {
		c, err := h.k.Send(cld.Msg{Cmd: cld.Create, Name: fmt.Appendf(nil, "client-%03d", i)})
		if err != nil {
			t.Fatal(err)
		}
		calls[i] = c
	}
	for i, c := range calls {
		r, err := c.Wait(ctx)
		if err != nil {
			t.Fatalf("Create %d: %v", i, err)
		}
		if r.Status == 0 {
			ok++
		}
	}
	return ok
}

// TestConcurrentCreatesAreAnsweredTogether: 100 Creates in flight at once
// all reach the store concurrently (a store can group-commit them) and
// are all answered 0.
func TestConcurrentCreatesAreAnsweredTogether(t *testing.T) {
	h := newHarness(t, nil, nil)
	h.openV2(t)
	if ok := concurrentCreates(t, h, 100); ok != 100 {
		t.Fatalf("%d of 100 Creates answered 0", ok)
	}
	if n := len(h.store.currentNames()); n != 100 {
		t.Fatalf("%d clients recorded, want 100", n)
	}
	if got := testutil.GatheredValue(t, h.reg, "nsmd_cld_upcalls_total", "command", "create", "result", "ok"); got != 100 {
		t.Fatalf("upcalls_total{create,ok} = %v", got)
	}
}

// TestConcurrentCreatesNegativeControl: with one upcall at a time
// (MaxInflight 1) the same store stalls the first Create until its
// timeout: the test above can fail.
func TestConcurrentCreatesNegativeControl(t *testing.T) {
	h := newHarness(t, func(c *cld.Config) { c.MaxInflight, c.OpTimeout = 1, 200*time.Millisecond }, nil)
	h.openV2(t)
	if ok := concurrentCreates(t, h, 3); ok == 3 {
		t.Fatal("all Creates answered 0 one at a time: the concurrency test proves nothing")
	}
}

// orderProbe sends Create a, then the upcall `next`, and makes the store
// hold Create a until the server reports `next` blocked behind it, or
// until `next` reaches the store (a violation). It returns the store's
// event log.
func orderProbe(t *testing.T, unordered bool, next cld.Msg, nextEvent string) []string {
	t.Helper()
	blocked := make(chan struct{})
	var once sync.Once
	h := newHarness(t, nil, func(s *cld.Server) {
		if unordered {
			cld.SetUnordered(s)
		}
		cld.SetBlockedHook(s, func(m cld.Msg) {
			if m.Cmd == next.Cmd && bytes.Equal(m.Name, next.Name) {
				once.Do(func() { close(blocked) })
			}
		})
	})
	h.openV2(t)
	nextIn := make(chan struct{})
	var nextOnce sync.Once
	h.store.setHook(func(ctx context.Context, op, name string) error {
		switch {
		case op == "create" && name == "a":
			select {
			case <-blocked:
			case <-nextIn:
			case <-ctx.Done():
				return ctx.Err()
			}
		case op+" "+name == nextEvent:
			nextOnce.Do(func() { close(nextIn) })
		}
		return nil
	})
	ctx := testCtx(t)
	first, err := h.k.Send(cld.Msg{Cmd: cld.Create, Name: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	second, err := h.k.Send(next)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*cldtest.Call{first, second} {
		if r, err := c.Wait(ctx); err != nil || r.Status != 0 {
			t.Fatalf("%v: status %d, %v", c.Cmd, r.Status, err)
		}
	}
	return h.store.eventLog()
}

// TestSameNameUpcallsReachTheStoreInArrivalOrder: Remove a, read while
// Create a is in the store, waits for it.
func TestSameNameUpcallsReachTheStoreInArrivalOrder(t *testing.T) {
	ev := orderProbe(t, false, cld.Msg{Cmd: cld.Remove, Name: []byte("a")}, "remove a")
	if !before(t, ev, "end create a", "start remove a") {
		t.Fatalf("Remove a overtook Create a: %q", ev)
	}
}

// TestBarriersWaitForEarlierUpcalls: GraceStart and GraceDone, read while
// Create a is in the store, wait for it.
func TestBarriersWaitForEarlierUpcalls(t *testing.T) {
	for _, c := range []struct {
		cmd   cld.Command
		event string
	}{{cld.GraceStart, "gracestart "}, {cld.GraceDone, "gracedone "}} {
		t.Run(c.cmd.String(), func(t *testing.T) {
			ev := orderProbe(t, false, cld.Msg{Cmd: c.cmd}, c.event)
			if !before(t, ev, "end create a", "start "+c.event) {
				t.Fatalf("%v overtook Create a: %q", c.cmd, ev)
			}
		})
	}
}

// TestOrderNegativeControl: without the order, the same probes see the
// later upcall overtake: the order tests can fail.
func TestOrderNegativeControl(t *testing.T) {
	ev := orderProbe(t, true, cld.Msg{Cmd: cld.Remove, Name: []byte("a")}, "remove a")
	if before(t, ev, "end create a", "start remove a") {
		t.Fatalf("unordered server kept the order: %q", ev)
	}
	ev = orderProbe(t, true, cld.Msg{Cmd: cld.GraceStart}, "gracestart ")
	if before(t, ev, "end create a", "start gracestart ") {
		t.Fatalf("unordered server kept the barrier: %q", ev)
	}
}

// TestUpcallsAfterABarrierWaitForIt: Create b, read while GraceStart is
// in the store, waits for it.
func TestUpcallsAfterABarrierWaitForIt(t *testing.T) {
	for _, unordered := range []bool{false, true} {
		t.Run(fmt.Sprint("unordered=", unordered), func(t *testing.T) {
			blocked := make(chan struct{})
			var once sync.Once
			h := newHarness(t, nil, func(s *cld.Server) {
				if unordered {
					cld.SetUnordered(s)
				}
				cld.SetBlockedHook(s, func(m cld.Msg) {
					if m.Cmd == cld.Create && string(m.Name) == "b" {
						once.Do(func() { close(blocked) })
					}
				})
			})
			h.openV2(t)
			bIn := make(chan struct{})
			var bOnce sync.Once
			h.store.setHook(func(ctx context.Context, op, name string) error {
				switch op {
				case "gracestart":
					select {
					case <-blocked:
					case <-bIn:
					case <-ctx.Done():
						return ctx.Err()
					}
				case "create":
					bOnce.Do(func() { close(bIn) })
				}
				return nil
			})
			ctx := testCtx(t)
			gs, err := h.k.Send(cld.Msg{Cmd: cld.GraceStart})
			if err != nil {
				t.Fatal(err)
			}
			if err := h.k.Create(ctx, []byte("b"), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := gs.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			ev := h.store.eventLog()
			if kept := before(t, ev, "end gracestart ", "start create b"); kept == unordered {
				t.Fatalf("unordered=%v, order kept=%v: %q", unordered, kept, ev)
			}
		})
	}
}

// TestNfsdRestartReopensWhileOldUpcallsRun: nfsd stops with a Create in
// the store and starts again at once; the server opens the new pipe
// within the kernel's wait although the old Create has not returned, and
// the new GraceStart (a barrier) waits for that Create.
func TestNfsdRestartReopensWhileOldUpcallsRun(t *testing.T) {
	h := newHarness(t, nil, nil)
	ctx := testCtx(t)
	if _, err := h.k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.k.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}
	release, entered := make(chan struct{}), make(chan struct{})
	h.store.setHook(func(_ context.Context, op, name string) error {
		if op == "create" && name == "slow" {
			close(entered)
			<-release
		}
		return nil
	})
	c, err := h.k.Send(cld.Msg{Cmd: cld.Create, Name: []byte("slow")})
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	h.k.Stop()
	if _, err := c.Wait(ctx); !errors.Is(err, cldtest.ErrNFSDStopped) {
		t.Fatalf("Create pending at nfsd stop: %v", err)
	}
	h.k.SetOpenWait(time.Second) // the kernel's wait
	started := make(chan error, 1)
	var recs []cld.Record
	go func() {
		var err error
		recs, err = h.k.Start(ctx)
		started <- err
	}()
	if err := h.k.WaitOpen(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-started; err != nil {
		t.Fatalf("Start while the old Create ran: %v", err)
	}
	if got := names(recs); got != "slow" {
		t.Fatalf("records %q: GraceStart did not wait for the old Create", got)
	}
}

// TestDaemonRestartOpensTheExistingPipe: a new server started while nfsd
// runs opens the pipe that is already there (no creation event comes).
func TestDaemonRestartOpensTheExistingPipe(t *testing.T) {
	h := newHarness(t, nil, nil)
	ctx := testCtx(t)
	if _, err := h.k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.k.Create(ctx, []byte("a"), nil); err != nil {
		t.Fatal(err)
	}
	h.stop()
	if st := h.srv.Status(); st.State != cld.StateStopped {
		t.Fatalf("status after Run returned: %+v", st)
	}
	srv2, _ := newServer(t, h.k, h.store, func(c *cld.Config) { c.RetryInterval = time.Hour })
	defer run(t, srv2)()
	waitStatus(t, srv2, "open", inState(cld.StateOpen))
	if err := h.k.Create(ctx, []byte("b"), nil); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(h.store.currentNames(), ","); got != "a,b" {
		t.Fatalf("clients %q", got)
	}
}

// TestCancelAnswersInFlightAndLeavesNoGoroutine: cancelling Run answers
// the upcall in the store with -EREMOTEIO before the pipe closes, Run
// returns, and no goroutine of the server or the fake is left.
func TestCancelAnswersInFlightAndLeavesNoGoroutine(t *testing.T) {
	baseline := runtime.NumGoroutine()
	k, err := cldtest.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k.SetOpenWait(10 * time.Second)
	store := newMemStore()
	srv, _ := newServer(t, k, store, nil)
	// The answer at shutdown is held back a moment: if Run closed the
	// pipe without waiting for it, the state leaves "open" meanwhile and
	// the answer is lost. (Proving that nothing closes needs a bound.)
	cld.SetAnswerHook(srv, func(m cld.Msg) {
		if m.Cmd != cld.Create {
			return
		}
		deadline := time.After(300 * time.Millisecond)
		for {
			ch := srv.StatusChanged()
			if srv.Status().State != cld.StateOpen {
				return
			}
			select {
			case <-ch:
			case <-deadline:
				return
			}
		}
	})
	stop := run(t, srv)
	ctx := testCtx(t)
	if _, err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	store.setHook(func(ctx context.Context, op, _ string) error {
		close(entered)
		<-ctx.Done() // honours its context
		return ctx.Err()
	})
	c, err := k.Send(cld.Msg{Cmd: cld.Create, Name: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	stop()
	r, err := c.Wait(ctx)
	if err != nil || r.Status != cld.StatusRemoteIO {
		t.Fatalf("in-flight Create at shutdown: status %d, %v; want -EREMOTEIO", r.Status, err)
	}
	k.Close()
	// Goroutines that ended may take a moment to be gone from the count;
	// there is no event for that.
	testutil.WaitForSeen(t, 5*time.Second, "the goroutines of the stopped server to end", func() (bool, string) {
		if n := runtime.NumGoroutine(); n > baseline {
			buf := make([]byte, 1<<20)
			return false, fmt.Sprintf("%d goroutines, %d before:\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
		}
		return true, ""
	})
}

// TestInotifyOpensThePipeWithinTheKernelsWait: with the server waiting
// and its retry timer far away, nfsd's start (the file appears, the
// kernel waits 1 s for an open) succeeds: the creation event opened it.
func TestInotifyOpensThePipeWithinTheKernelsWait(t *testing.T) {
	h := newHarness(t, func(c *cld.Config) { c.RetryInterval = time.Hour }, nil)
	waitStatus(t, h.srv, "waiting", inState(cld.StateWaiting))
	h.k.SetOpenWait(time.Second)
	for i := range 3 { // and again after each stop
		if _, err := h.k.Start(testCtx(t)); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		h.k.Stop()
	}
}

// TestNoPipefsReportsThePathAndTheFix: a PipefsDir that is not rpc_pipefs
// (here a plain directory, checked with the real statfs) is a status
// error naming the directory, the mount command and the privilege.
func TestNoPipefsReportsThePathAndTheFix(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	srv, err := cld.NewServer(newMemStore(), cld.Config{PipefsDir: dir, Registerer: reg, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer run(t, srv)()
	st := waitStatus(t, srv, "no_pipefs", inState(cld.StateNoPipefs))
	for _, want := range []string{dir, "rpc_pipefs", "mount -t rpc_pipefs sunrpc " + dir, "CAP_SYS_ADMIN"} {
		if !strings.Contains(st.Err, want) {
			t.Errorf("status error %q does not say %q", st.Err, want)
		}
	}
	if got := testutil.GatheredValue(t, reg, "nsmd_cld_tracking_error"); got != 1 {
		t.Errorf("nsmd_cld_tracking_error = %v, want 1", got)
	}
}

// TestTrackingErrorIsZeroWhileWaiting: the gauge of the previous test is
// not stuck at 1.
func TestTrackingErrorIsZeroWhileWaiting(t *testing.T) {
	h := newHarness(t, nil, nil)
	waitStatus(t, h.srv, "waiting", inState(cld.StateWaiting))
	if got := testutil.GatheredValue(t, h.reg, "nsmd_cld_tracking_error"); got != 0 {
		t.Errorf("nsmd_cld_tracking_error = %v while waiting", got)
	}
}

// TestMountPipefsFailureIsReported: MountPipefs on a kernel without
// rpc_pipefs (as on this test machine) says why the mount failed. On a
// kernel with it, the mount works and is undone.
func TestMountPipefsFailureIsReported(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	srv, err := cld.NewServer(newMemStore(), cld.Config{PipefsDir: dir, MountPipefs: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, srv)
	defer stop()
	st := waitStatus(t, srv, "a verdict", func(st cld.Status) bool { return st.State != cld.StateStopped })
	if st.State == cld.StateNoPipefs {
		if !strings.Contains(st.Err, "mount -t rpc_pipefs sunrpc "+dir) {
			t.Fatalf("status error %q does not name the mount", st.Err)
		}
		return
	}
	stop()
	if err := unix.Unmount(dir, 0); err != nil {
		t.Errorf("unmount %s: %v", dir, err)
	}
	if st.State != cld.StateWaiting {
		t.Fatalf("after mounting rpc_pipefs: %+v", st)
	}
}

// TestOpenRefusedNamesThePrivilege: a pipe that exists but cannot be
// opened (EACCES) is a status error naming the path and the privilege,
// retried until it opens.
func TestOpenRefusedNamesThePrivilege(t *testing.T) {
	var mu sync.Mutex
	deny := true
	var k *cldtest.Kernel
	h := newHarness(t, func(c *cld.Config) {
		c.RetryInterval = 20 * time.Millisecond
		open := c.OpenPipe
		c.OpenPipe = func(path string) (*cld.Pipe, error) {
			mu.Lock()
			defer mu.Unlock()
			if deny {
				return nil, &os.PathError{Op: "open", Path: path, Err: unix.EACCES}
			}
			return open(path)
		}
	}, nil)
	k = h.k
	if err := k.CreatePipe(); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, h.srv, "error", inState(cld.StateError))
	for _, want := range []string{k.PipePath(), "needs root or CAP_DAC_OVERRIDE"} {
		if !strings.Contains(st.Err, want) {
			t.Errorf("status error %q does not say %q", st.Err, want)
		}
	}
	if got := testutil.GatheredValue(t, h.reg, "nsmd_cld_tracking_error"); got != 1 {
		t.Errorf("nsmd_cld_tracking_error = %v, want 1", got)
	}
	mu.Lock()
	deny = false
	mu.Unlock()
	waitStatus(t, h.srv, "open", inState(cld.StateOpen))
	if err := k.WaitOpen(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := cld.NewServer(nil, cld.Config{}); !errors.Is(err, cld.ErrConfig) {
		t.Errorf("nil store: %v", err)
	}
	for _, c := range []cld.Config{
		{PipefsDir: "relative/dir"},
		{OpTimeout: -time.Second},
		{MaxInflight: -1},
		{RetryInterval: -1},
	} {
		if _, err := cld.NewServer(newMemStore(), c); !errors.Is(err, cld.ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", c, err)
		}
	}
	reg := prometheus.NewRegistry()
	if _, err := cld.NewServer(newMemStore(), cld.Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := cld.NewServer(newMemStore(), cld.Config{Registerer: reg}); err == nil {
		t.Error("second server on the same registry: no error")
	}
}

func TestRunTwiceAtOnceIsRefused(t *testing.T) {
	h := newHarness(t, nil, nil)
	waitStatus(t, h.srv, "waiting", inState(cld.StateWaiting))
	if err := h.srv.Run(context.Background()); !errors.Is(err, cld.ErrRunning) {
		t.Fatalf("second Run: %v, want ErrRunning", err)
	}
}

// dupStore returns every record of its memStore's GraceStart twice (the
// second copy with another principal hash), as a store that merged two
// epochs carelessly would.
type dupStore struct{ *memStore }

func (s dupStore) GraceStart(ctx context.Context) ([]cld.Record, error) {
	recs, err := s.memStore.GraceStart(ctx)
	out := slices.Clone(recs)
	for _, r := range recs {
		out = append(out, cld.Record{Name: r.Name, PrincHash: princA})
	}
	return out, err
}

// TestGraceStartSendsEachClientNameOnce: nfsd keeps one reclaim record per
// downcall, so a name sent twice would be waited for twice; whatever the
// store returns, the kernel gets each name once (the first record of it).
func TestGraceStartSendsEachClientNameOnce(t *testing.T) {
	k, err := cldtest.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k.SetOpenWait(10 * time.Second)
	store := dupStore{newMemStore()}
	srv, _ := newServer(t, k, store, nil)
	stop := run(t, srv)
	t.Cleanup(func() { stop(); k.Close() })
	ctx := testCtx(t)
	if _, err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		if err := k.Create(ctx, []byte(n), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}
	k.Stop()
	waitStatus(t, srv, "waiting after nfsd stopped", inState(cld.StateWaiting))
	recs, err := k.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(recs); got != "a,b" {
		t.Fatalf("GraceStart sent %q, want a,b (each once)", got)
	}
	for _, r := range recs {
		if r.PrincHash != nil {
			t.Fatalf("record %s: principal %x, want the first record's (none)", r.Name, r.PrincHash)
		}
	}
	if st := srv.Status(); st.LastGraceStartRecords != 2 {
		t.Fatalf("status: %d records sent, want 2", st.LastGraceStartRecords)
	}
}
