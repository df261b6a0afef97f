package e2e

import (
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sdMessage is one datagram received on a NOTIFY_SOCKET, with the sender's
// pid from SCM_CREDENTIALS (systemd accepts, by default, only the main
// process's messages).
type sdMessage struct {
	text string
	pid  int32
	at   time.Time
}

// listenNotify opens a unixgram socket as systemd's NOTIFY_SOCKET is,
// with SO_PASSCRED, and returns its path and the messages it receives.
func listenNotify(t *testing.T) (string, <-chan sdMessage) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil || serr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, serr)
	}
	msgs := make(chan sdMessage, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf, oob := make([]byte, 4096), make([]byte, 256)
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			m := sdMessage{text: string(buf[:n]), pid: -1, at: time.Now()}
			if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, cm := range cms {
					if cred, err := unix.ParseUnixCredentials(&cm); err == nil {
						m.pid = cred.Pid
					}
				}
			}
			select {
			case msgs <- m:
			default:
				t.Errorf("notify messages not consumed; dropped %q", m.text)
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return path, msgs
}

// readyz says whether GET /readyz on admin answers 200.
func readyz(admin string) bool {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestSystemdNotifyReadyOnlyOnceReadyAndWatchdogKeepsComing runs the agent
// as systemd runs a Type=notify service with WatchdogSec: NOTIFY_SOCKET is
// a real unixgram socket, WATCHDOG_USEC 200 ms. The node waits for a
// second voter (bootstrap_expect 2), so it cannot be ready: WATCHDOG=1
// must keep arriving (every ~100 ms) and READY=1 must not. Once the
// second node joins, READY=1 arrives exactly once, when /readyz answers
// 200; WATCHDOG=1 goes on; SIGTERM brings STOPPING=1. Every message comes
// from the agent's own pid (NotifyAccess=main).
func TestSystemdNotifyReadyOnlyOnceReadyAndWatchdogKeepsComing(t *testing.T) {
	sock, msgs := listenNotify(t)
	port := func() string { return strconv.Itoa(freePort(t, "127.0.0.1")) }
	gossipA := port()
	adminA := net.JoinHostPort("127.0.0.1", port())
	node := func(id, gossip, admin string, join ...string) []string {
		args := []string{"agent", "--node-id", id, "--data-dir", t.TempDir(), "--bind", "127.0.0.1",
			"--raft-port", port(), "--gossip-port", gossip, "--nsm-addr", "127.0.0.1:0", "--admin-addr", admin,
			"--bootstrap-expect", "2", "--rpcbind", "off", "--vip-mode", "none", "--log-level", "info"}
		if len(join) > 0 {
			args = append(args, "--join", strings.Join(join, ","))
		}
		return args
	}
	a := startNsmdEnv(t, []string{"NOTIFY_SOCKET=" + sock, "WATCHDOG_USEC=200000"}, node("a", gossipA, adminA)...)
	pid := int32(a.cmd.Process.Pid)

	next := func(within time.Duration) sdMessage {
		t.Helper()
		select {
		case m := <-msgs:
			if m.pid != pid {
				t.Errorf("message %q from pid %d, want the agent's %d", m.text, m.pid, pid)
			}
			return m
		case <-time.After(within):
			t.Fatalf("no notify message within %v", within)
		case <-a.done:
			t.Fatalf("agent exited:\n%s", a.log.String())
		}
		return sdMessage{}
	}

	// Not ready (one of two voters): five watchdog pings, no READY.
	var pings []time.Time
	for len(pings) < 5 {
		m := next(2 * time.Second)
		if strings.Contains(m.text, "READY=1") {
			t.Fatalf("READY=1 before the cluster formed: %q", m.text)
		}
		if m.text == "WATCHDOG=1" {
			pings = append(pings, m.at)
		}
	}
	if gap := pings[4].Sub(pings[0]) / 4; gap < 50*time.Millisecond || gap > 150*time.Millisecond {
		t.Errorf("watchdog pings every %v, want about 100 ms (half of WATCHDOG_USEC)", gap)
	}
	if readyz(adminA) {
		t.Fatal("/readyz says ready while one of two voters runs")
	}

	started := time.Now()
	startNsmd(t, node("b", port(), net.JoinHostPort("127.0.0.1", port()), net.JoinHostPort("127.0.0.1", gossipA))...)
	var ready int
	var after []time.Time
	for len(after) < 3 {
		m := next(15 * time.Second)
		switch {
		case strings.HasPrefix(m.text, "READY=1"):
			ready++
			if !readyz(adminA) {
				t.Errorf("READY=1 sent while /readyz says not ready")
			}
			t.Logf("READY=1 %v after the second node started: %q", m.at.Sub(started).Round(time.Millisecond), m.text)
		case m.text == "WATCHDOG=1" && ready > 0:
			after = append(after, m.at)
		}
	}
	if ready != 1 {
		t.Errorf("READY=1 sent %d times, want once", ready)
	}

	a.cmd.Process.Signal(syscall.SIGTERM)
	for {
		m := next(10 * time.Second)
		if m.text == "STOPPING=1" {
			break
		}
		if strings.HasPrefix(m.text, "READY=1") {
			t.Errorf("READY=1 sent again: %q", m.text)
		}
	}
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not exit after SIGTERM")
	}
	if code := a.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("agent exit code %d after SIGTERM:\n%s", code, a.log.String())
	}
}
