package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// TestHostilePeerThatNeverReadsCannotHoldTheNSMServer: a host opens as
// many TCP connections to the NSM port as its address may (64): 63 stay
// idle, one pipelines calls and never reads a reply. Another host's
// SM_STAT and lockd's SM_MON are answered throughout, the node holds
// little for the flood (each record is given back once served; a waiting
// reply is kept at its own size), and once the flooding connection's
// replies have been blocked for a second a new connection from the
// attacker's own address is served in its place — well within the 30 s
// write timeout, which is what frees the slot on a build without the
// stall rule (the negative control, run by hand: evicted_stalled 0, the
// new connection served only after ~30 s).
func TestHostilePeerThatNeverReadsCannotHoldTheNSMServer(t *testing.T) {
	if !inNetns(t) {
		return
	}
	const perHost = 64
	port := freePort(t, "127.0.0.1")
	nsmAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	adm := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	startNsmd(t, agentArgs(t, t.TempDir(), nsmAddr, adm, freePort(t, "127.0.0.1"), 111)...)
	waitLeader(t, adm, 0)

	attacker := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9)}
	var wg sync.WaitGroup
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
		wg.Wait()
	}()
	for range perHost - 1 {
		c, err := net.DialTCP("tcp", attacker, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(nsmAddr)))
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	flooder, err := smallWindowDial(attacker, nsmAddr)
	if err != nil {
		t.Fatal(err)
	}
	open = append(open, flooder)
	flood := bytes.Repeat(nullCall(), 1000)
	wg.Go(func() {
		for {
			if _, err := flooder.Write(flood); err != nil {
				return
			}
		}
	})

	// Another host and lockd are answered while the flood goes on.
	if err := tcpStat(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 10)}, nsmAddr); err != nil {
		t.Fatalf("another host's SM_STAT during the flood: %v", err)
	}
	if res := doLockd(t, nsmAddr); nsm.Res(res) != nsm.StatSucc {
		t.Fatalf("lockd's SM_MON during the flood: res %d", res)
	}
	// The attacker's address is at its cap: a new connection from it is
	// refused until the flooding one has not read for a second, then
	// served in its place.
	testutil.WaitForSeen(t, 20*time.Second, "a new connection from the flooding address to be served", func() (bool, string) {
		if err := tcpStat(attacker, nsmAddr); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	var m string
	if err := getText(adm, "/metrics", &m); err != nil {
		t.Fatal(err)
	}
	stalled := metricLine(m, `nsmd_nsm_tcp_connections_total{event="evicted_stalled"}`)
	buffered := metricLine(m, "nsmd_nsm_tcp_buffered_bytes")
	t.Logf("evicted_stalled %v, buffered %v bytes", stalled, buffered)
	if stalled != 1 {
		t.Fatalf("evicted_stalled %v, want the flooding connection only", stalled)
	}
	if buffered > 4<<20 {
		t.Fatalf("the node holds %v bytes for the flooding host, want at most its cap (4 MiB)", buffered)
	}
	flooder.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, flooder); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the flooding connection was not closed: %v", err)
	}
}

// nullCall is one record-marked NSM NULL call.
func nullCall() []byte {
	w := oncrpc.NewWriter(nil)
	oncrpc.CallHeader{XID: 1, Prog: nsm.Program.Prog, Vers: nsm.Program.Vers, Proc: nsm.ProcNull}.MarshalXDR(w)
	var rec bytes.Buffer
	oncrpc.WriteRecord(&rec, w.Bytes())
	return rec.Bytes()
}

// smallWindowDial connects from local to addr with a small receive
// buffer, as a peer that reads nothing would offer.
func smallWindowDial(local *net.TCPAddr, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: local, Timeout: 5 * time.Second,
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			}); err != nil {
				return err
			}
			return serr
		}}
	return d.Dial("tcp", addr)
}

// tcpStat makes one SM_STAT over a new TCP connection from local.
func tcpStat(local *net.TCPAddr, addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "tcp", Addr: addr, LocalAddr: local.AddrPort().Addr(), Timeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	var res nsm.SMStatRes
	if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: "e2e"}, &res); err != nil {
		return fmt.Errorf("SM_STAT from %v: %w", local.IP, err)
	}
	return nil
}

// metricLine is the value of the sample line that starts with series.
func metricLine(text, series string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// TestHostileLocalUserCannotRedirectLockdsCallback: with the embedded
// portmapper (`rpcbind: embedded`), an unprivileged local user's SET of
// lockd's program (where nsmd's callbacks go) and UNSET of NSM's are
// refused and change nothing; root — as the kernel's lockd, from a
// privileged port — registers. A build that took changes from any
// loopback port let the user redirect the callback (and read lockd's
// cookies on it).
func TestHostileLocalUserCannotRedirectLockdsCallback(t *testing.T) {
	if !inNetns(t) {
		return
	}
	h := newHostile(t)
	nsmAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	adm := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	startNsmd(t, append(agentArgs(t, t.TempDir(), nsmAddr, adm, freePort(t, "127.0.0.1"), 111), "--rpcbind", "embedded")...)
	waitLeader(t, adm, 0)
	pm := oncrpc.NewPmapClient("127.0.0.1", oncrpc.ClientConfig{Timeout: 3 * time.Second})
	getPort := func(prog, vers uint32) uint16 {
		t.Helper()
		port, err := pm.GetPort(context.Background(), prog, vers, oncrpc.IPProtoUDP)
		if err != nil && !errors.Is(err, oncrpc.ErrProgUnavail) {
			t.Fatal(err)
		}
		return port
	}
	nsmPort := getPort(nsm.Program.Prog, nsm.Program.Vers)
	if nsmPort == 0 {
		t.Fatal("the embedded portmapper does not map NSM")
	}
	user := h.run(t, "", true, nsmCall{Addr: "127.0.0.1", Op: "pmap", Count: 4045})
	if user.Res[0] != 0 || user.Res[1] != 0 {
		t.Fatalf("the local user's SET and UNSET = %v, want both refused", user.Res)
	}
	if p := getPort(100021, 4); p != 0 {
		t.Fatalf("lockd's program mapped to %d by the local user", p)
	}
	if p := getPort(nsm.Program.Prog, nsm.Program.Vers); p != nsmPort {
		t.Fatalf("NSM's mapping %d → %d after the local user's UNSET", nsmPort, p)
	}
	var root nsmCallResult
	if err := doNSMCall(nsmCall{Addr: "127.0.0.1", Op: "pmap", Count: 4046}, &root); err != nil {
		t.Fatal(err)
	}
	if root.Res[0] != 1 || getPort(100021, 4) != 4046 {
		t.Fatalf("root's SET = %v, mapping %d; want registered at 4046", root.Res, getPort(100021, 4))
	}
}
