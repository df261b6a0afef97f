package testutil

import (
	"net"
	"strconv"
	"testing"

	"github.com/nsmd/nsmd/internal/freeport"
)

// ports hands out the ports of every test of this process: one Picker, so
// that tests which each take ports before their nodes bind them never get
// the same one.
var ports freeport.Picker

// FreePorts finds n distinct ports, each free for TCP and UDP on every one
// of ips (127.0.0.1 when none is given) and handed to no other test of
// this process.
func FreePorts(t testing.TB, n int, ips ...string) []int {
	t.Helper()
	if len(ips) == 0 {
		ips = []string{"127.0.0.1"}
	}
	p, err := ports.Ports(ips, n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FreePort is one port of FreePorts.
func FreePort(t testing.TB, ips ...string) int {
	t.Helper()
	return FreePorts(t, 1, ips...)[0]
}

// FreeAddr is ip with a port of FreePort: an address to listen on.
func FreeAddr(t testing.TB, ip string) string {
	t.Helper()
	return net.JoinHostPort(ip, strconv.Itoa(FreePort(t, ip)))
}
