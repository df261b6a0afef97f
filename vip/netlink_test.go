//go:build linux

package vip

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/nsmd/nsmd/internal/testutil"
)

func TestNetlinkVIPConfigValidate(t *testing.T) {
	p := netip.MustParsePrefix("10.77.9.100/24")
	ok := NetlinkConfig{Prefix: p, Interface: "eth0"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	d := ok.withDefaults()
	if d.Lifetime != 2*time.Second || d.Refresh != 500*time.Millisecond || d.Announce != 3 {
		t.Fatalf("defaults: %+v", d)
	}
	for name, c := range map[string]NetlinkConfig{
		"no prefix":       {Interface: "eth0"},
		"no interface":    {Prefix: p},
		"multicast":       {Prefix: netip.MustParsePrefix("224.0.0.1/32"), Interface: "eth0"},
		"loopback":        {Prefix: netip.MustParsePrefix("127.0.0.100/32"), Interface: "eth0"},
		"mapped":          {Prefix: netip.MustParsePrefix("::ffff:10.0.0.1/128"), Interface: "eth0"},
		"fractional life": {Prefix: p, Interface: "eth0", Lifetime: 1500 * time.Millisecond},
		"short life":      {Prefix: p, Interface: "eth0", Lifetime: 500 * time.Millisecond},
		"slow refresh":    {Prefix: p, Interface: "eth0", Lifetime: 2 * time.Second, Refresh: 2 * time.Second},
		"negative burst":  {Prefix: p, Interface: "eth0", Announce: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
}

func TestVIPAnnouncementPackets(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0a}
	ip := netip.MustParseAddr("10.77.9.100")
	req := arpAnnouncement(arpOpRequest, mac, ip)
	want := []byte{0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 0x0a, 10, 77, 9, 100, 0, 0, 0, 0, 0, 0, 10, 77, 9, 100}
	if !bytes.Equal(req, want) {
		t.Errorf("ARP request\n got %x\nwant %x", req, want)
	}
	rep := arpAnnouncement(arpOpReply, mac, ip)
	if rep[7] != 2 || !bytes.Equal(rep[18:24], mac) || !bytes.Equal(rep[8:14], mac) {
		t.Errorf("ARP reply %x: want op 2 and the sender MAC as target MAC", rep)
	}

	ip6 := netip.MustParseAddr("fd77::100")
	p := unsolicitedNA(mac, ip6)
	if len(p) != 72 || p[0]>>4 != 6 || p[6] != 58 || p[7] != 255 || binary.BigEndian.Uint16(p[4:6]) != 32 {
		t.Fatalf("IPv6 header %x", p[:40])
	}
	if src := netip.AddrFrom16([16]byte(p[8:24])); src != ip6 {
		t.Errorf("source %v", src)
	}
	if dst := netip.AddrFrom16([16]byte(p[24:40])); dst != ip6AllNodes {
		t.Errorf("destination %v", dst)
	}
	m := p[40:]
	if m[0] != 136 || m[1] != 0 || m[4] != 0x20 {
		t.Errorf("NA type/code/flags %x", m[:8])
	}
	if tgt := netip.AddrFrom16([16]byte(m[8:24])); tgt != ip6 {
		t.Errorf("target %v", tgt)
	}
	if m[24] != 2 || m[25] != 1 || !bytes.Equal(m[26:32], mac) {
		t.Errorf("target link-layer option %x", m[24:])
	}
	if c := icmp6Checksum([16]byte(p[8:24]), [16]byte(p[24:40]), m); c != 0 {
		t.Errorf("checksum does not verify (residue %#x)", c)
	}
}

// --- network namespace tests -------------------------------------------

const (
	vipChildEnv  = "NSMD_VIP_NETNS_CHILD" // set in a test process inside netns A
	vipPeerEnv   = "NSMD_VIP_PEER_NS"     // the peer namespace B
	vipHolderEnv = "NSMD_VIP_HOLDER"      // TestNetlinkVIPHolderProcess: hold the VIP until killed
	vipMeasure   = "NSMD_VIP_MEASURE"     // samples for TestNetlinkVIPMeasureExpiry
	vipDev       = "vipa"
	vipPeerDev   = "vipb"
)

var vipNSSeq atomic.Int32

// vipProbeNetns says why namespaces cannot be made here ("": they can).
func vipProbeNetns() string {
	name := fmt.Sprintf("nsmd-vip-probe-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Sprintf("ip netns add failed: %v: %s", err, strings.TrimSpace(string(out)))
	}
	exec.Command("ip", "netns", "del", name).Run()
	return ""
}

// inVIPNetns runs the calling test again in a child process inside a
// fresh network namespace A, whose veth vipa (10.77.9.1/24, fd77::1/64)
// is peered with vipb (10.77.9.2/24, fd77::2/64) in a second fresh
// namespace B; no default routes. In the child it returns B's name and the
// test goes on; in the parent it waits for the child, reports its result
// and returns "". Both namespaces (and so the veth pair) are deleted at
// the end. It skips, saying why, where namespaces are not usable.
func inVIPNetns(t *testing.T) string {
	t.Helper()
	return testutil.NetnsPair{
		Base:     fmt.Sprintf("nsmd-vip-%d-%d", os.Getpid(), vipNSSeq.Add(1)),
		ChildEnv: vipChildEnv,
		PeerEnv:  vipPeerEnv,
		Usable:   vipProbeNetns,
		Timeout:  5 * time.Minute,
		Setup: func(_ *testing.T, a, b string) [][]string {
			return [][]string{
				{"-n", a, "link", "set", "lo", "up"},
				{"-n", b, "link", "set", "lo", "up"},
				{"-n", a, "link", "add", vipDev, "type", "veth", "peer", "name", vipPeerDev, "netns", b},
				{"-n", a, "addr", "add", "10.77.9.1/24", "dev", vipDev},
				{"-n", b, "addr", "add", "10.77.9.2/24", "dev", vipPeerDev},
				{"-n", a, "-6", "addr", "add", "fd77::1/64", "dev", vipDev, "nodad"},
				{"-n", b, "-6", "addr", "add", "fd77::2/64", "dev", vipPeerDev, "nodad"},
				{"-n", a, "link", "set", vipDev, "up"},
				{"-n", b, "link", "set", vipPeerDev, "up"},
			}
		},
	}.Run(t)
}

func vipTestLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newTestVIP is a VIP bound to the interface vipDev (the tests that watch
// it there); newBoundVIP chooses the binding.
func newTestVIP(t *testing.T, prefix string, life, refresh time.Duration) *Netlink {
	t.Helper()
	return newBoundVIP(t, prefix, life, refresh, BindInterface)
}

func newBoundVIP(t *testing.T, prefix string, life, refresh time.Duration, bind string) *Netlink {
	t.Helper()
	v, err := NewNetlink(NetlinkConfig{
		Prefix: netip.MustParsePrefix(prefix), Interface: vipDev, Lifetime: life, Refresh: refresh, Bind: bind,
		Logger: vipTestLogger(t), Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatalf("NewNetlink: %v", err)
	}
	t.Cleanup(func() {
		if err := v.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return v
}

func runIP(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// ipAddr is one entry of `ip -j addr show`.
type ipAddr struct {
	Local         string `json:"local"`
	PrefixLen     int    `json:"prefixlen"`
	NoPrefixRoute bool   `json:"noprefixroute"`
	NoDAD         bool   `json:"nodad"`
	Tentative     bool   `json:"tentative"`
	Dynamic       bool   `json:"dynamic"`
	Valid         int64  `json:"valid_life_time"`
	Preferred     int64  `json:"preferred_life_time"`
}

// addrOnDev is addr as `ip -j addr show dev` reports it on dev in this
// namespace.
func addrOnDev(t *testing.T, dev string, addr netip.Addr) (ipAddr, bool) {
	t.Helper()
	var links []struct {
		AddrInfo []ipAddr `json:"addr_info"`
	}
	if err := json.Unmarshal(runIP(t, "-j", "addr", "show", "dev", dev), &links); err != nil {
		t.Fatalf("ip -j addr: %v", err)
	}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if p, err := netip.ParseAddr(a.Local); err == nil && p == addr {
				return a, true
			}
		}
	}
	return ipAddr{}, false
}

// peerLLAddr is the link-layer address namespace ns has for addr on dev.
func peerLLAddr(t *testing.T, ns, dev string, addr netip.Addr) string {
	t.Helper()
	var entries []struct {
		Dst    string `json:"dst"`
		LLAddr string `json:"lladdr"`
	}
	if err := json.Unmarshal(runIP(t, "-n", ns, "-j", "neigh", "show", "dev", dev), &entries); err != nil {
		t.Fatalf("ip -j neigh: %v", err)
	}
	for _, n := range entries {
		if p, err := netip.ParseAddr(n.Dst); err == nil && p == addr {
			return n.LLAddr
		}
	}
	return ""
}

func devMAC(t *testing.T, dev string) net.HardwareAddr {
	t.Helper()
	ifi, err := net.InterfaceByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	return ifi.HardwareAddr
}

// capture is an AF_PACKET socket on an interface of another namespace.
type capture struct{ fd int }

// openCapture opens, in namespace ns, a packet socket for ethertype proto
// bound to dev. The socket stays in ns; the thread that entered ns is
// never unlocked, so it exits with its goroutine.
func openCapture(t *testing.T, ns, dev string, proto uint16) *capture {
	t.Helper()
	type res struct {
		fd  int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := func() (int, error) {
			f, err := os.Open("/run/netns/" + ns)
			if err != nil {
				return -1, err
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				return -1, fmt.Errorf("setns %s: %w", ns, err)
			}
			ifi, err := net.InterfaceByName(dev)
			if err != nil {
				return -1, err
			}
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(proto)))
			if err != nil {
				return -1, err
			}
			if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifi.Index}); err != nil {
				unix.Close(fd)
				return -1, err
			}
			tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				unix.Close(fd)
				return -1, err
			}
			return fd, nil
		}()
		ch <- res{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("capture on %s in %s: %v", dev, ns, r.err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	return &capture{fd: r.fd}
}

// next returns the first received packet (no link header) that match
// accepts, with the link-layer source address it came from.
func (c *capture) next(t *testing.T, d time.Duration, what string, match func([]byte) bool) (pkt []byte, from net.HardwareAddr) {
	t.Helper()
	buf := make([]byte, 2048)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		n, sa, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			continue // receive timeout: check the deadline
		}
		ll, ok := sa.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if match(buf[:n]) {
			return slices.Clone(buf[:n]), net.HardwareAddr(slices.Clone(ll.Addr[:ll.Halen]))
		}
	}
	t.Fatalf("no %s captured within %v", what, d)
	return nil, nil
}

// waitGone polls the kernel until addr left the interface and reports when.
func waitGone(t *testing.T, l link, d time.Duration) time.Time {
	t.Helper()
	return testutil.WaitForTime(t, d, 2*time.Millisecond, "the address to leave the interface", func() bool {
		_, ok, err := l.lookup()
		if err != nil {
			t.Fatalf("lookup: %v", err)
		}
		return !ok
	})
}

// rawLink is the VIP's netlink side without NewNetlink (which would
// remove the address): for watching and renewing it from a test.
func rawLink(t *testing.T, prefix string, life time.Duration) link {
	t.Helper()
	l, err := newLink(NetlinkConfig{Prefix: netip.MustParsePrefix(prefix), Interface: vipDev, Lifetime: life, Bind: BindInterface}, vipTestLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.close() })
	return l
}

