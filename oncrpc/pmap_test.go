package oncrpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
)

func TestEmbeddedPortmapper(t *testing.T) {
	if !canBindPrivileged() {
		t.Skip("needs root: the embedded portmapper takes SET and UNSET only from a privileged port")
	}
	pm := NewPortmapper()
	pm.Register(Mapping{PmapProg, PmapVers, IPProtoUDP, PmapPort})
	ts := startServer(t, ServerConfig{}, Programs{{PmapProg, PmapVers}: pm})
	ctx := context.Background()
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			p := NewPmapClient(ts.addr(network), ClientConfig{Net: network, Timeout: 2 * time.Second})
			if err := p.Null(ctx); err != nil {
				t.Fatal(err)
			}
			m := Mapping{Prog: 100024, Vers: 1, Prot: IPProtoTCP, Port: 32765}
			if ok, err := p.Set(ctx, m); err != nil || !ok {
				t.Fatalf("Set = %v, %v", ok, err)
			}
			if ok, err := p.Set(ctx, Mapping{Prog: 100024, Vers: 1, Prot: IPProtoTCP, Port: 1}); err != nil || ok {
				t.Fatalf("second Set of the same prog/vers/prot = %v, %v; want false (RFC 1833)", ok, err)
			}
			port, err := p.GetPort(ctx, 100024, 1, IPProtoTCP)
			if err != nil || port != 32765 {
				t.Fatalf("GetPort = %d, %v", port, err)
			}
			if _, err := p.GetPort(ctx, 100024, 1, IPProtoUDP); !errors.Is(err, ErrProgUnavail) {
				t.Fatalf("GetPort of an unregistered mapping = %v, want ErrProgUnavail", err)
			}
			ms, err := p.Dump(ctx)
			if network == "udp" {
				// No DUMP over UDP: TestPortmapperAnswersNoUDPCallWithMoreThanItsSize.
				if !errors.Is(err, ErrProcUnavail) {
					t.Fatalf("Dump over UDP = %v, %v; want PROC_UNAVAIL", ms, err)
				}
				ms, err = NewPmapClient(ts.addr("tcp"), ClientConfig{Net: "tcp", Timeout: 2 * time.Second}).Dump(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			want := []Mapping{{100000, 2, IPProtoUDP, 111}, m}
			if !slices.Equal(ms, want) {
				t.Fatalf("Dump = %v, want %v", ms, want)
			}
			if ok, err := p.Unset(ctx, Mapping{Prog: 100024, Vers: 1}); err != nil || !ok {
				t.Fatalf("Unset = %v, %v", ok, err)
			}
			if ok, err := p.Unset(ctx, Mapping{Prog: 100024, Vers: 1}); err != nil || ok {
				t.Fatalf("second Unset = %v, %v", ok, err)
			}
			// CALLIT is not served.
			c := dialTest(t, ClientConfig{Net: network, Addr: ts.addr(network)})
			if err := c.Call(ctx, PmapProg, PmapVers, PmapProcCallIt, nil, nil); !errors.Is(err, ErrProcUnavail) {
				t.Fatalf("CALLIT = %v", err)
			}
			if err := c.Call(ctx, PmapProg, PmapVers, PmapProcGetPort, u32(1), nil); !errors.Is(err, ErrGarbageArgs) {
				t.Fatalf("GETPORT with short args = %v", err)
			}
		})
	}
}

