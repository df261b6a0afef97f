//go:build linux

package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Open opens a NETLINK_ROUTE socket in the calling thread's network
// namespace, bound, with a receive timeout and extended acks (where the
// kernel has them). On error it returns -1 and leaves nothing open.
func Open(timeout time.Duration) (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return -1, fmt.Errorf("open netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("netlink receive timeout: %w", err)
	}
	// Error messages from the kernel ("extended ack"); older kernels lack it.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	return fd, nil
}

// Request is one netlink message: its header's fields and its body.
type Request struct {
	Type  uint16
	Flags uint16 // NLM_F_REQUEST is always added
	Seq   uint32
	Body  []byte
}

// Bytes is the message on the wire: struct nlmsghdr, then the body.
func (r Request) Bytes() []byte {
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(r.Body))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(unix.SizeofNlMsghdr+len(r.Body)))
	binary.NativeEndian.PutUint16(msg[4:6], r.Type)
	binary.NativeEndian.PutUint16(msg[6:8], r.Flags|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:12], r.Seq)
	return append(msg, r.Body...)
}

// Exchange sends req on fd (a socket from Open, whose receive timeout is
// timeout) and reads until its ack, error or dump end, handing every other
// message of the request to each (nil: dropped). Replies with another
// sequence number (late answers to an earlier, timed-out request) are
// skipped. The caller serialises its use of fd.
func Exchange(fd int, timeout time.Duration, req Request, each func(typ uint16, data []byte)) error {
	if err := unix.Sendto(fd, req.Bytes(), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
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
				return fmt.Errorf("netlink: no answer within %v", timeout)
			}
			return fmt.Errorf("netlink receive: %w", err)
		}
		if done, err := Replies(buf[:n], req.Seq, each); done {
			return err
		}
	}
}

// Replies walks the messages of one received datagram b, keeping those
// of sequence number seq: NLMSG_DONE ends the request (done, nil),
// NLMSG_ERROR ends it with DecodeError's answer, any other message goes to
// each (nil: dropped). A malformed datagram ends it with an error.
func Replies(b []byte, seq uint32, each func(typ uint16, data []byte)) (done bool, err error) {
	for len(b) >= unix.SizeofNlMsghdr {
		mlen := int(binary.NativeEndian.Uint32(b[0:4]))
		if mlen < unix.SizeofNlMsghdr || mlen > len(b) {
			return true, errors.New("netlink: malformed message")
		}
		mtyp := binary.NativeEndian.Uint16(b[4:6])
		mflags := binary.NativeEndian.Uint16(b[6:8])
		mseq := binary.NativeEndian.Uint32(b[8:12])
		data := b[unix.SizeofNlMsghdr:mlen]
		if next := align(mlen); next < len(b) {
			b = b[next:]
		} else {
			b = nil
		}
		if mseq != seq {
			continue
		}
		switch mtyp {
		case unix.NLMSG_DONE:
			return true, nil
		case unix.NLMSG_ERROR:
			return true, DecodeError(data, mflags)
		default:
			if each != nil {
				each(mtyp, data)
			}
		}
	}
	return false, nil
}

// DecodeError decodes struct nlmsgerr, the body of an NLMSG_ERROR whose
// header had flags: nil for an ack (error 0), else the errno (a
// syscall.Errno, for errors.Is), with the kernel's message in parentheses
// when it sent one (NLMSGERR_ATTR_MSG).
func DecodeError(data []byte, flags uint16) error {
	if len(data) < 4 {
		return errors.New("netlink: short error message")
	}
	code := int32(binary.NativeEndian.Uint32(data[0:4]))
	if code == 0 {
		return nil
	}
	errno := syscall.Errno(-code)
	if flags&unix.NLM_F_ACK_TLVS == 0 || len(data) < 4+unix.SizeofNlMsghdr {
		return errno
	}
	// The attributes follow the request's header (NLM_F_CAPPED), or the
	// whole request its header's length gives.
	off := 4 + unix.SizeofNlMsghdr
	if flags&unix.NLM_F_CAPPED == 0 {
		off = 4 + int(binary.NativeEndian.Uint32(data[4:8]))
	}
	off = align(off)
	if off > len(data) {
		return errno
	}
	var text string
	EachAttr(data[off:], func(t uint16, d []byte) {
		if t == unix.NLMSGERR_ATTR_MSG {
			for len(d) > 0 && d[len(d)-1] == 0 {
				d = d[:len(d)-1]
			}
			text = string(d)
		}
	})
	if text == "" {
		return errno
	}
	return fmt.Errorf("%w (%s)", errno, text)
}

// AppendAttr appends the attribute (struct nlattr and data, padded to 4
// bytes) to b.
func AppendAttr(b []byte, typ uint16, data []byte) []byte {
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

// EachAttr hands each attribute of b to f: its type without NLA_F_NESTED,
// and its data without padding. It stops at the first malformed one.
func EachAttr(b []byte, f func(typ uint16, data []byte)) {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		if n < 4 || n > len(b) {
			return
		}
		f(binary.NativeEndian.Uint16(b[2:4])&^unix.NLA_F_NESTED, b[4:n])
		n = align(n)
		if n >= len(b) {
			return
		}
		b = b[n:]
	}
}

// U32 is v in host byte order, as rtnetlink's 32-bit attributes are.
func U32(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}

func align(n int) int { return (n + 3) &^ 3 }
