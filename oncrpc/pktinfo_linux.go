//go:build linux

package oncrpc

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// pktinfo sends and receives the destination address of UDP datagrams
// (IP_PKTINFO, RFC 3542 IPV6_PKTINFO) on one socket.
type pktinfo struct{ v6 bool }

// enablePktinfo asks the kernel to report each datagram's destination
// address. On an AF_INET6 socket, IPv4 datagrams (to a dual-stack socket)
// are reported as IPv4-mapped IPV6_PKTINFO.
func enablePktinfo(uc *net.UDPConn) (*pktinfo, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("pktinfo: %w", err)
	}
	var pi pktinfo
	var serr error
	err = rc.Control(func(fd uintptr) {
		var domain int
		domain, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_DOMAIN)
		if serr != nil {
			return
		}
		if domain == syscall.AF_INET6 {
			pi.v6 = true
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_RECVPKTINFO, 1)
			return
		}
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_PKTINFO, 1)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return nil, fmt.Errorf("pktinfo: %w", err)
	}
	return &pi, nil
}

// parsePktinfo returns the destination address and interface index found in
// the control messages of one datagram.
func parsePktinfo(oob []byte) (netip.Addr, int) {
	hdr := syscall.CmsgLen(0)
	for len(oob) >= hdr {
		l, level, typ := getCmsgHdr(oob)
		if l < hdr || l > len(oob) {
			break
		}
		data := oob[hdr:l]
		switch {
		case level == syscall.IPPROTO_IP && typ == syscall.IP_PKTINFO && len(data) >= syscall.SizeofInet4Pktinfo:
			// struct in_pktinfo { int ipi_ifindex; in_addr ipi_spec_dst; in_addr ipi_addr; }
			ifx := int(int32(binary.NativeEndian.Uint32(data[0:4])))
			return netip.AddrFrom4([4]byte(data[8:12])), ifx
		case level == syscall.IPPROTO_IPV6 && typ == syscall.IPV6_PKTINFO && len(data) >= syscall.SizeofInet6Pktinfo:
			// struct in6_pktinfo { in6_addr ipi6_addr; unsigned ipi6_ifindex; }
			ifx := int(binary.NativeEndian.Uint32(data[16:20]))
			return netip.AddrFrom16([16]byte(data[0:16])), ifx
		}
		next := syscall.CmsgSpace(l - hdr)
		if next > len(oob) {
			break
		}
		oob = oob[next:]
	}
	return netip.Addr{}, 0
}

// marshal appends to b a control message that makes a reply leave from
// dst; it returns nil when dst cannot be a source address.
func (p *pktinfo) marshal(b []byte, dst netip.Addr, ifindex int) []byte {
	if !dst.IsValid() || dst.IsMulticast() || dst.IsUnspecified() {
		return nil
	}
	hdr := syscall.CmsgLen(0)
	if !p.v6 {
		a := dst.Unmap()
		if !a.Is4() {
			return nil
		}
		n := syscall.CmsgSpace(syscall.SizeofInet4Pktinfo)
		b = append(b[:0], make([]byte, n)...)
		putCmsgHdr(b, syscall.IPPROTO_IP, syscall.IP_PKTINFO, syscall.SizeofInet4Pktinfo)
		// ipi_ifindex 0 and ipi_spec_dst = dst: the routing table picks the
		// interface, the source address is dst.
		a4 := a.As4()
		copy(b[hdr+4:hdr+8], a4[:])
		return b
	}
	n := syscall.CmsgSpace(syscall.SizeofInet6Pktinfo)
	b = append(b[:0], make([]byte, n)...)
	putCmsgHdr(b, syscall.IPPROTO_IPV6, syscall.IPV6_PKTINFO, syscall.SizeofInet6Pktinfo)
	a16 := dst.As16() // IPv4 becomes IPv4-mapped, which Linux accepts for IPv4 replies
	copy(b[hdr:hdr+16], a16[:])
	if dst.Is6() && !dst.Is4In6() && (dst.IsLinkLocalUnicast()) {
		binary.NativeEndian.PutUint32(b[hdr+16:hdr+20], uint32(ifindex))
	}
	return b
}

// The cmsghdr is written and read field by field (cmsg_len is a size_t, then
// two ints) so that no buffer needs any particular alignment.

func getCmsgHdr(b []byte) (l int, level, typ int32) {
	off := syscall.SizeofCmsghdr - 8
	if off == 8 {
		l = int(binary.NativeEndian.Uint64(b[0:8]))
	} else {
		l = int(binary.NativeEndian.Uint32(b[0:4]))
	}
	return l, int32(binary.NativeEndian.Uint32(b[off:])), int32(binary.NativeEndian.Uint32(b[off+4:]))
}

func putCmsgHdr(b []byte, level, typ, datalen int) {
	l := syscall.CmsgLen(datalen)
	off := syscall.SizeofCmsghdr - 8
	if off == 8 {
		binary.NativeEndian.PutUint64(b[0:8], uint64(l))
	} else {
		binary.NativeEndian.PutUint32(b[0:4], uint32(l))
	}
	binary.NativeEndian.PutUint32(b[off:], uint32(int32(level)))
	binary.NativeEndian.PutUint32(b[off+4:], uint32(int32(typ)))
}
