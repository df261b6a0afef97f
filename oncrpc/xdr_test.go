package oncrpc

import (
	"bytes"
	"errors"
	"testing"
)

// RFC 4506 primitives: table tests for lengths, caps, padding and truncation.
func TestReaderPrimitives(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		read    func(r *Reader) any
		want    any
		wantErr error
	}{
		{"uint32", []byte{0xde, 0xad, 0xbe, 0xef}, func(r *Reader) any { return r.Uint32() }, uint32(0xdeadbeef), nil},
		{"uint32 short", []byte{1, 2, 3}, func(r *Reader) any { return r.Uint32() }, uint32(0), ErrShort},
		{"int32 negative", []byte{0xff, 0xff, 0xff, 0xff}, func(r *Reader) any { return r.Int32() }, int32(-1), nil},
		{"uint64", []byte{0, 0, 0, 1, 0, 0, 0, 2}, func(r *Reader) any { return r.Uint64() }, uint64(1<<32 | 2), nil},
		{"uint64 short", []byte{0, 0, 0, 1, 0, 0, 0}, func(r *Reader) any { return r.Uint64() }, uint64(0), ErrShort},
		{"bool true", []byte{0, 0, 0, 1}, func(r *Reader) any { return r.Bool() }, true, nil},
		{"bool false", []byte{0, 0, 0, 0}, func(r *Reader) any { return r.Bool() }, false, nil},
		{"bool 2 (§4.4)", []byte{0, 0, 0, 2}, func(r *Reader) any { return r.Bool() }, false, ErrBadBool},
		{"opaque 3 + 1 pad", []byte{0, 0, 0, 3, 'a', 'b', 'c', 0}, func(r *Reader) any { return string(r.Opaque(8)) }, "abc", nil},
		{"opaque 4 no pad", []byte{0, 0, 0, 4, 'a', 'b', 'c', 'd'}, func(r *Reader) any { return string(r.Opaque(4)) }, "abcd", nil},
		{"opaque empty", []byte{0, 0, 0, 0}, func(r *Reader) any { return string(r.Opaque(0)) }, "", nil},
		{"opaque over max", []byte{0, 0, 0, 5, 'a', 'b', 'c', 'd', 'e', 0, 0, 0}, func(r *Reader) any { return r.Opaque(4) }, []byte(nil), ErrTooLong},
		{"opaque huge length, no data (cap first)", []byte{0xff, 0xff, 0xff, 0xff}, func(r *Reader) any { return r.Opaque(1 << 30) }, []byte(nil), ErrTooLong},
		{"opaque huge length within max", []byte{0x7f, 0xff, 0xff, 0xff}, func(r *Reader) any { return r.Opaque(1<<31 - 1) }, []byte(nil), ErrShort},
		{"opaque data short", []byte{0, 0, 0, 3, 'a', 'b'}, func(r *Reader) any { return r.Opaque(8) }, []byte(nil), ErrShort},
		{"opaque padding missing", []byte{0, 0, 0, 3, 'a', 'b', 'c'}, func(r *Reader) any { return r.Opaque(8) }, []byte(nil), ErrShort},
		{"opaque padding non-zero (§4.10)", []byte{0, 0, 0, 3, 'a', 'b', 'c', 1}, func(r *Reader) any { return r.Opaque(8) }, []byte(nil), ErrPadding},
		{"string", []byte{0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o', 0, 0, 0}, func(r *Reader) any { return r.String(5) }, "hello", nil},
		{"string over max", []byte{0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o', 0, 0, 0}, func(r *Reader) any { return r.String(4) }, "", ErrTooLong},
		{"string bad pad", []byte{0, 0, 0, 1, 'x', 0, 9, 0}, func(r *Reader) any { return r.String(4) }, "", ErrPadding},
		{"fixed opaque 5", []byte{1, 2, 3, 4, 5, 0, 0, 0}, func(r *Reader) any { b := make([]byte, 5); r.FixedOpaque(b); return string(b) }, "\x01\x02\x03\x04\x05", nil},
		{"fixed opaque 16 (priv)", bytes.Repeat([]byte{7}, 16), func(r *Reader) any { b := make([]byte, 16); r.FixedOpaque(b); return len(b) }, 16, nil},
		{"fixed opaque bad pad", []byte{1, 2, 3, 4, 5, 0, 1, 0}, func(r *Reader) any { b := make([]byte, 5); r.FixedOpaque(b); return string(b) }, "\x00\x00\x00\x00\x00", ErrPadding},
		{"fixed opaque short", []byte{1, 2, 3}, func(r *Reader) any { b := make([]byte, 4); r.FixedOpaque(b); return string(b) }, "\x00\x00\x00\x00", ErrShort},
		{"negative max", []byte{0, 0, 0, 0}, func(r *Reader) any { return r.Opaque(-1) }, []byte(nil), ErrTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(tt.in)
			got := tt.read(r)
			if !equalAny(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
			if !errors.Is(r.Err(), tt.wantErr) || (tt.wantErr == nil && r.Err() != nil) {
				t.Fatalf("err = %v, want %v", r.Err(), tt.wantErr)
			}
			if tt.wantErr == nil && r.Done() != nil {
				t.Fatalf("Done = %v", r.Done())
			}
		})
	}
}

func equalAny(a, b any) bool {
	if ab, ok := a.([]byte); ok {
		bb, ok := b.([]byte)
		return ok && bytes.Equal(ab, bb) && (ab == nil) == (bb == nil)
	}
	return a == b
}

func TestReaderErrorsAreSticky(t *testing.T) {
	r := NewReader([]byte{0, 0, 0, 2, 0, 0, 0, 1})
	if r.Bool(); !errors.Is(r.Err(), ErrBadBool) {
		t.Fatalf("err = %v", r.Err())
	}
	if v := r.Uint32(); v != 0 {
		t.Fatalf("read after error = %d, want 0", v)
	}
	if r.Remaining() != 0 {
		t.Fatal("Remaining after error")
	}
	r.Fail(ErrTooLong)
	if !errors.Is(r.Done(), ErrBadBool) {
		t.Fatalf("Fail replaced the first error: %v", r.Done())
	}
}

func TestReaderDoneReportsTrailingBytes(t *testing.T) {
	r := NewReader([]byte{0, 0, 0, 1, 0, 0, 0, 2})
	r.Uint32()
	if r.Remaining() != 4 {
		t.Fatalf("Remaining = %d", r.Remaining())
	}
	if err := r.Done(); !errors.Is(err, ErrTrailing) {
		t.Fatalf("Done = %v, want ErrTrailing", err)
	}
	if r.Err() != nil {
		t.Fatal("Done must not set the sticky error")
	}
}

func TestReaderOpaqueCopies(t *testing.T) {
	in := []byte{0, 0, 0, 1, 'a', 0, 0, 0}
	b := NewReader(in).Opaque(4)
	in[4] = 'z'
	if string(b) != "a" {
		t.Fatal("Opaque aliases the input")
	}
}

func TestWriterEncodesAndPads(t *testing.T) {
	w := NewWriter(make([]byte, 10))
	w.Uint32(1)
	w.Int32(-2)
	w.Uint64(3)
	w.Bool(true)
	w.Bool(false)
	w.Opaque([]byte("abc"))
	w.String("hello")
	w.FixedOpaque([]byte{9, 9})
	want := []byte{
		0, 0, 0, 1, // uint32 1
		0xff, 0xff, 0xff, 0xfe, // int32 -2
		0, 0, 0, 0, 0, 0, 0, 3, // uint64 3
		0, 0, 0, 1, // TRUE
		0, 0, 0, 0, // FALSE
		0, 0, 0, 3, 'a', 'b', 'c', 0, // opaque<> "abc" + 1 pad
		0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o', 0, 0, 0, // string "hello" + 3 pad
		9, 9, 0, 0, // opaque[2] + 2 pad
	}
	if !bytes.Equal(w.Bytes(), want) || w.Len() != len(want) {
		t.Fatalf("got % x\nwant % x", w.Bytes(), want)
	}
	r := NewReader(w.Bytes())
	if r.Uint32() != 1 || r.Int32() != -2 || r.Uint64() != 3 || !r.Bool() || r.Bool() ||
		string(r.Opaque(3)) != "abc" || r.String(5) != "hello" {
		t.Fatal("round trip failed")
	}
	fo := make([]byte, 2)
	r.FixedOpaque(fo)
	if err := r.Done(); err != nil || fo[0] != 9 {
		t.Fatalf("Done = %v", err)
	}
	w.Reset()
	if w.Len() != 0 {
		t.Fatal("Reset")
	}
}