// TestPortmapperAnswersNoUDPCallWithMoreThanItsSize: over UDP, whose
// source address anyone can forge, no reply of the embedded portmapper is
// larger than the datagram that asked for it — DUMP, whose list is
// several times its call, is PROC_UNAVAIL there — while over TCP (a
// handshake proves the source) DUMP lists every mapping. The control: the
// same DUMP over TCP is larger than its call, so the UDP check measures
// what would amplify.
func TestPortmapperAnswersNoUDPCallWithMoreThanItsSize(t *testing.T) {
	pm := NewPortmapper()
	for _, m := range []Mapping{{PmapProg, PmapVers, IPProtoTCP, PmapPort}, {PmapProg, PmapVers, IPProtoUDP, PmapPort},
		{100024, 1, IPProtoTCP, 662}, {100024, 1, IPProtoUDP, 662}, {100021, 4, IPProtoTCP, 4045}, {100021, 4, IPProtoUDP, 4045}} {
		pm.Register(m)
	}
	ts := startServer(t, ServerConfig{}, Programs{{PmapProg, PmapVers}: pm})
	// call sends one PMAP call of proc with args as a bare datagram (no
	// credential: the smallest call) and returns the call's and the
	// reply's sizes.
	call := func(t *testing.T, proc uint32, args Marshaler) (int, int) {
		t.Helper()
		w := NewWriter(nil)
		CallHeader{XID: 0x5eed0000 + proc, Prog: PmapProg, Vers: PmapVers, Proc: proc}.MarshalXDR(w)
		if args != nil {
			args.MarshalXDR(w)
		}
		conn, err := net.Dial("udp", ts.addr("udp"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write(w.Bytes()); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("proc %d: no reply: %v", proc, err)
		}
		return len(w.Bytes()), n
	}
	getport := Mapping{Prog: 100024, Vers: 1, Prot: IPProtoUDP}
	for _, c := range []struct {
		name string
		proc uint32
		args Marshaler
	}{
		{"NULL", PmapProcNull, nil},
		{"GETPORT", PmapProcGetPort, getport},
		{"SET", PmapProcSet, Mapping{Prog: 7, Vers: 1, Prot: IPProtoUDP, Port: 7}},
		{"UNSET", PmapProcUnset, Mapping{Prog: 7, Vers: 1}},
		{"DUMP", PmapProcDump, nil},
		{"CALLIT", PmapProcCallIt, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			in, out := call(t, c.proc, c.args)
			if out > in {
				t.Errorf("%s over UDP: a %d-byte call got a %d-byte reply", c.name, in, out)
			}
		})
	}
	if _, err := NewPmapClient(ts.addr("udp"), ClientConfig{Net: "udp", Timeout: 2 * time.Second}).Dump(context.Background()); !errors.Is(err, ErrProcUnavail) {
		t.Errorf("DUMP over UDP = %v, want PROC_UNAVAIL", err)
	}
	t.Run("control: DUMP over TCP lists every mapping, larger than its call", func(t *testing.T) {
		ms, err := NewPmapClient(ts.addr("tcp"), ClientConfig{Net: "tcp", Timeout: 2 * time.Second}).Dump(context.Background())
		if err != nil || len(ms) != 6 {
			t.Fatalf("DUMP over TCP = %v, %v; want the 6 mappings", ms, err)
		}
		w := NewWriter(nil)
		CallHeader{Prog: PmapProg, Vers: PmapVers, Proc: PmapProcDump}.MarshalXDR(w)
		rw := NewWriter(nil)
		pmapList(ms).MarshalXDR(rw)
		if callSize, listSize := len(w.Bytes()), 24+len(rw.Bytes()); listSize < 3*callSize {
			t.Fatalf("the list (%d bytes with its reply header) is not the amplification it is refused for (call %d bytes)", listSize, callSize)
		}
	})
}

func TestPortmapperTakesChangesOnlyFromPrivilegedLoopbackPorts(t *testing.T) {
	pm := NewPortmapper()
	call := func(proc uint32, remote string, m Mapping) bool {
		w := NewWriter(nil)
		m.MarshalXDR(w)
		c := &Call{Prog: PmapProg, Vers: PmapVers, Proc: proc, Remote: ap(remote), Args: NewReader(w.Bytes())}
		res := NewWriter(nil)
		if err := pm.ServeRPC(context.Background(), c, res); err != nil {
			t.Fatal(err)
		}
		r := NewReader(res.Bytes())
		return r.Bool()
	}
	m := Mapping{Prog: 7, Vers: 1, Prot: IPProtoUDP, Port: 700}
	if call(PmapProcSet, "192.0.2.1:700", m) {
		t.Fatal("SET from a remote address accepted")
	}
	if call(PmapProcSet, "127.0.0.1:40000", m) {
		t.Fatal("SET from an unprivileged loopback port accepted: a local user could redirect lockd's callback")
	}
	if !call(PmapProcSet, "[::1]:700", m) {
		t.Fatal("SET from ::1 and a privileged port refused")
	}
	if call(PmapProcUnset, "127.0.0.1:40000", m) {
		t.Fatal("UNSET from an unprivileged loopback port accepted")
	}
	if call(PmapProcUnset, "192.0.2.1:700", m) {
		t.Fatal("UNSET from a remote address accepted")
	}
	if len(pm.Mappings()) != 1 {
		t.Fatal("mapping lost")
	}
}