func TestNetlinkVIPAcquireRelease(t *testing.T) {
	if inVIPNetns(t) == "" {
		return
	}
	vip := netip.MustParseAddr("10.77.9.100")
	v := newTestVIP(t, "10.77.9.100/24", 2*time.Second, 0)
	if v.Held() {
		t.Fatal("Held before Acquire")
	}
	if v.Lifetime() != 2*time.Second {
		t.Fatalf("Lifetime %v", v.Lifetime())
	}
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	a, ok := addrOnDev(t, vipDev, vip)
	if !ok {
		t.Fatal("address not on the interface after Acquire returned")
	}
	if a.PrefixLen != 24 || !a.NoPrefixRoute || !a.Dynamic || a.Valid < 1 || a.Valid > 2 || a.Preferred > a.Valid {
		t.Fatalf("address %+v: want /24, noprefixroute, dynamic, 1 ≤ valid_lft ≤ 2, preferred ≤ valid", a)
	}
	if !v.Held() {
		t.Fatal("not Held after Acquire")
	}
	if err := v.Acquire(context.Background()); err != nil { // idempotent
		t.Fatalf("second Acquire: %v", err)
	}
	if routes := string(runIP(t, "route", "show", "table", "all")); strings.Contains(routes, "src 10.77.9.100") {
		t.Fatalf("a route prefers the VIP as source:\n%s", routes)
	}
	if got := testutil.MetricValue(t, v.m.acquired); got != 1 {
		t.Errorf("nsmd_vip_acquired_total = %v, want 1", got)
	}
	if err := v.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, ok := addrOnDev(t, vipDev, vip); ok {
		t.Fatal("address still there after Release returned")
	}
	if v.Held() {
		t.Fatal("Held after Release")
	}
	if err := v.Release(); err != nil {
		t.Fatalf("Release when not held: %v", err)
	}

	// The hold ends with the acquire context too.
	ctx, cancel := context.WithCancel(context.Background())
	if err := v.Acquire(ctx); err != nil {
		t.Fatalf("Acquire again: %v", err)
	}
	if _, ok := addrOnDev(t, vipDev, vip); !ok || !v.Held() {
		t.Fatal("not held after the second Acquire")
	}
	cancel()
	testutil.WaitFor(t, 2*time.Second, "the address to go with its acquire context", func() bool {
		_, ok := addrOnDev(t, vipDev, vip)
		return !ok
	})
	if v.Held() {
		t.Fatal("Held after the acquire context ended")
	}
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire after a cancelled hold: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, ok := addrOnDev(t, vipDev, vip); ok {
		t.Fatal("address still there after Close")
	}
	if err := v.Acquire(context.Background()); err == nil {
		t.Fatal("Acquire after Close worked")
	}
}

