package oncrpc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
)

// FuzzReader decodes data with a sequence of primitives chosen by ops. It
// must never panic, and whatever decodes must re-encode to exactly the bytes
// consumed (XDR has one encoding per value once padding and bools are
// checked).
func FuzzReader(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5}, []byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 0, 1, 'x', 0, 0, 0, 1, 2, 3, 4, 5, 0, 0, 0})
	f.Add([]byte{3}, []byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{2}, []byte{0, 0, 0, 2})
	f.Fuzz(func(t *testing.T, ops, data []byte) {
		r := NewReader(data)
		w := NewWriter(nil)
		for _, op := range ops {
			switch op % 6 {
			case 0:
				w.Uint32(r.Uint32())
			case 1:
				w.Uint64(r.Uint64())
			case 2:
				w.Bool(r.Bool())
			case 3:
				w.Opaque(r.Opaque(int(op)))
			case 4:
				w.String(r.String(int(op)))
			case 5:
				b := make([]byte, op%23)
				r.FixedOpaque(b)
				w.FixedOpaque(b)
			}
		}
		if r.Err() != nil {
			if r.Remaining() != 0 {
				t.Fatal("Remaining after error")
			}
			return
		}
		used := len(data) - r.Remaining()
		if !bytes.Equal(w.Bytes(), data[:used]) {
			t.Fatalf("round trip:\n% x\n% x", w.Bytes(), data[:used])
		}
	})
}

// FuzzDecodeCall decodes call headers (RFC 5531 §9) with
// CallHeader.UnmarshalXDR and runs them through the server's dispatch; it
// must never panic, and a decoded header re-encodes to the same bytes.
func FuzzDecodeCall(f *testing.F) {
	f.Add(smStatCall[4:])
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0x20, 0, 0, 0x99, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c', 0})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3})
	panicky := HandlerFunc(func(ctx context.Context, c *Call, res *Writer) error {
		switch c.Proc {
		case 1:
			panic("fuzz")
		case 2:
			return ErrNoReply
		case 3:
			return ErrProcUnavail
		}
		return nil
	})
	s := NewServer(Programs{{testProg, testVers}: panicky, {100024, 1}: HandlerFunc(func(ctx context.Context, c *Call, res *Writer) error {
		res.String(c.Args.String(1024))
		return c.Args.Done()
	})}, ServerConfig{})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(data)
		var h CallHeader
		if err := h.UnmarshalXDR(r); err == nil {
			rest := data[len(data)-r.Remaining():]
			w := NewWriter(nil)
			h.MarshalXDR(w)
			if !bytes.Equal(append(w.Bytes(), rest...), data) {
				t.Fatalf("round trip:\n% x\n% x", w.Bytes(), data)
			}
		} else {
			var de *callDecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is not a callDecodeError", err)
			}
		}
		var x exchange
		x.begin(s, "udp", ap("127.0.0.1:1"), ap("127.0.0.1:2"))
		out := s.getBuf()
		reply, _, ok := s.serve(&x, data, out)
		if ok && reply != nil {
			if _, isReply := decodeReplyXID(reply); !isReply {
				t.Fatalf("server produced a non-reply % x", reply)
			}
			if _, err := decodeReply(NewReader(reply)); errors.Is(err, ErrBadReply) {
				t.Fatalf("server produced a reply it cannot decode: %v", err)
			}
		}
		s.putBuf(out)
	})
}

// FuzzDecodeReply decodes replies as the client does; it must never panic,
// every failure must map to a known error, and a SUCCESS header re-encodes
// to the same bytes.
func FuzzDecodeReply(f *testing.F) {
	f.Add(smStatReply[4:])
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 4})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 5})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 2})
	known := []error{ErrBadReply, ErrProgUnavail, ErrProgMismatch, ErrProcUnavail, ErrGarbageArgs, ErrSystemErr, ErrRPCMismatch, ErrAuth}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(data)
		xid, err := decodeReply(r)
		if err != nil {
			if !slicesContainsErr(known, err) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		rest := data[len(data)-r.Remaining():]
		vr := NewReader(data[12:])
		var verf OpaqueAuth
		verf.UnmarshalXDR(vr)
		w := NewWriter(nil)
		w.Uint32(xid)
		w.Uint32(msgReply)
		w.Uint32(ReplyAccepted)
		verf.MarshalXDR(w)
		w.Uint32(AcceptSuccess)
		if !bytes.Equal(append(w.Bytes(), rest...), data) {
			t.Fatalf("round trip:\n% x\n% x", w.Bytes(), data)
		}
	})
}

// FuzzReplyHeader decodes reply headers (RFC 5531 §9) as a client on its
// own socket does; it must never panic, a failure wraps ErrBadReply and sets
// the reader's error, and a decoded header re-encodes to exactly the bytes
// it consumed.
func FuzzReplyHeader(f *testing.F) {
	f.Add(smStatReply[4:])
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 2, 0xde, 0xad, 0, 0, 0, 0, 0, 5})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 5})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(data)
		var h ReplyHeader
		if err := h.UnmarshalXDR(r); err != nil {
			if !errors.Is(err, ErrBadReply) || r.Err() == nil {
				t.Fatalf("error %v (reader error %v)", err, r.Err())
			}
			return
		}
		used := data[:len(data)-r.Remaining()]
		w := NewWriter(nil)
		h.MarshalXDR(w)
		if !bytes.Equal(w.Bytes(), used) {
			t.Fatalf("round trip:\n% x\n% x", w.Bytes(), used)
		}
	})
}

func slicesContainsErr(errs []error, err error) bool {
	for _, e := range errs {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// FuzzReadRecord reads records from a stream (RFC 5531 §11); it must never
// panic or exceed the cap, and every record read re-encodes and reads back.
func FuzzReadRecord(f *testing.F) {
	f.Add(smStatCall)
	f.Add([]byte{0, 0, 0, 2, 'a', 'b', 0x80, 0, 0, 1, 'c', 0x80, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	const max = 512
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bytes.NewReader(data)
		var buf []byte
		for {
			rec, err := ReadRecord(br, buf, max)
			if err != nil {
				if len(rec) > max {
					t.Fatalf("%d bytes buffered over cap %d", len(rec), max)
				}
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrRecordTooBig) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			var b bytes.Buffer
			if err := WriteRecord(&b, rec); err != nil {
				t.Fatal(err)
			}
			again, err := ReadRecord(&b, nil, max)
			if err != nil || !bytes.Equal(again, rec) {
				t.Fatalf("re-read %q, %v; want %q", again, err, rec)
			}
			buf = rec
		}
	})
}

// FuzzAuthSys parses AUTH_SYS credential bodies (RFC 5531 appendix A); a
// body that parses re-encodes to the same bytes and respects the limits.
func FuzzAuthSys(f *testing.F) {
	f.Add(AuthSysCred(AuthSysParams{Stamp: 1, MachineName: "node", UID: 0, GID: 0, GIDs: []uint32{1, 2}}).Body)
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 17})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseAuthSys(body)
		if err != nil {
			return
		}
		if len(p.MachineName) > MaxMachineName || len(p.GIDs) > MaxAuthSysGIDs {
			t.Fatalf("limits not enforced: %d, %d", len(p.MachineName), len(p.GIDs))
		}
		if c := AuthSysCred(*p); !bytes.Equal(c.Body, body) {
			t.Fatalf("round trip:\n% x\n% x", c.Body, body)
		}
	})
}
