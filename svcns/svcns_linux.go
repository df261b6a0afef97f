//go:build linux

package svcns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// NS is one service namespace. Its methods are safe for concurrent use.
type NS struct {
	cfg  Config
	path string // NetnsDir/<Name>
	log  *slog.Logger

	removeMu sync.Mutex // serialises Remove

	mu sync.Mutex // guards what follows
	fd int        // the namespace (held open), -1 when absent or removed
	id nsID       // its identity, valid while fd >= 0
	// runDirOwned: Remove may delete RunDir. False only in a Create that
	// failed before making it (someone else's directory stays).
	runDirOwned bool
	removed     bool
}

// nsID is a namespace's identity: the nsfs device and inode.
type nsID struct{ dev, ino uint64 }

// Name is the namespace's name.
func (n *NS) Name() string { return n.cfg.Name }

// Path is the namespace's file, /run/netns/<Name>.
func (n *NS) Path() string { return n.path }

// RunDir is the service's run directory.
func (n *NS) RunDir() string { return n.cfg.RunDir }

// Link is the macvlan's name inside the namespace.
func (n *NS) Link() string { return n.cfg.Link }

// Create makes the namespace, its macvlan and its run directory (with
// nfsd and rpc_pipefs mounted from inside when cfg.Mounts). It refuses
// (ErrExists) when the name or the run directory exists, and when the
// parent interface is missing or the kernel lacks a filesystem, before
// changing anything; a failure half-way is undone.
func Create(cfg Config) (*NS, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	parent, err := net.InterfaceByName(cfg.Parent)
	if err != nil {
		return nil, fmt.Errorf("svcns: %s: parent interface %q in this namespace: %w", cfg.Name, cfg.Parent, err)
	}
	if cfg.Mounts {
		if err := haveFilesystems("nfsd", "rpc_pipefs"); err != nil {
			return nil, fmt.Errorf("svcns: %s: %w", cfg.Name, err)
		}
	}
	path := filepath.Join(NetnsDir, cfg.Name)
	for _, p := range []string{path, cfg.RunDir} {
		if _, err := os.Lstat(p); err == nil {
			return nil, fmt.Errorf("%w: %s (remove the stale namespace first)", ErrExists, p)
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("svcns: %s: %w", cfg.Name, err)
		}
	}
	if err := prepareNetnsDir(); err != nil {
		return nil, fmt.Errorf("svcns: %s: %w", cfg.Name, err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%w: %s", ErrExists, path)
		}
		return nil, fmt.Errorf("svcns: %s: create the namespace file: %w", cfg.Name, err)
	}
	f.Close()
	n := &NS{cfg: cfg, path: path, log: cfg.Logger.With("netns", cfg.Name), fd: -1}
	undo := func(err error) (*NS, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if rerr := n.Remove(ctx); rerr != nil {
			n.log.Error("undoing a failed create failed", "err", rerr)
			return nil, errors.Join(err, fmt.Errorf("undo: %w", rerr))
		}
		return nil, err
	}
	fd, err := newNetns(path)
	if err != nil {
		return undo(fmt.Errorf("svcns: %s: %w", cfg.Name, err))
	}
	id, err := fdID(fd)
	if err != nil {
		unix.Close(fd)
		return undo(fmt.Errorf("svcns: %s: %w", cfg.Name, err))
	}
	n.mu.Lock()
	n.fd, n.id = fd, id
	n.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(cfg.RunDir), 0o755); err != nil {
		return undo(fmt.Errorf("svcns: %s: run directory: %w", cfg.Name, err))
	}
	if err := os.Mkdir(cfg.RunDir, 0o755); err != nil { // not MkdirAll: it must be new
		return undo(fmt.Errorf("svcns: %s: run directory: %w", cfg.Name, err))
	}
	n.mu.Lock()
	n.runDirOwned = true
	n.mu.Unlock()
	for _, d := range []string{"nfsd", "rpc_pipefs", "run", "state"} {
		if err := os.Mkdir(filepath.Join(cfg.RunDir, d), 0o755); err != nil {
			return undo(fmt.Errorf("svcns: %s: run directory: %w", cfg.Name, err))
		}
	}
	// Made under a temporary name, then renamed inside: before 6.14
	// (6.1, 6.12) the kernel looks the new link's name up in the
	// sender's namespace, where the parent may have it (EEXIST).
	tmp := tempLinkName(cfg.Name)
	if err := createMacvlan(parent.Index, tmp, fd); err != nil {
		return undo(fmt.Errorf("svcns: %s: create macvlan %s on %s inside: %w", cfg.Name, tmp, cfg.Parent, err))
	}
	if err := n.Do(func() error {
		if err := renameLink(tmp, cfg.Link); err != nil {
			return fmt.Errorf("rename %s to %s inside: %w", tmp, cfg.Link, err)
		}
		for _, l := range []string{"lo", cfg.Link} {
			if err := setUp(l); err != nil {
				return fmt.Errorf("set %s up inside: %w", l, err)
			}
		}
		return nil
	}); err != nil {
		return undo(fmt.Errorf("svcns: %s: %w", cfg.Name, err))
	}
	if cfg.Mounts {
		if err := n.Do(func() error {
			for _, fs := range []string{"nfsd", "rpc_pipefs"} {
				if err := unix.Mount(fs, filepath.Join(cfg.RunDir, fs), fs, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
					return fmt.Errorf("mount %s at %s from inside: %w", fs, filepath.Join(cfg.RunDir, fs), err)
				}
			}
			return nil
		}); err != nil {
			return undo(fmt.Errorf("svcns: %s: %w", cfg.Name, err))
		}
	}
	n.log.Info("service namespace created", "link", cfg.Link, "parent", cfg.Parent, "run_dir", cfg.RunDir, "mounts", cfg.Mounts)
	return n, nil
}

