package oncrpc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// XDR decoding errors (RFC 4506). The Reader wraps them with context; check
// them with errors.Is.
var (
	// ErrShort means the data ended before the item being decoded.
	ErrShort = errors.New("xdr: truncated data")
	// ErrTooLong means a variable-length item is longer than its maximum.
	ErrTooLong = errors.New("xdr: length exceeds maximum")
	// ErrPadding means the padding after an opaque or string was not zero
	// (RFC 4506 §4.9–4.11: "the residual bytes ... are zero").
	ErrPadding = errors.New("xdr: non-zero padding")
	// ErrBadBool means a boolean was neither 0 nor 1 (RFC 4506 §4.4).
	ErrBadBool = errors.New("xdr: bool not 0 or 1")
	// ErrTrailing means bytes were left after the last item (Reader.Done).
	ErrTrailing = errors.New("xdr: trailing bytes")
)

// Marshaler is implemented by wire types that can encode themselves.
type Marshaler interface{ MarshalXDR(w *Writer) }

// Unmarshaler is implemented by wire types that can decode themselves. It
// returns r.Err() (or a more specific error) after reading its fields.
type Unmarshaler interface{ UnmarshalXDR(r *Reader) error }

// Void is the XDR void type.
type Void struct{}

// MarshalXDR encodes nothing.
func (Void) MarshalXDR(*Writer) {}

// UnmarshalXDR decodes nothing.
func (*Void) UnmarshalXDR(r *Reader) error { return nil }

// padLen is the number of zero bytes that follow n bytes of opaque data.
func padLen(n int) int { return (4 - n&3) & 3 }

// Reader decodes XDR from a byte slice. Errors are sticky: after the first
// error every method returns a zero value and Err reports that error.
type Reader struct {
	b   []byte
	off int
	err error
}

// NewReader returns a Reader over b. It does not copy b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// Reset makes r read b from its start and clears the error.
func (r *Reader) Reset(b []byte) { *r = Reader{b: b} }

// take returns the next n bytes, or nil after setting ErrShort.
func (r *Reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.err = fmt.Errorf("xdr: %s: need %d bytes, have %d: %w", what, n, len(r.b)-r.off, ErrShort)
		return nil
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p
}

// Uint32 decodes an unsigned integer (RFC 4506 §4.2).
func (r *Reader) Uint32() uint32 {
	p := r.take(4, "uint32")
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint32(p)
}

// Int32 decodes an integer (RFC 4506 §4.1).
func (r *Reader) Int32() int32 { return int32(r.Uint32()) }

// Uint64 decodes an unsigned hyper integer (RFC 4506 §4.5).
func (r *Reader) Uint64() uint64 {
	p := r.take(8, "uint64")
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint64(p)
}

// Int64 decodes a hyper integer (RFC 4506 §4.5).
func (r *Reader) Int64() int64 { return int64(r.Uint64()) }

// Bool decodes a boolean (RFC 4506 §4.4); values other than 0 and 1 are
// an error (ErrBadBool).
func (r *Reader) Bool() bool {
	v := r.Uint32()
	if v > 1 {
		r.Fail(fmt.Errorf("xdr: bool value %d: %w", v, ErrBadBool))
		return false
	}
	return v == 1
}

// padding consumes and checks the padding after n bytes of opaque data.
func (r *Reader) padding(n int) {
	p := r.take(padLen(n), "padding")
	for _, c := range p {
		if c != 0 {
			r.Fail(fmt.Errorf("xdr: padding byte %#x: %w", c, ErrPadding))
			return
		}
	}
}

// FixedOpaque decodes len(dst) bytes of fixed-length opaque data and their
// padding, which must be zero (RFC 4506 §4.9). On error dst is zeroed.
func (r *Reader) FixedOpaque(dst []byte) {
	p := r.take(len(dst), "fixed opaque")
	r.padding(len(dst))
	if r.err != nil {
		clear(dst)
		return
	}
	copy(dst, p)
}

// opaqueRef decodes a variable-length opaque (RFC 4506 §4.10) and returns a
// slice of the underlying buffer (not a copy). The length is checked against
// max and against the data left before anything else happens.
func (r *Reader) opaqueRef(max int, what string) []byte {
	n := r.Uint32()
	if r.err != nil {
		return nil
	}
	if max < 0 || uint64(n) > uint64(max) {
		r.err = fmt.Errorf("xdr: %s length %d > max %d: %w", what, n, max, ErrTooLong)
		return nil
	}
	if uint64(n)+uint64(padLen(int(n))) > uint64(len(r.b)-r.off) {
		r.err = fmt.Errorf("xdr: %s: length %d, have %d bytes: %w", what, n, len(r.b)-r.off, ErrShort)
		return nil
	}
	p := r.take(int(n), what)
	r.padding(int(n))
	if r.err != nil {
		return nil
	}
	return p
}

