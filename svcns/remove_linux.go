//go:build linux

package svcns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// termWait is how long Remove waits after SIGTERM before SIGKILL.
const termWait = 2 * time.Second

const nfsdMagic = 0x6e667364 // NFSD_MAGIC (linux/magic.h)

// Processes lists the processes whose network namespace (that of their
// main thread, /proc/PID/ns/net) is this one, matched by device and inode;
// never by name. Empty when the namespace is absent. This process is never
// listed: its main thread may be inside for a moment, running a Do.
func (n *NS) Processes() ([]int, error) {
	n.mu.Lock()
	fd, id := n.fd, n.id
	n.mu.Unlock()
	if fd < 0 {
		return nil, nil
	}
	return processesIn(id)
}

func processesIn(id nsID) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("svcns: list processes: %w", err)
	}
	var pids []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || pid == self {
			continue
		}
		if inNS(pid, id) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// inNS: pid's main thread is in namespace id (false when it is gone or a
// zombie).
func inNS(pid int, id nsID) bool {
	got, err := pathID("/proc/" + strconv.Itoa(pid) + "/ns/net")
	return err == nil && got == id
}

// NfsdThreads is the namespace's nfsd thread count (RunDir/nfsd/threads),
// 0 when the nfsd filesystem is not mounted there.
func (n *NS) NfsdThreads() (int, error) {
	dir := filepath.Join(n.cfg.RunDir, "nfsd")
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, fmt.Errorf("svcns: %s: statfs %s: %w", n.cfg.Name, dir, err)
	}
	if fs.Type != nfsdMagic {
		return 0, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "threads"))
	if err != nil {
		return 0, fmt.Errorf("svcns: %s: read nfsd threads: %w", n.cfg.Name, err)
	}
	t, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("svcns: %s: nfsd threads %q: %w", n.cfg.Name, b, err)
	}
	return t, nil
}

// Remove tears the namespace down, in this order, and stops at the first
// step that fails (an error means the service may still be served here):
//  1. every process in the namespace gets SIGTERM, then, after a short
//     bounded wait, SIGKILL, until none is left;
//  2. nfsd's threads: when there are any, 0 is written to its threads file
//     (what `rpc.nfsd 0` does); Remove refuses while any remain;
//  3. nfsd and rpc_pipefs are unmounted from RunDir (a busy mount is an
//     error: never detached lazily, the service could still be served);
//  4. the macvlan is deleted inside;
//  5. the namespace's name is unmounted and deleted (only if it still
//     names this namespace);
//  6. RunDir is deleted, refused while anything is mounted below it.
//
// Absent pieces are fine, so Remove is idempotent. ctx bounds it.
func (n *NS) Remove(ctx context.Context) error {
	n.removeMu.Lock()
	defer n.removeMu.Unlock()
	name := n.cfg.Name
	n.mu.Lock()
	fd, id, ownDir, again := n.fd, n.id, n.runDirOwned, n.removed
	n.mu.Unlock()
	if fd >= 0 {
		if err := n.stopProcesses(ctx, id); err != nil {
			return fmt.Errorf("svcns: remove %s: stop its processes: %w", name, err)
		}
		if err := n.stopNfsd(ownDir); err != nil {
			return fmt.Errorf("svcns: remove %s: %w", name, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("svcns: remove %s: %w", name, err)
	}
	for _, fs := range []string{"nfsd", "rpc_pipefs"} {
		if err := unmountAll(filepath.Join(n.cfg.RunDir, fs)); err != nil {
			return fmt.Errorf("svcns: remove %s: %w", name, err)
		}
	}
	if fd >= 0 {
		if err := n.Do(func() error { return deleteLink(n.cfg.Link) }); err != nil {
			return fmt.Errorf("svcns: remove %s: delete link %s inside: %w", name, n.cfg.Link, err)
		}
	}
	if err := n.removeName(fd, id); err != nil {
		return fmt.Errorf("svcns: remove %s: %w", name, err)
	}
	if ownDir {
		if err := removeRunDir(n.cfg.RunDir); err != nil {
			return fmt.Errorf("svcns: remove %s: %w", name, err)
		}
	}
	n.mu.Lock()
	if n.fd >= 0 {
		unix.Close(n.fd)
		n.fd = -1
	}
	n.removed = true
	n.mu.Unlock()
	if !again {
		n.log.Info("service namespace removed")
	}
	return nil
}

// stopProcesses signals through pidfds: a pid is checked to be in the
// namespace after its pidfd is open, so a reused pid is never signalled.
func (n *NS) stopProcesses(ctx context.Context, id nsID) error {
	for round := 0; ; round++ {
		pids, err := processesIn(id)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%d still running (%v): %w", len(pids), pids, err)
		}
		var pfds []int
		closeAll := func() {
			for _, p := range pfds {
				unix.Close(p)
			}
		}
		for _, pid := range pids {
			pfd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue // gone
			}
			if !inNS(pid, id) { // the pid was reused meanwhile: not ours
				unix.Close(pfd)
				continue
			}
			pfds = append(pfds, pfd)
		}
		sig := unix.SIGTERM
		if round > 0 {
			sig = unix.SIGKILL
		}
		n.log.Info("stopping the namespace's processes", "pids", pids, "signal", sig.String())
		for _, p := range pfds {
			if err := unix.PidfdSendSignal(p, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				closeAll()
				return fmt.Errorf("signal: %w", err)
			}
		}
		wait := termWait
		if sig == unix.SIGKILL {
			wait = time.Minute // bounded by ctx
		}
		waitExited(ctx, pfds, wait)
		closeAll()
	}
}

