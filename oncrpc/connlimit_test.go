package oncrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
)

// connEvents collects OnConn events for a test to wait on.
type connEvents struct {
	ch    chan string
	count map[string]int // read by the test goroutine only
}

func newConnEvents() *connEvents {
	return &connEvents{ch: make(chan string, 4096), count: map[string]int{}}
}

func (e *connEvents) onConn(ev string) { e.ch <- ev }

// await consumes events until the counts reach want (events not named in
// want must stay at zero), then checks that they are exactly want.
func (e *connEvents) await(t testing.TB, want map[string]int) {
	t.Helper()
	bound := time.NewTimer(5 * time.Second)
	defer bound.Stop()
	for !e.reached(want) {
		select {
		case ev := <-e.ch:
			e.count[ev]++
		case <-bound.C:
			t.Fatalf("OnConn events %v, want %v within 5s", e.count, want)
		}
	}
	for ev, n := range e.count {
		if n != want[ev] {
			t.Fatalf("OnConn events %v, want %v", e.count, want)
		}
	}
}

func (e *connEvents) reached(want map[string]int) bool {
	for ev, n := range want {
		if e.count[ev] < n {
			return false
		}
	}
	return true
}

// logCapture is a slog.Handler that keeps the records.
type logCapture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logCapture) WithGroup(string) slog.Handler            { return l }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

