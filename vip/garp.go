package vip

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Announcement packets for a VIP, built without the link-layer header (the
// packet socket adds it).

const (
	arpOpRequest = 1
	arpOpReply   = 2
	arpLen       = 28 // Ethernet/IPv4 ARP (RFC 826)

	icmp6NeighborAdvert = 136
	naLen               = 24 + 8 // NA with a target link-layer address option
	naFlagOverride      = 0x20   // R=0x80, S=0x40, O=0x20
	ndOptTargetLLAddr   = 2
	ipv6HeaderLen       = 40
	protoICMPv6         = 58
)

var (
	ethBroadcast  = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	ip6AllNodes   = netip.MustParseAddr("ff02::1")
	ethAllNodesV6 = net.HardwareAddr{0x33, 0x33, 0x00, 0x00, 0x00, 0x01} // RFC 2464 mapping of ff02::1
)

// arpAnnouncement is an Ethernet/IPv4 ARP packet announcing that ip is at
// mac: sender and target protocol address are both ip (RFC 5227 "ARP
// Announcement"). A request has a zero target hardware address; a reply
// repeats mac there (Linux treats a reply as gratuitous only then). Some
// hosts update their caches only from one of the two, so both are sent.
func arpAnnouncement(op uint16, mac net.HardwareAddr, ip netip.Addr) []byte {
	b := make([]byte, arpLen)
	binary.BigEndian.PutUint16(b[0:2], 1)      // hardware type: Ethernet
	binary.BigEndian.PutUint16(b[2:4], 0x0800) // protocol type: IPv4
	b[4], b[5] = 6, 4                          // hardware, protocol address lengths
	binary.BigEndian.PutUint16(b[6:8], op)
	copy(b[8:14], mac)
	a := ip.As4()
	copy(b[14:18], a[:])
	if op == arpOpReply {
		copy(b[18:24], mac)
	}
	copy(b[24:28], a[:])
	return b
}

// unsolicitedNA is an IPv6 packet (header included) carrying an unsolicited
// neighbour advertisement (RFC 4861 4.4, 7.2.6): from ip to all nodes
// (ff02::1), hop limit 255, Override set, Solicited clear, target ip and a
// target link-layer address option with mac.
func unsolicitedNA(mac net.HardwareAddr, ip netip.Addr) []byte {
	b := make([]byte, ipv6HeaderLen+naLen)
	b[0] = 6 << 4 // version 6, traffic class 0, flow label 0
	binary.BigEndian.PutUint16(b[4:6], naLen)
	b[6] = protoICMPv6
	b[7] = 255 // hop limit: receivers drop ND packets that crossed a router
	src, dst := ip.As16(), ip6AllNodes.As16()
	copy(b[8:24], src[:])
	copy(b[24:40], dst[:])
	m := b[ipv6HeaderLen:]
	m[0] = icmp6NeighborAdvert
	m[1] = 0 // code
	m[4] = naFlagOverride
	copy(m[8:24], src[:])
	m[24] = ndOptTargetLLAddr
	m[25] = 1 // option length in units of 8 octets
	copy(m[26:32], mac)
	binary.BigEndian.PutUint16(m[2:4], icmp6Checksum(src, dst, m))
	return b
}

// icmp6Checksum is the Internet checksum of msg (its checksum field zero)
// over the IPv6 pseudo-header (RFC 8200 8.1).
func icmp6Checksum(src, dst [16]byte, msg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for len(b) >= 2 {
			sum += uint32(binary.BigEndian.Uint16(b))
			b = b[2:]
		}
		if len(b) == 1 {
			sum += uint32(b[0]) << 8
		}
	}
	add(src[:])
	add(dst[:])
	var tail [8]byte
	binary.BigEndian.PutUint32(tail[0:4], uint32(len(msg)))
	tail[7] = protoICMPv6
	add(tail[:])
	add(msg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
