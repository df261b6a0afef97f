package oncrpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var networks = []string{"tcp", "udp"}

// TestReplyStatusesOverTCPAndUDP checks every accept and reject status of
// RFC 5531 §9 end to end: server encoding, client mapping to errors.
func TestReplyStatusesOverTCPAndUDP(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			c := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network)})
			ctx := context.Background()
			badSys := OpaqueAuth{Flavor: AuthSys, Body: []byte{0, 0, 0, 1}} // truncated authsys_parms
			tests := []struct {
				name             string
				prog, vers, proc uint32
				args             Marshaler
				cred             *OpaqueAuth
				want             error
			}{
				{"SUCCESS", testProg, testVers, procNull, nil, nil, nil},
				{"PROG_UNAVAIL", 0x20000098, 1, 0, nil, nil, ErrProgUnavail},
				{"PROG_MISMATCH", testProg, 2, 0, nil, nil, ErrProgMismatch},
				{"PROC_UNAVAIL", testProg, testVers, procUnavail, nil, nil, ErrProcUnavail},
				{"PROC_UNAVAIL unknown proc", testProg, testVers, 999, nil, nil, ErrProcUnavail},
				{"GARBAGE_ARGS trailing", testProg, testVers, procStrict, bytesArg("xyz"), nil, ErrGarbageArgs},
				{"GARBAGE_ARGS short", testProg, testVers, procEcho, nil, nil, ErrGarbageArgs},
				{"SYSTEM_ERR plain error", testProg, testVers, procFail, nil, nil, ErrSystemErr},
				{"SYSTEM_ERR wrapped", testProg, testVers, procSysErrWrap, nil, nil, ErrSystemErr},
				{"SYSTEM_ERR panic", testProg, testVers, procPanic, nil, nil, ErrSystemErr},
				{"AUTH_ERROR bad AUTH_SYS", testProg, testVers, procNull, nil, &badSys, ErrAuth},
				{"AUTH_ERROR unknown flavor", testProg, testVers, procNull, nil, &OpaqueAuth{Flavor: 6}, ErrAuth},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					cl := c
					if tt.cred != nil {
						cl = dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network), Cred: *tt.cred})
					}
					err := cl.Call(ctx, tt.prog, tt.vers, tt.proc, tt.args, nil)
					if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
						t.Fatalf("Call = %v, want %v", err, tt.want)
					}
				})
			}
			// PROG_MISMATCH carries the lowest and highest registered versions.
			var me *MismatchError
			err := c.Call(ctx, testProg, 7, 0, nil, nil)
			if !errors.As(err, &me) || me.Low != testVers || me.High != testVers3 {
				t.Fatalf("PROG_MISMATCH: %v, want low %d high %d", err, testVers, testVers3)
			}
			// AUTH_ERROR carries AUTH_BADCRED.
			cl := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network), Cred: badSys})
			var ae *AuthError
			if err := cl.Call(ctx, testProg, testVers, 0, nil, nil); !errors.As(err, &ae) || ae.Stat != AuthBadCred {
				t.Fatalf("bad cred: %v, want AUTH_BADCRED", err)
			}
			// The server is still serving after the panic.
			var out bytesArg
			if err := c.Call(ctx, testProg, testVers, procEcho, bytesArg("hello"), &out); err != nil || string(out) != "hello" {
				t.Fatalf("echo after errors = %q, %v", out, err)
			}
		})
	}
}

