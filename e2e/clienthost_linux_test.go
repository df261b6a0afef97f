package e2e

import (
	"bufio"
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/nsm/nsmtest"
	"github.com/nsmd/nsmd/oncrpc"
)

// A client host is this test binary re-run inside a client namespace
// (TestClientHostProcess). It serves a fake statd + portmapper on port 111
// of its address, prints one line per SM_NOTIFY received, and performs
// SM_MON / SM_STAT when the parent asks on stdin. The protocol is JSON
// lines; the child's lines start with clientLinePrefix so that anything
// else the test binary prints is ignored.

const (
	clientHostEnv    = "NSMD_E2E_CLIENT_HOST" // JSON clientHostConfig
	clientLinePrefix = "E2E-CLIENT "
)

type clientHostConfig struct {
	IP   string `json:"ip"`
	Name string `json:"name"` // my_name in SM_MON
}

// clientCmd is a request from the parent.
type clientCmd struct {
	ID     int    `json:"id"`
	Op     string `json:"op"`      // "mon" | "stat"
	Addr   string `json:"addr"`    // server IP (the VIP); its port comes from its portmapper on 111
	MyName string `json:"my_name"` // mon
}

// clientLine is an event or an answer from the child.
type clientLine struct {
	Ev string `json:"ev"` // "ready" | "notify" | "reply"
	// notify
	From    string `json:"from,omitempty"`
	MonName string `json:"mon_name,omitempty"`
	State   int32  `json:"state"`
	AtNano  int64  `json:"at"`
	// reply
	ID   int    `json:"id,omitempty"`
	Res  int32  `json:"res"`
	Priv string `json:"priv,omitempty"`
	Err  string `json:"err,omitempty"`
}

// TestClientHostProcess is not a test of its own: it is the client host
// process of the multi-host tests, run by them inside a client namespace.
func TestClientHostProcess(t *testing.T) {
	raw := os.Getenv(clientHostEnv)
	if raw == "" {
		t.Skip("helper process of TestClusterFaultSchedules (runs inside a client namespace)")
	}
	var cfg clientHostConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("%s: %v", clientHostEnv, err)
	}
	var outMu sync.Mutex
	emit := func(l clientLine) {
		b, _ := json.Marshal(l)
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, "%s%s\n", clientLinePrefix, b)
	}
	h := nsmtest.StartHost(t, cfg.IP, oncrpc.PmapPort)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case n := <-h.Notified:
				emit(clientLine{Ev: "notify", From: n.From.String(), MonName: n.Arg.MonName, State: n.Arg.State, AtNano: time.Now().UnixNano()})
			case <-done:
				return
			}
		}
	}()
	emit(clientLine{Ev: "ready", AtNano: time.Now().UnixNano()})

	var wg sync.WaitGroup
	defer wg.Wait()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() { // EOF: the parent is done with us
		var c clientCmd
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			emit(clientLine{Ev: "reply", Err: fmt.Sprintf("bad command %q: %v", sc.Text(), err)})
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := clientDo(cfg, c)
			l.Ev, l.ID, l.AtNano = "reply", c.ID, time.Now().UnixNano()
			emit(l)
		}()
	}
}

// clientDo performs one request: the server's NSM port from its
// portmapper (UDP, port 111), then the call over UDP.
func clientDo(cfg clientHostConfig, c clientCmd) clientLine {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	rpcCfg := oncrpc.ClientConfig{Net: "udp", Timeout: 2 * time.Second, Retransmit: 200 * time.Millisecond}
	port, err := oncrpc.NewPmapClient(c.Addr, rpcCfg).GetPort(ctx, nsm.Program.Prog, nsm.Program.Vers, oncrpc.IPProtoUDP)
	if err != nil || port == 0 {
		return clientLine{Err: fmt.Sprintf("portmapper GETPORT 100024/1/udp at %s: port %d, %v", c.Addr, port, err)}
	}
	rpcCfg.Addr = net.JoinHostPort(c.Addr, strconv.Itoa(int(port)))
	rpcCfg.Timeout = 5 * time.Second
	cl, err := oncrpc.Dial(ctx, rpcCfg)
	if err != nil {
		return clientLine{Err: err.Error()}
	}
	defer cl.Close()
	var res nsm.SMStatRes
	switch c.Op {
	case "mon":
		var priv [16]byte
		rand.Read(priv[:])
		mon := nsm.Mon{ID: nsm.MonID{MonName: cfg.IP, My: nsm.MyID{MyName: c.MyName, Prog: 100021, Vers: 3, Proc: 16}}, Priv: priv}
		if err := cl.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res); err != nil {
			return clientLine{Err: fmt.Sprintf("SM_MON: %v", err)}
		}
		return clientLine{Res: int32(res.Res), State: res.State, Priv: hex.EncodeToString(priv[:])}
	case "stat":
		if err := cl.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: cfg.IP}, &res); err != nil {
			return clientLine{Err: fmt.Sprintf("SM_STAT: %v", err)}
		}
		return clientLine{Res: int32(res.Res), State: res.State}
	}
	return clientLine{Err: "unknown op " + c.Op}
}

// ---- parent side -------------------------------------------------------------

// notice is one SM_NOTIFY a client host received.
type notice struct {
	from    netip.AddrPort
	monName string
	state   int32
	at      time.Time
}

// clientHost is the parent's handle on one client host process.
type clientHost struct {
	host   *netHost
	myName string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	wmu    sync.Mutex // one request line at a time
	done   chan struct{}
	ready  chan struct{}

	replies replies[clientLine]

	mu      sync.Mutex
	notices []notice
	log     childLog // lines that are not ours (test output), for failures
}

