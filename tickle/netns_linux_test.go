package tickle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var nsSeq atomic.Int32

// canNetns says why network namespaces cannot be used here ("" if they can).
func canNetns() string {
	if os.Geteuid() != 0 {
		return "not root: network namespaces and raw sockets need root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "ip (iproute2) not installed"
	}
	name := fmt.Sprintf("nsmd-tk-probe-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Sprintf("ip netns add failed: %v: %s", err, strings.TrimSpace(string(out)))
	}
	exec.Command("ip", "netns", "del", name).Run()
	return ""
}

func ipCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNS runs fn on an OS thread inside network namespace ns and returns its
// error. Sockets fn opens stay in ns. The thread is never unlocked, so it
// ends with its goroutine instead of going back to the pool.
func inNS(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// lan is a client C and two servers A and B, each in a namespace of its
// own with an interface e0 on one bridge (in a fourth namespace), in
// 10.77.50.0/24 and fd77:50::/64; no default routes.
type lan struct {
	br, c, a, b string
	ip          map[string]netip.Addr // by namespace
}

func newLAN(t *testing.T) *lan {
	t.Helper()
	base := fmt.Sprintf("nsmd-tk-%d-%d-", os.Getpid(), nsSeq.Add(1))
	l := &lan{br: base + "br", c: base + "c", a: base + "a", b: base + "b", ip: map[string]netip.Addr{}}
	for _, ns := range []string{l.br, l.c, l.a, l.b} {
		ipCmd(t, "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	ipCmd(t, "-n", l.br, "link", "add", "br0", "type", "bridge")
	ipCmd(t, "-n", l.br, "link", "set", "br0", "up")
	for i, ns := range []string{l.c, l.a, l.b} {
		port := fmt.Sprintf("p%d", i)
		ipCmd(t, "-n", l.br, "link", "add", port, "type", "veth", "peer", "name", "e0", "netns", ns)
		ipCmd(t, "-n", l.br, "link", "set", port, "master", "br0", "up")
		ipCmd(t, "-n", ns, "link", "set", "e0", "up")
		ipCmd(t, "-n", ns, "addr", "add", fmt.Sprintf("10.77.50.%d/24", i+1), "dev", "e0")
		ipCmd(t, "-n", ns, "-6", "addr", "add", fmt.Sprintf("fd77:50::%d/64", i+1), "dev", "e0", "nodad")
	}
	return l
}

// takeVIP puts vip on ns's e0 and points the client's neighbour entry for
// it at ns, as the new holder's gratuitous ARP / unsolicited NA does.
func (l *lan) takeVIP(t *testing.T, ns string, vip netip.Addr) {
	t.Helper()
	bits := 24
	if vip.Is6() {
		bits = 64
	}
	ipCmd(t, "-n", ns, "addr", "add", fmt.Sprintf("%s/%d", vip, bits), "dev", "e0", "nodad")
	var mac string
	if err := inNS(ns, func() error {
		ifi, err := net.InterfaceByName("e0")
		if err == nil {
			mac = ifi.HardwareAddr.String()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ipCmd(t, "-n", l.c, "neigh", "replace", vip.String(), "lladdr", mac, "dev", "e0", "nud", "permanent")
}

func listenIn(t *testing.T, ns string, addr netip.AddrPort) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := inNS(ns, func() (err error) {
		ln, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func dialIn(t *testing.T, ns string, addr netip.AddrPort) net.Conn {
	t.Helper()
	var c net.Conn
	if err := inNS(ns, func() (err error) {
		c, err = net.DialTimeout("tcp", addr.String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestTickleMakesTheClientOfADeadHolderReconnectAtOnce: a client holds an
// established connection to the VIP on server A, with a call sent (and
// acknowledged by A's TCP) whose reply never comes; A dies (its link goes
// down: it sends nothing more); B takes the VIP and listens on the port.
// After B tickles the connection A listed, the client's socket is reset
// within a second or two and a new connection reaches B. The negative
// control, without the tickle, shows the client's socket still
// established after the same time: it would wait for its own timers.
func TestTickleMakesTheClientOfADeadHolderReconnectAtOnce(t *testing.T) {
	if why := canNetns(); why != "" {
		t.Skip("skipping: " + why)
	}
	const wait = 3 * time.Second
	for _, fam := range []struct {
		name string
		vip  netip.Addr
	}{{"IPv4", netip.MustParseAddr("10.77.50.100")}, {"IPv6", netip.MustParseAddr("fd77:50::100")}} {
		for _, tickle := range []bool{true, false} {
			name := fam.name + "/tickle"
			if !tickle {
				name = fam.name + "/without_tickle(negative_control)"
			}
			t.Run(name, func(t *testing.T) {
				l := newLAN(t)
				vip := netip.AddrPortFrom(fam.vip, NFSPort)
				l.takeVIP(t, l.a, fam.vip)
				lnA := listenIn(t, l.a, vip)
				cl := dialIn(t, l.c, vip)
				srv, err := lnA.Accept()
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				if _, err := cl.Write([]byte("call")); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(srv, make([]byte, 4)); err != nil {
					t.Fatal(err)
				}

				// The holder's sample of its connections on the VIP.
				var conns []Conn
				if err := inNS(l.a, func() (err error) {
					conns, _, err = Read("/proc/thread-self", Filter{VIP: fam.vip, Ports: []uint16{NFSPort}, Max: 4096})
					return err
				}); err != nil {
					t.Fatal(err)
				}
				clientEnd := cl.LocalAddr().(*net.TCPAddr).AddrPort()
				if len(conns) != 1 || conns[0] != (Conn{Local: vip, Remote: clientEnd}) {
					t.Fatalf("A's sample %v, want the client's one connection from %v", conns, clientEnd)
				}

				ipCmd(t, "-n", l.a, "link", "set", "e0", "down") // A dies
				l.takeVIP(t, l.b, fam.vip)
				lnB := listenIn(t, l.b, vip)

				start := time.Now()
				sendDone := make(chan error, 1)
				if tickle {
					go func() {
						sendDone <- inNS(l.b, func() error {
							sent, err := Send(context.Background(), conns, SendConfig{Rounds: 3, Gap: 600 * time.Millisecond})
							if err == nil && sent != 3 {
								err = fmt.Errorf("sent %d tickles, want 3", sent)
							}
							return err
						})
					}()
				} else {
					close(sendDone)
				}
				cl.SetReadDeadline(start.Add(wait))
				_, rerr := cl.Read(make([]byte, 1))
				took := time.Since(start)
				if err := <-sendDone; err != nil {
					t.Fatalf("tickle: %v", err)
				}
				if !tickle {
					if !errors.Is(rerr, os.ErrDeadlineExceeded) {
						t.Fatalf("without a tickle the client's read ended with %v, want it still waiting after %v", rerr, wait)
					}
					var mine []Conn
					if err := inNS(l.c, func() (err error) {
						mine, _, err = Read("/proc/thread-self", Filter{VIP: clientEnd.Addr(), Ports: []uint16{clientEnd.Port()}})
						return err
					}); err != nil {
						t.Fatal(err)
					}
					if len(mine) != 1 {
						t.Fatalf("the client's socket is not established after %v without a tickle: %v", wait, mine)
					}
					t.Logf("without a tickle the client's socket is still established after %v", wait)
					return
				}
				if !errors.Is(rerr, syscall.ECONNRESET) {
					t.Fatalf("after the tickle the client's read ended with %v after %v, want a reset", rerr, took)
				}
				t.Logf("client's socket reset %v after B started tickling", took.Round(time.Millisecond))
				again := dialIn(t, l.c, vip)
				got, err := lnB.Accept()
				if err != nil {
					t.Fatal(err)
				}
				defer got.Close()
				if got.RemoteAddr().String() != again.LocalAddr().String() {
					t.Fatalf("B accepted %v, want the client's new connection from %v", got.RemoteAddr(), again.LocalAddr())
				}
				if took > 2*time.Second {
					t.Fatalf("reset after %v, want within 2s", took)
				}
			})
		}
	}
}