// TestRPCVersionMismatchIsDenied sends rpcvers 3 and expects MSG_DENIED
// RPC_MISMATCH low 2 high 2 (RFC 5531 §9).
func TestRPCVersionMismatchIsDenied(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	conn, err := net.Dial("udp", ts.udpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := []byte{
		0, 0, 0, 9, // XID
		0, 0, 0, 0, // CALL
		0, 0, 0, 3, // rpcvers 3
		0x20, 0, 0, 0x99, 0, 0, 0, 1, 0, 0, 0, 0, // prog, vers, proc
		0, 0, 0, 0, 0, 0, 0, 0, // cred AUTH_NONE
		0, 0, 0, 0, 0, 0, 0, 0, // verf AUTH_NONE
	}
	if _, err := conn.Write(call); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{
		0, 0, 0, 9, // XID
		0, 0, 0, 1, // REPLY
		0, 0, 0, 1, // MSG_DENIED
		0, 0, 0, 0, // RPC_MISMATCH
		0, 0, 0, 2, // low
		0, 0, 0, 2, // high
	}
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("reply % x, want % x", buf[:n], want)
	}
	r := NewReader(buf[:n])
	var me *MismatchError
	if _, err := decodeReply(r); !errors.As(err, &me) || !errors.Is(err, ErrRPCMismatch) || me.Low != 2 || me.High != 2 {
		t.Fatalf("decodeReply = %v", err)
	}
}

func TestAuthSysCredentialReachesHandler(t *testing.T) {
	var got atomic.Pointer[AuthSysParams]
	h := HandlerFunc(func(ctx context.Context, c *Call, res *Writer) error {
		if c.Sys != nil {
			p := *c.Sys
			got.Store(&p)
		}
		return nil
	})
	ts := startServer(t, ServerConfig{}, Programs{{0x20000100, 1}: h})
	want := AuthSysParams{Stamp: 5, MachineName: "client.example", UID: 1000, GID: 100, GIDs: []uint32{4, 24, 27}}
	for _, network := range networks {
		got.Store(nil)
		c := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network), Cred: AuthSysCred(want)})
		if err := c.Call(context.Background(), 0x20000100, 1, 0, nil, nil); err != nil {
			t.Fatal(err)
		}
		p := got.Load()
		if p == nil || p.MachineName != want.MachineName || p.UID != 1000 || fmt.Sprint(p.GIDs) != fmt.Sprint(want.GIDs) {
			t.Fatalf("%s: Sys = %+v, want %+v", network, p, want)
		}
	}
}

// TestPipelinedConcurrentCallsOnOneConnection runs many concurrent calls on
// one TCP connection, each with its own payload, and checks every caller
// gets its own answer.
func TestPipelinedConcurrentCallsOnOneConnection(t *testing.T) {
	ts := startServer(t, ServerConfig{MaxInFlight: 8}, nil)
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			c := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network)})
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for i := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range 20 {
						msg := fmt.Sprintf("caller %d call %d %s", i, j, strings.Repeat("x", i))
						var out bytesArg
						if err := c.Call(context.Background(), testProg, testVers, procEcho, bytesArg(msg), &out); err != nil {
							errs <- err
							return
						}
						if string(out) != msg {
							errs <- fmt.Errorf("got %q, want %q", out, msg)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// TestUDPSocketServesMoreCallsAtOnceThanATCPConnection: one UDP socket
// carries every UDP client, so its bound is MaxInFlightUDP, not the
// per-connection MaxInFlight: 3× MaxInFlight blocked calls all start.
func TestUDPSocketServesMoreCallsAtOnceThanATCPConnection(t *testing.T) {
	const perConn, calls = 4, 12
	ts := startServer(t, ServerConfig{MaxInFlight: perConn, MaxInFlightUDP: calls}, nil)
	c := dialTest(t, ClientConfig{Net: "udp", Addr: ts.udpAddr, Retransmit: 10 * time.Second})
	errs := make(chan error, calls)
	for range calls {
		go func() { errs <- c.Call(context.Background(), testProg, testVers, procBlock, nil, nil) }()
	}
	timeout := time.After(5 * time.Second)
	for i := range calls {
		select {
		case <-ts.svc.started:
		case <-timeout:
			t.Fatalf("%d of %d calls started on one UDP socket", i, calls)
		}
	}
	close(ts.svc.release)
	for range calls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestTCPRepliesMayComeOutOfOrder: a blocked call does not hold back a
// later one on the same connection.
func TestTCPRepliesMayComeOutOfOrder(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	c := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr})
	blocked := make(chan error, 1)
	go func() { blocked <- c.Call(context.Background(), testProg, testVers, procBlock, nil, nil) }()
	<-ts.svc.started
	if err := c.Call(context.Background(), testProg, testVers, procNull, nil, nil); err != nil {
		t.Fatal(err)
	}
	close(ts.svc.release)
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
}

// TestUDPRetransmitsSameXID: the server ignores the first transmission;
// the client's retransmission (same XID) gets the answer.
func TestUDPRetransmitsSameXID(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	c := dialTest(t, ClientConfig{Net: "udp", Addr: ts.udpAddr, Retransmit: 20 * time.Millisecond})
	var n u32
	if err := c.Call(context.Background(), testProg, testVers, procDropFirst, nil, &n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("server saw the XID %d times before replying, want 2", n)
	}
}

func TestUDPTimeout(t *testing.T) {
	// A socket nobody reads: every transmission is lost.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	c := dialTest(t, ClientConfig{Net: "udp", Addr: pc.LocalAddr().String(), Timeout: 100 * time.Millisecond, Retransmit: 10 * time.Millisecond})
	start := time.Now()
	err = c.Call(context.Background(), testProg, testVers, 0, nil, nil)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Call = %v, want ErrTimeout", err)
	}
	// Count the retransmissions: 10, 20, 40 ms → 4 sends within 100 ms.
	// The datagrams are already queued; the deadline only ends the loop.
	pc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	buf := make([]byte, 1500)
	sends := 0
	var xids []uint32
	for {
		if _, _, err := pc.ReadFrom(buf); err != nil {
			break
		}
		sends++
		x, _ := decodeReplyXID(append(buf[:4:4], 0, 0, 0, 1))
		xids = append(xids, x)
	}
	if sends < 2 {
		t.Fatalf("%d transmissions in %v, want retransmits", sends, time.Since(start))
	}
	for _, x := range xids {
		if x != xids[0] {
			t.Fatalf("retransmissions changed XID: %v", xids)
		}
	}
	// ctx cancellation is honoured too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Call(ctx, testProg, testVers, 0, nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Call = %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.Call(ctx, testProg, testVers, 0, nil, nil); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Call past ctx deadline = %v", err)
	}
}

