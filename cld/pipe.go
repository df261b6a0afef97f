//go:build linux

package cld

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Pipe is a message pipe on a file descriptor: the kernel's rpc_pipefs
// file <pipefs>/nfsd/cld, or one end of an AF_UNIX SOCK_SEQPACKET
// socketpair standing in for it in tests. One read returns one whole
// message and one write sends one.
//
// rpc_pipefs files do not block: read returns one queued message, or 0
// when none is queued (not EAGAIN), and -EPIPE once nfsd destroyed the
// pipe, when poll also reports POLLERR|POLLHUP. So ReadMsg waits with
// poll(2) on the pipe and on two eventfds, one that Close signals and one
// that the cancellation of ReadMsg's context signals, and treats a read of
// 0 without POLLHUP as "nothing yet".
//
// ReadMsg calls are serialised, and so are WriteMsg calls; one ReadMsg and
// any number of WriteMsg calls may run at once. Close may be called at any
// time, from any goroutine: calls in progress return ErrClosed, and so do
// later ones.
type Pipe struct {
	fd      int
	closeFd int // eventfd: readable for good once Close starts
	ctxFd   int // eventfd: signalled when a ReadMsg context is done; used only under rmu

	closed atomic.Bool
	// live is held shared by every call using the descriptors and
	// exclusively by Close to close them.
	live sync.RWMutex
	rmu  sync.Mutex
	wmu  sync.Mutex
	once sync.Once
}

// NewPipe takes ownership of fd (closed by Close, or here on error) and
// sets it non-blocking.
func NewPipe(fd int) (*Pipe, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("cld: pipe fd %d: set non-blocking: %w", fd, err)
	}
	closeFd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("cld: pipe: eventfd: %w", err)
	}
	ctxFd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		unix.Close(closeFd)
		return nil, fmt.Errorf("cld: pipe: eventfd: %w", err)
	}
	return &Pipe{fd: fd, closeFd: closeFd, ctxFd: ctxFd}, nil
}

// OpenPipeFile opens the rpc_pipefs file at path read-write, as nfsdcld
// does, and refuses (ErrNotPipe) a file that is not a FIFO: rpc_pipefs
// pipes are, and a regular file would read as an endless stream of empty
// messages. Errors keep the errno (errors.Is(err, fs.ErrNotExist),
// unix.EACCES …) inside an *os.PathError. It is the default
// Config.OpenPipe.
func OpenPipeFile(path string) (*Pipe, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		unix.Close(fd)
		return nil, &os.PathError{Op: "open", Path: path, Err: ErrNotPipe}
	}
	return NewPipe(fd)
}

// enter marks a call in progress; false once the pipe is closed.
func (p *Pipe) enter() bool {
	p.live.RLock()
	if p.closed.Load() {
		p.live.RUnlock()
		return false
	}
	return true
}

func (p *Pipe) leave() { p.live.RUnlock() }

// ReadMsg waits for one message and reads it into buf, which must hold
// the largest message (MsgSizeV2; a bigger buffer shows oversized ones).
// It returns ErrPipeGone once the pipe is destroyed or the peer closed,
// ErrClosed after Close, and ctx.Err() when ctx is done first.
func (p *Pipe) ReadMsg(ctx context.Context, buf []byte) (int, error) {
	if len(buf) == 0 {
		return 0, fmt.Errorf("cld: ReadMsg: empty buffer")
	}
	p.rmu.Lock()
	defer p.rmu.Unlock()
	if !p.enter() {
		return 0, ErrClosed
	}
	defer p.leave()

	defer armWake(ctx, p.ctxFd)()

	hup := false
	for {
		n, err := unix.Read(p.fd, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EPIPE || err == unix.ECONNRESET:
			return 0, ErrPipeGone
		case err == nil && n > 0:
			return n, nil
		case hup && (err == nil || err == unix.EAGAIN):
			// Nothing more after POLLHUP: the end of a socketpair, or a
			// pipe that nfsd is destroying.
			return 0, ErrPipeGone
		case err != nil && err != unix.EAGAIN:
			return 0, fmt.Errorf("cld: read pipe: %w", err)
		}
		// Nothing queued (EAGAIN, or 0 from rpc_pipefs): wait.
		if p.closed.Load() {
			return 0, ErrClosed
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		fds := []unix.PollFd{
			{Fd: int32(p.fd), Events: unix.POLLIN},
			{Fd: int32(p.closeFd), Events: unix.POLLIN},
			{Fd: int32(p.ctxFd), Events: unix.POLLIN},
		}
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return 0, fmt.Errorf("cld: poll pipe: %w", err)
		}
		if fds[1].Revents != 0 || p.closed.Load() {
			return 0, ErrClosed
		}
		if fds[2].Revents != 0 && ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if fds[0].Revents&unix.POLLNVAL != 0 {
			return 0, fmt.Errorf("cld: poll pipe: %w", unix.EBADF)
		}
		// POLLERR|POLLHUP: read once more; a socketpair may still hold
		// messages the peer sent before closing.
		hup = fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0
	}
}

