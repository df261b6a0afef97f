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
	var h CallHeader
	if err := h.UnmarshalXDR(r); err != nil {
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
	h.MarshalXDR(w)
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

// TestCallHeaderVectors encodes and decodes call headers as a client that
// runs its own socket builds them (RFC 5531 §9 call_body; AUTH_NONE §10.1,
// AUTH_SYS appendix A); the arguments follow the header untouched.
func TestCallHeaderVectors(t *testing.T) {
	sys := AuthSysCred(AuthSysParams{Stamp: 42, MachineName: "node", GIDs: []uint32{1, 2}})
	tests := []struct {
		name string
		h    CallHeader
		args []byte
		want []byte // header, then args
	}{
		{"PMAP GETPORT with AUTH_NONE", CallHeader{XID: 0x0a0b0c0d, Prog: PmapProg, Vers: PmapVers, Proc: PmapProcGetPort},
			[]byte{0, 1, 0x86, 0xb8, 0, 0, 0, 1, 0, 0, 0, 17, 0, 0, 0, 0}, []byte{
				0x0a, 0x0b, 0x0c, 0x0d, // XID
				0x00, 0x00, 0x00, 0x00, // msg_type CALL
				0x00, 0x00, 0x00, 0x02, // rpcvers 2
				0x00, 0x01, 0x86, 0xa0, // prog 100000 (portmapper)
				0x00, 0x00, 0x00, 0x02, // vers 2
				0x00, 0x00, 0x00, 0x03, // proc GETPORT
				0x00, 0x00, 0x00, 0x00, // cred flavor AUTH_NONE
				0x00, 0x00, 0x00, 0x00, // cred length 0
				0x00, 0x00, 0x00, 0x00, // verf flavor AUTH_NONE
				0x00, 0x00, 0x00, 0x00, // verf length 0
				0x00, 0x01, 0x86, 0xb8, // args: mapping prog 100024
				0x00, 0x00, 0x00, 0x01, //   vers 1
				0x00, 0x00, 0x00, 0x11, //   prot UDP (17)
				0x00, 0x00, 0x00, 0x00, //   port 0
			}},
		{"SM_STAT with AUTH_SYS", CallHeader{XID: 0x12345678, Prog: 100024, Vers: 1, Proc: 1, Cred: sys},
			[]byte{0, 0, 0, 3, 'f', 'o', 'o', 0}, smStatCall[4:]},
		{"verifier with a padded body", CallHeader{XID: 1, Prog: 7, Vers: 8, Proc: 9, Verf: OpaqueAuth{Flavor: 6, Body: []byte{0xaa, 0xbb, 0xcc}}},
			nil, []byte{
				0x00, 0x00, 0x00, 0x01, // XID
				0x00, 0x00, 0x00, 0x00, // msg_type CALL
				0x00, 0x00, 0x00, 0x02, // rpcvers 2
				0x00, 0x00, 0x00, 0x07, // prog
				0x00, 0x00, 0x00, 0x08, // vers
				0x00, 0x00, 0x00, 0x09, // proc
				0x00, 0x00, 0x00, 0x00, // cred flavor AUTH_NONE
				0x00, 0x00, 0x00, 0x00, // cred length 0
				0x00, 0x00, 0x00, 0x06, // verf flavor 6
				0x00, 0x00, 0x00, 0x03, // verf length 3
				0xaa, 0xbb, 0xcc, 0x00, // verf body + 1 pad
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWriter(nil)
			tt.h.MarshalXDR(w)
			w.FixedOpaque(tt.args)
			if !bytes.Equal(w.Bytes(), tt.want) {
				t.Fatalf("encoded\n% x\nwant\n% x", w.Bytes(), tt.want)
			}
			r := NewReader(tt.want)
			var got CallHeader
			if err := got.UnmarshalXDR(r); err != nil {
				t.Fatal(err)
			}
			if got.XID != tt.h.XID || got.Prog != tt.h.Prog || got.Vers != tt.h.Vers || got.Proc != tt.h.Proc ||
				got.Cred.Flavor != tt.h.Cred.Flavor || !bytes.Equal(got.Cred.Body, tt.h.Cred.Body) ||
				got.Verf.Flavor != tt.h.Verf.Flavor || !bytes.Equal(got.Verf.Body, tt.h.Verf.Body) {
				t.Fatalf("decoded %+v, want %+v", got, tt.h)
			}
			if rest := tt.want[len(tt.want)-r.Remaining():]; !bytes.Equal(rest, tt.args) {
				t.Fatalf("reader left at % x, want the args % x", rest, tt.args)
			}
		})
	}
}

// TestCallHeaderRefusesBadHeaders: only a CALL with rpcvers 2 and
// well-formed opaque_auths of at most 400 bytes decodes (RFC 5531 §8.2,
// §9); the XID survives a later failure and the reader's error is set.
func TestCallHeaderRefusesBadHeaders(t *testing.T) {
	hdr := []byte{
		0, 0, 0, 3, // XID
		0, 0, 0, 0, // CALL
		0, 0, 0, 2, // rpcvers 2
		0, 0, 0, 7, // prog
		0, 0, 0, 1, // vers
		0, 0, 0, 0, // proc
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	none := []byte{0, 0, 0, 0, 0, 0, 0, 0} // AUTH_NONE, length 0
	tests := []struct {
		name string
		in   []byte
		want error
		xid  uint32
	}{
		{"empty", nil, ErrShort, 0},
		{"REPLY, not CALL", []byte{0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 2}, nil, 3},
		{"rpcvers 3", []byte{0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3}, ErrRPCMismatch, 3},
		{"truncated before proc", hdr[:20], ErrShort, 3},
		{"no verifier", cat(hdr, none), ErrShort, 3},
		{"cred body over 400", cat(hdr, []byte{0, 0, 0, 1, 0, 0, 1, 0x91}), ErrTooLong, 3},
		{"verf padding not zero", cat(hdr, none, []byte{0, 0, 0, 0, 0, 0, 0, 1, 'x', 0, 0, 1}), ErrPadding, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(tt.in)
			var h CallHeader
			err := h.UnmarshalXDR(r)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if h.XID != tt.xid {
				t.Fatalf("XID %d, want %d", h.XID, tt.xid)
			}
			if r.Err() == nil {
				t.Fatal("reader error not set")
			}
		})
	}
}

// TestReplyHeaderVectors decodes reply headers (RFC 5531 §9 reply_body)
// and checks where each leaves the reader: at the results after SUCCESS,
// at mismatch_info after PROG_MISMATCH, at the rejected_reply after
// MSG_DENIED. Each re-encodes to the bytes it was decoded from.
func TestReplyHeaderVectors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want ReplyHeader
		rest int // bytes left for the caller
	}{
		{"SUCCESS with results", smStatReply[4:], ReplyHeader{XID: 0x12345678, Stat: ReplyAccepted, AcceptStat: AcceptSuccess}, 8},
		{"PROG_MISMATCH", []byte{
			0x00, 0x00, 0x00, 0x09, // XID
			0x00, 0x00, 0x00, 0x01, // msg_type REPLY
			0x00, 0x00, 0x00, 0x00, // reply_stat MSG_ACCEPTED
			0x00, 0x00, 0x00, 0x00, // verf flavor AUTH_NONE
			0x00, 0x00, 0x00, 0x00, // verf length 0
			0x00, 0x00, 0x00, 0x02, // accept_stat PROG_MISMATCH
			0x00, 0x00, 0x00, 0x01, // mismatch_info low
			0x00, 0x00, 0x00, 0x02, // high
		}, ReplyHeader{XID: 9, Stat: ReplyAccepted, AcceptStat: AcceptProgMismatch}, 8},
		{"SYSTEM_ERR with a verifier body", []byte{
			0x00, 0x00, 0x00, 0x0a, // XID
			0x00, 0x00, 0x00, 0x01, // msg_type REPLY
			0x00, 0x00, 0x00, 0x00, // reply_stat MSG_ACCEPTED
			0x00, 0x00, 0x00, 0x02, // verf flavor 2
			0x00, 0x00, 0x00, 0x02, // verf length 2
			0xde, 0xad, 0x00, 0x00, // verf body + 2 pad
			0x00, 0x00, 0x00, 0x05, // accept_stat SYSTEM_ERR
		}, ReplyHeader{XID: 10, Stat: ReplyAccepted, Verf: OpaqueAuth{Flavor: 2, Body: []byte{0xde, 0xad}}, AcceptStat: AcceptSystemErr}, 0},
		{"MSG_DENIED AUTH_ERROR", []byte{
			0x00, 0x00, 0x00, 0x0b, // XID
			0x00, 0x00, 0x00, 0x01, // msg_type REPLY
			0x00, 0x00, 0x00, 0x01, // reply_stat MSG_DENIED
			0x00, 0x00, 0x00, 0x01, // reject_stat AUTH_ERROR (the caller's)
			0x00, 0x00, 0x00, 0x02, // auth_stat AUTH_REJECTEDCRED
		}, ReplyHeader{XID: 11, Stat: ReplyDenied}, 8},
		{"reply_stat 7 left to the caller", []byte{
			0x00, 0x00, 0x00, 0x0c, // XID
			0x00, 0x00, 0x00, 0x01, // msg_type REPLY
			0x00, 0x00, 0x00, 0x07, // reply_stat 7 (no such value)
		}, ReplyHeader{XID: 12, Stat: 7}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(tt.in)
			var got ReplyHeader
			if err := got.UnmarshalXDR(r); err != nil {
				t.Fatal(err)
			}
			if got.XID != tt.want.XID || got.Stat != tt.want.Stat || got.AcceptStat != tt.want.AcceptStat ||
				got.Verf.Flavor != tt.want.Verf.Flavor || !bytes.Equal(got.Verf.Body, tt.want.Verf.Body) {
				t.Fatalf("decoded %+v, want %+v", got, tt.want)
			}
			if r.Remaining() != tt.rest {
				t.Fatalf("%d bytes left, want %d", r.Remaining(), tt.rest)
			}
			w := NewWriter(nil)
			got.MarshalXDR(w)
			if used := tt.in[:len(tt.in)-tt.rest]; !bytes.Equal(w.Bytes(), used) {
				t.Fatalf("re-encoded\n% x\nwant\n% x", w.Bytes(), used)
			}
		})
	}
}