// TestUDPClientIgnoresUnknownXIDs: a stray reply with another XID does not
// complete a call.
func TestUDPClientIgnoresUnknownXIDs(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 1500)
		n, from, err := pc.ReadFrom(buf)
		if err != nil || n < 4 {
			return
		}
		xid := buf[:4]
		stray := []byte{
			xid[0] ^ 0xff, xid[1], xid[2], xid[3], // XID (wrong)
			0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // REPLY ACCEPTED verf SUCCESS
			0, 0, 0, 1, // result 1
		}
		good := append([]byte{xid[0], xid[1], xid[2], xid[3]}, stray[4:len(stray)-4]...)
		good = append(good, 0, 0, 0, 2) // result 2
		pc.WriteTo(stray, from)
		pc.WriteTo(good, from)
	}()
	c := dialTest(t, ClientConfig{Net: "udp", Addr: pc.LocalAddr().String()})
	var n u32
	if err := c.Call(context.Background(), testProg, testVers, 0, nil, &n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("result %d, want 2 (from the reply with the right XID)", n)
	}
}

// TestCallRemoteAndLocal checks Call.Net, Remote and Local over both
// transports.
func TestCallRemoteAndLocal(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	for _, network := range networks {
		c := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network)})
		var who stringRes
		if err := c.Call(context.Background(), testProg, testVers, procWho, nil, &who); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%s %s %s", network, c.LocalAddr(), ts.addr(network))
		if string(who) != want {
			t.Fatalf("who = %q, want %q", who, want)
		}
	}
}

// TestLocalAddrIsCallerAddress: a client bound to 127.0.0.2 (like the VIP)
// is seen by the server as 127.0.0.2.
func TestLocalAddrIsCallerAddress(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	for _, network := range networks {
		c := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network), LocalAddr: netip.MustParseAddr("127.0.0.2")})
		var who stringRes
		if err := c.Call(context.Background(), testProg, testVers, procWho, nil, &who); err != nil {
			t.Fatal(err)
		}
		remote := strings.Fields(string(who))[1]
		if !strings.HasPrefix(remote, "127.0.0.2:") {
			t.Fatalf("%s: server saw caller %s, want 127.0.0.2", network, remote)
		}
	}
}

