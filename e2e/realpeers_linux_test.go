package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nlm"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/nsm/nsmtest"
	"github.com/nsmd/nsmd/oncrpc"
)

// The real Debian peers of the interop test (interop_linux_test.go), each
// in a namespace of the multi-host topology: rpcbind on the nodes, a
// client host running rpcbind + rpc.statd (+ sm-notify on request), stand-in
// lock managers registered with those rpcbinds, and the kernel-lockd-shaped
// SM_MON.

// startRealRpcbind runs Debian's rpcbind in h's namespace with a private
// /run (its socket and warm-start files live there) and waits until it
// answers on 127.0.0.1:111. It is stopped when the test ends.
func startRealRpcbind(t *testing.T, h *netHost) {
	t.Helper()
	bin := lookTool(t, "rpcbind")
	cmd := exec.Command("ip", "netns", "exec", h.ns, "unshare", "--mount", "--propagation", "private",
		"sh", "-c", `mount -t tmpfs nsmd-rpcbind /run && mkdir -p /run/rpcbind && exec "$0" -f -w`, bin)
	log := &childLog{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startPinned(cmd); err != nil {
		t.Fatalf("rpcbind in %s: %v", h.name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("rpcbind on %s:\n%s", h.name, log)
		}
	})
	testutil.WaitForSeen(t, 5*time.Second, "rpcbind on "+h.name, func() (bool, string) {
		err := inNetnsThread(h.ns, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			return oncrpc.NewPmapClient("127.0.0.1", oncrpc.ClientConfig{Timeout: 250 * time.Millisecond}).Null(ctx)
		})
		return err == nil, fmt.Sprint(err)
	})
}

// lockMgr is a stand-in lock manager in one namespace: NLM v3 over UDP on
// 127.0.0.1 at an ephemeral port that only the namespace's rpcbind knows
// (so every callback that reaches it went through a portmapper lookup).
type lockMgr struct {
	host      *netHost
	port      int
	callbacks chan nsmtest.Callback
}

// startLockMgr starts it and registers 100021/3/udp with the rpcbind on
// 127.0.0.1:111 in h's namespace.
func startLockMgr(t *testing.T, h *netHost) *lockMgr {
	t.Helper()
	lm := &lockMgr{host: h, callbacks: make(chan nsmtest.Callback, 64)}
	var conn net.PacketConn
	err := inNetnsThread(h.ns, func() error {
		var err error
		if conn, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			return err
		}
		lm.port = conn.LocalAddr().(*net.UDPAddr).Port
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		ok, err := oncrpc.NewPmapClient("127.0.0.1", oncrpc.ClientConfig{Timeout: 2 * time.Second}).
			Set(ctx, oncrpc.Mapping{Prog: nlm.Program, Vers: 3, Prot: oncrpc.IPProtoUDP, Port: uint32(lm.port)})
		if err == nil && !ok {
			err = fmt.Errorf("rpcbind refused SET 100021/3/udp port %d", lm.port)
		}
		return err
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		t.Fatalf("lock manager on %s: %v", h.name, err)
	}
	srv := oncrpc.NewServer(oncrpc.Programs{{Prog: nlm.Program, Vers: 3}: nsmtest.LockManagerHandler(lm.callbacks)}, oncrpc.ServerConfig{})
	go srv.ServeUDP(conn)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return lm
}

// next waits for the next callback.
func (lm *lockMgr) next(t *testing.T, timeout time.Duration, what string) nsmtest.Callback {
	t.Helper()
	select {
	case cb := <-lm.callbacks:
		return cb
	case <-time.After(timeout):
		t.Fatalf("%s: no lock-manager callback on %s within %v", what, lm.host.name, timeout)
	}
	return nsmtest.Callback{}
}