// warns returns the attributes of the Warn records whose remote attribute
// is the address host (any port).
func (l *logCapture) warns(host string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.recs {
		if r.Level != slog.LevelWarn {
			continue
		}
		attrs := map[string]string{"msg": r.Message}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		if strings.HasPrefix(attrs["remote"], host+":") {
			out = append(out, attrs)
		}
	}
	return out
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// dialFromAddr opens a TCP connection from the loopback address local,
// closed when the test ends.
func dialFromAddr(t testing.TB, local, addr string) net.Conn {
	t.Helper()
	c, err := dialLoopback(local, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func dialLoopback(local, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, local, err)
	}
	return c, nil
}

// rawNull makes a NULL call of the test program over a record-marked
// stream and waits (at most 5 s) for its reply.
func rawNull(c net.Conn, xid uint32) error {
	w := NewWriter(nil)
	CallHeader{XID: xid, Prog: testProg, Vers: testVers, Proc: procNull}.MarshalXDR(w)
	if err := WriteRecord(c, w.Bytes()); err != nil {
		return fmt.Errorf("writing call: %w", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rec, err := ReadRecord(c, nil, 1<<16)
	if err != nil {
		return fmt.Errorf("reading reply: %w", err)
	}
	if got, ok := decodeReplyXID(rec); !ok || got != xid {
		return fmt.Errorf("reply XID %d, want %d", got, xid)
	}
	return decodeResult(rec, nil)
}

// closedByPeer reports whether err says the server closed the connection.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// awaitClosed waits (at most 5 s) for the server to close c.
func awaitClosed(t testing.TB, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !closedByPeer(err) {
		t.Fatalf("read from %v = %v, want the connection closed by the server", c.LocalAddr(), err)
	}
}

// TestPerHostCapClosesExcessConnections: 200 connections from one address
// get MaxConnsPerHost served and the rest closed at once, with one Warn line
// per minute for that address; another address is still served.
func TestPerHostCapClosesExcessConnections(t *testing.T) {
	const perHost, flood = 8, 200
	ev := newConnEvents()
	logs := &logCapture{}
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	ts := startServerPrep(t, "127.0.0.1:0",
		ServerConfig{MaxConnsPerHost: perHost, OnConn: ev.onConn, Logger: slog.New(logs)}, nil,
		func(s *Server) { s.connLog.now = clock.Now })

	conns := make([]net.Conn, flood)
	for i := range conns {
		conns[i] = dialFromAddr(t, "127.0.0.2", ts.tcpAddr)
	}
	ev.await(t, map[string]int{ConnAccepted: perHost, ConnRefusedPerHost: flood - perHost})
	served := 0
	for i, c := range conns {
		switch err := rawNull(c, uint32(i)); {
		case err == nil:
			served++
		case !closedByPeer(err):
			t.Fatalf("connection %d: %v, want a reply or closed", i, err)
		}
	}
	if served != perHost {
		t.Fatalf("%d connections from one host served, want %d", served, perHost)
	}
	if n := ts.srv.Conns(); n != perHost {
		t.Fatalf("Conns() = %d, want %d", n, perHost)
	}

	// A well-behaved client from another address is served.
	c := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr, LocalAddr: netip.MustParseAddr("127.0.0.3")})
	if err := c.Call(context.Background(), testProg, testVers, procNull, nil, nil); err != nil {
		t.Fatalf("client from 127.0.0.3: %v", err)
	}
	ev.await(t, map[string]int{ConnAccepted: perHost + 1, ConnRefusedPerHost: flood - perHost})

	// One Warn line for the flood within the minute...
	if w := logs.warns("127.0.0.2"); len(w) != 1 || w[0]["max_per_host"] != "8" {
		t.Fatalf("Warn lines for 127.0.0.2: %v, want one about the per-host cap", w)
	}
	// ...and a minute later the next line counts those held back.
	clock.Advance(time.Minute)
	awaitClosed(t, dialFromAddr(t, "127.0.0.2", ts.tcpAddr))
	ev.await(t, map[string]int{ConnAccepted: perHost + 1, ConnRefusedPerHost: flood - perHost + 1})
	w := logs.warns("127.0.0.2")
	if len(w) != 2 || w[1]["suppressed_refused_per_host"] != fmt.Sprint(flood-perHost-1) {
		t.Fatalf("Warn lines for 127.0.0.2: %v, want a second one with suppressed_refused_per_host=%d", w, flood-perHost-1)
	}
	if w := logs.warns("127.0.0.3"); len(w) != 0 {
		t.Fatalf("Warn lines for the well-behaved client: %v", w)
	}
}

// TestIdleConnectionEvictedAtTotalCap: with MaxConns held by connections
// from many addresses, a new client is served because the connection idle
// the longest is closed; an older connection with a call in flight is not.
func TestIdleConnectionEvictedAtTotalCap(t *testing.T) {
	const maxConns = 16
	ev := newConnEvents()
	ts := startServer(t, ServerConfig{MaxConns: maxConns, MaxConnsPerHost: 4, OnConn: ev.onConn}, nil)
	ctx := context.Background()

	// The oldest connection has a call in flight.
	busy := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr, LocalAddr: netip.MustParseAddr("127.0.0.9")})
	res := make(chan error, 1)
	go func() { res <- blockCall(ctx, busy) }()
	<-ts.svc.started

	// Idle connections from 127.0.0.10 to 127.0.0.14, three each, fill the
	// server.
	var idle []net.Conn
	for i := range maxConns - 1 {
		idle = append(idle, dialFromAddr(t, fmt.Sprintf("127.0.0.%d", 10+i/3), ts.tcpAddr))
	}
	ev.await(t, map[string]int{ConnAccepted: maxConns})

	fresh := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr, LocalAddr: netip.MustParseAddr("127.0.0.20")})
	if err := fresh.Call(ctx, testProg, testVers, procNull, nil, nil); err != nil {
		t.Fatalf("new client at the cap: %v", err)
	}
	ev.await(t, map[string]int{ConnAccepted: maxConns + 1, ConnEvictedIdle: 1})
	awaitClosed(t, idle[0])
	if err := rawNull(idle[1], 1); err != nil {
		t.Fatalf("second oldest idle connection: %v, want served", err)
	}
	if n := ts.srv.Conns(); n != maxConns {
		t.Fatalf("Conns() = %d, want %d", n, maxConns)
	}

	// Each further client evicts the next idle one, never the busy one.
	for i := range maxConns - 2 {
		c := dialFromAddr(t, fmt.Sprintf("127.0.0.%d", 30+i/3), ts.tcpAddr)
		if err := rawNull(c, uint32(i)); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	ev.await(t, map[string]int{ConnAccepted: 2*maxConns - 1, ConnEvictedIdle: maxConns - 1})
	for _, c := range idle[2:] {
		awaitClosed(t, c)
	}
	close(ts.svc.release)
	if err := <-res; err != nil {
		t.Fatalf("call in flight on the oldest connection: %v", err)
	}
}

