// Package tickle makes TCP clients of a floating address (VIP) notice at
// once that the address moved to another host.
//
// When the VIP moves, the clients' connections to it die with the old
// holder, but the clients do not know: a client waiting for a reply sends
// nothing, and one whose last segment was lost retransmits on its own
// backoff (0.2, 0.4, 0.9 … 6.9 s). Only the first of its segments that
// reaches the new holder is answered with a reset, and only then does the
// client reconnect.
//
// The new holder shortens that to a round trip. For every connection the
// previous holder had on the VIP (Read, on that holder, from
// /proc/net/tcp and /proc/net/tcp6), it sends a "tickle ACK" (Send): a
// bare ACK from VIP:port to client:port with sequence and acknowledgment
// numbers that are not the connection's. The client's TCP answers an ACK
// outside its window with an ACK that carries the right numbers (RFC 793
// §3.9; RFC 5961 §4, §5: the challenge ACK); the new holder's kernel has no
// socket for that 4-tuple and answers it with a reset the client accepts
// (its sequence number is exactly the one the client expects); the
// client's RPC layer sees the connection reset and reconnects at once.
//
// A tickle resets nothing by itself: it only makes the client ask, and the
// answer comes from the new holder's own kernel, which resets only a
// connection it has no socket for. A connection the new holder does have
// (a client that already reconnected with the same port) gets the ACK, the
// client's reply is a duplicate ACK on a live connection, and nothing
// happens; Send skips such connections anyway.
package tickle

import (
	"net/netip"
)

// NFSPort is nfsd's TCP port.
const NFSPort = 2049

// Conn is one TCP connection as the server saw it: Local is the server's
// end (the VIP and the service's port), Remote the client's.
type Conn struct {
	Local, Remote netip.AddrPort
}

func (c Conn) String() string { return c.Local.String() + "<-" + c.Remote.String() }

// Valid reports whether c can be tickled: both ends are addresses of one
// family (IPv4-mapped IPv6 addresses count as IPv4), neither is
// unspecified, multicast or broadcast, and neither port is 0.
func (c Conn) Valid() bool {
	l, r := c.Local.Addr().Unmap(), c.Remote.Addr().Unmap()
	if !l.IsValid() || !r.IsValid() || l.Is4() != r.Is4() {
		return false
	}
	for _, a := range []netip.Addr{l, r} {
		if a.IsUnspecified() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return false
		}
	}
	return c.Local.Port() != 0 && c.Remote.Port() != 0
}

// unmap returns c with IPv4-mapped IPv6 addresses as IPv4 ones (an IPv6
// socket that accepted an IPv4 client lists it so in /proc/net/tcp6).
func (c Conn) unmap() Conn {
	return Conn{
		Local:  netip.AddrPortFrom(c.Local.Addr().Unmap(), c.Local.Port()),
		Remote: netip.AddrPortFrom(c.Remote.Addr().Unmap(), c.Remote.Port()),
	}
}