// Open finds a namespace already there (a predecessor's): found is false
// when neither its file nor its run directory exists. A half-made one (a
// namespace file that is not a namespace, or a run directory alone) is
// found too, so Remove can clear it; Do on it returns an error. Open
// refuses a name that is this process's own network namespace or the
// host's (PID 1's): Remove would stop every process in it.
func Open(cfg Config) (n *NS, found bool, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, false, err
	}
	cfg = cfg.withDefaults()
	path := filepath.Join(NetnsDir, cfg.Name)
	_, ferr := os.Lstat(path)
	_, derr := os.Lstat(cfg.RunDir)
	for _, e := range []error{ferr, derr} {
		if e != nil && !errors.Is(e, os.ErrNotExist) {
			return nil, false, fmt.Errorf("svcns: open %s: %w", cfg.Name, e)
		}
	}
	if ferr != nil && derr != nil {
		return nil, false, nil
	}
	n = &NS{cfg: cfg, path: path, log: cfg.Logger.With("netns", cfg.Name), fd: -1, runDirOwned: true}
	if ferr == nil {
		fd, id, ok, err := openNetnsFile(path)
		if err != nil {
			return nil, false, fmt.Errorf("svcns: open %s: %w", cfg.Name, err)
		}
		if ok {
			if err := notOwnOrHost(id); err != nil {
				unix.Close(fd)
				return nil, false, fmt.Errorf("svcns: open %s: %w", cfg.Name, err)
			}
			n.fd, n.id = fd, id
		}
	}
	return n, true, nil
}

// openNetnsFile opens path; ok is false when it is not a namespace (an
// empty file a failed create left).
func openNetnsFile(path string) (fd int, id nsID, ok bool, err error) {
	fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nsID{}, false, fmt.Errorf("open %s: %w", path, err)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		unix.Close(fd)
		return -1, nsID{}, false, fmt.Errorf("statfs %s: %w", path, err)
	}
	if fs.Type != unix.NSFS_MAGIC {
		unix.Close(fd)
		return -1, nsID{}, false, nil
	}
	id, err = fdID(fd)
	if err != nil {
		unix.Close(fd)
		return -1, nsID{}, false, err
	}
	return fd, id, true, nil
}

func notOwnOrHost(id nsID) error {
	for _, p := range []string{"/proc/self/ns/net", "/proc/thread-self/ns/net", "/proc/1/ns/net"} {
		other, err := pathID(p)
		if p == "/proc/1/ns/net" && errors.Is(err, unix.EACCES) {
			continue // PID 1 is beyond this process (a container's sandbox)
		}
		if err != nil {
			return err
		}
		if other == id {
			return fmt.Errorf("the namespace is the one of %s: not a service namespace, refused", p)
		}
	}
	return nil
}

func fdID(fd int) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nsID{}, fmt.Errorf("stat namespace: %w", err)
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

func pathID(p string) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return nsID{}, fmt.Errorf("stat %s: %w", p, err)
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// prepareNetnsDir makes /run/netns a shared mount point, as iproute2 does:
// the namespaces' bind mounts then propagate into the mount namespaces
// `ip netns exec` makes (slaves of this one) and back out of peers.
func prepareNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return fmt.Errorf("make %s: %w", NetnsDir, err)
	}
	err := unix.Mount("none", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet: bind it onto itself
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s onto itself: %w", NetnsDir, err)
		}
		err = unix.Mount("none", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s a shared mount: %w", NetnsDir, err)
	}
	return nil
}

