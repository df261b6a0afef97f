//go:build linux

package svcns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nsmd/nsmd/internal/rtnl"
)

// The links, over rtnetlink straight on golang.org/x/sys/unix. Each call
// opens its own socket, in the namespace of the calling thread.

const (
	nlTimeout          = 5 * time.Second
	macvlanModeBridge  = 4 // MACVLAN_MODE_BRIDGE (linux/if_link.h)
	ifinfomsgFlagsOff  = 8
	ifinfomsgChangeOff = 12
)

// createMacvlan makes a macvlan (mode bridge) named name on the lower
// device parent (an index in the calling thread's namespace), straight
// into the namespace nsfd: one RTM_NEWLINK, so the device never exists
// in the caller's namespace (its name may be the parent's).
func createMacvlan(parent int, name string, nsfd int) error {
	b := make([]byte, unix.SizeofIfInfomsg) // family AF_UNSPEC, no index: the kernel picks
	b = rtnl.AppendAttr(b, unix.IFLA_IFNAME, append([]byte(name), 0))
	b = rtnl.AppendAttr(b, unix.IFLA_LINK, rtnl.U32(uint32(parent)))
	b = rtnl.AppendAttr(b, unix.IFLA_NET_NS_FD, rtnl.U32(uint32(nsfd)))
	data := rtnl.AppendAttr(nil, unix.IFLA_MACVLAN_MODE, rtnl.U32(macvlanModeBridge))
	info := rtnl.AppendAttr(nil, unix.IFLA_INFO_KIND, []byte("macvlan"))
	info = rtnl.AppendAttr(info, unix.IFLA_INFO_DATA|unix.NLA_F_NESTED, data)
	b = rtnl.AppendAttr(b, unix.IFLA_LINKINFO|unix.NLA_F_NESTED, info)
	return exchange(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK, b)
}

// tempLinkName is the name a namespace's macvlan is made under before it
// is renamed inside: "nsmv" and 8 hex digits of the namespace's name.
func tempLinkName(ns string) string {
	return fmt.Sprintf("nsmv%08x", crc32.ChecksumIEEE([]byte(ns)))
}

// renameLink renames link from to to in the calling thread's namespace
// (the link is down: a new macvlan).
func renameLink(from, to string) error {
	ifc, err := net.InterfaceByName(from)
	if err != nil {
		return err
	}
	b := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(b[4:], uint32(ifc.Index))
	b = rtnl.AppendAttr(b, unix.IFLA_IFNAME, append([]byte(to), 0))
	return exchange(unix.RTM_NEWLINK, unix.NLM_F_ACK, b)
}

// deleteLink deletes the link name in the calling thread's namespace;
// gone already is fine.
func deleteLink(name string) error {
	b := make([]byte, unix.SizeofIfInfomsg)
	b = rtnl.AppendAttr(b, unix.IFLA_IFNAME, append([]byte(name), 0))
	err := exchange(unix.RTM_DELLINK, unix.NLM_F_ACK, b)
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	return err
}

// setUp sets the link name up in the calling thread's namespace.
func setUp(name string) error {
	b := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(b[ifinfomsgFlagsOff:], unix.IFF_UP)
	binary.NativeEndian.PutUint32(b[ifinfomsgChangeOff:], unix.IFF_UP)
	b = rtnl.AppendAttr(b, unix.IFLA_IFNAME, append([]byte(name), 0))
	return exchange(unix.RTM_NEWLINK, unix.NLM_F_ACK, b)
}

// exchange sends one request on a new NETLINK_ROUTE socket and waits for
// its ack.
func exchange(typ, flags uint16, body []byte) error {
	fd, err := rtnl.Open(nlTimeout)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return rtnl.Exchange(fd, nlTimeout, rtnl.Request{Type: typ, Flags: flags, Seq: 1, Body: body}, nil)
}