func TestNetlinkVIPRemovesStale(t *testing.T) {
	if inVIPNetns(t) == "" {
		return
	}
	vip := netip.MustParseAddr("10.77.9.100")
	runIP(t, "addr", "add", "10.77.9.100/32", "dev", vipDev) // a crashed run's copy, other prefix length, no lifetime
	newTestVIP(t, "10.77.9.100/24", 2*time.Second, 0)
	if a, ok := addrOnDev(t, vipDev, vip); ok {
		t.Fatalf("stale address %+v still there after NewNetlink", a)
	}
	if _, ok := addrOnDev(t, vipDev, netip.MustParseAddr("10.77.9.1")); !ok {
		t.Fatal("the interface's own address went too")
	}
}

// Drop deletes a copy of the address that appeared after NewNetlink and
// that this Netlink never held (a previous process's, found only when a
// service's stop at start asks); Release, which deletes only its own
// hold, leaves it (the control). Absent, it is no error.
func TestNetlinkVIPDropRemovesACopyItDoesNotHold(t *testing.T) {
	if inVIPNetns(t) == "" {
		return
	}
	vip := netip.MustParseAddr("10.77.9.100")
	v := newTestVIP(t, "10.77.9.100/24", 2*time.Second, 0)
	if err := v.Drop(); err != nil {
		t.Fatalf("Drop with no copy anywhere: %v", err)
	}
	runIP(t, "addr", "add", "10.77.9.100/32", "dev", vipDev)
	if err := v.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, ok := addrOnDev(t, vipDev, vip); !ok {
		t.Fatal("control: Release removed a copy it did not hold; this test no longer shows what Drop adds")
	}
	if err := v.Drop(); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	if a, ok := addrOnDev(t, vipDev, vip); ok {
		t.Fatalf("the copy %+v is still there after Drop", a)
	}
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire after Drop: %v", err)
	}
	if err := v.Drop(); err != nil {
		t.Fatalf("Drop of a hold: %v", err)
	}
	if _, ok := addrOnDev(t, vipDev, vip); ok || v.Held() {
		t.Fatal("the held address is still there after Drop")
	}
	if _, ok := addrOnDev(t, vipDev, netip.MustParseAddr("10.77.9.1")); !ok {
		t.Fatal("the interface's own address went too")
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if err := v.Drop(); err != nil {
		t.Fatalf("Drop after Close: %v", err)
	}
}

