package oncrpc

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
)

// holds collects OnHold events for a test to wait on.
type holds chan string

func (h holds) onHold(cap string) {
	select {
	case h <- cap:
	default:
	}
}

// await waits (at most 10 s) for a hold at cap.
func (h holds) await(t testing.TB, cap string) {
	t.Helper()
	bound := time.NewTimer(10 * time.Second)
	defer bound.Stop()
	for {
		select {
		case got := <-h:
			if got == cap {
				return
			}
		case <-bound.C:
			t.Fatalf("no read held at the %s cap within 10s", cap)
		}
	}
}

// callRecord is one record-marked call of the test program with pad bytes
// of garbage after its header (a handler that ignores its arguments still
// holds them while it runs).
func callRecord(xid, proc uint32, pad int) []byte {
	w := NewWriter(nil)
	CallHeader{XID: xid, Prog: testProg, Vers: testVers, Proc: proc}.MarshalXDR(w)
	body := append(w.Bytes(), make([]byte, pad)...)
	rec := make([]byte, 4, 4+len(body))
	putMarker(rec, len(body))
	return append(rec, body...)
}

// echoRecord is a record-marked echo call of payload bytes.
func echoRecord(xid uint32, payload int) []byte {
	w := NewWriter(nil)
	CallHeader{XID: xid, Prog: testProg, Vers: testVers, Proc: procEcho}.MarshalXDR(w)
	w.Opaque(make([]byte, payload))
	rec := make([]byte, 4, 4+len(w.Bytes()))
	putMarker(rec, len(w.Bytes()))
	return append(rec, w.Bytes()...)
}

// TestCallsThatWaitHoldAtMostTheConnectionsBufferCap: a peer pipelines 64
// calls of 60 KiB that all wait (as NSM calls wait for readiness during an
// election). The server reads only as many as fit the connection's buffer
// cap and holds the rest back in TCP; once the calls are released every
// one is answered and nothing stays held. The negative control, with the
// cap out of the way, shows the test catching a server that reads all 64
// (3.75 MiB held by one connection).
func TestCallsThatWaitHoldAtMostTheConnectionsBufferCap(t *testing.T) {
	const calls, pad, capBytes = 64, 60 << 10, 256 << 10
	for _, tc := range []struct {
		name    string
		connCap int
	}{
		{"capped", capBytes},
		{"negative control: no cap", 1 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := make(holds, 64)
			ts := startServer(t, ServerConfig{MaxConnBuffered: tc.connCap, MaxHostBuffered: 1 << 30, MaxBuffered: 1 << 30, OnHold: h.onHold}, nil)
			c := dialFromAddr(t, "127.0.0.1", ts.tcpAddr)
			sent := make(chan error, 1)
			go func() {
				for i := range calls {
					if _, err := c.Write(callRecord(uint32(i+1), procBlock, pad)); err != nil {
						sent <- err
						return
					}
				}
				sent <- nil
			}()
			capped := tc.connCap == capBytes
			if capped {
				h.await(t, HoldConn)
			} else {
				for range calls {
					<-ts.svc.started
				}
			}
			held, started := ts.srv.Buffered(), len(ts.svc.started)
			t.Logf("held %d bytes, %d calls being served", held, started)
			switch {
			case capped && held > capBytes+DefaultMaxRecordSize:
				t.Fatalf("held %d bytes, want at most the cap %d + one record", held, capBytes)
			case !capped && held < calls*pad:
				t.Fatalf("negative control held %d bytes, want all %d records", held, calls*pad)
			}
			close(ts.svc.release)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			for i := range calls {
				rec, err := ReadRecord(c, nil, 1<<16)
				if err != nil {
					t.Fatalf("reply %d: %v", i, err)
				}
				if err := decodeResult(rec, nil); err != nil {
					t.Fatalf("reply %d: %v", i, err)
				}
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, 5*time.Second, "every byte given back", func() bool { return ts.srv.Buffered() == 0 })
		})
	}
}

// smallReceiver dials addr from local with a small receive buffer, so that
// the server's replies fill the socket soon when it does not read.
func smallReceiver(t testing.TB, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second,
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
			if err != nil {
				return err
			}
			return serr
		}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// stallConn makes c a connection the server cannot write to: it pipelines
// echo calls and never reads, until the server holds its reader at the
// connection's cap and a reply write has been blocked for 50 ms. The
// writing goroutine ends when c is closed.
func stallConn(t testing.TB, ts *testServer, h holds, c net.Conn) {
	t.Helper()
	go func() {
		for i := uint32(1); ; i++ {
			if _, err := c.Write(echoRecord(i, 1000)); err != nil {
				return
			}
		}
	}()
	h.await(t, HoldConn)
	local := addrPortOf(c.LocalAddr())
	testutil.WaitFor(t, 10*time.Second, "a reply write blocked for 50 ms", func() bool {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		for e := ts.srv.conns.Front(); e != nil; e = e.Next() {
			if sc := e.Value.(*serverConn); sc.remote == local {
				w := sc.writing.Load()
				return w != 0 && time.Since(time.Unix(0, w)) >= 50*time.Millisecond
			}
		}
		return false
	})
}