// newNetns makes a new network namespace and binds it onto path (an
// existing empty file), returning a descriptor of it. It runs on a
// goroutine of its own, locked to its OS thread: unshare moves only that
// thread. The thread is moved back to its namespace before it is unlocked;
// if that fails, it is never unlocked, so Go ends the thread with the
// goroutine and no other goroutine ever runs in the wrong namespace.
func newNetns(path string) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("open this thread's namespace: %w", err)}
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("unshare the network namespace: %w", err)}
			return
		}
		r := func() result {
			self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
				return result{-1, fmt.Errorf("bind %s onto %s: %w", self, path, err)}
			}
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return result{-1, fmt.Errorf("open %s: %w", path, err)}
			}
			return result{fd, nil}
		}()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			if r.fd >= 0 {
				unix.Close(r.fd)
			}
			// Still locked: the thread dies with this goroutine.
			ch <- result{-1, errors.Join(r.err, fmt.Errorf("return to the original network namespace (thread discarded): %w", err))}
			return
		}
		runtime.UnlockOSThread()
		ch <- r
	}()
	r := <-ch
	return r.fd, r.err
}

// dupFD is a descriptor of the namespace for one Do.
func (n *NS) dupFD() (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.removed {
		return -1, fmt.Errorf("svcns: %s: removed", n.cfg.Name)
	}
	if n.fd < 0 {
		return -1, fmt.Errorf("svcns: %s: %s is not a network namespace", n.cfg.Name, n.path)
	}
	fd, err := unix.FcntlInt(uintptr(n.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("svcns: %s: dup: %w", n.cfg.Name, err)
	}
	return fd, nil
}

// Do runs fn on an OS thread locked inside the namespace and waits for
// it. Sockets (netlink and packet sockets too) fn opens belong to the
// namespace for good; goroutines fn starts do not run inside it. The
// thread goes back to its own namespace afterwards; if it cannot, the
// thread is discarded (never unlocked) and Do says so. A panic in fn is
// raised again in the caller.
func (n *NS) Do(fn func() error) error {
	fd, err := n.dupFD()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	type result struct {
		err      error
		panicked bool
		p        any
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("svcns: %s: open this thread's namespace: %w", n.cfg.Name, err)}
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("svcns: %s: enter: %w", n.cfg.Name, err)}
			return
		}
		var r result
		func() {
			defer func() {
				if p := recover(); p != nil {
					r = result{panicked: true, p: p}
				}
			}()
			r.err = fn()
		}()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			r.err = errors.Join(r.err, fmt.Errorf("svcns: %s: return to the original network namespace (thread discarded): %w", n.cfg.Name, err))
			ch <- r
			return // still locked: Go ends the thread with this goroutine
		}
		runtime.UnlockOSThread()
		ch <- r
	}()
	r := <-ch
	if r.panicked {
		panic(r.p)
	}
	return r.err
}

// Listen is net.Listen inside the namespace. The host part of address
// must be empty or an IP literal (no name is resolved).
func (n *NS) Listen(network, address string) (net.Listener, error) {
	if err := literal(address); err != nil {
		return nil, fmt.Errorf("svcns: %s: listen: %w", n.cfg.Name, err)
	}
	var l net.Listener
	err := n.Do(func() (err error) {
		l, err = net.Listen(network, address)
		return err
	})
	return l, err
}

// ListenPacket is net.ListenPacket inside the namespace (address as for
// Listen).
func (n *NS) ListenPacket(network, address string) (net.PacketConn, error) {
	if err := literal(address); err != nil {
		return nil, fmt.Errorf("svcns: %s: listen: %w", n.cfg.Name, err)
	}
	var c net.PacketConn
	err := n.Do(func() (err error) {
		c, err = net.ListenPacket(network, address)
		return err
	})
	return c, err
}

// DialContext dials from inside the namespace with d (nil: a zero
// Dialer; its LocalAddr picks the source, e.g. the service's address).
// The host part of address must be an IP literal: a name would be
// resolved by goroutines outside the namespace.
func (n *NS) DialContext(ctx context.Context, d *net.Dialer, network, address string) (net.Conn, error) {
	if err := literal(address); err != nil {
		return nil, fmt.Errorf("svcns: %s: dial: %w", n.cfg.Name, err)
	}
	if d == nil {
		d = &net.Dialer{}
	}
	var c net.Conn
	err := n.Do(func() (err error) {
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

func literal(address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if host == "" {
		return nil
	}
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i]
	}
	if net.ParseIP(host) == nil {
		return fmt.Errorf("%q: the host must be an IP literal", address)
	}
	return nil
}

// haveFilesystems checks /proc/filesystems for each of names.
func haveFilesystems(names ...string) error {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("read /proc/filesystems: %w", err)
	}
	have := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			have[f[len(f)-1]] = true
		}
	}
	var missing []string
	for _, n := range names {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the kernel has no %s filesystem (not in /proc/filesystems: load the NFS server modules, e.g. modprobe nfsd)", strings.Join(missing, " and no "))
	}
	return nil
}
