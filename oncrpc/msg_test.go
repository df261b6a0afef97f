package oncrpc

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// An SM_STAT call (NSM 100024 v1 proc 1) with AUTH_SYS, as Linux sends it,
// annotated field by field (RFC 5531 §9, appendix A).
var smStatCall = []byte{
	0x80, 0x00, 0x00, 0x50, // record marker: last fragment, 80 bytes
	0x12, 0x34, 0x56, 0x78, // XID
	0x00, 0x00, 0x00, 0x00, // msg_type CALL
	0x00, 0x00, 0x00, 0x02, // rpcvers 2
	0x00, 0x01, 0x86, 0xb8, // prog 100024
	0x00, 0x00, 0x00, 0x01, // vers 1
	0x00, 0x00, 0x00, 0x01, // proc SM_STAT
	0x00, 0x00, 0x00, 0x01, // cred flavor AUTH_SYS
	0x00, 0x00, 0x00, 0x20, // cred body length 32
	0x00, 0x00, 0x00, 0x2a, //   stamp 42
	0x00, 0x00, 0x00, 0x04, //   machinename length 4
	'n', 'o', 'd', 'e', //       machinename "node"
	0x00, 0x00, 0x00, 0x00, //   uid 0
	0x00, 0x00, 0x00, 0x00, //   gid 0
	0x00, 0x00, 0x00, 0x02, //   gids count 2
	0x00, 0x00, 0x00, 0x01, //   gid 1
	0x00, 0x00, 0x00, 0x02, //   gid 2
	0x00, 0x00, 0x00, 0x00, // verf flavor AUTH_NONE
	0x00, 0x00, 0x00, 0x00, // verf length 0
	0x00, 0x00, 0x00, 0x03, // args: mon_name length 3
	'f', 'o', 'o', 0x00, //    "foo" + 1 pad
}

// The SUCCESS reply to it with sm_stat_res{stat_succ, state 7}.
var smStatReply = []byte{
	0x80, 0x00, 0x00, 0x20, // record marker: last fragment, 32 bytes
	0x12, 0x34, 0x56, 0x78, // XID
	0x00, 0x00, 0x00, 0x01, // msg_type REPLY
	0x00, 0x00, 0x00, 0x00, // reply_stat MSG_ACCEPTED
	0x00, 0x00, 0x00, 0x00, // verf flavor AUTH_NONE
	0x00, 0x00, 0x00, 0x00, // verf length 0
	0x00, 0x00, 0x00, 0x00, // accept_stat SUCCESS
	0x00, 0x00, 0x00, 0x00, // res stat_succ
	0x00, 0x00, 0x00, 0x07, // state 7
}

func TestDecodeCallVector(t *testing.T) {
	rec, err := ReadRecord(bytes.NewReader(smStatCall), nil, 1024)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReader(rec)
	var h callHeader
	if err := decodeCall(r, &h); err != nil {
		t.Fatal(err)
	}
	if h.XID != 0x12345678 || h.Prog != 100024 || h.Vers != 1 || h.Proc != 1 || h.Cred.Flavor != AuthSys || h.Verf.Flavor != AuthNone {
		t.Fatalf("header %+v", h)
	}
	sys, err := parseAuthSys(h.Cred.Body)
	if err != nil || sys.Stamp != 42 || sys.MachineName != "node" || len(sys.GIDs) != 2 || sys.GIDs[1] != 2 {
		t.Fatalf("auth_sys %+v, %v", sys, err)
	}
	if name := r.String(1024); name != "foo" || r.Done() != nil {
		t.Fatalf("args %q %v", name, r.Done())
	}
	// Encoding the same header gives the same bytes.
	w := NewWriter(nil)
	h.marshal(w)
	w.String("foo")
	if !bytes.Equal(w.Bytes(), smStatCall[4:]) {
		t.Fatalf("re-encoded call\n% x\nwant\n% x", w.Bytes(), smStatCall[4:])
	}
	if c := AuthSysCred(*sys); !bytes.Equal(c.Body, h.Cred.Body) {
		t.Fatalf("AuthSysCred % x", c.Body)
	}
}

// TestServerAnswersVector runs the recorded SM_STAT call through the
// server's dispatch and compares the reply byte for byte.
func TestServerAnswersVector(t *testing.T) {
	h := HandlerFunc(func(ctx context.Context, c *Call, res *Writer) error {
		if c.Args.String(1024) != "foo" || c.Sys == nil || c.Sys.MachineName != "node" {
			return ErrGarbageArgs
		}
		res.Uint32(0) // stat_succ
		res.Uint32(7) // state
		return nil
	})
	s := NewServer(Programs{{100024, 1}: h}, ServerConfig{})
	var x exchange
	x.begin(s, "tcp", ap("127.0.0.1:700"), ap("127.0.0.1:111"))
	out := s.getBuf()
	reply, status, ok := s.serve(&x, smStatCall[4:], out)
	if !ok || status != nil {
		t.Fatalf("serve: ok %v status %v", ok, status)
	}
	b := (*out)[:replyReserve+len(reply)]
	putMarker(b, len(reply))
	if !bytes.Equal(b, smStatReply) {
		t.Fatalf("reply\n% x\nwant\n% x", b, smStatReply)
	}
}

