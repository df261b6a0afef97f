//go:build !linux

package oncrpc

import (
	"errors"
	"net"
	"net/netip"
)

type pktinfo struct{}

func enablePktinfo(*net.UDPConn) (*pktinfo, error) {
	return nil, errors.New("pktinfo: not supported on this platform")
}

func parsePktinfo([]byte) (netip.Addr, int) { return netip.Addr{}, 0 }

func (*pktinfo) marshal(b []byte, dst netip.Addr, ifindex int) []byte { return nil }