// Opaque decodes variable-length opaque data of at most max bytes
// (RFC 4506 §4.10) into a new slice. A longer length is ErrTooLong.
func (r *Reader) Opaque(max int) []byte {
	p := r.opaqueRef(max, "opaque")
	if p == nil {
		return nil
	}
	return append(make([]byte, 0, len(p)), p...)
}

// OpaqueRef is Opaque without the copy: the result aliases the Reader's
// buffer and is valid only as long as that buffer is.
func (r *Reader) OpaqueRef(max int) []byte { return r.opaqueRef(max, "opaque") }

// String decodes a string of at most max bytes (RFC 4506 §4.11). A longer
// length is ErrTooLong. The bytes are not checked for any encoding.
func (r *Reader) String(max int) string {
	p := r.opaqueRef(max, "string")
	if p == nil {
		return ""
	}
	return string(p)
}

// Remaining reports how many bytes are left (0 after an error).
func (r *Reader) Remaining() int {
	if r.err != nil {
		return 0
	}
	return len(r.b) - r.off
}

// Err reports the first error met, or nil.
func (r *Reader) Err() error { return r.err }

// Fail sets the sticky error unless one is already set; decoders use it for
// type-level validation (an out-of-range enum, say). Fail(nil) does nothing.
func (r *Reader) Fail(err error) {
	if r.err == nil && err != nil {
		r.err = err
	}
}

// Done reports Err, or an error wrapping ErrTrailing if bytes remain.
func (r *Reader) Done() error {
	if r.err != nil {
		return r.err
	}
	if n := len(r.b) - r.off; n > 0 {
		return fmt.Errorf("xdr: %d bytes after the last item: %w", n, ErrTrailing)
	}
	return nil
}

// Writer encodes XDR into a growing buffer. It never fails.
type Writer struct {
	buf  []byte
	base int // bytes reserved in front of the output (for reply headers)
}

// NewWriter returns a Writer that appends to buf[:0].
func NewWriter(buf []byte) *Writer { return &Writer{buf: buf[:0]} }

// Uint32 encodes an unsigned integer (RFC 4506 §4.2).
func (w *Writer) Uint32(v uint32) { w.buf = binary.BigEndian.AppendUint32(w.buf, v) }

// Int32 encodes an integer (RFC 4506 §4.1).
func (w *Writer) Int32(v int32) { w.Uint32(uint32(v)) }

// Uint64 encodes an unsigned hyper integer (RFC 4506 §4.5).
func (w *Writer) Uint64(v uint64) { w.buf = binary.BigEndian.AppendUint64(w.buf, v) }

// Int64 encodes a hyper integer (RFC 4506 §4.5).
func (w *Writer) Int64(v int64) { w.Uint64(uint64(v)) }

// Bool encodes a boolean as 1 or 0 (RFC 4506 §4.4).
func (w *Writer) Bool(v bool) {
	if v {
		w.Uint32(1)
	} else {
		w.Uint32(0)
	}
}

var zeroPad [4]byte

// FixedOpaque encodes fixed-length opaque data and zero padding (RFC 4506 §4.9).
func (w *Writer) FixedOpaque(b []byte) {
	w.buf = append(w.buf, b...)
	w.buf = append(w.buf, zeroPad[:padLen(len(b))]...)
}

// Opaque encodes variable-length opaque data (RFC 4506 §4.10).
func (w *Writer) Opaque(b []byte) {
	w.Uint32(uint32(len(b)))
	w.FixedOpaque(b)
}

// String encodes a string (RFC 4506 §4.11).
func (w *Writer) String(s string) {
	w.Uint32(uint32(len(s)))
	w.buf = append(w.buf, s...)
	w.buf = append(w.buf, zeroPad[:padLen(len(s))]...)
}

// Bytes returns the encoded bytes; they alias the Writer's buffer.
func (w *Writer) Bytes() []byte { return w.buf[w.base:] }

// Len reports the number of encoded bytes.
func (w *Writer) Len() int { return len(w.buf) - w.base }

// Reset discards everything written so far, keeping the buffer.
func (w *Writer) Reset() { w.buf = w.buf[:w.base] }
