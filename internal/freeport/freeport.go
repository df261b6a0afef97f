// Package freeport finds ports a node can listen on: each free for TCP
// and UDP on every address asked about, drawn below the kernel's
// ephemeral port range.
//
// A port the kernel picks for ":0" lies inside the ephemeral range, where
// any outgoing connection on the machine may take it between the check and
// the caller's own bind (a loaded test machine saw "address already in
// use" that way). Below that range only another caller that draws the same
// port can take it, and a Picker never draws the same port twice.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// The range drawn from: from lowest up to the start of the kernel's
// ephemeral range, at most up to highest (the usual start of it).
const (
	lowest  = 20000
	highest = 32768
)

// Picker hands out free ports, never the same one twice (until it has
// handed out half of its range, when it starts afresh): callers that each
// ask for ports before any of them binds get distinct ones. The zero
// Picker is ready to use; it is safe for concurrent use.
type Picker struct {
	mu     sync.Mutex
	handed map[int]bool
}

// Ports finds n distinct ports, each free for TCP and UDP on every one of
// ips right now.
func Ports(ips []string, n int) ([]int, error) {
	var p Picker
	return p.Ports(ips, n)
}

// Ports finds n distinct ports, each free for TCP and UDP on every one of
// ips right now and not handed out by p before.
func (p *Picker) Ports(ips []string, n int) ([]int, error) {
	if len(ips) == 0 {
		return nil, fmt.Errorf("find %d free ports: no address to check them on", n)
	}
	lo, hi := drawRange()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.handed == nil || len(p.handed) > (hi-lo)/2 {
		p.handed = map[int]bool{}
	}
	var out []int
	for range 500 + 100*n {
		if len(out) == n {
			return out, nil
		}
		var port int
		if hi-lo >= 1000 {
			port = lo + rand.IntN(hi-lo)
		} else { // an unusual ephemeral range: let the kernel choose
			ln, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
			if err != nil {
				return nil, fmt.Errorf("find a free port: %w", err)
			}
			port = ln.Addr().(*net.TCPAddr).Port
			ln.Close()
		}
		if p.handed[port] || !free(ips, port) {
			continue
		}
		p.handed[port] = true
		out = append(out, port)
	}
	if len(out) == n {
		return out, nil
	}
	return nil, fmt.Errorf("no %d ports free on all of %s", n, strings.Join(ips, ", "))
}

// drawRange is [lo, hi): below the kernel's ephemeral range.
func drawRange() (lo, hi int) {
	lo, hi = lowest, highest
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var first, last int
		if _, err := fmt.Sscan(string(b), &first, &last); err == nil && first < hi {
			hi = first
		}
	}
	return lo, hi
}

// free says whether port can be bound for TCP and UDP on every one of ips.
func free(ips []string, port int) bool {
	for _, ip := range ips {
		addr := net.JoinHostPort(ip, strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		l.Close()
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return false
		}
		pc.Close()
	}
	return true
}
