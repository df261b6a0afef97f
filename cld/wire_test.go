package cld

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// The byte vectors below are laid out as include/uapi/linux/nfsd/cld.h
// lays out the packed structures, in little-endian (the host order of
// amd64 and arm64, where these tests run).
func skipBigEndian(t testing.TB) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("byte vectors are little-endian; the codec uses the host's order")
	}
}

// fld puts bytes at a fixed offset of a vector.
type fld struct {
	off int
	b   []byte
}

func f(off int, b ...byte) fld { return fld{off, b} }

// vector is a size-byte message, zero but for the fields given.
func vector(size int, fields ...fld) []byte {
	v := make([]byte, size)
	for _, x := range fields {
		copy(v[x.off:], x.b)
	}
	return v
}

func repeat(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }

var decodeVectors = []struct {
	name string
	in   []byte
	want Msg
}{
	{"v1 GetVersion, the kernel's first upcall", vector(MsgSizeV1,
		f(0, 1),          // cm_vers 1
		f(1, 5),          // cm_cmd Cld_GetVersion
		f(2, 0, 0),       // cm_status 0
		f(4, 0, 0, 0, 0), // cm_xid 0
		// cm_u.cm_version 0 (the kernel asks)
	), Msg{Version: 1, Cmd: GetVersion}},
	{"v1 GetVersion reply: version 2", vector(MsgSizeV1,
		f(0, 1),          // cm_vers 1
		f(1, 5),          // cm_cmd Cld_GetVersion
		f(2, 0, 0),       // cm_status 0
		f(4, 9, 0, 0, 0), // cm_xid 9
		f(8, 2),          // cm_u.cm_version 2
	), Msg{Version: 1, Cmd: GetVersion, XID: 9, UpcallVersion: 2}},
	{"v2 Create with a principal hash", vector(MsgSizeV2,
		f(0, 2),                // cm_vers 2
		f(1, 0),                // cm_cmd Cld_Create
		f(2, 0, 0),             // cm_status 0
		f(4, 0x07, 0x01, 0, 0), // cm_xid 263
		f(8, 3, 0),             // cc_name.cn_len 3
		f(10, 'a', 'b', 'c'),   // cc_name.cn_id
		f(1034, 2),             // cc_princhash.cp_len 2
		f(1035, 0xde, 0xad),    // cc_princhash.cp_data
	), Msg{Version: 2, Cmd: Create, XID: 263, Name: []byte("abc"), PrincHash: []byte{0xde, 0xad}}},
	{"v2 Create, AUTH_SYS (no principal)", vector(MsgSizeV2,
		f(0, 2),          // cm_vers 2
		f(1, 0),          // cm_cmd Cld_Create
		f(4, 1, 0, 0, 0), // cm_xid 1
		f(8, 1, 0),       // cn_len 1
		f(10, 'x'),       // cn_id
		// cp_len 0
	), Msg{Version: 2, Cmd: Create, XID: 1, Name: []byte("x")}},
	{"v2 Create, longest name and hash", vector(MsgSizeV2,
		f(0, 2),                      // cm_vers 2
		f(1, 0),                      // cm_cmd Cld_Create
		f(4, 0xff, 0xff, 0xff, 0xff), // cm_xid 2^32-1
		f(8, 0x00, 0x04),             // cn_len 1024
		fld{10, repeat('n', 1024)},   // cn_id
		f(1034, 32),                  // cp_len 32
		fld{1035, repeat(0xaa, 32)},  // cp_data
	), Msg{Version: 2, Cmd: Create, XID: 0xffffffff, Name: repeat('n', 1024), PrincHash: repeat(0xaa, 32)}},
	{"v1 Create (no principal in version 1)", vector(MsgSizeV1,
		f(0, 1),          // cm_vers 1
		f(1, 0),          // cm_cmd Cld_Create
		f(4, 2, 0, 0, 0), // cm_xid 2
		f(8, 2, 0),       // cn_len 2
		f(10, 'h', 'i'),  // cn_id
	), Msg{Version: 1, Cmd: Create, XID: 2, Name: []byte("hi")}},
	{"v2 Remove", vector(MsgSizeV2,
		f(0, 2),          // cm_vers 2
		f(1, 1),          // cm_cmd Cld_Remove
		f(4, 3, 0, 0, 0), // cm_xid 3
		f(8, 2, 0),       // cm_name.cn_len 2
		f(10, 'h', 'i'),  // cm_name.cn_id
	), Msg{Version: 2, Cmd: Remove, XID: 3, Name: []byte("hi")}},
	{"v1 Check reply -EACCES", vector(MsgSizeV1,
		f(0, 1),          // cm_vers 1
		f(1, 2),          // cm_cmd Cld_Check
		f(2, 0xf3, 0xff), // cm_status -13
		f(4, 4, 0, 0, 0), // cm_xid 4
		f(8, 1, 0),       // cn_len 1
		f(10, 'c'),       // cn_id
	), Msg{Version: 1, Cmd: Check, Status: StatusAccessDenied, XID: 4, Name: []byte("c")}},
	{"v1 GraceDone with cm_gracetime (oldest ops)", vector(MsgSizeV1,
		f(0, 1),                                  // cm_vers 1
		f(1, 3),                                  // cm_cmd Cld_GraceDone
		f(4, 5, 0, 0, 0),                         // cm_xid 5
		f(8, 0x00, 0xe1, 0xf5, 0x05, 0, 0, 0, 0), // cm_gracetime 100000000
	), Msg{Version: 1, Cmd: GraceDone, XID: 5, GraceTime: 100000000}},
	{"v2 GraceDone", vector(MsgSizeV2,
		f(0, 2),          // cm_vers 2
		f(1, 3),          // cm_cmd Cld_GraceDone
		f(4, 6, 0, 0, 0), // cm_xid 6
	), Msg{Version: 2, Cmd: GraceDone, XID: 6}},
	{"v2 GraceStart", vector(MsgSizeV2,
		f(0, 2),          // cm_vers 2
		f(1, 4),          // cm_cmd Cld_GraceStart
		f(4, 7, 0, 0, 0), // cm_xid 7
	), Msg{Version: 2, Cmd: GraceStart, XID: 7}},
	{"v2 GraceStart record downcall", vector(MsgSizeV2,
		f(0, 2),          // cm_vers 2
		f(1, 4),          // cm_cmd Cld_GraceStart
		f(2, 0x8d, 0xff), // cm_status -115 (-EINPROGRESS)
		f(4, 7, 0, 0, 0), // cm_xid 7
		f(8, 1, 0),       // cc_name.cn_len 1
		f(10, 'r'),       // cc_name.cn_id
		f(1034, 1),       // cc_princhash.cp_len 1
		f(1035, 0x11),    // cc_princhash.cp_data
	), Msg{Version: 2, Cmd: GraceStart, Status: StatusInProgress, XID: 7, Name: []byte("r"), PrincHash: []byte{0x11}}},
	{"v1 GraceStart record downcall", vector(MsgSizeV1,
		f(0, 1),          // cm_vers 1
		f(1, 4),          // cm_cmd Cld_GraceStart
		f(2, 0x8d, 0xff), // cm_status -115
		f(4, 8, 0, 0, 0), // cm_xid 8
		f(8, 1, 0),       // cm_name.cn_len 1
		f(10, 'r'),       // cm_name.cn_id
	), Msg{Version: 1, Cmd: GraceStart, Status: StatusInProgress, XID: 8, Name: []byte("r")}},
}