// TestReplyHeaderZeroValueIsServerSuccess: a ReplyHeader with only an XID
// encodes the accepted SUCCESS header the server sends (RFC 5531 §9,
// AUTH_NONE verifier §10.1).
func TestReplyHeaderZeroValueIsServerSuccess(t *testing.T) {
	w := NewWriter(nil)
	ReplyHeader{XID: 0x12345678}.MarshalXDR(w)
	if want := smStatReply[4 : 4+successHeaderLen]; !bytes.Equal(w.Bytes(), want) {
		t.Fatalf("encoded\n% x\nwant\n% x", w.Bytes(), want)
	}
}

// TestReplyHeaderRefusesBadHeaders: a CALL, a truncated header or a bad
// verifier (over 400 bytes, RFC 5531 §8.2; non-zero padding, RFC 4506
// §4.10) is ErrBadReply with the cause; the XID survives when it was read.
func TestReplyHeaderRefusesBadHeaders(t *testing.T) {
	tests := []struct {
		name  string
		in    []byte
		cause error
		xid   uint32
	}{
		{"CALL, not REPLY", smStatCall[4:], nil, 0x12345678},
		{"no reply_stat", []byte{0, 0, 0, 4, 0, 0, 0, 1}, ErrShort, 4},
		{"no accept_stat", []byte{0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, ErrShort, 4},
		{"verifier over 400", []byte{0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x91}, ErrTooLong, 4},
		{"verifier padding not zero", []byte{0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 'x', 1, 0, 0, 0, 0, 0, 0}, ErrPadding, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(tt.in)
			var h ReplyHeader
			err := h.UnmarshalXDR(r)
			if !errors.Is(err, ErrBadReply) || (tt.cause != nil && !errors.Is(err, tt.cause)) {
				t.Fatalf("err = %v, want %v and %v", err, ErrBadReply, tt.cause)
			}
			if h.XID != tt.xid {
				t.Fatalf("XID %d, want %d", h.XID, tt.xid)
			}
			if r.Err() == nil {
				t.Fatal("reader error not set")
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