func TestNetlinkVIPAnnouncesARP(t *testing.T) {
	peer := inVIPNetns(t)
	if peer == "" {
		return
	}
	vip := netip.MustParseAddr("10.77.9.100")
	mac := devMAC(t, vipDev)
	// The peer knew the VIP at an old holder's MAC; a gratuitous ARP must
	// move it (Linux does not create entries from one by default).
	runIP(t, "-n", peer, "neigh", "add", vip.String(), "lladdr", "02:00:00:00:00:99", "dev", vipPeerDev, "nud", "stale")
	c := openCapture(t, peer, vipPeerDev, unix.ETH_P_ARP)
	v := newTestVIP(t, "10.77.9.100/24", 2*time.Second, 0)
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	v4 := vip.As4()
	for _, op := range []byte{arpOpRequest, arpOpReply} {
		p, from := c.next(t, 2*time.Second, fmt.Sprintf("gratuitous ARP op %d", op), func(p []byte) bool {
			return len(p) >= arpLen && p[7] == op && bytes.Equal(p[14:18], v4[:]) && bytes.Equal(p[24:28], v4[:])
		})
		if !bytes.Equal(p[8:14], mac) || !bytes.Equal(from, mac) {
			t.Errorf("ARP op %d from %v sender MAC %x, want %v", op, from, p[8:14], mac)
		}
	}
	testutil.WaitFor(t, 2*time.Second, "the peer's neighbour entry to move to "+mac.String(), func() bool {
		return peerLLAddr(t, peer, vipPeerDev, vip) == mac.String()
	})
	testutil.WaitFor(t, 2*time.Second, "the acquire burst (3 rounds of request + reply)", func() bool {
		return testutil.MetricValue(t, v.m.announcements) >= 6
	})
	// The peer reaches the VIP (answered from A), where ping is installed.
	if _, err := exec.LookPath("ping"); err == nil {
		if out, err := exec.Command("ip", "netns", "exec", peer, "ping", "-c", "1", "-W", "2", vip.String()).CombinedOutput(); err != nil {
			t.Fatalf("ping the VIP from the peer: %v: %s", err, out)
		}
	}
}

