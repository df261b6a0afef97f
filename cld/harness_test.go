//go:build linux

package cld_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cld/cldtest"
)

// memStore is an in-memory Store with nfsdcld's epoch semantics:
//
//	GraceStart: if recovery == 0 {recovery = current; current++; rec = cur; cur = {}} else {cur = {}}; return rec
//	Create: cur[name] = princ      Remove: delete cur[name]
//	Check: if recovery == 0 {GraceStart}; name in rec → cur[name] = rec[name], true
//	GraceDone: if recovery == 0 {GraceStart}; rec = {}; recovery = 0
//
// It logs "start <op> <name>" and "end <op> <name>" for each call, and
// calls hook (if set) between the two, outside its lock: the hook may
// block, and an error it returns fails the call without a change.
type memStore struct {
	mu                sync.Mutex
	current, recovery uint64
	cur, rec          map[string][]byte
	calls             int
	events            []string
	hook              func(ctx context.Context, op, name string) error
}

func newMemStore() *memStore {
	return &memStore{current: 1, cur: map[string][]byte{}, rec: map[string][]byte{}}
}

func (s *memStore) setHook(h func(ctx context.Context, op, name string) error) {
	s.mu.Lock()
	s.hook = h
	s.mu.Unlock()
}

func (s *memStore) op(ctx context.Context, op, name string, apply func()) error {
	s.mu.Lock()
	s.calls++
	s.events = append(s.events, "start "+op+" "+name)
	hook := s.hook
	s.mu.Unlock()
	var err error
	if hook != nil {
		err = hook(ctx, op, name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		apply()
	}
	s.events = append(s.events, "end "+op+" "+name)
	return err
}

func (s *memStore) graceStartLocked() {
	if s.recovery == 0 {
		s.recovery = s.current
		s.current++
		s.rec, s.cur = s.cur, map[string][]byte{}
	} else {
		s.cur = map[string][]byte{}
	}
}

func (s *memStore) Create(ctx context.Context, name, princHash []byte) error {
	return s.op(ctx, "create", string(name), func() { s.cur[string(name)] = slices.Clone(princHash) })
}

func (s *memStore) Remove(ctx context.Context, name []byte) error {
	return s.op(ctx, "remove", string(name), func() { delete(s.cur, string(name)) })
}

func (s *memStore) Check(ctx context.Context, name []byte) (bool, error) {
	var ok bool
	err := s.op(ctx, "check", string(name), func() {
		if s.recovery == 0 {
			s.graceStartLocked()
		}
		var p []byte
		if p, ok = s.rec[string(name)]; ok {
			s.cur[string(name)] = p
		}
	})
	return ok, err
}

func (s *memStore) GraceStart(ctx context.Context) ([]cld.Record, error) {
	var recs []cld.Record
	err := s.op(ctx, "gracestart", "", func() {
		s.graceStartLocked()
		for n, p := range s.rec {
			recs = append(recs, cld.Record{Name: []byte(n), PrincHash: slices.Clone(p)})
		}
	})
	if err != nil {
		return nil, err
	}
	return recs, nil
}

func (s *memStore) GraceDone(ctx context.Context) error {
	return s.op(ctx, "gracedone", "", func() {
		if s.recovery == 0 {
			s.graceStartLocked()
		}
		s.rec, s.recovery = map[string][]byte{}, 0
	})
}

func (s *memStore) callCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *memStore) eventLog() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

func (s *memStore) currentNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n []string
	for k := range s.cur {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// before reports whether event a is logged before event b (both must be).
func before(t *testing.T, events []string, a, b string) bool {
	t.Helper()
	ia, ib := slices.Index(events, a), slices.Index(events, b)
	if ia < 0 || ib < 0 {
		t.Fatalf("events %q: missing %q or %q", events, a, b)
	}
	return ia < ib
}

// harness runs a Server against a fake kernel in a temporary directory.
type harness struct {
	k     *cldtest.Kernel
	srv   *cld.Server
	store *memStore
	reg   *prometheus.Registry
	stop  func() // cancel Run and wait for it to return
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newServer builds a Server on the fake kernel k (not running yet).
func newServer(t *testing.T, k *cldtest.Kernel, store cld.Store, mod func(*cld.Config)) (*cld.Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := cld.Config{
		PipefsDir:  k.Dir(),
		OpenPipe:   k.OpenPipe,
		IsPipefs:   k.IsPipefs,
		Logger:     testLogger(t),
		Registerer: reg,
		OpTimeout:  10 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := cld.NewServer(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv, reg
}

// run starts srv.Run and returns a function that cancels it and checks
// that it returns nil.
func run(t *testing.T, srv *cld.Server) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	return sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("Run did not return 20 s after its context was cancelled")
		}
	})
}

// newHarness builds and runs a Server on a fresh fake kernel (nfsd not
// started). mod may change the Config, hooks the server before Run.
func newHarness(t *testing.T, mod func(*cld.Config), hooks func(*cld.Server)) *harness {
	t.Helper()
	k, err := cldtest.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k.SetOpenWait(10 * time.Second) // generous under -race; the 1 s default has its own test
	h := &harness{k: k, store: newMemStore()}
	h.srv, h.reg = newServer(t, k, h.store, mod)
	if hooks != nil {
		hooks(h.srv)
	}
	h.stop = run(t, h.srv)
	t.Cleanup(func() {
		h.stop()
		k.Close()
		if r := k.Rejected(); len(r) > 0 {
			t.Errorf("the kernel rejected downcalls: %q", r)
		}
	})
	return h
}

// openV2 makes nfsd create the pipe, waits for the server to open it and
// negotiates the version, without GraceStart (no store call).
func (h *harness) openV2(t *testing.T) {
	t.Helper()
	if err := h.k.CreatePipe(); err != nil {
		t.Fatal(err)
	}
	if err := h.k.WaitOpen(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if v, err := h.k.GetVersion(testCtx(t)); err != nil || v != 2 {
		t.Fatalf("GetVersion: %d, %v", v, err)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitStatus waits, on StatusChanged, until pred holds.
func waitStatus(t *testing.T, srv *cld.Server, what string, pred func(cld.Status) bool) cld.Status {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		ch := srv.StatusChanged()
		st := srv.Status()
		if pred(st) {
			return st
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("waiting for %s; status %+v", what, st)
		}
	}
}

func inState(state string) func(cld.Status) bool {
	return func(st cld.Status) bool { return st.State == state }
}

// statusOf is the status of a fake-kernel call's error (0 for nil).
func statusOf(t *testing.T, err error) int16 {
	t.Helper()
	if err == nil {
		return 0
	}
	var se *cldtest.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("not a status: %v", err)
	}
	return se.Status
}

func names(recs []cld.Record) string {
	var n []string
	for _, r := range recs {
		n = append(n, string(r.Name))
	}
	sort.Strings(n)
	return strings.Join(n, ",")
}