func TestPrivilegedSourcePort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("binding a port below 1024 needs root")
	}
	ts := startServer(t, ServerConfig{}, nil)
	for _, network := range networks {
		c := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network), Privileged: true})
		var who stringRes
		if err := c.Call(context.Background(), testProg, testVers, procWho, nil, &who); err != nil {
			t.Fatal(err)
		}
		remote := netip.MustParseAddrPort(strings.Fields(string(who))[1])
		if remote.Port() < 512 || remote.Port() > 1023 {
			t.Fatalf("%s: source port %d, want 512..1023", network, remote.Port())
		}
		if c.LocalAddr().Port() != remote.Port() {
			t.Fatalf("LocalAddr %v, server saw %v", c.LocalAddr(), remote)
		}
	}
}

// udpReplySource sends a NULL call from a raw socket to dst and returns the
// source address of the reply.
func udpReplySource(t *testing.T, network string, dst netip.AddrPort) netip.AddrPort {
	t.Helper()
	laddr := "127.0.0.1:0"
	if dst.Addr().Is6() {
		laddr = "[::1]:0"
	}
	pc, err := net.ListenPacket(network, laddr)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	w := NewWriter(nil)
	CallHeader{XID: 77, Prog: testProg, Vers: testVers, Proc: procNull}.MarshalXDR(w)
	if _, err := pc.WriteTo(w.Bytes(), net.UDPAddrFromAddrPort(dst)); err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := pc.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	if xid, _ := decodeReplyXID(buf[:n]); xid != 77 {
		t.Fatalf("reply XID %d", xid)
	}
	return addrPortOf(from)
}

// TestUDPReplyLeavesFromRequestDestination binds the server to the wildcard
// address and calls it at 127.0.0.5: the reply must come from 127.0.0.5, as
// a reply to a VIP must come from the VIP.
func TestUDPReplyLeavesFromRequestDestination(t *testing.T) {
	cases := []struct {
		name, bind string
		to         string
	}{
		{"ipv4 wildcard", "0.0.0.0:0", "127.0.0.5"},
		{"ipv4 specific", "127.0.0.5:0", "127.0.0.5"},
		{"dual-stack wildcard, ipv4 call", "[::]:0", "127.0.0.5"},
		{"dual-stack wildcard, ipv6 call", "[::]:0", "::1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := net.ListenPacket("udp", tc.bind)
			if err != nil {
				t.Skipf("cannot bind %s: %v", tc.bind, err)
			}
			srv := NewServer(Programs{{testProg, testVers}: newTestService()}, ServerConfig{Logger: testLogger(t)})
			done := make(chan error, 1)
			go func() { done <- srv.ServeUDP(pc) }()
			defer func() {
				srv.Shutdown(context.Background())
				if err := <-done; !errors.Is(err, ErrClosed) {
					t.Errorf("ServeUDP = %v", err)
				}
			}()
			port := addrPortOf(pc.LocalAddr()).Port()
			dst := netip.AddrPortFrom(netip.MustParseAddr(tc.to), port)
			if got := udpReplySource(t, "udp", dst); got != dst {
				t.Fatalf("reply came from %v, want %v", got, dst)
			}
		})
	}
}

// TestOversizedRecordClosesConnection: a record above MaxRecordSize closes
// that connection (RFC 5531 §11 gives no way to skip it) and the server
// keeps serving others.
func TestOversizedRecordClosesConnection(t *testing.T) {
	ts := startServer(t, ServerConfig{MaxRecordSize: 1024}, nil)
	conn, err := net.Dial("tcp", ts.tcpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte{0x80, 0, 0x10, 0}) // record marker: last fragment, 4096 bytes
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read = %v, want connection closed", err)
	}
	c := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr})
	var out bytesArg
	if err := c.Call(context.Background(), testProg, testVers, procEcho, bytesArg("still here"), &out); err != nil {
		t.Fatal(err)
	}
	// A call just under the cap still works, over several fragments.
	big := bytes.Repeat([]byte{'a'}, 900)
	if err := c.Call(context.Background(), testProg, testVers, procEcho, bytesArg(big), &out); err != nil || !bytes.Equal(out, big) {
		t.Fatalf("large echo: %v", err)
	}
}