// TestNetlinkVIPQuietStartAnnouncesOnlyWhenTold: acquired under
// WithQuietStart, the address is on the interface and renewed, but no
// ARP leaves and the peer keeps the old holder's MAC, through several
// refreshes, until Announce; then the burst moves the peer.
func TestNetlinkVIPQuietStartAnnouncesOnlyWhenTold(t *testing.T) {
	peer := inVIPNetns(t)
	if peer == "" {
		return
	}
	vip := netip.MustParseAddr("10.77.9.100")
	mac := devMAC(t, vipDev)
	const old = "02:00:00:00:00:99"
	runIP(t, "-n", peer, "neigh", "add", vip.String(), "lladdr", old, "dev", vipPeerDev, "nud", "stale")
	v := newTestVIP(t, "10.77.9.100/24", 2*time.Second, 0) // refresh every 500 ms
	if err := v.Acquire(WithQuietStart(context.Background())); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if !v.Held() {
		t.Fatal("a quiet acquire did not put the address on the interface")
	}
	testutil.HoldsFor(t, 1500*time.Millisecond, 100*time.Millisecond, "nothing announced while quiet (three refreshes)", func() (bool, string) {
		n, at := testutil.MetricValue(t, v.m.announcements), peerLLAddr(t, peer, vipPeerDev, vip)
		return n == 0 && at == old, fmt.Sprintf("%v announcements, the peer has it at %s", n, at)
	})
	v.Announce()
	testutil.WaitFor(t, 2*time.Second, "the peer's neighbour entry to move to "+mac.String(), func() bool {
		return peerLLAddr(t, peer, vipPeerDev, vip) == mac.String()
	})
	testutil.WaitFor(t, 2*time.Second, "the announce burst (3 rounds of request + reply)", func() bool {
		return testutil.MetricValue(t, v.m.announcements) >= 6
	})
}

func TestNetlinkVIPRefreshReadds(t *testing.T) {
	if inVIPNetns(t) == "" {
		return
	}
	vip := netip.MustParseAddr("10.77.9.100")
	v := newTestVIP(t, "10.77.9.100/24", time.Second, 200*time.Millisecond)
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	runIP(t, "addr", "del", "10.77.9.100/24", "dev", vipDev)
	testutil.WaitFor(t, 2*time.Second, "the refresh loop to re-add the address", func() bool {
		_, ok := addrOnDev(t, vipDev, vip)
		return ok
	})
	if a, _ := addrOnDev(t, vipDev, vip); !a.NoPrefixRoute || !a.Dynamic {
		t.Fatalf("re-added address %+v: want noprefixroute with a lifetime", a)
	}
	testutil.WaitFor(t, time.Second, "nsmd_vip_readded_total to count it", func() bool {
		return testutil.MetricValue(t, v.m.readded) == 1
	})
	if !v.Held() {
		t.Fatal("not Held after the re-add")
	}
	// Renewal: after more than a lifetime the address is still there.
	testutil.HoldsFor(t, 1500*time.Millisecond, 50*time.Millisecond, "the held address", func() (bool, string) {
		a, ok := addrOnDev(t, vipDev, vip)
		return ok && a.Valid >= 1, fmt.Sprintf("lapsed: %+v present=%v", a, ok)
	})
	if got := testutil.MetricValue(t, v.m.readded); got != 1 {
		t.Fatalf("nsmd_vip_readded_total = %v after renewals, want 1", got)
	}
}