// lockdMon sends SM_MON in h's namespace the way Linux lockd does
// (fs/lockd/mon.c): to the NSM found through the local rpcbind (PMAP v2
// GETPORT over TCP to 127.0.0.1:111), over TCP from 127.0.0.1 and a
// privileged port, AUTH_NULL, my_name = the host's name, 100021/3/16, a
// random 16-byte cookie; mon_name is the peer's IP literal.
func lockdMon(h *netHost, monName, myName string) (nsm.SMStatRes, [nsm.PrivLen]byte, error) {
	var res nsm.SMStatRes
	var priv [nsm.PrivLen]byte
	rand.Read(priv[:])
	err := inNetnsThread(h.ns, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cfg := oncrpc.ClientConfig{Net: "tcp", Timeout: 8 * time.Second, Privileged: true}
		port, err := oncrpc.NewPmapClient("127.0.0.1", cfg).GetPort(ctx, nsm.Program.Prog, nsm.Program.Vers, oncrpc.IPProtoTCP)
		if err != nil || port == 0 {
			return fmt.Errorf("rpcbind GETPORT 100024/1/tcp on %s: port %d, %v", h.name, port, err)
		}
		cfg.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
		cl, err := oncrpc.Dial(ctx, cfg)
		if err != nil {
			return err
		}
		defer cl.Close()
		mon := nsm.Mon{ID: nsm.MonID{MonName: monName, My: nsm.MyID{MyName: myName, Prog: nlm.Program, Vers: 3, Proc: nlm.ProcSMNotify}}, Priv: priv}
		if err := cl.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res); err != nil {
			return fmt.Errorf("SM_MON{%s, %s} on %s: %w", monName, myName, h.name, err)
		}
		return nil
	})
	return res, priv, err
}

// ---- a client host with the real rpc.statd -----------------------------------

// A real-statd host is this test binary re-run in a client namespace
// (TestRealStatdHostProcess) inside a private mount namespace with its own
// /run and an /etc/hosts that names the cluster and the clients. It runs
// rpcbind and rpc.statd, says "ready" with statd's port, and runs the real
// sm-notify when the parent asks.

const (
	realStatdEnv    = "NSMD_E2E_REAL_STATD" // JSON realStatdConfig
	realStatdPrefix = "E2E-STATD "
)

type realStatdConfig struct {
	Hosts string `json:"hosts"` // the /etc/hosts to bind-mount (read by the wrapper)
}

// smNotifyCmd asks the child to run sm-notify once.
type smNotifyCmd struct {
	ID     int    `json:"id"`
	Server string `json:"server"`  // the record's mon_name: whom to notify
	Source string `json:"source"`  // -v: source address (and, as a name, mon_name)
	State  int32  `json:"state"`   // the state file's number (-n: sent as is)
	Priv   string `json:"priv"`    // the record's cookie (hex)
	MyName string `json:"my_name"` // the record's my_name
}

type realStatdLine struct {
	Ev   string `json:"ev"` // "ready" | "done"
	Port int    `json:"port,omitempty"`
	ID   int    `json:"id,omitempty"`
	Out  string `json:"out,omitempty"`
	Err  string `json:"err,omitempty"`
	At   int64  `json:"at"`
}

// TestRealStatdHostProcess is not a test of its own: it is the real-statd
// client host of TestInteropWithRealPeers.
func TestRealStatdHostProcess(t *testing.T) {
	if os.Getenv(realStatdEnv) == "" {
		t.Skip("helper process of TestInteropWithRealPeers (runs inside a client namespace)")
	}
	smNotify := lookTool(t, "sm-notify")
	var outMu sync.Mutex
	emit := func(l realStatdLine) {
		l.At = time.Now().UnixNano()
		b, _ := json.Marshal(l)
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, "%s%s\n", realStatdPrefix, b)
	}
	startRealStatd(t)
	// Its UDP port (SM_NOTIFY comes over UDP; TCP has another one).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	udpPort, err := oncrpc.NewPmapClient("127.0.0.1", oncrpc.ClientConfig{Timeout: 2 * time.Second}).
		GetPort(ctx, nsm.Program.Prog, nsm.Program.Vers, oncrpc.IPProtoUDP)
	cancel()
	if err != nil || udpPort == 0 {
		t.Fatalf("rpc.statd's UDP port: %d %v", udpPort, err)
	}
	emit(realStatdLine{Ev: "ready", Port: int(udpPort)})
	var wg sync.WaitGroup
	defer wg.Wait()
	dec := json.NewDecoder(os.Stdin)
	for { // EOF: the parent is done with us
		var c smNotifyCmd
		if err := dec.Decode(&c); err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := runSmNotify(t, smNotify, c)
			l := realStatdLine{Ev: "done", ID: c.ID, Out: out}
			if err != nil {
				l.Err = err.Error()
			}
			emit(l)
		}()
	}
}