func TestMultiFragmentCallIsReassembled(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	conn, err := net.Dial("tcp", ts.tcpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w := NewWriter(nil)
	CallHeader{XID: 5, Prog: testProg, Vers: testVers, Proc: procEcho}.MarshalXDR(w)
	bytesArg("fragmented").MarshalXDR(w)
	msg := w.Bytes()
	var stream []byte
	// Fragments of 7 bytes, one empty non-last fragment, then the rest.
	stream = append(stream, 0, 0, 0, 7)
	stream = append(stream, msg[:7]...)
	stream = append(stream, 0, 0, 0, 0) // empty fragment
	rest := msg[7:]
	stream = append(stream, 0x80, 0, 0, byte(len(rest)))
	stream = append(stream, rest...)
	if _, err := conn.Write(stream); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	rec, err := ReadRecord(conn, nil, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	var out bytesArg
	if err := decodeResult(rec, &out); err != nil || string(out) != "fragmented" {
		t.Fatalf("reply %q, %v", out, err)
	}
}

// TestNonCallClosesTCPConnectionAndIsDroppedOverUDP: a REPLY sent to the
// server is not a call; nothing is answered and nothing crashes.
func TestNonCallClosesTCPConnectionAndIsDroppedOverUDP(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	junk := []byte{0, 0, 0, 1, 0, 0, 0, 1} // XID 1, REPLY
	conn, err := net.Dial("tcp", ts.tcpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	WriteRecord(conn, junk)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read = %v, want closed", err)
	}
	u, err := net.Dial("udp", ts.udpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.Write(junk)
	u.Write([]byte{1, 2}) // shorter than an XID
	c := dialTest(t, ClientConfig{Net: "udp", Addr: ts.udpAddr})
	if err := c.Call(context.Background(), testProg, testVers, 0, nil, nil); err != nil {
		t.Fatal(err)
	}
}

func TestObserveCalledAfterEachReply(t *testing.T) {
	type obs struct {
		proc uint32
		err  error
	}
	ch := make(chan obs, 10)
	ts := startServer(t, ServerConfig{Observe: func(c *Call, err error, d time.Duration) { ch <- obs{c.Proc, err} }}, nil)
	c := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr})
	c.Call(context.Background(), testProg, testVers, procNull, nil, nil)
	c.Call(context.Background(), testProg, testVers, procUnavail, nil, nil)
	// Observe runs after the reply is sent, so the second call can be
	// observed first.
	got := map[uint32]error{}
	for range 2 {
		o := <-ch
		got[o.proc] = o.err
	}
	if err, ok := got[procNull]; !ok || err != nil {
		t.Fatalf("observations %v: NULL missing or failed", got)
	}
	if err, ok := got[procUnavail]; !ok || !errors.Is(err, ErrProcUnavail) {
		t.Fatalf("observations %v: want PROC_UNAVAIL", got)
	}
}

// TestShutdownWaitsForInFlightCalls: a call in progress when Shutdown
// starts still gets its reply; Shutdown returns once it has.
func TestShutdownWaitsForInFlightCalls(t *testing.T) {
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			ts := startServer(t, ServerConfig{}, nil)
			c := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network)})
			res := make(chan error, 1)
			go func() {
				var n u32
				err := c.Call(context.Background(), testProg, testVers, procBlock, nil, &n)
				if err == nil && n != 7 {
					err = fmt.Errorf("result %d", n)
				}
				res <- err
			}()
			<-ts.svc.started
			shut := make(chan error, 1)
			go func() { shut <- ts.srv.Shutdown(context.Background()) }()
			select {
			case err := <-shut:
				t.Fatalf("Shutdown returned %v with a call in flight", err)
			case <-time.After(50 * time.Millisecond):
			}
			close(ts.svc.release)
			if err := <-res; err != nil {
				t.Fatalf("in-flight call: %v", err)
			}
			if err := <-shut; err != nil {
				t.Fatal(err)
			}
			// New connections are refused.
			if conn, err := net.Dial("tcp", ts.tcpAddr); err == nil {
				conn.Close()
				t.Fatal("listener still accepting after Shutdown")
			}
		})
	}
}

