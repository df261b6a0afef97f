package grace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Manager names one of the kernel's lock managers that keep a grace period
// after a server (re)start: while any of them is in grace, Linux grants no
// new lock from either protocol, only reclaims (fs/nfs_common/grace.c:
// locks_in_grace is true while any registered manager is in grace).
type Manager string

// The kernel's lock managers.
const (
	// NLM is lockd (NFSv2/v3 locks); its grace starts with lockd and lasts
	// nlm_grace_period seconds.
	NLM Manager = "nlm"
	// NFSv4 is nfsd's NFSv4 state manager; its grace lasts nfsv4gracetime
	// seconds unless every client in the tracking database finished
	// reclaiming (RECLAIM_COMPLETE) sooner.
	NFSv4 Manager = "nfsv4"
)

// Managers lists every kernel lock manager, in a fixed order.
func Managers() []Manager { return []Manager{NLM, NFSv4} }

// ErrNoManager means the kernel does not offer the control file of that
// lock manager: no lockd or nfsd loaded, or a kernel older than the file.
var ErrNoManager = errors.New("grace: kernel lock manager not present")

// KernelGrace reads and ends the kernel lock managers' grace periods
// through procfs: /proc/fs/lockd/nlm_end_grace (lockd, Linux ≥ 3.19) and
// /proc/fs/nfsd/v4_end_grace (nfsd, where /proc/fs/nfsd is the nfsd
// filesystem). Reading either gives "Y" once that grace is over and "N"
// while it lasts; writing "Y" ends it at once (for nfsd this also makes
// nfsd tell its client-tracking daemon, cld.GraceDone).
type KernelGrace struct {
	// Proc is the procfs root; "" means /proc. Tests point it at a
	// directory of plain files.
	Proc string
	// NFSd is the directory of the nfsd filesystem ("" means
	// <Proc>/fs/nfsd): a network namespace other than the host's has its
	// own, mounted apart (a service's namespace).
	NFSd string
	// Within, when set, runs every read and write of lockd's control file
	// inside the lock managers' network namespace: nlm_end_grace acts on
	// the network namespace of the thread that reads or writes it,
	// whatever procfs it is opened in. (nfsd's files belong to the nfsd
	// filesystem they are in, NFSd, whichever thread reads them.)
	Within func(fn func() error) error
	// write, when set, replaces the write of "Y" to a control file (tests:
	// a kernel that ends grace later, or answers EBUSY).
	write func(path string) error
}

func (k KernelGrace) path(m Manager) string {
	root := k.Proc
	if root == "" {
		root = "/proc"
	}
	switch m {
	case NLM:
		return filepath.Join(root, "fs", "lockd", "nlm_end_grace")
	case NFSv4:
		return filepath.Join(k.nfsdDir(), "v4_end_grace")
	}
	return ""
}

// nfsdDir is the nfsd filesystem's directory.
func (k KernelGrace) nfsdDir() string {
	if k.NFSd != "" {
		return k.NFSd
	}
	root := k.Proc
	if root == "" {
		root = "/proc"
	}
	return filepath.Join(root, "fs", "nfsd")
}

// within runs fn, which touches m's control file, in the lock managers'
// network namespace when m's file acts on the toucher's (lockd's).
func (k KernelGrace) within(m Manager, fn func() error) error {
	if k.Within == nil || m != NLM {
		return fn()
	}
	return k.Within(fn)
}

// Clients lists nfsd's NFSv4 clients (NFSdClients) from the nfsd
// filesystem of k.
func (k KernelGrace) Clients() ([]V4Client, error) {
	return nfsdClientsIn(filepath.Join(k.nfsdDir(), "clients"))
}

// InGrace reports whether manager m is in its grace period now. A missing
// control file gives ErrNoManager.
func (k KernelGrace) InGrace(m Manager) (bool, error) {
	p := k.path(m)
	if p == "" {
		return false, fmt.Errorf("grace: unknown lock manager %q", m)
	}
	var b []byte
	err := k.within(m, func() (err error) {
		b, err = os.ReadFile(p)
		return err
	})
	if errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("%w: %s: no %s", ErrNoManager, m, p)
	}
	if err != nil {
		return false, fmt.Errorf("grace: read %s grace state: %w", m, err)
	}
	// lockd's file reads "Y\n" or "N\n" and a NUL.
	switch strings.TrimRight(string(b), " \n\x00") {
	case "N":
		return true, nil
	case "Y":
		return false, nil
	}
	return false, fmt.Errorf("grace: %s: unexpected content %q", p, b)
}

// End asks the kernel to end manager m's grace period. lockd and older
// nfsd end it in the write; a newer nfsd hands it to its laundromat and
// returns first, and answers EBUSY (kept in the error: errors.Is
// syscall.EBUSY) when grace already ended or its client tracking is not
// active. Read InGrace to know it ended.
func (k KernelGrace) End(m Manager) error {
	p := k.path(m)
	if p == "" {
		return fmt.Errorf("grace: unknown lock manager %q", m)
	}
	if k.write != nil {
		if err := k.within(m, func() error { return k.write(p) }); err != nil {
			return fmt.Errorf("grace: end %s grace: write %s: %w", m, p, err)
		}
		return nil
	}
	return k.within(m, func() error { return endGrace(m, p) })
}

// endGrace writes "Y" to m's control file p.
func endGrace(m Manager, p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s: no %s", ErrNoManager, m, p)
	}
	if err != nil {
		return fmt.Errorf("grace: end %s grace: %w", m, err)
	}
	_, err = f.Write([]byte("Y"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("grace: end %s grace: write %s: %w", m, p, err)
	}
	return nil
}