func TestDecodeVectors(t *testing.T) {
	skipBigEndian(t)
	for _, tc := range decodeVectors {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Decode:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestEncodeVectors: Encode of each decoded vector gives its bytes back
// (the kernel zeroes what a message does not use, and so does Encode).
func TestEncodeVectors(t *testing.T) {
	skipBigEndian(t)
	for _, tc := range decodeVectors {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Encode(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.in) {
				t.Fatalf("Encode differs from the vector at byte %d", firstDiff(got, tc.in))
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestDecodeRefusesAndKeepsTheHeader: every refusal wraps ErrBadUpcall,
// and the header fields read so far come back for the error downcall.
func TestDecodeRefusesAndKeepsTheHeader(t *testing.T) {
	skipBigEndian(t)
	hdr := func(vers, cmd byte) []fld {
		return []fld{
			f(0, vers),          // cm_vers
			f(1, cmd),           // cm_cmd
			f(4, 0x2a, 0, 0, 0), // cm_xid 42
		}
	}
	with := func(size int, vers, cmd byte, more ...fld) []byte {
		return vector(size, append(hdr(vers, cmd), more...)...)
	}
	cases := []struct {
		name    string
		in      []byte
		unknown bool // ErrUnknownCommand
		header  bool // the header was read: XID 42
	}{
		{"empty", nil, false, false},
		{"7 bytes, less than a header", []byte{2, 0, 0, 0, 42, 0, 0}, false, false},
		{"header only", with(HeaderSize, 2, 0), false, true},
		{"v2 header, 100 bytes", with(100, 2, 0), false, true},
		{"v2 header, a v1 length", with(MsgSizeV1, 2, 0, f(8, 1, 0), f(10, 'a')), false, true},
		{"v1 header, a v2 length", with(MsgSizeV2, 1, 0, f(8, 1, 0), f(10, 'a')), false, true},
		{"v2, one byte too many", with(MsgSizeV2+1, 2, 3), false, true},
		{"version 0", with(MsgSizeV1, 0, 5), false, true},
		{"version 3", with(MsgSizeV2, 3, 5), false, true},
		{"command 6", with(MsgSizeV2, 2, 6), true, true},
		{"command 255", with(MsgSizeV1, 1, 255), true, true},
		{"Create, cn_len 0", with(MsgSizeV2, 2, 0), false, true},
		{"Remove, cn_len 1025", with(MsgSizeV2, 2, 1, f(8, 0x01, 0x04)), false, true},
		{"Check, cn_len 65535", with(MsgSizeV1, 1, 2, f(8, 0xff, 0xff)), false, true},
		{"Create, cp_len 33", with(MsgSizeV2, 2, 0, f(8, 1, 0), f(10, 'a'), f(1034, 33)), false, true},
		{"Create, cp_len 255", with(MsgSizeV2, 2, 0, f(8, 1, 0), f(10, 'a'), f(1034, 255)), false, true},
		{"GraceStart record, cn_len 0", with(MsgSizeV2, 2, 4, f(2, 0x8d, 0xff)), false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(tc.in)
			if !errors.Is(err, ErrBadUpcall) {
				t.Fatalf("err %v, want ErrBadUpcall", err)
			}
			if got := errors.Is(err, ErrUnknownCommand); got != tc.unknown {
				t.Fatalf("ErrUnknownCommand %v, want %v (%v)", got, tc.unknown, err)
			}
			if tc.header && (m.XID != 42 || m.Version != tc.in[0] || m.Cmd != Command(tc.in[1])) {
				t.Fatalf("header not kept: %+v", m)
			}
			if !tc.header && m.XID != 0 {
				t.Fatalf("fields from a message shorter than a header: %+v", m)
			}
			if m.Name != nil || m.PrincHash != nil {
				t.Fatalf("payload from a refused message: %+v", m)
			}
		})
	}
}

func TestEncodeRefusesWhatCannotBeSent(t *testing.T) {
	cases := []struct {
		name string
		m    Msg
	}{
		{"version 0", Msg{Version: 0, Cmd: GraceDone}},
		{"version 3", Msg{Version: 3, Cmd: GraceDone}},
		{"command 6", Msg{Version: 2, Cmd: 6}},
		{"Create without a name", Msg{Version: 2, Cmd: Create}},
		{"Remove, name of 1025 bytes", Msg{Version: 2, Cmd: Remove, Name: repeat('a', 1025)}},
		{"v1 Create with a principal hash", Msg{Version: 1, Cmd: Create, Name: []byte("a"), PrincHash: []byte{1}}},
		{"Remove with a principal hash", Msg{Version: 2, Cmd: Remove, Name: []byte("a"), PrincHash: []byte{1}}},
		{"principal hash of 33 bytes", Msg{Version: 2, Cmd: Create, Name: []byte("a"), PrincHash: repeat(1, 33)}},
		{"v2 GraceDone with a grace time", Msg{Version: 2, Cmd: GraceDone, GraceTime: 1}},
		{"Create with a grace time", Msg{Version: 1, Cmd: Create, Name: []byte("a"), GraceTime: 1}},
		{"Create with a version", Msg{Version: 2, Cmd: Create, Name: []byte("a"), UpcallVersion: 2}},
		{"GraceDone with a name", Msg{Version: 2, Cmd: GraceDone, Name: []byte("a")}},
		{"GraceStart final with a name", Msg{Version: 2, Cmd: GraceStart, Name: []byte("a")}},
		{"GraceStart record without a name", Msg{Version: 2, Cmd: GraceStart, Status: StatusInProgress}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if b, err := Encode(tc.m); !errors.Is(err, ErrBadMsg) {
				t.Fatalf("Encode = %d bytes, %v; want ErrBadMsg", len(b), err)
			}
		})
	}
}

func TestSizesMatchTheKernelStructs(t *testing.T) {
	// sizeof(struct cld_msg) and sizeof(struct cld_msg_v2), packed.
	if MsgSizeV1 != 1034 || MsgSizeV2 != 1067 {
		t.Fatalf("sizes %d, %d; want 1034, 1067", MsgSizeV1, MsgSizeV2)
	}
}

func TestCommandStrings(t *testing.T) {
	for c, want := range map[Command]string{Create: "Create", GetVersion: "GetVersion", 6: "Command(6)"} {
		if got := c.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", uint8(c), got, want)
		}
	}
	if Command(6).label() != "unknown" || GraceDone.label() != "grace_done" {
		t.Error("labels")
	}
}

// FuzzDecode: Decode never panics; a message it refuses that is at least
// a header keeps its header; a message it accepts encodes back to a
// message of the same size that decodes to the same Msg.
func FuzzDecode(f *testing.F) {
	for _, tc := range decodeVectors {
		f.Add(tc.in)
	}
	f.Add([]byte{})
	f.Add([]byte{2, 0, 0, 0, 1, 0, 0, 0})
	f.Add(vector(MsgSizeV2, f2(0, 2), f2(1, 0), f2(8, 0xff, 0xff)))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrBadUpcall) {
				t.Fatalf("error %v does not wrap ErrBadUpcall", err)
			}
			if len(b) >= HeaderSize && (m.Version != b[0] || m.Cmd != Command(b[1]) || m.XID != byteOrder.Uint32(b[4:8])) {
				t.Fatalf("header lost: %+v", m)
			}
			return
		}
		enc, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode(Decode(b)) = %v for %+v", err, m)
		}
		if len(enc) != len(b) {
			t.Fatalf("re-encoded %d bytes, read %d", len(enc), len(b))
		}
		m2, err := Decode(enc)
		if err != nil {
			t.Fatalf("Decode(Encode(m)) = %v", err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip:\n%+v\n%+v", m, m2)
		}
	})
}

func f2(off int, b ...byte) fld { return fld{off, b} } // f is taken by the fuzz target's parameter
