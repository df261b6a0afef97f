//go:build linux

// Package slowfs is a test helper: a FUSE passthrough of a directory whose
// fsync and fdatasync (files and directories) take an extra, adjustable
// delay — a slow disk under a data directory, for the tests of how a node
// with one behaves. Everything else passes straight through to the backing
// directory (a full backing tmpfs still answers ENOSPC).
//
// The FUSE server runs in the calling process: the mount answers only while
// that process lives (when it dies, the kernel aborts the connection and
// the mount answers ENOTCONN until it is unmounted). Needs root and
// /dev/fuse.
package slowfs

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FS is one mounted slow passthrough.
type FS struct {
	Dir     string // the mount point
	backing string
	server  *fuse.Server
	delay   atomic.Int64 // ns added to every fsync
	syncs   atomic.Uint64
}

// Usable says why a slow disk cannot be mounted here ("" when it can).
func Usable() string {
	if os.Geteuid() != 0 {
		return "needs root to mount a FUSE file system"
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Sprintf("no usable /dev/fuse: %v", err)
	}
	f.Close()
	return ""
}

// Mount mounts a passthrough of backing on mountpoint (both existing
// directories), with no delay to begin with.
func Mount(backing, mountpoint string) (*FS, error) {
	f := &FS{Dir: mountpoint, backing: backing}
	rootOps, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("slowfs: loopback root %s: %w", backing, err)
	}
	root := &node{LoopbackNode: rootOps.(*fs.LoopbackNode), fs: f}
	server, err := fs.Mount(mountpoint, root, &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:        "nsmd-slowfs",
			Name:          "slowfs",
			DirectMount:   true,
			AllowOther:    true,
			DisableXAttrs: true,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("slowfs: mount %s on %s: %w", backing, mountpoint, err)
	}
	f.server = server
	return f, nil
}

// SetDelay sets the time every fsync/fdatasync takes on top of the backing
// directory's own (0: none).
func (f *FS) SetDelay(d time.Duration) { f.delay.Store(int64(d)) }

// Delay is the current added fsync delay.
func (f *FS) Delay() time.Duration { return time.Duration(f.delay.Load()) }

// Syncs counts the fsync/fdatasync calls served.
func (f *FS) Syncs() uint64 { return f.syncs.Load() }

// Unmount drops any delay and unmounts (lazily if the mount is busy). It
// waits a second at most for the server to stop: a process that
// unshared its mount namespace while the mount was up (an nsmd started by
// another test with unshare --mount) keeps a copy of it, and the kernel
// ends the connection only when that copy goes too — or when this process
// exits. Where fusectl is mounted, the connection is aborted instead, and
// such copies answer ENOTCONN.
func (f *FS) Unmount() error {
	f.SetDelay(0)
	var st syscall.Stat_t
	statErr := syscall.Stat(f.Dir, &st)
	if err := syscall.Unmount(f.Dir, 0); err != nil {
		if lerr := syscall.Unmount(f.Dir, syscall.MNT_DETACH); lerr != nil {
			return fmt.Errorf("slowfs: unmount %s: %w (lazily: %w)", f.Dir, err, lerr)
		}
	}
	if statErr == nil {
		abort := fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", unix.Minor(st.Dev))
		os.WriteFile(abort, []byte("1"), 0) // absent without fusectl
	}
	done := make(chan struct{})
	go func() { f.server.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		// Still referenced elsewhere (see above): its readers end with
		// this process.
	}
	return nil
}

// node is a loopback node whose fsync waits first.
type node struct {
	*fs.LoopbackNode
	fs *FS
}

var (
	_ fs.NodeWrapChilder = (*node)(nil)
	_ fs.NodeFsyncer     = (*node)(nil)
)

func (n *node) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), fs: n.fs}
}

// Fsync serves fsync and fdatasync of files and directories: the delay,
// then the backing file's own sync.
func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	n.fs.syncs.Add(1)
	if d := n.fs.Delay(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return syscall.EINTR
		}
	}
	if s, ok := fh.(fs.FileFsyncer); ok {
		return s.Fsync(ctx, flags)
	}
	return 0
}
