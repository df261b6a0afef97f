package oncrpc

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// Record marking, RFC 5531 §11.
func TestReadRecord(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		max     int
		want    string
		wantErr error
	}{
		{"single fragment", []byte{0x80, 0, 0, 3, 'a', 'b', 'c'}, 10, "abc", nil},
		{"two fragments", []byte{0, 0, 0, 2, 'a', 'b', 0x80, 0, 0, 1, 'c'}, 10, "abc", nil},
		{"empty fragments between", []byte{0, 0, 0, 0, 0, 0, 0, 1, 'a', 0, 0, 0, 0, 0x80, 0, 0, 0}, 10, "a", nil},
		{"empty record", []byte{0x80, 0, 0, 0}, 10, "", nil},
		{"exactly max", []byte{0x80, 0, 0, 4, 1, 2, 3, 4}, 4, "\x01\x02\x03\x04", nil},
		{"one over max", []byte{0x80, 0, 0, 5, 1, 2, 3, 4, 5}, 4, "", ErrRecordTooBig},
		{"fragments sum over max", []byte{0, 0, 0, 3, 1, 2, 3, 0x80, 0, 0, 2, 4, 5}, 4, "", ErrRecordTooBig},
		{"huge length, no data", []byte{0xff, 0xff, 0xff, 0xff}, 1 << 16, "", ErrRecordTooBig},
		{"clean EOF", nil, 10, "", io.EOF},
		{"EOF in marker", []byte{0x80, 0}, 10, "", io.ErrUnexpectedEOF},
		{"EOF in fragment", []byte{0x80, 0, 0, 3, 'a'}, 10, "", io.ErrUnexpectedEOF},
		{"EOF after non-last fragment", []byte{0, 0, 0, 1, 'a'}, 10, "", io.ErrUnexpectedEOF},
		{"endless empty fragments", bytes.Repeat([]byte{0, 0, 0, 0}, MaxFragments+1), 10, "", ErrRecordTooBig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := ReadRecord(bytes.NewReader(tt.in), nil, tt.max)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && string(rec) != tt.want {
				t.Fatalf("record %q, want %q", rec, tt.want)
			}
		})
	}
}

func TestReadRecordReusesBufferAndReadsBackToBack(t *testing.T) {
	var stream bytes.Buffer
	WriteRecord(&stream, []byte("first"))
	WriteRecord(&stream, []byte("second!"))
	buf := make([]byte, 0, 64)
	rec, err := ReadRecord(&stream, buf, 100)
	if err != nil || string(rec) != "first" || &rec[0] != &buf[:1][0] {
		t.Fatalf("first: %q %v (buffer reused: %v)", rec, err, err == nil && &rec[0] == &buf[:1][0])
	}
	rec, err = ReadRecord(&stream, rec, 100)
	if err != nil || string(rec) != "second!" {
		t.Fatalf("second: %q %v", rec, err)
	}
	if _, err := ReadRecord(&stream, rec, 100); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

func TestWriteRecordSingleLastFragment(t *testing.T) {
	var b bytes.Buffer
	WriteRecord(&b, []byte{1, 2, 3, 4, 5})
	want := []byte{
		0x80, 0, 0, 5, // record marker: last fragment, 5 bytes
		1, 2, 3, 4, 5,
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Fatalf("% x", b.Bytes())
	}
}
