//go:build linux

package cld

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStatusesAreThisBuildsErrnos: the Status constants are the generic
// Linux errno values; on an architecture with other values this fails.
func TestStatusesAreThisBuildsErrnos(t *testing.T) {
	for _, c := range []struct {
		got  int16
		want unix.Errno
	}{
		{StatusAccessDenied, unix.EACCES},
		{StatusInvalid, unix.EINVAL},
		{StatusNotSupported, unix.EOPNOTSUPP},
		{StatusInProgress, unix.EINPROGRESS},
		{StatusRemoteIO, unix.EREMOTEIO},
	} {
		if int(c.got) != -int(c.want) {
			t.Errorf("status %d, want -%d (%v)", c.got, int(c.want), c.want)
		}
	}
}

// seqpacket returns a Pipe on one end of a SOCK_SEQPACKET socketpair and
// the other end, which plays the kernel.
func seqpacket(t *testing.T) (*Pipe, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPipe(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); unix.Close(fds[1]) })
	return p, fds[1]
}

func send(t *testing.T, fd int, b []byte) {
	t.Helper()
	if _, err := unix.Write(fd, b); err != nil {
		t.Fatal(err)
	}
}

// readAsync runs ReadMsg on its own goroutine; the test receives its
// result (and so waits for the goroutine).
type readResult struct {
	n   int
	err error
	b   []byte
}

func readAsync(ctx context.Context, p *Pipe) <-chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		buf := make([]byte, 2*MsgSizeV2)
		n, err := p.ReadMsg(ctx, buf)
		ch <- readResult{n, err, buf[:max(n, 0)]}
	}()
	return ch
}

func waitRead(t *testing.T, ch <-chan readResult) readResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("ReadMsg did not return")
		return readResult{}
	}
}

func TestPipeReadsOneWholeMessagePerRead(t *testing.T) {
	p, k := seqpacket(t)
	a, b := repeat('a', MsgSizeV1), repeat('b', MsgSizeV2)
	send(t, k, a)
	send(t, k, b)
	for _, want := range [][]byte{a, b} {
		r := waitRead(t, readAsync(context.Background(), p))
		if r.err != nil || !bytes.Equal(r.b, want) {
			t.Fatalf("read %d bytes, %v; want the %d-byte message", r.n, r.err, len(want))
		}
	}
}

// TestPipeEmptyReadIsNotTheEnd: rpc_pipefs read() returns 0 when nothing
// is queued, with no POLLHUP; a zero-length SOCK_SEQPACKET message does
// the same. ReadMsg must keep waiting, not report the pipe gone.
func TestPipeEmptyReadIsNotTheEnd(t *testing.T) {
	p, k := seqpacket(t)
	send(t, k, nil) // POLLIN, and read() = 0
	want := repeat('m', MsgSizeV2)
	send(t, k, want)
	r := waitRead(t, readAsync(context.Background(), p))
	if r.err != nil || !bytes.Equal(r.b, want) {
		t.Fatalf("ReadMsg = %d bytes, %v; want the message after the empty read", r.n, r.err)
	}
}

// TestPipePeerCloseIsPipeGone: POLLHUP and read() = 0 (a socketpair whose
// peer closed, as rpc_pipefs after nfsd destroyed the pipe reports
// POLLHUP and -EPIPE): ErrPipeGone, after any message still queued.
func TestPipePeerCloseIsPipeGone(t *testing.T) {
	p, k := seqpacket(t)
	blocked := readAsync(context.Background(), p)
	want := repeat('q', MsgSizeV1)
	send(t, k, want)
	if r := waitRead(t, blocked); r.err != nil || !bytes.Equal(r.b, want) {
		t.Fatalf("first read: %d, %v", r.n, r.err)
	}
	send(t, k, want)
	unix.Close(k)
	r := waitRead(t, readAsync(context.Background(), p))
	if r.err != nil || !bytes.Equal(r.b, want) {
		t.Fatalf("message sent before the close: %d, %v", r.n, r.err)
	}
	if r := waitRead(t, readAsync(context.Background(), p)); !errors.Is(r.err, ErrPipeGone) {
		t.Fatalf("after the peer closed: %d, %v; want ErrPipeGone", r.n, r.err)
	}
	if err := p.WriteMsg(want); !errors.Is(err, ErrPipeGone) {
		t.Fatalf("WriteMsg after the peer closed: %v, want ErrPipeGone", err)
	}
}

