package tickle

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/nsmd/nsmd/internal/ctxtime"
)

// SendConfig says how tickles are sent.
type SendConfig struct {
	// Rounds is how many tickle ACKs each connection gets (default 3): a
	// lost one, or one whose answer the client's TCP rate-limits, is
	// covered by the next round.
	Rounds int
	// Gap is the pause between rounds (default 1 s). Linux answers at
	// most one out-of-window segment per connection every 500 ms
	// (tcp_invalid_ratelimit): rounds closer than that go unanswered.
	Gap time.Duration
	// Rate bounds the packets sent per second (default 20,000).
	Rate int
	// Skip are connections not to tickle: those the sender's host has
	// itself (a client that already reconnected with the same port).
	Skip []Conn
}

func (c SendConfig) withDefaults() SendConfig {
	if c.Rounds <= 0 {
		c.Rounds = 3
	}
	if c.Gap <= 0 {
		c.Gap = time.Second
	}
	if c.Rate <= 0 {
		c.Rate = 20_000
	}
	return c
}

// Send sends tickle ACKs to every valid connection of conns from its local
// address (which must be an address of this host: the VIP, held), over raw
// IP sockets (CAP_NET_RAW), cfg.Rounds rounds cfg.Gap apart, at most
// cfg.Rate packets a second. It returns how many were sent and stops when
// ctx ends. A send that fails (a route gone, a full queue) is counted in
// the error and the others go on; opening a socket that fails (no
// CAP_NET_RAW, the address no longer local) fails the connections of that
// address.
func Send(ctx context.Context, conns []Conn, cfg SendConfig) (sent int, err error) {
	cfg = cfg.withDefaults()
	skip := make(map[Conn]bool, len(cfg.Skip))
	for _, c := range cfg.Skip {
		skip[c.unmap()] = true
	}
	byLocal := map[netip.Addr][]Conn{}
	var order []netip.Addr
	for _, c := range conns {
		c = c.unmap()
		if !c.Valid() || skip[c] {
			continue
		}
		l := c.Local.Addr()
		if _, ok := byLocal[l]; !ok {
			order = append(order, l)
		}
		byLocal[l] = append(byLocal[l], c)
	}
	if len(order) == 0 {
		return 0, nil
	}
	socks := map[netip.Addr]*net.IPConn{}
	var errs []error
	for _, l := range order {
		network := "ip4:tcp"
		if l.Is6() {
			network = "ip6:tcp"
		}
		s, err := net.ListenIP(network, &net.IPAddr{IP: l.AsSlice()})
		if err != nil {
			errs = append(errs, fmt.Errorf("tickle: raw socket on %s (CAP_NET_RAW?): %w", l, err))
			continue
		}
		s.SetReadBuffer(1) // it reads nothing; keep the copies of inbound TCP small
		defer s.Close()
		socks[l] = s
	}
	p := pacer{rate: cfg.Rate, start: time.Now()}
	failed := 0
	var lastErr error
	for round := range cfg.Rounds {
		if round > 0 {
			if !ctxtime.Sleep(ctx, cfg.Gap) {
				break
			}
			p = pacer{rate: cfg.Rate, start: time.Now()}
		}
		for _, l := range order {
			s := socks[l]
			if s == nil {
				continue
			}
			for _, c := range byLocal[l] {
				if !p.wait(ctx) {
					return sent, errors.Join(append(errs, ctx.Err())...)
				}
				seg := Segment(c)
				if _, err := s.WriteToIP(seg, &net.IPAddr{IP: c.Remote.Addr().AsSlice()}); err != nil {
					failed++
					lastErr = err
					continue
				}
				sent++
			}
		}
	}
	if failed > 0 {
		errs = append(errs, fmt.Errorf("tickle: %d sends failed, the last: %w", failed, lastErr))
	}
	return sent, errors.Join(errs...)
}

// Segment is the tickle ACK for c: a 20-byte TCP header from c.Local to
// c.Remote with the ACK flag, sequence and acknowledgment numbers 0 (all
// but certainly outside the connection's window), and its checksum over
// the pseudo-header (RFC 793 §3.1; RFC 8200 §8.1 for IPv6).
func Segment(c Conn) []byte {
	c = c.unmap()
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], c.Local.Port())
	binary.BigEndian.PutUint16(seg[2:], c.Remote.Port())
	// seq [4:8] and ack [8:12] stay 0
	seg[12] = 5 << 4 // data offset: 5 words, no options
	seg[13] = 0x10   // ACK
	binary.BigEndian.PutUint16(seg[14:], 1024)
	binary.BigEndian.PutUint16(seg[16:], Checksum(c.Local.Addr(), c.Remote.Addr(), seg))
	return seg
}

// Checksum is the TCP checksum of seg (its checksum field zero) sent from
// src to dst: the ones' complement of the ones' complement sum of the
// pseudo-header (addresses, protocol 6, length) and seg.
func Checksum(src, dst netip.Addr, seg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(src.Unmap().AsSlice())
	add(dst.Unmap().AsSlice())
	sum += 6 // protocol (IPv4: zero byte + 6; IPv6: next header 6)
	sum += uint32(len(seg))
	add(seg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// pacer spaces sends to at most rate a second.
type pacer struct {
	rate  int
	start time.Time
	n     int
}

// wait returns once one more packet may go (false when ctx ended).
func (p *pacer) wait(ctx context.Context) bool {
	if ctx.Err() != nil {
		return false
	}
	due := p.start.Add(time.Duration(p.n) * time.Second / time.Duration(p.rate))
	p.n++
	if d := time.Until(due); d > time.Millisecond {
		return ctxtime.Sleep(ctx, d)
	}
	return true
}