// runSmNotify writes a state directory holding one monitor record (as
// rpc.statd would have left it before the reboot) and runs
// `sm-notify -d -f -n -m 1 -P DIR -v SOURCE` until it exits.
func runSmNotify(t *testing.T, bin string, c smNotifyCmd) (string, error) {
	dir := t.TempDir()
	var priv [nsm.PrivLen]byte
	if b, err := hex.DecodeString(c.Priv); err != nil || len(b) != nsm.PrivLen {
		return "", fmt.Errorf("priv %q: want %d hex bytes (%v)", c.Priv, nsm.PrivLen, err)
	} else {
		copy(priv[:], b)
	}
	rec := nsm.StatdRecord{Callback: netip.MustParseAddr("127.0.0.1"), Priv: priv, MonName: c.Server,
		My: fsm.MyID{MyName: c.MyName, Prog: nlm.Program, Vers: 3, Proc: nlm.ProcSMNotify}}
	if err := nsm.WriteStatdDir(dir, nsm.StatdDir{State: c.State, Records: []nsm.StatdRecord{rec}}); err != nil {
		return "", err
	}
	out, err := exec.Command(bin, "-d", "-f", "-n", "-m", "1", "-P", dir, "-v", c.Source).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("sm-notify: %w", err)
	}
	left, _ := os.ReadDir(filepath.Join(dir, "sm.bak"))
	if len(left) != 0 {
		return string(out), fmt.Errorf("sm-notify exited with %d host(s) not notified", len(left))
	}
	return string(out), nil
}

// realStatdHost is the parent's handle on one such child.
type realStatdHost struct {
	host  *netHost
	port  int // rpc.statd's UDP port
	log   childLog
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ready chan struct{}
	done  chan struct{}

	replies replies[realStatdLine]
}

// startRealStatdHost runs the child in h's namespace with hostsFile as its
// /etc/hosts.
func startRealStatdHost(t *testing.T, h *netHost, hostsFile string) *realStatdHost {
	t.Helper()
	r := &realStatdHost{host: h, ready: make(chan struct{}), done: make(chan struct{})}
	cfg, _ := json.Marshal(realStatdConfig{Hosts: hostsFile})
	wrap := []string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs nsmd-run /run && mkdir -p /run/rpcbind && mount --bind "$NSMD_E2E_HOSTS" /etc/hosts && exec "$0" "$@"`}
	r.cmd, r.stdin = spawnChildWrapped(t, h, wrap, []string{"NSMD_E2E_HOSTS=" + hostsFile}, "real statd host "+h.name,
		"TestRealStatdHostProcess", realStatdEnv, cfg, &r.log, r.read, r.log.String, r.ready, r.done)
	return r
}

func (r *realStatdHost) read(rd io.Reader) {
	scanChild(rd, realStatdPrefix, &r.log, func(l realStatdLine) {
		switch l.Ev {
		case "ready":
			r.port = l.Port
			close(r.ready)
		case "done":
			r.replies.deliver(l.ID, l)
		}
	})
}

// smNotify starts the real sm-notify in the child; the channel gets its
// outcome when it exits.
func (r *realStatdHost) smNotify(t *testing.T, c smNotifyCmd) <-chan realStatdLine {
	t.Helper()
	var ch <-chan realStatdLine
	c.ID, ch = r.replies.expect()
	b, _ := json.Marshal(c)
	if _, err := r.stdin.Write(append(b, '\n')); err != nil {
		t.Fatalf("%s: ask for sm-notify: %v", r.host.name, err)
	}
	return ch
}