func TestDecodeReplyVectors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want error
		low  uint32
		high uint32
	}{
		{"SUCCESS", smStatReply[4:], nil, 0, 0},
		{"PROG_UNAVAIL", []byte{
			0, 0, 0, 1, // XID
			0, 0, 0, 1, // REPLY
			0, 0, 0, 0, // MSG_ACCEPTED
			0, 0, 0, 0, 0, 0, 0, 0, // verf AUTH_NONE, length 0
			0, 0, 0, 1, // PROG_UNAVAIL
		}, ErrProgUnavail, 0, 0},
		{"PROG_MISMATCH", []byte{
			0, 0, 0, 1, // XID
			0, 0, 0, 1, // REPLY
			0, 0, 0, 0, // MSG_ACCEPTED
			0, 0, 0, 0, 0, 0, 0, 0, // verf
			0, 0, 0, 2, // PROG_MISMATCH
			0, 0, 0, 1, // low
			0, 0, 0, 4, // high
		}, ErrProgMismatch, 1, 4},
		{"PROC_UNAVAIL", []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3}, ErrProcUnavail, 0, 0},
		{"GARBAGE_ARGS", []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4}, ErrGarbageArgs, 0, 0},
		{"SYSTEM_ERR", []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5}, ErrSystemErr, 0, 0},
		{"accept_stat 6", []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6}, ErrBadReply, 0, 0},
		{"RPC_MISMATCH", []byte{
			0, 0, 0, 1, // XID
			0, 0, 0, 1, // REPLY
			0, 0, 0, 1, // MSG_DENIED
			0, 0, 0, 0, // RPC_MISMATCH
			0, 0, 0, 2, // low
			0, 0, 0, 2, // high
		}, ErrRPCMismatch, 2, 2},
		{"AUTH_ERROR", []byte{
			0, 0, 0, 1, // XID
			0, 0, 0, 1, // REPLY
			0, 0, 0, 1, // MSG_DENIED
			0, 0, 0, 1, // AUTH_ERROR
			0, 0, 0, 5, // AUTH_TOOWEAK
		}, ErrAuth, 0, 0},
		{"CALL, not REPLY", smStatCall[4:], ErrBadReply, 0, 0},
		{"truncated", []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}, ErrBadReply, 0, 0},
		{"verifier too long", []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x91}, ErrBadReply, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeReply(NewReader(tt.in))
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			var me *MismatchError
			if errors.As(err, &me) && (me.Low != tt.low || me.High != tt.high) {
				t.Fatalf("range %d..%d, want %d..%d", me.Low, me.High, tt.low, tt.high)
			}
			var ae *AuthError
			if errors.As(err, &ae) && ae.Stat != AuthTooWeak {
				t.Fatalf("auth_stat %d", ae.Stat)
			}
		})
	}
}

// TestServerRejectsBadHeaders covers the rejections decided from the header
// alone (RFC 5531 §9): drop, RPC_MISMATCH, AUTH_BADCRED, AUTH_BADVERF.
func TestServerRejectsBadHeaders(t *testing.T) {
	s := NewServer(Programs{{testProg, testVers}: newTestService()}, ServerConfig{})
	hdr := []byte{
		0, 0, 0, 3, // XID
		0, 0, 0, 0, // CALL
		0, 0, 0, 2, // rpcvers
		0x20, 0, 0, 0x99, // prog
		0, 0, 0, 1, // vers
		0, 0, 0, 0, // proc
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	none := []byte{0, 0, 0, 0, 0, 0, 0, 0}
	tests := []struct {
		name   string
		in     []byte
		ok     bool
		status error
		reply  []byte
	}{
		{"empty", nil, false, nil, nil},
		{"REPLY not CALL", []byte{0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 2}, false, nil, nil},
		{"truncated before proc", hdr[:16], false, nil, nil},
		{"cred body over 400", cat(hdr, []byte{0, 0, 0, 1, 0, 0, 1, 0x91}), true, ErrAuth,
			[]byte{0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}}, // XID, REPLY, MSG_DENIED, AUTH_ERROR, AUTH_BADCRED
		{"verf truncated", cat(hdr, none, []byte{0, 0, 0, 0, 0, 0, 0, 8}), true, ErrAuth,
			[]byte{0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 3}}, // ... AUTH_BADVERF
		{"AUTH_SYS with 17 gids", cat(hdr, []byte{0, 0, 0, 1, 0, 0, 0, 20}, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 17}, none), true, ErrAuth,
			[]byte{0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}},
		{"NULL ok", cat(hdr, none, none), true, nil,
			[]byte{0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}}, // XID, REPLY, ACCEPTED, verf, SUCCESS
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var x exchange
			x.begin(s, "udp", ap("127.0.0.1:1000"), ap("127.0.0.1:2000"))
			out := s.getBuf()
			reply, status, ok := s.serve(&x, tt.in, out)
			if ok != tt.ok || !errors.Is(status, tt.status) || (tt.status == nil && status != nil) {
				t.Fatalf("ok %v status %v, want %v %v", ok, status, tt.ok, tt.status)
			}
			if !bytes.Equal(reply, tt.reply) {
				t.Fatalf("reply % x\nwant % x", reply, tt.reply)
			}
		})
	}
}

func TestAuthSysLimits(t *testing.T) {
	long := string(bytes.Repeat([]byte{'m'}, 256))
	c := AuthSysCred(AuthSysParams{MachineName: long, GIDs: make([]uint32, 20)})
	p, err := parseAuthSys(c.Body)
	if err != nil || len(p.MachineName) != MaxMachineName || len(p.GIDs) != MaxAuthSysGIDs {
		t.Fatalf("AuthSysCred does not clamp: %v", err)
	}
	w := NewWriter(nil)
	(&AuthSysParams{MachineName: long}).MarshalXDR(w)
	if _, err := parseAuthSys(w.Bytes()); !errors.Is(err, ErrTooLong) {
		t.Fatalf("256-byte machinename: %v", err)
	}
	w.Reset()
	(&AuthSysParams{MachineName: "a"}).MarshalXDR(w)
	w.Uint32(0)
	if _, err := parseAuthSys(w.Bytes()); !errors.Is(err, ErrTrailing) {
		t.Fatalf("trailing bytes in credential: %v", err)
	}
}