// maxExpiryDelay bounds how late the kernel removes an expired address:
// its lifetime check may be rescheduled up to ADDRCONF_TIMER_FUZZ_MAX (1 s)
// away by any other address change on the host, plus timer slack.
const maxExpiryDelay = 1500 * time.Millisecond

func TestNetlinkVIPExpiresWhenAbandoned(t *testing.T) {
	if inVIPNetns(t) == "" {
		return
	}
	const life = time.Second
	v := newTestVIP(t, "10.77.9.100/24", life, 250*time.Millisecond)
	l := rawLink(t, "10.77.9.100/24", life)
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	v.Abandon()
	if _, ok, _ := l.lookup(); !ok {
		t.Fatal("abandon deleted the address")
	}
	t0 := time.Now()
	if err := l.replace(); err != nil { // the dead holder's last renewal
		t.Fatal(err)
	}
	gone := waitGone(t, l, life+maxExpiryDelay)
	delay := gone.Sub(t0) - life
	t.Logf("IPv4 address with valid_lft %v expired %v after its lifetime", life, delay.Round(time.Millisecond))
	if delay < -50*time.Millisecond {
		t.Fatalf("address went %v before its lifetime ended", -delay)
	}
}

// TestNetlinkVIPHolderProcess is the holder killed by
// TestNetlinkVIPExpiresAfterSIGKILL; it does nothing on its own.
func TestNetlinkVIPHolderProcess(t *testing.T) {
	if os.Getenv(vipHolderEnv) == "" {
		t.Skip("helper process of TestNetlinkVIPExpiresAfterSIGKILL")
	}
	bind := os.Getenv(vipHolderEnv) // "1" (interface) or a binding
	if bind == "1" {
		bind = BindInterface
	}
	v := newBoundVIP(t, "10.77.9.100/24", time.Second, 250*time.Millisecond, bind)
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	fmt.Println("NSMD_VIP_HELD")
	bufio.NewReader(os.Stdin).ReadByte() // until killed, or the parent goes
}

// holder is a running TestNetlinkVIPHolderProcess.
type holder struct {
	cmd     *exec.Cmd
	drained chan struct{} // closed once its output ended
}

// kill sends SIGKILL and reaps the process; safe to repeat.
func (h *holder) kill() {
	h.cmd.Process.Kill()
	<-h.drained
	h.cmd.Wait()
}

// startHolder runs TestNetlinkVIPHolderProcess (lifetime 1 s, refresh
// 250 ms, bound to the interface) and returns once it holds the VIP.
func startHolder(t *testing.T) *holder {
	t.Helper()
	return startBoundHolder(t, BindInterface)
}

func startBoundHolder(t *testing.T, bind string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestNetlinkVIPHolderProcess$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), vipHolderEnv+"="+bind, testutil.QuickRaceExit())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, drained: make(chan struct{})}
	t.Cleanup(func() {
		stdin.Close()
		h.kill()
	})
	held := make(chan bool, 1)
	go func() {
		defer close(h.drained)
		sc := bufio.NewScanner(out)
		seen := false
		for sc.Scan() {
			t.Log("holder: " + sc.Text())
			if !seen && sc.Text() == "NSMD_VIP_HELD" {
				seen = true
				held <- true
			}
		}
		if !seen {
			held <- false
		}
	}()
	if !<-held {
		t.Fatal("holder process ended without taking the VIP")
	}
	return h
}

func TestNetlinkVIPExpiresAfterSIGKILL(t *testing.T) {
	if inVIPNetns(t) == "" {
		return
	}
	const life, refresh = time.Second, 250 * time.Millisecond
	l := rawLink(t, "10.77.9.100/24", life)
	h := startHolder(t)
	killed := time.Now()
	h.kill()
	if _, ok, _ := l.lookup(); !ok {
		t.Fatal("the address went with the process: it must outlive it by its lifetime")
	}
	gone := waitGone(t, l, life+maxExpiryDelay)
	after := gone.Sub(killed)
	t.Logf("after SIGKILL the address went after %v (lifetime %v, last renewal up to %v before the kill)",
		after.Round(time.Millisecond), life, refresh)
	if after < life-refresh-50*time.Millisecond {
		t.Fatalf("address went %v after the kill, before its lifetime could have ended", after)
	}
}