// WriteMsg writes b as one message (one downcall). It returns ErrPipeGone
// once the pipe is destroyed or the peer closed, ErrClosed after Close,
// and the kernel's refusal otherwise (for example EINVAL: an xid it does
// not wait for, or a length that is not that of its messages).
func (p *Pipe) WriteMsg(b []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if !p.enter() {
		return ErrClosed
	}
	defer p.leave()
	for {
		n, err := unix.Write(p.fd, b)
		switch {
		case err == nil && n == len(b):
			return nil
		case err == nil:
			return fmt.Errorf("cld: write pipe: short write, %d of %d bytes", n, len(b))
		case err == unix.EINTR:
			continue
		case err == unix.EPIPE || err == unix.ECONNRESET:
			return ErrPipeGone
		case err != unix.EAGAIN:
			return fmt.Errorf("cld: write pipe (%d bytes): %w", len(b), err)
		}
		// A socketpair whose peer does not read yet (rpc_pipefs writes
		// never block).
		fds := []unix.PollFd{
			{Fd: int32(p.fd), Events: unix.POLLOUT},
			{Fd: int32(p.closeFd), Events: unix.POLLIN},
		}
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return fmt.Errorf("cld: poll pipe: %w", err)
		}
		if fds[1].Revents != 0 || p.closed.Load() {
			return ErrClosed
		}
		if fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0 && fds[0].Revents&unix.POLLOUT == 0 {
			return ErrPipeGone
		}
	}
}

// Close wakes every call in progress (they return ErrClosed), waits for
// them to leave and closes the descriptor. Later calls return ErrClosed;
// a second Close does nothing.
func (p *Pipe) Close() error {
	var err error
	p.once.Do(func() {
		p.closed.Store(true)
		signalEventfd(p.closeFd)
		p.live.Lock()
		defer p.live.Unlock()
		err = unix.Close(p.fd)
		unix.Close(p.closeFd)
		unix.Close(p.ctxFd)
		if err != nil {
			err = fmt.Errorf("cld: close pipe: %w", err)
		}
	})
	return err
}

// armWake makes the eventfd fd readable once ctx is done. The returned
// disarm waits for a signal in progress and empties fd again, so that the
// next user of fd starts clean; fd must have one user at a time.
func armWake(ctx context.Context, fd int) (disarm func()) {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		signalEventfd(fd)
	})
	return func() {
		if !stop() {
			<-fired
			drainEventfd(fd)
		}
	}
}

func signalEventfd(fd int) {
	var one [8]byte
	byteOrder.PutUint64(one[:], 1)
	for {
		_, err := unix.Write(fd, one[:])
		if err != unix.EINTR {
			return // EAGAIN: the counter is already far from 0
		}
	}
}

func drainEventfd(fd int) {
	var b [8]byte
	for {
		_, err := unix.Read(fd, b[:])
		if err != unix.EINTR {
			return
		}
	}
}

// isGone reports whether err means the pipe can no longer be used.
func isGone(err error) bool {
	return errors.Is(err, ErrPipeGone) || errors.Is(err, ErrClosed)
}
