package agent

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/internal/testutil"
)

// At admin_max_conns a new connection closes the longest-idle keep-alive
// connection to get in; with every connection in a request, it is closed
// at once. Each is counted.
func TestAdminConnectionCapEvictsIdleThenRefuses(t *testing.T) {
	reg := prometheus.NewRegistry()
	caps, err := newAdminConns(2, reg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	inBlock := make(chan struct{}, 4)
	mux := http.NewServeMux()
	mux.HandleFunc("/fast", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/block", func(w http.ResponseWriter, r *http.Request) {
		inBlock <- struct{}{}
		<-release
		io.WriteString(w, "ok")
	})
	srv := &http.Server{Handler: mux, ConnState: caps.connState, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(caps.listener(ln))
	t.Cleanup(func() { close(release); srv.Close() })
	addr := ln.Addr().String()

	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	get := func(c net.Conn, path string) {
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	answered := func(c net.Conn) error {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return err == io.EOF
	}
	metric := func(ev string) float64 {
		return testutil.GatheredValue(t, reg, "nsmd_admin_connections_total", "event", ev)
	}

	idle := dial()
	get(idle, "/fast")
	if err := answered(idle); err != nil {
		t.Fatal(err)
	}
	idleConns := func() int {
		caps.mu.Lock()
		defer caps.mu.Unlock()
		return caps.idle.Len()
	}
	testutil.WaitFor(t, 5*time.Second, "the answered connection to be idle", func() bool { return idleConns() == 1 })
	busy := dial()
	get(busy, "/block")
	<-inBlock
	// At the cap: the idle keep-alive connection makes room.
	third := dial()
	get(third, "/fast")
	if err := answered(third); err != nil {
		t.Fatalf("third connection: %v", err)
	}
	if !closed(idle) {
		t.Fatal("the idle connection was not closed to make room")
	}
	// third is idle now; make it busy too: the next one is refused.
	get(third, "/block")
	<-inBlock
	fourth := dial()
	if !closed(fourth) {
		t.Fatal("a connection over the cap with none idle was served")
	}
	testutil.WaitFor(t, 5*time.Second, "the refusal to be counted", func() bool { return metric("refused") == 1 })
	if a, e := metric("accepted"), metric("evicted_idle"); a != 3 || e != 1 {
		t.Fatalf("accepted %v evicted_idle %v, want 3 and 1", a, e)
	}
}