// TestShutdownDeadlineCancelsHandlers: a handler that does not finish is
// cancelled through its ctx when Shutdown's ctx ends.
func TestShutdownDeadlineCancelsHandlers(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	c := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr})
	res := make(chan error, 1)
	go func() { res <- c.Call(context.Background(), testProg, testVers, procBlock, nil, nil) }()
	<-ts.svc.started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := ts.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want DeadlineExceeded", err)
	}
	if err := <-res; err == nil {
		t.Fatal("call of a cancelled handler succeeded")
	}
	// Shutdown cut short does not wait for the connection goroutines; the
	// handler may still be logging its failed reply through t.
	ts.srv.workers.Wait()
}

func TestServeAfterShutdownReturnsErrClosed(t *testing.T) {
	srv := NewServer(Programs{}, ServerConfig{})
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.ServeTCP(l); !errors.Is(err, ErrClosed) {
		t.Fatalf("ServeTCP = %v", err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.ServeUDP(pc); !errors.Is(err, ErrClosed) {
		t.Fatalf("ServeUDP = %v", err)
	}
}

// TestTCPClientRedialsAfterServerClosesConnection: the calls in flight fail,
// the next call dials again.
func TestTCPClientRedialsAfterConnectionLoss(t *testing.T) {
	ts := startServer(t, ServerConfig{IdleTimeout: 50 * time.Millisecond}, nil)
	c := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr})
	if err := c.Call(context.Background(), testProg, testVers, 0, nil, nil); err != nil {
		t.Fatal(err)
	}
	first := c.LocalAddr()
	c.mu.Lock()
	dead := c.cur.dead
	c.mu.Unlock()
	<-dead // the server closed the idle connection
	if err := c.Call(context.Background(), testProg, testVers, 0, nil, nil); err != nil {
		t.Fatal(err)
	}
	if c.LocalAddr() == first {
		t.Fatalf("still on %v after the connection closed", first)
	}
}

func TestClientCloseFailsCallsAndIsIdempotent(t *testing.T) {
	ts := startServer(t, ServerConfig{}, nil)
	for _, network := range networks {
		c := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network)})
		res := make(chan error, 1)
		go func() { res <- c.Call(context.Background(), testProg, testVers, procBlock, nil, nil) }()
		<-ts.svc.started
		c.Close()
		if err := <-res; err == nil {
			t.Fatal("call survived Close")
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Call(context.Background(), testProg, testVers, 0, nil, nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("Call after Close = %v", err)
		}
	}
	close(ts.svc.release)
}

// A datagram from a loopback address that came in on a network interface
// is spoofed (the kernel lets it through with route_localnet=1): it is
// dropped before any program sees it. From the loopback interface, from
// another address, or without interface information, it is served.
func TestLoopbackSourceFromTheWireIsDropped(t *testing.T) {
	lo := []int{1}
	for _, tc := range []struct {
		from string
		ifx  int
		want bool
	}{
		{"127.0.0.1:700", 2, true},
		{"127.0.0.5:40000", 3, true},
		{"[::ffff:127.0.0.1]:700", 2, true},
		{"[::1]:700", 2, true},
		{"127.0.0.1:700", 1, false},
		{"192.0.2.1:700", 2, false},
		{"127.0.0.1:700", 0, false},
	} {
		if got := martian(ap(tc.from), tc.ifx, lo); got != tc.want {
			t.Errorf("martian(%s, if %d) = %v, want %v", tc.from, tc.ifx, got, tc.want)
		}
	}
	if got := martian(ap("127.0.0.1:700"), 2, nil); got {
		t.Error("dropped without knowing the loopback interfaces")
	}
	if lo := loopbackIndexes(); len(lo) == 0 {
		t.Error("no loopback interface found")
	}
}
