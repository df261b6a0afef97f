package nsm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/oncrpc"
)

var (
	lo    = netip.MustParseAddr("127.0.0.1")
	loStr = "127.0.0.1"
)

// testResolve resolves IP literals and a few fixed names, without DNS.
func testResolve(_ context.Context, name string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(name); err == nil {
		return []netip.Addr{a}, nil
	}
	switch name {
	case "client.example.test":
		return []netip.Addr{netip.MustParseAddr("127.0.0.7"), netip.MustParseAddr("::1")}, nil
	case "client2.example.test":
		return []netip.Addr{netip.MustParseAddr("127.0.0.8")}, nil
	}
	return nil, fmt.Errorf("no such host %q", name)
}

// serveRPC serves progs on fresh TCP and UDP sockets on addr (host:port)
// until the test ends; it returns their addresses.
func serveRPC(t testing.TB, progs oncrpc.Programs, addr string) (tcp, udp string) {
	t.Helper()
	srv := oncrpc.NewServer(progs, oncrpc.ServerConfig{})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	serveOn(t, srv, ln, pc)
	return ln.Addr().String(), pc.LocalAddr().String()
}

// serveOn runs srv on ln and pcs (either may be nil) and shuts it down
// when the test ends.
func serveOn(t testing.TB, srv *oncrpc.Server, ln net.Listener, pcs ...net.PacketConn) {
	t.Helper()
	var wg sync.WaitGroup
	if ln != nil {
		wg.Go(func() { _ = srv.ServeTCP(ln) })
	}
	for _, pc := range pcs {
		wg.Go(func() { _ = srv.ServeUDP(pc) })
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, oncrpc.ErrClosed) {
			t.Logf("shutdown: %v", err)
		}
		if ln != nil {
			ln.Close()
		}
		for _, pc := range pcs {
			pc.Close()
		}
		wg.Wait()
	})
}

// nsmServer is a Service over a mapRegistry served on 127.0.0.1.
type nsmServer struct {
	reg      *mapRegistry
	svc      *Service
	tcp, udp string
}

func newNSMServer(t testing.TB, cfg Config) *nsmServer {
	t.Helper()
	reg := newMapRegistry(3)
	if cfg.NodeID == "" {
		cfg.NodeID = "n1"
	}
	if cfg.Resolve == nil {
		cfg.Resolve = testResolve
	}
	svc, err := NewService(reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &nsmServer{reg: reg, svc: svc}
	s.tcp, s.udp = serveRPC(t, oncrpc.Programs{Program: svc}, loStr+":0")
	return s
}

// dial connects to the server over network from the given source address.
func (s *nsmServer) dial(t testing.TB, network string, from netip.Addr, privileged bool) *oncrpc.Client {
	t.Helper()
	addr := s.tcp
	if network == "udp" {
		addr = s.udp
	}
	c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{
		Net: network, Addr: addr, LocalAddr: from, Privileged: privileged, Timeout: 3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawArgs marshals as the given bytes (length a multiple of 4).
type rawArgs []byte

func (r rawArgs) MarshalXDR(w *oncrpc.Writer) { w.FixedOpaque(r) }

func call(t testing.TB, c *oncrpc.Client, proc uint32, args oncrpc.Marshaler, res oncrpc.Unmarshaler) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if args == nil {
		args = oncrpc.Void{}
	}
	return c.Call(ctx, Program.Prog, Program.Vers, proc, args, res)
}

var networks = []string{"udp", "tcp"}

// testWriter sends log output to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// recv waits for a value on ch, failing the test after 10 s.
func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting")
		panic("unreachable")
	}
}
