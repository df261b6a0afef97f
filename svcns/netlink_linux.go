//go:build linux

package svcns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The links, over rtnetlink straight on golang.org/x/sys/unix. Each call
// opens its own socket, in the namespace of the calling thread.

const (
	nlTimeout          = 5 * time.Second
	macvlanModeBridge  = 4 // MACVLAN_MODE_BRIDGE (linux/if_link.h)
	nlaFNested         = 0x8000
	nlmFAckTLVs        = 0x200 // NLM_F_ACK_TLVS
	nlmFCapped         = 0x100 // NLM_F_CAPPED
	nlmsgerrAttrMsg    = 1     // NLMSGERR_ATTR_MSG
	ifinfomsgFlagsOff  = 8
	ifinfomsgChangeOff = 12
)

// createMacvlan makes a macvlan (mode bridge) named name on the lower
// device parent (an index in the calling thread's namespace), straight
// into the namespace nsfd: one RTM_NEWLINK, so the device never exists
// in the caller's namespace (its name may be the parent's).
func createMacvlan(parent int, name string, nsfd int) error {
	b := make([]byte, unix.SizeofIfInfomsg) // family AF_UNSPEC, no index: the kernel picks
	b = appendAttr(b, unix.IFLA_IFNAME, append([]byte(name), 0))
	b = appendAttr(b, unix.IFLA_LINK, u32(uint32(parent)))
	b = appendAttr(b, unix.IFLA_NET_NS_FD, u32(uint32(nsfd)))
	data := appendAttr(nil, unix.IFLA_MACVLAN_MODE, u32(macvlanModeBridge))
	info := appendAttr(nil, unix.IFLA_INFO_KIND, []byte("macvlan"))
	info = appendAttr(info, unix.IFLA_INFO_DATA|nlaFNested, data)
	b = appendAttr(b, unix.IFLA_LINKINFO|nlaFNested, info)
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
	b = appendAttr(b, unix.IFLA_IFNAME, append([]byte(to), 0))
	return exchange(unix.RTM_NEWLINK, unix.NLM_F_ACK, b)
}

// deleteLink deletes the link name in the calling thread's namespace;
// gone already is fine.
func deleteLink(name string) error {
	b := make([]byte, unix.SizeofIfInfomsg)
	b = appendAttr(b, unix.IFLA_IFNAME, append([]byte(name), 0))
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
	b = appendAttr(b, unix.IFLA_IFNAME, append([]byte(name), 0))
	return exchange(unix.RTM_NEWLINK, unix.NLM_F_ACK, b)
}

func u32(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}

func appendAttr(b []byte, typ uint16, data []byte) []byte {
	var h [4]byte
	binary.NativeEndian.PutUint16(h[0:2], uint16(4+len(data)))
	binary.NativeEndian.PutUint16(h[2:4], typ)
	b = append(b, h[:]...)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// exchange sends one request on a new NETLINK_ROUTE socket and waits for
// its ack.
func exchange(typ, flags uint16, body []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("open netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("bind netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(nlTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("netlink receive timeout: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1) // older kernels lack it
	const seq = 1
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:6], typ)
	binary.NativeEndian.PutUint16(msg[6:8], flags|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:12], seq)
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EAGAIN) {
				return fmt.Errorf("netlink: no answer within %v", nlTimeout)
			}
			return fmt.Errorf("netlink receive: %w", err)
		}
		b := buf[:n]
		for len(b) >= unix.SizeofNlMsghdr {
			mlen := int(binary.NativeEndian.Uint32(b[0:4]))
			if mlen < unix.SizeofNlMsghdr || mlen > len(b) {
				return errors.New("netlink: malformed message")
			}
			mtyp := binary.NativeEndian.Uint16(b[4:6])
			mflags := binary.NativeEndian.Uint16(b[6:8])
			mseq := binary.NativeEndian.Uint32(b[8:12])
			data := b[unix.SizeofNlMsghdr:mlen]
			if next := (mlen + 3) &^ 3; next < len(b) {
				b = b[next:]
			} else {
				b = nil
			}
			if mseq != seq {
				continue
			}
			switch mtyp {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				return nlError(data, mflags)
			}
		}
	}
}

// nlError decodes struct nlmsgerr (0: an ack), with the kernel's message
// when it sent one.
func nlError(data []byte, flags uint16) error {
	if len(data) < 4 {
		return errors.New("netlink: short error message")
	}
	code := int32(binary.NativeEndian.Uint32(data[0:4]))
	if code == 0 {
		return nil
	}
	errno := syscall.Errno(-code)
	if flags&nlmFAckTLVs == 0 || len(data) < 4+unix.SizeofNlMsghdr {
		return errno
	}
	off := 4 + unix.SizeofNlMsghdr
	if flags&nlmFCapped == 0 {
		off = 4 + int(binary.NativeEndian.Uint32(data[4:8]))
	}
	off = (off + 3) &^ 3
	if off > len(data) {
		return errno
	}
	var text string
	for b := data[off:]; len(b) >= 4; {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			break
		}
		if binary.NativeEndian.Uint16(b[2:4])&^nlaFNested == nlmsgerrAttrMsg {
			d := b[4:l]
			for len(d) > 0 && d[len(d)-1] == 0 {
				d = d[:len(d)-1]
			}
			text = string(d)
		}
		l = (l + 3) &^ 3
		if l >= len(b) {
			break
		}
		b = b[l:]
	}
	if text == "" {
		return errno
	}
	return fmt.Errorf("%w (%s)", errno, text)
}