// TestConnectionThatDoesNotReadIsEvictedFirst: a peer that pipelines calls
// and never reads its replies no longer keeps its connection slot for the
// write timeout: at the total cap, with every other connection busy, and
// at its address's cap, a new connection closes it and is served; the
// connections that read are untouched. The negative controls, with the
// stall rule out of reach, show the new connection refused instead.
func TestConnectionThatDoesNotReadIsEvictedFirst(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        ServerConfig
		newFrom    string // the new connection's address
		busyFrom   string // a connection with a call in flight
		stalledFrm string
		refused    string // the negative control's refusal, "" for the rule
	}{
		{"total cap, the others busy", ServerConfig{MaxConns: 2}, "127.0.0.62", "127.0.0.61", "127.0.0.60", ""},
		{"the address's cap", ServerConfig{MaxConnsPerHost: 2}, "127.0.0.70", "127.0.0.70", "127.0.0.70", ""},
		{"negative control: total cap", ServerConfig{MaxConns: 2}, "127.0.0.65", "127.0.0.64", "127.0.0.63", ConnRefusedTotal},
		{"negative control: the address's cap", ServerConfig{MaxConnsPerHost: 2}, "127.0.0.71", "127.0.0.71", "127.0.0.71", ConnRefusedPerHost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := newConnEvents()
			h := make(holds, 64)
			cfg := tc.cfg
			cfg.OnConn, cfg.OnHold = ev.onConn, h.onHold
			cfg.MaxConnBuffered, cfg.StallAfter, cfg.WriteTimeout = 16<<10, 50*time.Millisecond, time.Minute
			if tc.refused != "" {
				cfg.StallAfter = time.Hour
			}
			ts := startServer(t, cfg, nil)
			stalled := smallReceiver(t, tc.stalledFrm, ts.tcpAddr)
			stallConn(t, ts, h, stalled)

			busy := dialTest(t, ClientConfig{Net: "tcp", Addr: ts.tcpAddr, LocalAddr: netip.MustParseAddr(tc.busyFrom)})
			done := make(chan error, 1)
			go func() { done <- blockCall(context.Background(), busy) }()
			<-ts.svc.started
			ev.await(t, map[string]int{ConnAccepted: 2})

			c := dialFromAddr(t, tc.newFrom, ts.tcpAddr)
			if tc.refused != "" {
				if err := rawNull(c, 1); !closedByPeer(err) {
					t.Fatalf("negative control: the new connection's call = %v, want it closed", err)
				}
				ev.await(t, map[string]int{ConnAccepted: 2, tc.refused: 1})
				close(ts.svc.release)
				if err := <-done; err != nil {
					t.Fatalf("the busy connection's call: %v", err)
				}
				return
			}
			if err := rawNull(c, 1); err != nil {
				t.Fatalf("new connection not served: %v", err)
			}
			ev.await(t, map[string]int{ConnAccepted: 3, ConnEvictedStalled: 1})
			// Its unread replies come first, then the end of the stream.
			stalled.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.Copy(io.Discard, stalled); err != nil && !closedByPeer(err) {
				t.Fatalf("the stalled connection was not closed: %v", err)
			}
			close(ts.svc.release)
			if err := <-done; err != nil {
				t.Fatalf("the busy connection's call: %v", err)
			}
		})
	}
}

// TestPrivilegedLoopbackReadsPastTheHostAndTotalCaps: when other
// connections hold the total buffer cap, a connection from a privileged
// loopback port (lockd) is still read; an ordinary one waits.
func TestPrivilegedLoopbackReadsPastTheHostAndTotalCaps(t *testing.T) {
	if !canBindPrivileged() {
		t.Skip("needs root (or CAP_NET_BIND_SERVICE) to bind a privileged source port")
	}
	const pad = 60 << 10
	h := make(holds, 64)
	ts := startServer(t, ServerConfig{MaxBuffered: 2 * pad, OnHold: h.onHold}, nil)
	hog := dialFromAddr(t, "127.0.0.80", ts.tcpAddr)
	for i := range 3 {
		if _, err := hog.Write(callRecord(uint32(i+1), procBlock, pad)); err != nil {
			t.Fatal(err)
		}
	}
	h.await(t, HoldTotal)
	ordinary := dialFromAddr(t, "127.0.0.81", ts.tcpAddr)
	if _, err := ordinary.Write(callRecord(100, procNull, 0)); err != nil {
		t.Fatal(err)
	}
	h.await(t, HoldTotal)
	lockd, err := Dial(context.Background(), ClientConfig{Net: "tcp", Addr: ts.tcpAddr, Privileged: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lockd.Close()
	if err := lockd.Call(context.Background(), testProg, testVers, procNull, nil, nil); err != nil {
		t.Fatalf("privileged loopback call at the total cap: %v", err)
	}
	ordinary.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := ordinary.Read(make([]byte, 1)); err == nil {
		t.Fatal("an ordinary connection was read past the total cap")
	}
	close(ts.svc.release)
	ordinary.SetReadDeadline(time.Now().Add(5 * time.Second))
	if rec, err := ReadRecord(ordinary, nil, 1<<16); err != nil {
		t.Fatalf("ordinary call after the hog's calls ended: %v", err)
	} else if xid, _ := decodeReplyXID(rec); xid != 100 {
		t.Fatalf("reply XID %d", xid)
	}
}

// canBindPrivileged reports whether this process may bind a port below 1024.
func canBindPrivileged() bool { return os.Geteuid() == 0 }