// startClientHost runs the client host process in h's namespace; it is
// stopped (stdin closed, then SIGKILL by pid) when the test ends.
func startClientHost(t *testing.T, h *netHost) *clientHost {
	t.Helper()
	c := &clientHost{host: h, myName: "client-" + h.name, done: make(chan struct{}), ready: make(chan struct{})}
	cfg, _ := json.Marshal(clientHostConfig{IP: h.ip.String(), Name: c.myName})
	c.cmd, c.stdin = spawnChild(t, h, "client host "+h.name, "TestClientHostProcess", clientHostEnv, cfg,
		&c.log, c.read, c.log.String, c.ready, c.done)
	return c
}

func (c *clientHost) read(r io.Reader) {
	scanChild(r, clientLinePrefix, &c.log, func(l clientLine) {
		switch l.Ev {
		case "ready":
			close(c.ready)
		case "notify":
			from, _ := netip.ParseAddrPort(l.From)
			c.mu.Lock()
			c.notices = append(c.notices, notice{from: from, monName: l.MonName, state: l.State, at: time.Unix(0, l.AtNano)})
			c.mu.Unlock()
		case "reply":
			c.replies.deliver(l.ID, l)
		}
	})
}

// replies matches a child's answers to the parent's requests by id.
type replies[L any] struct {
	mu      sync.Mutex
	nextID  int
	waiting map[int]chan L
}

// expect numbers a new request; its answer will come on the channel.
func (r *replies[L]) expect() (int, <-chan L) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting == nil {
		r.waiting = make(map[int]chan L)
	}
	r.nextID++
	ch := make(chan L, 1)
	r.waiting[r.nextID] = ch
	return r.nextID, ch
}

// deliver hands the answer to request id to its waiter (once).
func (r *replies[L]) deliver(id int, l L) {
	r.mu.Lock()
	ch := r.waiting[id]
	delete(r.waiting, id)
	r.mu.Unlock()
	if ch != nil {
		ch <- l
	}
}

// childLog keeps a child's stderr and unprefixed stdout (up to 1 MiB),
// shown when a test fails.
type childLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *childLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<20 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *childLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// scanChild reads a child's stdout: lines starting with prefix carry one
// JSON-encoded T each and go to handle; everything else goes to log.
func scanChild[T any](r io.Reader, prefix string, log io.Writer, handle func(T)) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			fmt.Fprintln(log, line)
			continue
		}
		var v T
		if err := json.Unmarshal([]byte(rest), &v); err != nil {
			fmt.Fprintln(log, "unparsable:", line)
			continue
		}
		handle(v)
	}
}

// do sends a request and waits for its answer.
func (c *clientHost) do(cmd clientCmd, timeout time.Duration) (clientLine, error) {
	var ch <-chan clientLine
	cmd.ID, ch = c.replies.expect()
	b, _ := json.Marshal(cmd)
	c.wmu.Lock()
	_, err := c.stdin.Write(append(b, '\n'))
	c.wmu.Unlock()
	if err != nil {
		return clientLine{}, fmt.Errorf("client host %s: send %s: %w", c.host.name, cmd.Op, err)
	}
	select {
	case l := <-ch:
		if l.Err != "" {
			return l, fmt.Errorf("client host %s: %s", c.host.name, l.Err)
		}
		return l, nil
	case <-c.done:
		return clientLine{}, fmt.Errorf("client host %s exited", c.host.name)
	case <-time.After(timeout):
		return clientLine{}, fmt.Errorf("client host %s: no answer to %s within %v", c.host.name, cmd.Op, timeout)
	}
}

// Notices returns every SM_NOTIFY received so far.
func (c *clientHost) Notices() []notice {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]notice(nil), c.notices...)
}

// spawnChild re-runs this test binary's testName inside h's namespace with
// env key=cfg, feeds its stdout to read (which must close ready when the
// child says so), reaps it and closes done once its output ends, stops it
// at test end (stdin closed, then SIGKILL after 3 s), and waits until it
// is ready.
func spawnChild(t *testing.T, h *netHost, what, testName, key string, cfg []byte, stderr io.Writer,
	read func(io.Reader), output func() string, ready, done chan struct{}) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	return spawnChildWrapped(t, h, nil, nil, what, testName, key, cfg, stderr, read, output, ready, done)
}

// spawnChildWrapped is spawnChild with a wrapper command between `ip netns
// exec NS` and the test binary (it must exec it: the pid we hold is then
// the child's own) and extra environment.
func spawnChildWrapped(t *testing.T, h *netHost, wrap, env []string, what, testName, key string, cfg []byte, stderr io.Writer,
	read func(io.Reader), output func() string, ready, done chan struct{}) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	args := append([]string{"netns", "exec", h.ns}, wrap...)
	args = append(args, os.Args[0], "-test.run", "^"+testName+"$", "-test.count=1", "-test.v")
	cmd := exec.Command("ip", args...)
	cmd.Env = append(append(os.Environ(), env...), key+"="+string(cfg), "NSMD_BIN="+nsmdBin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := startPinned(cmd); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	go func() { // the child's output, then its exit
		read(stdout)
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", what, output())
		}
	})
	select {
	case <-ready:
	case <-done:
		t.Fatalf("%s exited before it was ready:\n%s", what, output())
	case <-time.After(15 * time.Second):
		t.Fatalf("%s not ready within 15s:\n%s", what, output())
	}
	return cmd, stdin
}