// blockCall makes a procBlock call and checks its result.
func blockCall(ctx context.Context, c *Client) error {
	var n u32
	err := c.Call(ctx, testProg, testVers, procBlock, nil, &n)
	if err == nil && n != 7 {
		err = fmt.Errorf("result %d, want 7", n)
	}
	return err
}

// TestBusyConnectionsAreNeverEvicted: when every connection has a call in
// flight, a new connection is refused; once the calls are answered, a new
// connection evicts an idle one.
func TestBusyConnectionsAreNeverEvicted(t *testing.T) {
	const maxConns = 4
	ev := newConnEvents()
	ts := startServer(t, ServerConfig{MaxConns: maxConns, OnConn: ev.onConn}, nil)
	ctx := context.Background()
	res := make(chan error, maxConns)
	for i := range maxConns {
		c := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr, LocalAddr: netip.MustParseAddr(fmt.Sprintf("127.0.0.%d", 30+i))})
		go func() { res <- blockCall(ctx, c) }()
	}
	for range maxConns {
		<-ts.svc.started
	}
	awaitClosed(t, dialFromAddr(t, "127.0.0.40", ts.tcpAddr))
	ev.await(t, map[string]int{ConnAccepted: maxConns, ConnRefusedTotal: 1})
	if n := ts.srv.Conns(); n != maxConns {
		t.Fatalf("Conns() = %d, want %d", n, maxConns)
	}

	close(ts.svc.release)
	for range maxConns {
		if err := <-res; err != nil {
			t.Fatalf("call in flight at the cap: %v", err)
		}
	}
	// A reply reaches the client just before its slot is released.
	testutil.WaitFor(t, 5*time.Second, "an idle connection", func() bool {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		return ts.srv.longestIdle() != nil
	})
	if err := rawNull(dialFromAddr(t, "127.0.0.40", ts.tcpAddr), 1); err != nil {
		t.Fatalf("new connection once the others are idle: %v", err)
	}
	ev.await(t, map[string]int{ConnAccepted: maxConns + 1, ConnRefusedTotal: 1, ConnEvictedIdle: 1})
}

// fakeConn is a net.Conn with only addresses, for admit.
type fakeConn struct {
	net.Conn
	remote net.Addr
}

func (c fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c fakeConn) LocalAddr() net.Addr  { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 111} }

// TestPerHostCapCountsMappedAddressesAsIPv4: an IPv4-mapped IPv6 remote
// address counts against its IPv4 address; a non-IP one is not counted.
func TestPerHostCapCountsMappedAddressesAsIPv4(t *testing.T) {
	s := NewServer(Programs{}, ServerConfig{MaxConnsPerHost: 1})
	admit := func(remote net.Addr) connEvent {
		t.Helper()
		a, ok := s.admit(fakeConn{remote: remote})
		if !ok {
			t.Fatal("admit: shutting down")
		}
		if a.sc != nil {
			t.Cleanup(func() {
				s.mu.Lock()
				s.dropConn(a.sc)
				s.mu.Unlock()
				s.workers.Done()
			})
		}
		return a.event
	}
	mapped := &net.TCPAddr{IP: net.ParseIP("::ffff:127.0.0.2"), Port: 41000}
	if ev := admit(mapped); ev != evAccepted {
		t.Fatalf("first connection: %v", ev)
	}
	if ev := admit(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 2).To4(), Port: 41001}); ev != evRefusedPerHost {
		t.Fatalf("second connection from the same host as IPv4: %v, want %v", ev, evRefusedPerHost)
	}
	for range 3 {
		if ev := admit(&net.UnixAddr{Name: "@", Net: "unix"}); ev != evAccepted {
			t.Fatalf("non-IP remote: %v, want %v", ev, evAccepted)
		}
	}
	if got := s.hosts[netip.MustParseAddr("127.0.0.2")]; got != 1 || len(s.hosts) != 1 {
		t.Fatalf("per-host counts %v", s.hosts)
	}
}