func TestNewPmapClientAddress(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1":      "127.0.0.1:111",
		"127.0.0.1:1111": "127.0.0.1:1111",
		"::1":            "[::1]:111",
		"[::1]":          "[::1]:111",
		"[::1]:5":        "[::1]:5",
	} {
		p := NewPmapClient(in, ClientConfig{})
		if p.cfg.Addr != want || p.cfg.Net != "udp" {
			t.Errorf("NewPmapClient(%q): %s %s, want udp %s", in, p.cfg.Net, p.cfg.Addr, want)
		}
	}
}

// ---- The real rpcbind and rpcinfo, in a private network namespace ---------

const netnsChildEnv = "NSMD_ONCRPC_NETNS_CHILD"

// TestRealRpcbindAndRpcinfo checks our PMAP client against the real rpcbind
// and our server and embedded portmapper against the real rpcinfo. Port 111
// is involved, so the check runs in a fresh network namespace (and a private
// mount namespace, for rpcbind's files under /run): the test binary re-runs
// itself there.
func TestRealRpcbindAndRpcinfo(t *testing.T) {
	if os.Getenv(netnsChildEnv) == "1" {
		realRpcbindChild(t)
		return
	}
	if testing.Short() {
		t.Skip("short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	for _, bin := range []string{"/usr/sbin/rpcbind", "rpcinfo", "ip", "unshare", "mount"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not available: %v", bin, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("nsmd-oncrpc-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace: %v: %s", err, out)
	}
	defer func() {
		if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
			t.Errorf("deleting netns %s: %v: %s", ns, err, out)
		}
	}()
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private",
		self, "-test.run=^TestRealRpcbindAndRpcinfo$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), netnsChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("namespace run:\n%s", out)
	if err != nil {
		t.Fatalf("check in namespace %s failed: %v", ns, err)
	}
	if !strings.Contains(string(out), "--- PASS: TestRealRpcbindAndRpcinfo") {
		t.Fatal("namespace run did not pass")
	}
}

