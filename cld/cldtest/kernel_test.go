//go:build linux

package cldtest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/cld"
)

// daemon is a hand-driven daemon on the fake's pipe.
type daemon struct {
	t *testing.T
	p *cld.Pipe
}

func openDaemon(t *testing.T, k *Kernel) *daemon {
	t.Helper()
	p, err := k.OpenPipe(k.PipePath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &daemon{t, p}
}

func (d *daemon) read() []byte {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf := make([]byte, 4096)
	n, err := d.p.ReadMsg(ctx, buf)
	if err != nil {
		d.t.Fatal(err)
	}
	return buf[:n]
}

func (d *daemon) write(b []byte) {
	d.t.Helper()
	if err := d.p.WriteMsg(b); err != nil {
		d.t.Fatal(err)
	}
}

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newKernel(t *testing.T) *Kernel {
	t.Helper()
	k, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// wantRejected: the fake rejected a downcall, saying substr.
func wantRejected(t *testing.T, k *Kernel, substr string) {
	t.Helper()
	for _, r := range k.Rejected() {
		if strings.Contains(r, substr) {
			return
		}
	}
	t.Fatalf("no rejection saying %q in %q", substr, k.Rejected())
}

// TestFakeSwitchesVersionLikeTheKernel: GetVersion goes out in 1034
// bytes; a 1067-byte answer and an answer with an unknown xid are
// rejected; the 1034-byte answer saying 2 switches the fake to 1067-byte
// messages.
func TestFakeSwitchesVersionLikeTheKernel(t *testing.T) {
	k := newKernel(t)
	if err := k.CreatePipe(); err != nil {
		t.Fatal(err)
	}
	d := openDaemon(t, k)
	c, err := k.Send(cld.Msg{Cmd: cld.GetVersion})
	if err != nil {
		t.Fatal(err)
	}
	up := d.read()
	m, err := cld.Decode(up)
	if err != nil || len(up) != 1034 || m.Version != 1 || m.Cmd != cld.GetVersion {
		t.Fatalf("GetVersion upcall: %d bytes, %+v, %v", len(up), m, err)
	}
	m.UpcallVersion = 2
	reply, _ := cld.Encode(m)
	long := append(append([]byte(nil), reply...), make([]byte, 33)...)
	d.write(long)
	wrong := append([]byte(nil), reply...)
	wrong[4] ^= 0xff
	d.write(wrong)
	d.write(reply)
	if _, err := c.Wait(ctx10(t)); err != nil {
		t.Fatal(err)
	}
	wantRejected(t, k, "1067 bytes, the kernel's messages have 1034")
	wantRejected(t, k, "no upcall waits for it")
	if k.Version() != 2 {
		t.Fatalf("version %d after the answer 2", k.Version())
	}
	if _, err := k.Send(cld.Msg{Cmd: cld.Create, Name: []byte("a"), PrincHash: []byte{1, 2}}); err != nil {
		t.Fatal(err)
	}
	up = d.read()
	if m, err := cld.Decode(up); err != nil || len(up) != 1067 || m.Version != 2 || string(m.PrincHash) != "\x01\x02" {
		t.Fatalf("Create after the switch: %d bytes, %+v, %v", len(up), m, err)
	}
}

// TestFakeCollectsRecordsAndRejectsBadOnes: -EINPROGRESS downcalls for
// GraceStart become records; one for another command or with an empty
// name is rejected.
func TestFakeCollectsRecordsAndRejectsBadOnes(t *testing.T) {
	k := newKernel(t)
	if err := k.CreatePipe(); err != nil {
		t.Fatal(err)
	}
	d := openDaemon(t, k)
	gs, err := k.Send(cld.Msg{Cmd: cld.GraceStart})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cld.Decode(d.read())
	if err != nil {
		t.Fatal(err)
	}
	rec := func(cmd cld.Command, name string) []byte {
		b, err := cld.Encode(cld.Msg{Version: 1, Cmd: cld.GraceStart, Status: cld.StatusInProgress, XID: m.XID, Name: []byte(name)})
		if err != nil {
			t.Fatal(err)
		}
		b[1] = byte(cmd)
		return b
	}
	d.write(rec(cld.GraceStart, "r1"))
	d.write(rec(cld.Create, "r2"))
	empty := rec(cld.GraceStart, "x")
	empty[8], empty[9] = 0, 0
	d.write(empty)
	final, _ := cld.Encode(m)
	d.write(final)
	r, err := gs.Wait(ctx10(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Records) != 1 || string(r.Records[0].Name) != "r1" {
		t.Fatalf("records %+v", r.Records)
	}
	wantRejected(t, k, "-EINPROGRESS downcall for Create")
	wantRejected(t, k, "name length 0")
}

// TestFakeQueuesUntilOpenAndFailsOnStop: upcalls sent before a daemon
// opens the pipe reach it at the open; nfsd's stop fails what is pending
// and removes the file, and — like the kernel — does not wake a reader of
// the destroyed pipe: it reads nothing until the fake is closed.
func TestFakeQueuesUntilOpenAndFailsOnStop(t *testing.T) {
	k := newKernel(t)
	if _, err := k.Send(cld.Msg{Cmd: cld.GraceDone}); !errors.Is(err, ErrNFSDStopped) {
		t.Fatalf("Send with nfsd stopped: %v", err)
	}
	if err := k.CreatePipe(); err != nil {
		t.Fatal(err)
	}
	c, err := k.Send(cld.Msg{Cmd: cld.Remove, Name: []byte("q")})
	if err != nil {
		t.Fatal(err)
	}
	d := openDaemon(t, k)
	if m, err := cld.Decode(d.read()); err != nil || m.Cmd != cld.Remove || string(m.Name) != "q" {
		t.Fatalf("queued upcall: %+v, %v", m, err)
	}
	k.Stop()
	if _, err := c.Wait(ctx10(t)); !errors.Is(err, ErrNFSDStopped) {
		t.Fatalf("pending at stop: %v", err)
	}
	if _, err := os.Stat(k.PipePath()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("pipe file after stop: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := d.p.ReadMsg(ctx, make([]byte, 4096)); !errors.Is(err, context.Canceled) {
		t.Fatalf("daemon read after stop: %d bytes, %v; want nothing (a canceled wait)", n, err)
	}
	k.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if _, err := d.p.ReadMsg(rctx, make([]byte, 4096)); !errors.Is(err, cld.ErrPipeGone) {
		t.Fatalf("daemon read after the fake closed: %v, want ErrPipeGone", err)
	}
}

// TestFakeStartWithoutDaemonGivesUp: nobody opens the pipe within the
// wait: ErrNoDaemon, and the file is gone, as the kernel falls back.
func TestFakeStartWithoutDaemonGivesUp(t *testing.T) {
	k := newKernel(t)
	k.SetOpenWait(50 * time.Millisecond)
	if _, err := k.Start(ctx10(t)); !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Start: %v, want ErrNoDaemon", err)
	}
	if _, err := os.Stat(k.PipePath()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("pipe file: %v", err)
	}
}

// TestFakeDaemonCloseFailsPending: the daemon closing the pipe fails the
// upcalls it had not answered.
func TestFakeDaemonCloseFailsPending(t *testing.T) {
	k := newKernel(t)
	if err := k.CreatePipe(); err != nil {
		t.Fatal(err)
	}
	d := openDaemon(t, k)
	c, err := k.Send(cld.Msg{Cmd: cld.GraceDone})
	if err != nil {
		t.Fatal(err)
	}
	d.read()
	d.p.Close()
	if _, err := c.Wait(ctx10(t)); !errors.Is(err, ErrDaemonClosed) {
		t.Fatalf("pending at the daemon's close: %v", err)
	}
}
