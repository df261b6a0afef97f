package oncrpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Record marking (RFC 5531 §11): on a stream, a record is a sequence of
// fragments, each preceded by a 4-byte big-endian header whose top bit marks
// the last fragment and whose low 31 bits give the fragment length.

const (
	lastFragment = 1 << 31
	// MaxFragments caps the fragments of one record, so a peer cannot keep
	// a reader busy with an endless run of empty fragments.
	MaxFragments = 1024
	// DefaultMaxRecordSize is the default record size cap of the server.
	DefaultMaxRecordSize = 64 << 10
	// DefaultClientMaxRecordSize is the default reply record cap of a client.
	DefaultClientMaxRecordSize = 1 << 20
)

// ReadRecord reads one record from r, reassembling its fragments into buf
// (reused if large enough) and returning the record. A record larger than
// max bytes, or made of more than MaxFragments fragments, is an error
// wrapping ErrRecordTooBig; the stream is then out of sync and must be
// closed. A stream that ends inside a record gives io.ErrUnexpectedEOF; one
// that ends cleanly between records gives io.EOF.
func ReadRecord(r io.Reader, buf []byte, max int) ([]byte, error) {
	buf = buf[:0]
	var hdr [4]byte
	for frag := 0; ; frag++ {
		if frag == MaxFragments {
			return buf, fmt.Errorf("rpc: more than %d fragments in one record: %w", MaxFragments, ErrRecordTooBig)
		}
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if frag > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return buf, err
		}
		h := binary.BigEndian.Uint32(hdr[:])
		n := int(h &^ lastFragment)
		if n > max-len(buf) {
			return buf, fmt.Errorf("rpc: record of at least %d bytes > max %d: %w", len(buf)+n, max, ErrRecordTooBig)
		}
		start := len(buf)
		if cap(buf)-start < n {
			nb := make([]byte, start, start+n)
			copy(nb, buf)
			buf = nb
		}
		buf = buf[:start+n]
		if _, err := io.ReadFull(r, buf[start:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return buf[:start], err
		}
		if h&lastFragment != 0 {
			return buf, nil
		}
	}
}

// WriteRecord writes rec as one record made of a single last fragment, with
// one Write call.
func WriteRecord(w io.Writer, rec []byte) error {
	if len(rec) > 1<<31-1 {
		return fmt.Errorf("rpc: writing record of %d bytes: %w", len(rec), ErrRecordTooBig)
	}
	b := make([]byte, 4, 4+len(rec))
	binary.BigEndian.PutUint32(b, lastFragment|uint32(len(rec)))
	_, err := w.Write(append(b, rec...))
	return err
}

// putMarker writes the record marker of a single-fragment record of n
// bytes into b[:4].
func putMarker(b []byte, n int) { binary.BigEndian.PutUint32(b, lastFragment|uint32(n)) }