func realRpcbindChild(t *testing.T) {
	if out, err := exec.Command("mount", "-t", "tmpfs", "tmpfs", "/run").CombinedOutput(); err != nil {
		t.Fatalf("private /run: %v: %s", err, out)
	}
	ctx := context.Background()
	rpcbind := exec.Command("/usr/sbin/rpcbind", "-f", "-w")
	rpcbind.Stdout, rpcbind.Stderr = os.Stderr, os.Stderr
	if err := rpcbind.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			rpcbind.Process.Kill()
			rpcbind.Wait()
		}
	}
	defer stop()
	pmap := NewPmapClient("127.0.0.1", ClientConfig{Timeout: 200 * time.Millisecond, Retransmit: 50 * time.Millisecond})
	waitPmap(t, pmap)

	t.Run("our PmapClient against rpcbind", func(t *testing.T) {
		for _, network := range networks {
			p := NewPmapClient("127.0.0.1", ClientConfig{Net: network, Timeout: 2 * time.Second})
			m := Mapping{Prog: testProg, Vers: testVers, Prot: IPProtoUDP, Port: 4001}
			if ok, err := p.Set(ctx, m); err != nil || !ok {
				t.Fatalf("%s: Set = %v, %v", network, ok, err)
			}
			if port, err := p.GetPort(ctx, testProg, testVers, IPProtoUDP); err != nil || port != 4001 {
				t.Fatalf("%s: GetPort = %d, %v", network, port, err)
			}
			ms, err := p.Dump(ctx)
			if err != nil || !slices.Contains(ms, m) || !slices.Contains(ms, Mapping{PmapProg, PmapVers, IPProtoTCP, PmapPort}) {
				t.Fatalf("%s: Dump = %v, %v", network, ms, err)
			}
			if ok, err := p.Unset(ctx, m); err != nil || !ok {
				t.Fatalf("%s: Unset = %v, %v", network, ok, err)
			}
			if _, err := p.GetPort(ctx, testProg, testVers, IPProtoUDP); !errors.Is(err, ErrProgUnavail) {
				t.Fatalf("%s: GetPort after Unset = %v", network, err)
			}
		}
	})

	t.Run("rpcinfo against our server registered with rpcbind", func(t *testing.T) {
		ts := startServer(t, ServerConfig{}, nil)
		_, tcpPort, _ := net.SplitHostPort(ts.tcpAddr)
		_, udpPort, _ := net.SplitHostPort(ts.udpAddr)
		tp, _ := strconv.Atoi(tcpPort)
		up, _ := strconv.Atoi(udpPort)
		p := NewPmapClient("127.0.0.1", ClientConfig{Timeout: 2 * time.Second})
		for _, m := range []Mapping{{testProg, testVers, IPProtoTCP, uint32(tp)}, {testProg, testVers, IPProtoUDP, uint32(up)}} {
			if ok, err := p.Set(ctx, m); err != nil || !ok {
				t.Fatalf("Set %v = %v, %v", m, ok, err)
			}
		}
		out := rpcinfo(t, "-p", "127.0.0.1")
		for _, port := range []string{tcpPort, udpPort} {
			if !strings.Contains(out, strconv.Itoa(int(testProg))) || !strings.Contains(out, port) {
				t.Fatalf("rpcinfo -p does not list %d at %s:\n%s", testProg, port, out)
			}
		}
		rpcinfo(t, "-n", tcpPort, "-t", "127.0.0.1", strconv.Itoa(int(testProg)), "1")
		rpcinfo(t, "-n", udpPort, "-u", "127.0.0.1", strconv.Itoa(int(testProg)), "1")
		// Through rpcbind's GETPORT rather than a given port.
		rpcinfo(t, "-T", "udp", "127.0.0.1", strconv.Itoa(int(testProg)), "1")
	})

	stop()
	t.Run("rpcinfo against our embedded portmapper", func(t *testing.T) {
		pm := NewPortmapper()
		srv := NewServer(Programs{{PmapProg, PmapVers}: pm}, ServerConfig{Logger: testLogger(t)})
		l, err := net.Listen("tcp", "127.0.0.1:111")
		if err != nil {
			t.Fatal(err)
		}
		pc, err := net.ListenPacket("udp", "127.0.0.1:111")
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		go func() { errs <- srv.ServeTCP(l) }()
		go func() { errs <- srv.ServeUDP(pc) }()
		defer func() {
			srv.Shutdown(ctx)
			<-errs
			<-errs
		}()
		pm.Register(Mapping{PmapProg, PmapVers, IPProtoTCP, PmapPort})
		pm.Register(Mapping{PmapProg, PmapVers, IPProtoUDP, PmapPort})
		pm.Register(Mapping{100024, 1, IPProtoUDP, 32765})
		out := rpcinfo(t, "-p", "127.0.0.1")
		if !strings.Contains(out, "100024") || !strings.Contains(out, "32765") {
			t.Fatalf("rpcinfo -p against our portmapper:\n%s", out)
		}
		rpcinfo(t, "-n", "111", "-t", "127.0.0.1", "100000", "2")
		rpcinfo(t, "-n", "111", "-u", "127.0.0.1", "100000", "2")
	})
}

// waitPmap polls PMAP NULL until the portmapper answers (bounded).
func waitPmap(t *testing.T, p *PmapClient) {
	t.Helper()
	testutil.WaitForSeen(t, 10*time.Second, "rpcbind to answer", func() (bool, string) {
		err := p.Null(context.Background())
		return err == nil, fmt.Sprint(err)
	})
}

func rpcinfo(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rpcinfo", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rpcinfo %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("rpcinfo %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}
