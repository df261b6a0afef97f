//go:build linux

package rtnl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// msg is one message as the kernel sends it: struct nlmsghdr (length,
// type, flags, seq, pid 0), the body, padding to 4 bytes.
func msg(typ, flags uint16, seq uint32, body []byte) []byte {
	b := Request{Type: typ, Flags: flags, Seq: seq, Body: body}.Bytes()
	binary.NativeEndian.PutUint16(b[6:8], flags) // as sent: no NLM_F_REQUEST
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// nlmsgerr is struct nlmsgerr: the error (a negative errno, 0 an ack),
// then the request's header (and, not capped, its body), then the
// extended-ack attributes.
func nlmsgerr(code int32, req []byte, tlvs []byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(code))
	b = append(b, req...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return append(b, tlvs...)
}

func TestRequestBytes(t *testing.T) {
	got := Request{Type: unix.RTM_GETADDR, Flags: unix.NLM_F_DUMP, Seq: 7, Body: []byte{2, 0, 0, 0}}.Bytes()
	want := binary.NativeEndian.AppendUint32(nil, 20)                                 // nlmsg_len
	want = binary.NativeEndian.AppendUint16(want, unix.RTM_GETADDR)                   // nlmsg_type
	want = binary.NativeEndian.AppendUint16(want, unix.NLM_F_DUMP|unix.NLM_F_REQUEST) // nlmsg_flags
	want = binary.NativeEndian.AppendUint32(want, 7)                                  // nlmsg_seq
	want = binary.NativeEndian.AppendUint32(want, 0)                                  // nlmsg_pid
	want = append(want, 2, 0, 0, 0)                                                   // body
	if !bytes.Equal(got, want) {
		t.Fatalf("Bytes() = % x, want % x", got, want)
	}
}

func TestAttributesArePaddedAndWalked(t *testing.T) {
	b := AppendAttr(nil, 3, []byte("eth0\x00")) // 4+5 bytes, 3 of padding
	if len(b) != 12 || !bytes.Equal(b[9:], []byte{0, 0, 0}) {
		t.Fatalf("one attribute of 5 bytes: % x, want 12 bytes ending in 3 of padding", b)
	}
	if l := binary.NativeEndian.Uint16(b[0:2]); l != 9 {
		t.Fatalf("nla_len %d, want 9 (the padding does not count)", l)
	}
	b = AppendAttr(b, 18|unix.NLA_F_NESTED, AppendAttr(nil, 1, []byte("macvlan")))
	b = AppendAttr(b, 4, U32(1500))
	type attr struct {
		typ  uint16
		data string
	}
	var got []attr
	EachAttr(b, func(typ uint16, data []byte) { got = append(got, attr{typ, string(data)}) })
	nested := string(AppendAttr(nil, 1, []byte("macvlan")))
	want := []attr{{3, "eth0\x00"}, {18, nested}, {4, string(U32(1500))}}
	if !slices.Equal(got, want) {
		t.Fatalf("EachAttr: %+v, want %+v", got, want)
	}
	// A last attribute whose length runs past the end is not handed out.
	got = nil
	EachAttr(b[:len(b)-2], func(typ uint16, data []byte) { got = append(got, attr{typ, string(data)}) })
	if !slices.Equal(got, want[:2]) {
		t.Fatalf("EachAttr on a truncated buffer: %+v, want %+v", got, want[:2])
	}
}

func TestRepliesOfAnotherRequestAreSkipped(t *testing.T) {
	addr := AppendAttr(make([]byte, unix.SizeofIfAddrmsg), unix.IFA_LOCAL, []byte{10, 0, 0, 1})
	var b []byte
	b = append(b, msg(unix.RTM_NEWADDR, unix.NLM_F_MULTI, 4, addr)...)                    // a late answer to request 4
	b = append(b, msg(unix.NLMSG_ERROR, 0, 4, nlmsgerr(-int32(unix.EPERM), nil, nil))...) // and its error
	b = append(b, msg(unix.RTM_NEWADDR, unix.NLM_F_MULTI, 5, addr)...)
	var seen int
	done, err := Replies(b, 5, func(typ uint16, data []byte) {
		if typ != unix.RTM_NEWADDR || !bytes.Equal(data, addr) {
			t.Errorf("each(%d, % x), want RTM_NEWADDR with % x", typ, data, addr)
		}
		seen++
	})
	if done || err != nil || seen != 1 {
		t.Fatalf("Replies = %v, %v after %d messages, want not done, nil, after 1 (request 4's error skipped)", done, err, seen)
	}
	done, err = Replies(msg(unix.NLMSG_DONE, unix.NLM_F_MULTI, 5, make([]byte, 4)), 5, nil)
	if !done || err != nil {
		t.Fatalf("NLMSG_DONE: %v, %v, want done, nil", done, err)
	}
	done, err = Replies(msg(unix.NLMSG_ERROR, 0, 5, nlmsgerr(0, make([]byte, unix.SizeofNlMsghdr), nil)), 5, nil)
	if !done || err != nil {
		t.Fatalf("an ack: %v, %v, want done, nil", done, err)
	}
}

func TestMalformedRepliesEndTheRequest(t *testing.T) {
	good := msg(unix.RTM_NEWLINK, 0, 1, make([]byte, unix.SizeofIfInfomsg))
	long := slices.Clone(good)
	binary.NativeEndian.PutUint32(long[0:4], uint32(len(good)+4)) // longer than the datagram
	short := slices.Clone(good)
	binary.NativeEndian.PutUint32(short[0:4], 8) // shorter than a header
	for name, b := range map[string][]byte{"length past the end": long, "length under a header": short} {
		done, err := Replies(b, 1, func(uint16, []byte) { t.Errorf("%s: a message was handed out", name) })
		if !done || err == nil || !strings.Contains(err.Error(), "malformed") {
			t.Errorf("%s: %v, %v, want done and a malformed-message error", name, done, err)
		}
	}
	if err := DecodeError([]byte{1, 2}, 0); err == nil || !strings.Contains(err.Error(), "short error") {
		t.Errorf("a 2-byte nlmsgerr: %v, want a short-error error", err)
	}
}

func TestDecodeErrorWithAndWithoutTheKernelsMessage(t *testing.T) {
	req := Request{Type: unix.RTM_NEWLINK, Flags: unix.NLM_F_ACK, Seq: 1, Body: make([]byte, unix.SizeofIfInfomsg)}.Bytes()
	text := AppendAttr(nil, unix.NLMSGERR_ATTR_MSG, []byte("Unknown device type\x00"))
	offs := AppendAttr(nil, 2, U32(16)) // NLMSGERR_ATTR_OFFS: not a message
	for _, c := range []struct {
		name  string
		flags uint16
		body  []byte
		want  string
	}{
		{"no extended ack", 0, nlmsgerr(-int32(unix.EOPNOTSUPP), req[:unix.SizeofNlMsghdr], nil), ""},
		{"capped, with a message", unix.NLM_F_ACK_TLVS | unix.NLM_F_CAPPED,
			nlmsgerr(-int32(unix.EOPNOTSUPP), req[:unix.SizeofNlMsghdr], slices.Concat(offs, text)), "Unknown device type"},
		{"the whole request, with a message", unix.NLM_F_ACK_TLVS,
			nlmsgerr(-int32(unix.EOPNOTSUPP), req, text), "Unknown device type"},
		{"extended ack without a message", unix.NLM_F_ACK_TLVS | unix.NLM_F_CAPPED,
			nlmsgerr(-int32(unix.EOPNOTSUPP), req[:unix.SizeofNlMsghdr], offs), ""},
		{"the request's length past the end", unix.NLM_F_ACK_TLVS,
			nlmsgerr(-int32(unix.EOPNOTSUPP), slices.Concat(binary.NativeEndian.AppendUint32(nil, 4096), req[4:]), nil), ""},
	} {
		err := DecodeError(c.body, c.flags)
		if !errors.Is(err, unix.EOPNOTSUPP) {
			t.Errorf("%s: %v, want EOPNOTSUPP", c.name, err)
			continue
		}
		if c.want == "" {
			if _, bare := err.(syscall.Errno); !bare {
				t.Errorf("%s: %q, want the bare errno", c.name, err)
			}
			continue
		}
		if want := unix.EOPNOTSUPP.Error() + " (" + c.want + ")"; err.Error() != want {
			t.Errorf("%s: %q, want %q", c.name, err, want)
		}
	}
}

// TestExchangeWithTheKernel asks this namespace's kernel (read only: no
// privilege, nothing changed): a dump of the links has lo; a get of a
// name no link has is ENODEV.
func TestExchangeWithTheKernel(t *testing.T) {
	fd, err := Open(time.Second)
	if err != nil {
		t.Skipf("no netlink here: %v", err)
	}
	defer unix.Close(fd)
	var names []string
	err = Exchange(fd, time.Second, Request{Type: unix.RTM_GETLINK, Flags: unix.NLM_F_DUMP, Seq: 1, Body: make([]byte, unix.SizeofIfInfomsg)},
		func(typ uint16, m []byte) {
			if typ == unix.RTM_NEWLINK && len(m) >= unix.SizeofIfInfomsg {
				EachAttr(m[unix.SizeofIfInfomsg:], func(at uint16, d []byte) {
					if at == unix.IFLA_IFNAME {
						names = append(names, strings.TrimRight(string(d), "\x00"))
					}
				})
			}
		})
	if err != nil || !slices.Contains(names, "lo") {
		t.Fatalf("link dump: %v, names %q, want lo among them", err, names)
	}
	body := AppendAttr(make([]byte, unix.SizeofIfInfomsg), unix.IFLA_IFNAME, []byte("nsmd-none\x00"))
	err = Exchange(fd, time.Second, Request{Type: unix.RTM_GETLINK, Flags: unix.NLM_F_ACK, Seq: 2, Body: body}, nil)
	if !errors.Is(err, unix.ENODEV) {
		t.Fatalf("get of a missing link: %v, want ENODEV", err)
	}
}