func TestPipeCloseUnblocksReadAndLaterCalls(t *testing.T) {
	p, _ := seqpacket(t)
	blocked := readAsync(context.Background(), p)
	select {
	case r := <-blocked:
		t.Fatalf("ReadMsg returned with nothing sent: %v", r.err)
	default:
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if r := waitRead(t, blocked); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("blocked ReadMsg: %v, want ErrClosed", r.err)
	}
	if r := waitRead(t, readAsync(context.Background(), p)); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("ReadMsg after Close: %v", r.err)
	}
	if err := p.WriteMsg([]byte{1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("WriteMsg after Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestPipeCancelUnblocksReadAndLeavesThePipeUsable: a done context ends
// the read; the wake-up it left behind does not disturb the next one.
func TestPipeCancelUnblocksReadAndLeavesThePipeUsable(t *testing.T) {
	p, k := seqpacket(t)
	ctx, cancel := context.WithCancel(context.Background())
	blocked := readAsync(ctx, p)
	cancel()
	if r := waitRead(t, blocked); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("ReadMsg after cancel: %v", r.err)
	}
	next := readAsync(context.Background(), p)
	want := repeat('z', 100)
	send(t, k, want)
	if r := waitRead(t, next); r.err != nil || !bytes.Equal(r.b, want) {
		t.Fatalf("ReadMsg after a cancelled one: %d, %v", r.n, r.err)
	}
}

// TestPipeConcurrentWritesStayWhole: WriteMsg from many goroutines, more
// than a socket buffer holds (so writers also wait in poll for POLLOUT):
// every message arrives whole.
func TestPipeConcurrentWritesStayWhole(t *testing.T) {
	p, k := seqpacket(t)
	const writers, each = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := p.WriteMsg(repeat(byte('A'+w), MsgSizeV2)); err != nil {
					t.Errorf("WriteMsg: %v", err)
					return
				}
			}
		}()
	}
	buf := make([]byte, 2*MsgSizeV2)
	for i := range writers * each {
		n, err := unix.Read(k, buf)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if n != MsgSizeV2 || !bytes.Equal(buf[:n], repeat(buf[0], n)) {
			t.Fatalf("message %d: %d bytes, mixed", i, n)
		}
	}
	wg.Wait()
}

func TestOpenPipeFileOpensFIFOsOnly(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "regular")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenPipeFile(regular); !errors.Is(err, ErrNotPipe) {
		t.Fatalf("regular file: %v, want ErrNotPipe", err)
	}
	if _, err := OpenPipeFile(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v, want fs.ErrNotExist", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := OpenPipeFile(fifo)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// A FIFO open read-write reads back its own writes.
	msg := repeat('f', 64)
	if err := p.WriteMsg(msg); err != nil {
		t.Fatal(err)
	}
	if r := waitRead(t, readAsync(context.Background(), p)); r.err != nil || !bytes.Equal(r.b, msg) {
		t.Fatalf("read back: %d, %v", r.n, r.err)
	}
}

// FuzzParseInotify: the inotify event walker never panics and never reads
// past its buffer.
func FuzzParseInotify(f *testing.F) {
	ev := func(mask uint32, name string) []byte {
		n := (len(name) + 1 + 15) &^ 15
		b := make([]byte, 16+n)
		byteOrder.PutUint32(b[4:], mask)
		byteOrder.PutUint32(b[12:], uint32(n))
		copy(b[16:], name)
		return b
	}
	f.Add(ev(unix.IN_CREATE, "cld"))
	f.Add(append(ev(unix.IN_CREATE, "x"), ev(unix.IN_IGNORED, "")...))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		total := 0
		err := parseInotify(b, func(mask uint32, name string) {
			total += 16
			if len(name) > len(b) {
				t.Fatalf("name of %d bytes from %d", len(name), len(b))
			}
		})
		if err == nil && total > len(b) {
			t.Fatalf("%d header bytes from %d", total, len(b))
		}
	})
}

func TestParseInotifyFindsThePipe(t *testing.T) {
	var b []byte
	for _, e := range []struct {
		mask uint32
		name string
	}{{unix.IN_CREATE, "other"}, {unix.IN_CREATE, "cld"}, {unix.IN_IGNORED, ""}} {
		n := (len(e.name) + 1 + 15) &^ 15
		x := make([]byte, 16+n)
		byteOrder.PutUint32(x[4:], e.mask)
		byteOrder.PutUint32(x[12:], uint32(n))
		copy(x[16:], e.name)
		b = append(b, x...)
	}
	var got []string
	if err := parseInotify(b, func(mask uint32, name string) { got = append(got, name) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != "other" || got[1] != "cld" || got[2] != "" {
		t.Fatalf("names %q", got)
	}
	if err := parseInotify(b[:len(b)-1], func(uint32, string) {}); err == nil {
		t.Fatal("a truncated event parsed")
	}
}