// TestPrivilegedLoopbackPortIsNeverLockedOut: other local users fill
// 127.0.0.1's per-host cap and every slot of MaxConns with busy
// connections; a connection from a privileged loopback port (lockd's:
// only root binds one) is still admitted, beyond both caps, up to
// ReservedLocal of them; the same from an unprivileged port, or from a
// privileged port of another host, is refused.
func TestPrivilegedLoopbackPortIsNeverLockedOut(t *testing.T) {
	s := NewServer(Programs{}, ServerConfig{MaxConnsPerHost: 2, MaxConns: 3, ReservedLocal: 2})
	admit := func(ip string, port int, busy bool) connEvent {
		t.Helper()
		a, ok := s.admit(fakeConn{remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}})
		if !ok {
			t.Fatal("admit: shutting down")
		}
		if a.sc != nil {
			if busy {
				a.sc.sem <- struct{}{} // a call in flight: never evicted
			}
			t.Cleanup(func() {
				s.mu.Lock()
				s.dropConn(a.sc)
				s.mu.Unlock()
				s.workers.Done()
			})
		}
		return a.event
	}
	for i, want := range []connEvent{evAccepted, evAccepted, evRefusedPerHost} {
		if ev := admit("127.0.0.1", 40000+i, true); ev != want {
			t.Fatalf("local user's connection %d: %v, want %v", i, ev, want)
		}
	}
	// Over 127.0.0.1's cap: lockd is admitted all the same.
	if ev := admit("127.0.0.1", 700, true); ev != evAcceptedReserved {
		t.Fatalf("lockd over the per-host cap: %v, want %v", ev, evAcceptedReserved)
	}
	// MaxConns (3) reached, every connection busy.
	if ev := admit("127.0.0.5", 40000, true); ev != evRefusedTotal {
		t.Fatalf("another local user at the total cap: %v, want %v", ev, evRefusedTotal)
	}
	if ev := admit("10.0.0.1", 700, true); ev != evRefusedTotal {
		t.Fatalf("a privileged port of a remote host at the total cap: %v, want %v", ev, evRefusedTotal)
	}
	if ev := admit("127.0.0.1", 701, true); ev != evAcceptedReserved {
		t.Fatalf("a second lockd connection at the total cap: %v, want %v", ev, evAcceptedReserved)
	}
	// ReservedLocal (2) used up.
	if ev := admit("127.0.0.1", 702, true); ev != evRefusedTotal {
		t.Fatalf("a third privileged loopback connection: %v, want %v", ev, evRefusedTotal)
	}
	if s.localPriv != 2 || s.hosts[netip.MustParseAddr("127.0.0.1")] != 2 {
		t.Fatalf("accounting: localPriv %d, hosts %v", s.localPriv, s.hosts)
	}
}

// TestHostLogLimiter: one line per IP per interval, the held-back events
// counted into the next line, and at most max IPs remembered.
func TestHostLogLimiter(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	l := newHostLogLimiter(time.Minute, 3)
	l.now = clock.Now
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	if ok, held := l.allow(a, evRefusedPerHost); !ok || held != [numConnEvents]int{} {
		t.Fatalf("first line: %v %v", ok, held)
	}
	for range 50 {
		if ok, _ := l.allow(a, evRefusedPerHost); ok {
			t.Fatal("second line within the interval")
		}
	}
	if ok, _ := l.allow(a, evEvictedIdle); ok {
		t.Fatal("eviction line within the interval")
	}
	if ok, _ := l.allow(b, evRefusedTotal); !ok {
		t.Fatal("another IP is held back")
	}
	clock.Advance(time.Minute - time.Nanosecond)
	if ok, _ := l.allow(a, evRefusedPerHost); ok {
		t.Fatal("line before the interval ended")
	}
	clock.Advance(time.Nanosecond)
	ok, held := l.allow(a, evRefusedTotal)
	want := [numConnEvents]int{evRefusedPerHost: 51, evEvictedIdle: 1}
	if !ok || held != want {
		t.Fatalf("line after the interval: %v, held %v, want %v", ok, held, want)
	}

	// Bounded: the IP whose line is the oldest is forgotten first.
	for i := range 10 {
		l.allow(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), evRefusedTotal)
		if n := len(l.hosts); n > 3 || n != l.order.Len() {
			t.Fatalf("%d IPs remembered (list %d), max 3", n, l.order.Len())
		}
	}
	if ok, _ := l.allow(b, evRefusedTotal); !ok {
		t.Fatal("forgotten IP held back")
	}
	if ok, _ := l.allow(netip.AddrFrom4([4]byte{198, 51, 100, 9}), evRefusedTotal); ok {
		t.Fatal("most recent IP forgotten")
	}
}
