package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The multi-host topology: a "switch" namespace holding a bridge, and one
// namespace per host (nsmd nodes n1..n3, client hosts c1..cK), each with an
// eth0 whose veth peer is a port of that bridge. Every address is in
// 10.77.0.0/24; nothing has a default route; the host namespace is never
// touched (the veth pairs are created inside the switch namespace).

const (
	topoNet   = "10.77.0"
	topoBits  = 24
	vipString = topoNet + ".100"
)

// netHost is one namespace on the bridge.
type netHost struct {
	name   string     // short name: n1, c2
	ns     string     // namespace name: nsmd-<pid>-n1
	ip     netip.Addr // eth0 address
	swPort string     // the veth end in the switch namespace
}

// topology is the set of namespaces this test process made.
type topology struct {
	prefix string // nsmd-<pid>-
	sw     string // switch namespace
	nodes  []*netHost
	hosts  []*netHost // client hosts
}

// topoPrefix is the prefix of every namespace this process creates; it
// carries the pid, so cleanup never touches another run's namespaces.
func topoPrefix() string { return fmt.Sprintf("nsmd-%d-", os.Getpid()) }

// ipCmd runs `ip args...` and returns its combined output, wrapped in an
// error naming the command when it fails.
func ipCmd(args ...string) (string, error) {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// nsCmd runs a command inside namespace ns.
func nsCmd(ns string, name string, args ...string) (string, error) {
	return ipCmd(append([]string{"netns", "exec", ns, name}, args...)...)
}

// removeOurNamespaces deletes every namespace named with this process's
// prefix (leftovers of an earlier topology of this same process too).
func removeOurNamespaces(prefix string) error {
	out, err := ipCmd("netns", "list")
	if err != nil {
		return err
	}
	var errs []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], prefix) {
			continue
		}
		if _, err := ipCmd("netns", "del", f[0]); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("removing namespaces: %s", strings.Join(errs, "; "))
	}
	return nil
}

// newTopology builds the switch, nNodes node hosts (10.77.0.11+) and
// nClients client hosts (10.77.0.21+). It is removed when the test ends,
// after every cleanup registered later (the processes inside) has run.
func newTopology(t *testing.T, nNodes, nClients int) *topology {
	t.Helper()
	tp := &topology{prefix: topoPrefix()}
	tp.sw = tp.prefix + "sw"
	if err := removeOurNamespaces(tp.prefix); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeOurNamespaces(tp.prefix); err != nil {
			t.Error(err)
		}
	})
	must := func(args ...string) {
		t.Helper()
		if _, err := ipCmd(args...); err != nil {
			t.Fatalf("building the topology: %v", err)
		}
	}
	must("netns", "add", tp.sw)
	must("-n", tp.sw, "link", "set", "lo", "up")
	must("-n", tp.sw, "link", "add", "br0", "type", "bridge")
	must("-n", tp.sw, "link", "set", "br0", "up")
	add := func(name string, ip netip.Addr) *netHost {
		h := &netHost{name: name, ns: tp.prefix + name, ip: ip, swPort: "v-" + name}
		must("netns", "add", h.ns)
		must("-n", h.ns, "link", "set", "lo", "up")
		must("-n", tp.sw, "link", "add", h.swPort, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
		must("-n", tp.sw, "link", "set", h.swPort, "master", "br0", "up")
		must("-n", h.ns, "addr", "add", fmt.Sprintf("%s/%d", ip, topoBits), "dev", "eth0")
		must("-n", h.ns, "link", "set", "eth0", "up")
		return h
	}
	for i := range nNodes {
		tp.nodes = append(tp.nodes, add(fmt.Sprintf("n%d", i+1), netip.MustParseAddr(fmt.Sprintf("%s.%d", topoNet, 11+i))))
	}
	for i := range nClients {
		tp.hosts = append(tp.hosts, add(fmt.Sprintf("c%d", i+1), netip.MustParseAddr(fmt.Sprintf("%s.%d", topoNet, 21+i))))
	}
	return tp
}

// inNetnsThread runs f on a fresh OS thread that has joined network
// namespace ns; the thread is thrown away afterwards (never unlocked), so
// no other goroutine ever runs in ns. Sockets f creates on its own
// goroutine belong to ns for their whole life.
func inNetnsThread(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // no UnlockOSThread: the thread exits with this goroutine
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// dialIn dials addr from inside namespace ns.
func dialIn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNetnsThread(ns, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// httpIn is an HTTP client whose connections start in namespace ns (the
// admin APIs listen on addresses only reachable there); with tc, HTTPS.
func httpIn(ns string, tc *tls.Config) *http.Client {
	return &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   tc,
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dialIn(ctx, ns, network, addr)
			},
		},
	}
}

// startPinned starts cmd from one OS thread that lives as long as this
// process. The kernel sends Pdeathsig when the thread that forked a child
// exits, not the process, and inNetnsThread throws threads away; forking
// from this thread makes Pdeathsig mean "the test process died".
func startPinned(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	spawner() <- func() { errc <- cmd.Start() }
	return <-errc
}

var spawner = sync.OnceValue(func() chan<- func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread() // for good: this goroutine never returns
		for f := range ch {
			f()
		}
	}()
	return ch
})