// waitExited waits until every pidfd says its process exited, d passed or
// ctx ended.
func waitExited(ctx context.Context, pfds []int, d time.Duration) {
	deadline := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	pending := pfds
	for len(pending) > 0 {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return
		}
		// Wake at least every 100 ms to notice a cancelled ctx without a deadline.
		ms := min(left.Milliseconds()+1, 100)
		fds := make([]unix.PollFd, len(pending))
		for i, p := range pending {
			fds[i] = unix.PollFd{Fd: int32(p), Events: unix.POLLIN}
		}
		if _, err := unix.Poll(fds, int(ms)); err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		var still []int
		for i, f := range fds {
			if f.Revents == 0 {
				still = append(still, pending[i])
			}
		}
		pending = still
	}
}

// stopNfsd writes 0 to nfsd's threads when it has any, and refuses while
// any remain.
func (n *NS) stopNfsd(ownDir bool) error {
	if ownDir {
		if err := n.mountNfsdToCheck(); err != nil {
			return err
		}
	}
	t, err := n.NfsdThreads()
	if err != nil {
		return err
	}
	if t == 0 {
		return nil
	}
	n.log.Warn("nfsd still has threads in the namespace: stopping them", "threads", t)
	file := filepath.Join(n.cfg.RunDir, "nfsd", "threads")
	werr := os.WriteFile(file, []byte("0\n"), 0)
	if t, err = n.NfsdThreads(); err != nil {
		return err
	}
	if t > 0 {
		return fmt.Errorf("nfsd has %d threads after writing 0 to %s (%v): refused, the service may still be served", t, file, werr)
	}
	return nil
}

// mountNfsdToCheck mounts the namespace's nfsd filesystem at RunDir/nfsd
// (from inside) when the kernel has it and it is not mounted there (a
// half-made or hand-made namespace): nfsd may run in the namespace all the
// same, and Remove must see its threads. Step 3 unmounts it.
func (n *NS) mountNfsdToCheck() error {
	if haveFilesystems("nfsd") != nil {
		return nil // no nfsd module: no nfsd threads anywhere
	}
	dir := filepath.Join(n.cfg.RunDir, "nfsd")
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err == nil && fs.Type == nfsdMagic {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make %s to check nfsd's threads: %w", dir, err)
	}
	if err := n.Do(func() error {
		return unix.Mount("nfsd", dir, "nfsd", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	}); err != nil {
		return fmt.Errorf("mount nfsd at %s from inside to check its threads: %w", dir, err)
	}
	return nil
}

// unmountAll unmounts everything mounted at dir (not lazily: a busy
// mount is an error).
func unmountAll(dir string) error {
	for range 16 {
		mounted, err := isMountPoint(dir)
		if err != nil || !mounted {
			return err
		}
		if err := unix.Unmount(dir, 0); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted after 16 unmounts", dir)
}

// removeName unmounts and deletes the namespace's file, unless it names
// another namespace now.
func (n *NS) removeName(fd int, id nsID) error {
	if _, err := os.Lstat(n.path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if fd >= 0 {
		if got, err := pathID(n.path); err == nil && got != id {
			var fs unix.Statfs_t
			if unix.Statfs(n.path, &fs) == nil && fs.Type == unix.NSFS_MAGIC {
				return fmt.Errorf("%s names another namespace now: left alone", n.path)
			}
		}
	}
	// Detached as `ip netns del` does: the bind has no users of its own,
	// and its copies in other mount namespaces go with it.
	if err := unix.Unmount(n.path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", n.path, err)
	}
	if err := os.Remove(n.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", n.path, err)
	}
	return nil
}

// removeRunDir deletes dir, refusing while anything is mounted at or
// below it (deleting would reach into the mounted filesystem).
func removeRunDir(dir string) error {
	mps, err := mountPoints()
	if err != nil {
		return err
	}
	for _, mp := range mps {
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			return fmt.Errorf("delete %s: %s is mounted below it", dir, mp)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("delete %s: %w", dir, err)
	}
	return nil
}

func isMountPoint(dir string) (bool, error) {
	mps, err := mountPoints()
	if err != nil {
		return false, err
	}
	for _, mp := range mps {
		if mp == dir {
			return true, nil
		}
	}
	return false, nil
}

// mountPoints lists this process's mount points (/proc/self/mountinfo).
func mountPoints() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			mps = append(mps, unescapeMount(fields[4]))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	return mps, nil
}

// unescapeMount undoes the kernel's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