// A frozen holder (SIGSTOP) loses the address by itself; once it runs
// again it waits a lifetime before re-adding, so that a deposed leader has
// time to release first.
func TestNetlinkVIPExpiresWhileStopped(t *testing.T) {
	if inVIPNetns(t) == "" {
		return
	}
	const life = time.Second
	l := rawLink(t, "10.77.9.100/24", life)
	h := startHolder(t)
	if err := h.cmd.Process.Signal(unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	gone := waitGone(t, l, life+maxExpiryDelay)
	t.Logf("after SIGSTOP the address went after %v", gone.Sub(stopped).Round(time.Millisecond))
	if err := h.cmd.Process.Signal(unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	testutil.HoldsFor(t, life*7/10-time.Since(resumed), 5*time.Millisecond, "no re-add within a lifetime of the resume", func() (bool, string) {
		_, ok, _ := l.lookup()
		return !ok, fmt.Sprintf("the resumed holder re-added the address after %v, before waiting a lifetime", time.Since(resumed))
	})
	testutil.WaitFor(t, 2*time.Second, "the resumed holder to re-add the address", func() bool {
		_, ok, _ := l.lookup()
		return ok
	})
	t.Logf("re-added %v after SIGCONT", time.Since(resumed).Round(time.Millisecond))
}

func TestNetlinkVIPIPv6(t *testing.T) {
	peer := inVIPNetns(t)
	if peer == "" {
		return
	}
	vip := netip.MustParseAddr("fd77::100")
	mac := devMAC(t, vipDev)
	runIP(t, "-n", peer, "-6", "neigh", "add", vip.String(), "lladdr", "02:00:00:00:00:99", "dev", vipPeerDev, "nud", "stale")
	c := openCapture(t, peer, vipPeerDev, unix.ETH_P_IPV6)
	v := newTestVIP(t, "fd77::100/64", 2*time.Second, 0)
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	a, ok := addrOnDev(t, vipDev, vip)
	if !ok {
		t.Fatal("address not on the interface after Acquire returned")
	}
	if a.Tentative || !a.NoDAD || !a.NoPrefixRoute || !a.Dynamic || a.Valid < 1 || a.Valid > 2 {
		t.Fatalf("address %+v: want nodad (never tentative), noprefixroute, 1 ≤ valid_lft ≤ 2", a)
	}
	tgt := vip.As16()
	p, from := c.next(t, 2*time.Second, "unsolicited NA", func(p []byte) bool {
		return len(p) >= 72 && p[6] == 58 && p[40] == 136 && bytes.Equal(p[48:64], tgt[:])
	})
	if p[7] != 255 || p[44]&0xe0 != naFlagOverride || !bytes.Equal(p[66:72], mac) || !bytes.Equal(from, mac) {
		t.Errorf("NA %x from %v: want hop limit 255, flags O only, target link-layer address %v", p, from, mac)
	}
	if dst := netip.AddrFrom16([16]byte(p[24:40])); dst != ip6AllNodes {
		t.Errorf("NA to %v, want ff02::1", dst)
	}
	// The peer ignores NAs for about a second after its entry last changed
	// (here: created just now); a later re-announce moves it.
	testutil.WaitFor(t, 3*time.Second, "the peer's neighbour entry to move to "+mac.String(), func() bool {
		return peerLLAddr(t, peer, vipPeerDev, vip) == mac.String()
	})
	if !v.Held() {
		t.Fatal("not Held")
	}
	if err := v.Release(); err != nil {
		t.Fatal(err)
	}
	if _, ok := addrOnDev(t, vipDev, vip); ok {
		t.Fatal("address still there after Release")
	}
}

// TestNetlinkVIPMeasureExpiry measures how late the kernel drops an
// expired address: quiet, and with one unrelated address change at a
// given time before the expiry (any address change on the host runs the
// kernel's lifetime check at once and reschedules it, at least
// ADDRCONF_TIMER_FUZZ_MAX = 1 s later). Run with NSMD_VIP_MEASURE=N.
func TestNetlinkVIPMeasureExpiry(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(vipMeasure))
	if n <= 0 {
		t.Skip("measurement: set " + vipMeasure + "=samples")
	}
	if inVIPNetns(t) == "" {
		return
	}
	const life = 2 * time.Second
	for _, fam := range []struct{ prefix, other string }{
		{"10.77.9.100/24", "10.77.9.200/24"},
		{"fd77::100/64", "fd77::200/64"},
	} {
		l := rawLink(t, fam.prefix, life)
		other := rawLink(t, fam.other, 10*time.Second)
		for _, before := range []time.Duration{0, 700 * time.Millisecond, 300 * time.Millisecond, 50 * time.Millisecond} {
			var ds []time.Duration
			for range n {
				t0 := time.Now()
				if err := l.replace(); err != nil {
					t.Fatal(err)
				}
				if before > 0 {
					time.Sleep(time.Until(t0.Add(life - before)))
					if err := other.replace(); err != nil {
						t.Fatal(err)
					}
				}
				ds = append(ds, waitGone(t, l, life+3*time.Second).Sub(t0)-life)
			}
			slices.Sort(ds)
			what := "quiet"
			if before > 0 {
				what = fmt.Sprintf("another address changed %v before expiry", before)
			}
			t.Logf("%s valid_lft %v, %s, %d samples: expiry delay min %v median %v max %v", fam.prefix, life, what, n,
				ds[0].Round(time.Millisecond), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
		}
		other.remove()
	}
}

// addrDevices lists the devices that carry addr in this namespace.
func addrDevices(t *testing.T, addr netip.Addr) []string {
	t.Helper()
	var links []struct {
		IfName   string   `json:"ifname"`
		AddrInfo []ipAddr `json:"addr_info"`
	}
	if err := json.Unmarshal(runIP(t, "-j", "addr", "show"), &links); err != nil {
		t.Fatalf("ip -j addr: %v", err)
	}
	var devs []string
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if p, err := netip.ParseAddr(a.Local); err == nil && p == addr {
				devs = append(devs, l.IfName)
			}
		}
	}
	return devs
}

