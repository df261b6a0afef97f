//go:build linux

package cld

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// DefaultPipefsDir is where nfs-utils mounts rpc_pipefs.
	DefaultPipefsDir = "/var/lib/nfs/rpc_pipefs"
	// RPCPipefsMagic is statfs f_type of rpc_pipefs (RPCAUTH_GSSMAGIC).
	RPCPipefsMagic = 0x67596969
	// pipeDir and pipeName: nfsd creates <pipefs>/nfsd/cld.
	pipeDir  = "nfsd"
	pipeName = "cld"
)

// IsRPCPipefs reports whether dir is on an rpc_pipefs mount (statfs
// f_type). It is the default Config.IsPipefs.
func IsRPCPipefs(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	return st.Type == RPCPipefsMagic, nil
}

// mountPipefs mounts rpc_pipefs at dir (mount -t rpc_pipefs sunrpc dir),
// creating dir first.
func mountPipefs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create mount point: %w", err)
	}
	err := unix.Mount("sunrpc", dir, "rpc_pipefs", 0, "")
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("mount -t rpc_pipefs sunrpc %s: %w (mounting needs CAP_SYS_ADMIN)", dir, err)
	case errors.Is(err, unix.ENODEV):
		return fmt.Errorf("mount -t rpc_pipefs sunrpc %s: %w (this kernel has no rpc_pipefs: is the sunrpc module loaded?)", dir, err)
	}
	return fmt.Errorf("mount -t rpc_pipefs sunrpc %s: %w", dir, err)
}

// dirWatch is an inotify watch on the directory where nfsd creates its
// pipe.
type dirWatch struct {
	dir  string
	fd   int // inotify, non-blocking
	wake int // eventfd for wait's context
	buf  []byte
}

// watchEvents sums up the events read from a dirWatch.
type watchEvents struct {
	created bool // a file named pipeName appeared
	removed bool // the file named pipeName went (nfsd stopped: its pipe is destroyed)
	invalid bool // the watch ended (directory removed, unmounted) or events were lost
}

func newDirWatch(dir string) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	const mask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &dirWatch{dir: dir, fd: fd, wake: wake, buf: make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))}, nil
}

func (w *dirWatch) close() {
	unix.Close(w.fd)
	unix.Close(w.wake)
}

// drain reads every queued event without waiting.
func (w *dirWatch) drain() (watchEvents, error) {
	var ev watchEvents
	for {
		n, err := unix.Read(w.fd, w.buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN || (err == nil && n == 0):
			return ev, nil
		case err != nil:
			return ev, fmt.Errorf("read inotify: %w", err)
		}
		err = parseInotify(w.buf[:n], func(mask uint32, name string) {
			if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 && name == pipeName {
				ev.created = true
			}
			if mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0 && name == pipeName {
				ev.removed = true
			}
			if mask&(unix.IN_IGNORED|unix.IN_UNMOUNT|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_Q_OVERFLOW) != 0 {
				ev.invalid = true
			}
		})
		if err != nil {
			return ev, err
		}
	}
}

// wait blocks until events arrive, timeout passes (timeout < 0: never) or
// ctx is done (then it returns ctx.Err()), and returns the events read.
func (w *dirWatch) wait(ctx context.Context, timeout time.Duration) (watchEvents, error) {
	if err := ctx.Err(); err != nil {
		return watchEvents{}, err
	}
	defer armWake(ctx, w.wake)()
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	fds := []unix.PollFd{
		{Fd: int32(w.fd), Events: unix.POLLIN},
		{Fd: int32(w.wake), Events: unix.POLLIN},
	}
	for {
		_, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue // the timeout restarts: only a retry comes later
		}
		if err != nil {
			return watchEvents{}, fmt.Errorf("poll inotify: %w", err)
		}
		break
	}
	if err := ctx.Err(); err != nil {
		return watchEvents{}, err
	}
	return w.drain()
}

// parseInotify walks a buffer of struct inotify_event records (wd s32,
// mask u32, cookie u32, len u32, then len bytes of NUL-padded name) and
// calls fn for each. A record running past the buffer is an error.
func parseInotify(b []byte, fn func(mask uint32, name string)) error {
	const hdr = 16
	for len(b) > 0 {
		if len(b) < hdr {
			return fmt.Errorf("inotify: %d stray bytes after the last event", len(b))
		}
		mask := byteOrder.Uint32(b[4:8])
		n := byteOrder.Uint32(b[12:16])
		if uint64(n) > uint64(len(b)-hdr) {
			return fmt.Errorf("inotify: event name of %d bytes, %d left", n, len(b)-hdr)
		}
		name := b[hdr : hdr+int(n)]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		fn(mask, string(name))
		b = b[hdr+int(n):]
	}
	return nil
}
