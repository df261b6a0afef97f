package oncrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"
)

// The test program: 0x20000099 versions 1 and 3.
const (
	testProg  uint32 = 0x20000099
	testVers  uint32 = 1
	testVers3 uint32 = 3

	procNull       uint32 = 0
	procEcho       uint32 = 1 // opaque<1024> → opaque
	procPanic      uint32 = 2
	procUnavail    uint32 = 3 // ErrProcUnavail
	procStrict     uint32 = 4 // uint32 then Done(): trailing bytes → GARBAGE_ARGS
	procFail       uint32 = 5 // a plain error → SYSTEM_ERR
	procDropFirst  uint32 = 6 // no reply to the first transmission of each XID
	procWho        uint32 = 7 // → string "net remote local"
	procBlock      uint32 = 8 // waits until released or ctx cancelled
	procSysErrWrap uint32 = 9 // wraps ErrSystemErr
)

type bytesArg []byte

func (b bytesArg) MarshalXDR(w *Writer)          { w.Opaque(b) }
func (b *bytesArg) UnmarshalXDR(r *Reader) error { *b = r.Opaque(1024); return r.Err() }

type stringRes string

func (s stringRes) MarshalXDR(w *Writer)          { w.String(string(s)) }
func (s *stringRes) UnmarshalXDR(r *Reader) error { *s = stringRes(r.String(1024)); return r.Err() }

type u32 uint32

func (v u32) MarshalXDR(w *Writer)          { w.Uint32(uint32(v)) }
func (v *u32) UnmarshalXDR(r *Reader) error { *v = u32(r.Uint32()); return r.Err() }

// testService implements the test program.
type testService struct {
	mu      sync.Mutex
	seen    map[uint32]int // XID → transmissions seen (procDropFirst)
	started chan struct{}  // procBlock: one value per call that started
	release chan struct{}  // procBlock: closed to let calls finish
}

func newTestService() *testService {
	return &testService{seen: map[uint32]int{}, started: make(chan struct{}, 128), release: make(chan struct{})}
}

func (s *testService) ServeRPC(ctx context.Context, c *Call, res *Writer) error {
	switch c.Proc {
	case procNull:
		return nil
	case procEcho:
		var b bytesArg
		if err := b.UnmarshalXDR(c.Args); err != nil {
			return fmt.Errorf("echo: %w: %w", err, ErrGarbageArgs)
		}
		b.MarshalXDR(res)
		return nil
	case procPanic:
		res.Uint32(42) // must not leak into the SYSTEM_ERR reply
		panic("test panic")
	case procUnavail:
		return fmt.Errorf("nope: %w", ErrProcUnavail)
	case procStrict:
		c.Args.Uint32()
		if err := c.Args.Done(); err != nil {
			return fmt.Errorf("strict: %w: %w", err, ErrGarbageArgs)
		}
		return nil
	case procFail:
		return errors.New("disk on fire")
	case procDropFirst:
		s.mu.Lock()
		s.seen[c.XID]++
		n := s.seen[c.XID]
		s.mu.Unlock()
		if n == 1 {
			return ErrNoReply
		}
		res.Uint32(uint32(n))
		return nil
	case procWho:
		res.String(fmt.Sprintf("%s %s %s", c.Net, c.Remote, c.Local))
		return nil
	case procBlock:
		s.started <- struct{}{}
		select {
		case <-s.release:
			res.Uint32(7)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case procSysErrWrap:
		return fmt.Errorf("busy: %w", ErrSystemErr)
	}
	return ErrProcUnavail
}

// testLogger logs through t.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) { w.t.Helper(); w.t.Log(string(p)); return len(p), nil }

type testServer struct {
	srv     *Server
	svc     *testService
	tcp     net.Listener
	udp     net.PacketConn
	tcpAddr string
	udpAddr string
	errs    chan error
}

// startServer serves the test program (and the portmapper when pm is set)
// on 127.0.0.1:0 over TCP and UDP until the test ends.
func startServer(t testing.TB, cfg ServerConfig, extra Programs) *testServer {
	t.Helper()
	return startServerOn(t, "127.0.0.1:0", cfg, extra)
}

func startServerOn(t testing.TB, addr string, cfg ServerConfig, extra Programs) *testServer {
	t.Helper()
	return startServerPrep(t, addr, cfg, extra, nil)
}

// startServerPrep is startServerOn with prep, when set, run on the Server
// before it serves.
func startServerPrep(t testing.TB, addr string, cfg ServerConfig, extra Programs, prep func(*Server)) *testServer {
	t.Helper()
	if cfg.Logger == nil {
		if _, ok := t.(*testing.B); !ok {
			cfg.Logger = testLogger(t)
		}
	}
	svc := newTestService()
	progs := Programs{{testProg, testVers}: svc, {testProg, testVers3}: svc}
	for k, v := range extra {
		progs[k] = v
	}
	ts := &testServer{srv: NewServer(progs, cfg), svc: svc, errs: make(chan error, 2)}
	if prep != nil {
		prep(ts.srv)
	}
	var err error
	if ts.tcp, err = net.Listen("tcp", addr); err != nil {
		t.Fatal(err)
	}
	if ts.udp, err = net.ListenPacket("udp", addr); err != nil {
		t.Fatal(err)
	}
	ts.tcpAddr, ts.udpAddr = ts.tcp.Addr().String(), ts.udp.LocalAddr().String()
	go func() { ts.errs <- ts.srv.ServeTCP(ts.tcp) }()
	go func() { ts.errs <- ts.srv.ServeUDP(ts.udp) }()
	t.Cleanup(func() { ts.shutdown(t) })
	return ts
}

func (ts *testServer) shutdown(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ts.srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	for range 2 {
		select {
		case err := <-ts.errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("Serve returned %v, want ErrClosed", err)
			}
		case <-ctx.Done():
			t.Errorf("Serve did not return after Shutdown")
			return
		}
	}
}

func (ts *testServer) addr(network string) string {
	if network == "udp" {
		return ts.udpAddr
	}
	return ts.tcpAddr
}

func dialTest(t testing.TB, cfg ClientConfig) *Client {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	c, err := Dial(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func testingProcs() int { return runtime.GOMAXPROCS(0) }