// skipWithoutTun skips where TUN devices cannot be made (bind process
// then falls back to the interface under auto, and refuses under process).
func skipWithoutTun(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no TUN devices here (%v): bind process cannot be tested", err)
	}
	f.Close()
}

// With bind process the VIP lives on a TUN device of the holder's, the
// kernel answers ARP for it on the interface, Release deletes it, and the
// device goes when the VIP is closed.
func TestNetlinkVIPBoundToProcess(t *testing.T) {
	skipWithoutTun(t)
	peer := inVIPNetns(t)
	if peer == "" {
		return
	}
	vip := netip.MustParseAddr("10.77.9.100")
	v := newBoundVIP(t, "10.77.9.100/24", 2*time.Second, 0, BindProcess)
	if !v.DiesWithProcess() {
		t.Fatal("bind process: DiesWithProcess is false")
	}
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	devs := addrDevices(t, vip)
	if len(devs) != 1 || !strings.HasPrefix(devs[0], "nsmdvip") {
		t.Fatalf("VIP on %v, want one nsmdvip* device", devs)
	}
	a, _ := addrOnDev(t, devs[0], vip)
	if !a.NoPrefixRoute || a.Valid > 2 || a.Valid < 1 {
		t.Errorf("VIP on %s: %+v, want noprefixroute and valid_lft ≤ 2s", devs[0], a)
	}
	if _, err := exec.LookPath("ping"); err == nil {
		if out, err := exec.Command("ip", "netns", "exec", peer, "ping", "-c", "1", "-W", "2", vip.String()).CombinedOutput(); err != nil {
			t.Fatalf("ping the process-bound VIP from the peer (ARP answered on %s): %v: %s", vipDev, err, out)
		}
	}
	if err := v.Release(); err != nil {
		t.Fatal(err)
	}
	if d := addrDevices(t, vip); len(d) != 0 {
		t.Fatalf("VIP still on %v after Release", d)
	}
	if err := v.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire again: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if d := addrDevices(t, vip); len(d) != 0 {
		t.Fatalf("VIP still on %v after Close", d)
	}
	if _, err := net.InterfaceByName(devs[0]); err == nil {
		t.Fatalf("device %s still there after Close", devs[0])
	}
}

// A process-bound VIP goes with its holder at SIGKILL: by the time the
// holder is reaped, no lifetime later.
func TestNetlinkVIPBoundToProcessGoesAtSIGKILL(t *testing.T) {
	skipWithoutTun(t)
	if inVIPNetns(t) == "" {
		return
	}
	vip := netip.MustParseAddr("10.77.9.100")
	h := startBoundHolder(t, BindProcess)
	devs := addrDevices(t, vip)
	if len(devs) != 1 || !strings.HasPrefix(devs[0], "nsmdvip") {
		t.Fatalf("holder's VIP on %v, want one nsmdvip* device", devs)
	}
	h.kill()
	if d := addrDevices(t, vip); len(d) != 0 {
		t.Fatalf("VIP still on %v after the holder was killed and reaped", d)
	}
	if _, err := net.InterfaceByName(devs[0]); err == nil {
		t.Fatalf("device %s outlived its process", devs[0])
	}
}
