package grace

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// KeeperConfig configures a Keeper.
type KeeperConfig struct {
	// Proc is the procfs root ("" = /proc).
	Proc string
	// NFSd and Within: where nfsd's filesystem is and how the grace files
	// are touched (KernelGrace's fields of the same names).
	NFSd   string
	Within func(fn func() error) error
	// LocksOn, when set, is a path of the filesystem whose locks count as
	// reclaim activity (/proc/locks lists every lock of the host; a
	// service counts only those on its own filesystem). "": every lock.
	LocksOn string
	// Settle is how long reclaims must be quiet, after the last expected
	// client came back, before a grace period is ended (default 3 s).
	Settle time.Duration
	// Poll is how often the kernel's state is read (default 200 ms).
	Poll time.Duration
	// OnEnd, when set, is called once per lock manager when its grace
	// ended (by the Keeper or by the kernel). It must not block.
	OnEnd func(m Manager, reason string, after time.Duration)
	// OnBack, when set, is called when a client of m comes back for the
	// first time; last: it was the last expected client of m still out.
	// It must not block.
	OnBack func(m Manager, name string, last bool)
	Logger *slog.Logger
	Now    func() time.Time
}

// Keeper ends the kernel's grace periods of one server incarnation as soon
// as the rule of Reclaims allows, and reports how and when each ended. One
// Keeper serves one leadership term: it is built when the takeover
// committed, learns the NFSv4 clients that may reclaim when nfsd's
// GraceStart is answered, is told every client that comes back, and Run
// polls the kernel until both grace periods are over.
type Keeper struct {
	cfg     KeeperConfig
	kernel  KernelGrace
	log     *slog.Logger
	started time.Time
	r       *Reclaims

	mu      sync.Mutex
	v4Known bool // ExpectV4 was called: nfsd's GraceStart was answered
	ended   map[Manager]End
	// asked: the Keeper wrote the end of m's grace (with this reason) and
	// waits to read it over: a kernel may end it after the write returns.
	asked   map[Manager]askedEnd
	absent  map[Manager]bool // its control file is missing: not running here
	locks   int              // POSIX locks last seen in /proc/locks (-1: not read yet)
	lastErr string
}

// askedEnd is an end of grace the Keeper asked the kernel for.
type askedEnd struct {
	reason string
	at     time.Time
}

// reaskAfter is how long the Keeper waits for an end it asked for before
// it asks again.
const reaskAfter = 2 * time.Second

// End is how one lock manager's grace period ended: when it was seen
// over, how long after the takeover, and why (a Reason constant).
type End struct {
	At     time.Time
	After  time.Duration
	Reason string
}

// NewKeeper starts tracking a server incarnation that began at started,
// expecting the hosts in nlmHosts (monitored at takeover) to reclaim.
func NewKeeper(cfg KeeperConfig, nlmHosts []string, started time.Time) *Keeper {
	if cfg.Settle <= 0 {
		cfg.Settle = 3 * time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Keeper{
		cfg:     cfg,
		kernel:  KernelGrace{Proc: cfg.Proc, NFSd: cfg.NFSd, Within: cfg.Within},
		log:     cfg.Logger.With("component", "grace"),
		started: started,
		r:       NewReclaims(ReclaimPlan{NLMHosts: nlmHosts, Settle: cfg.Settle}, started),
		ended:   map[Manager]End{},
		asked:   map[Manager]askedEnd{},
		absent:  map[Manager]bool{},
		locks:   -1,
	}
}

// ExpectV4 sets the NFSv4 clients that may reclaim (the recovery epoch's
// records nfsd was given at GraceStart). Until it is called, the NFSv4
// grace is left to the kernel.
func (k *Keeper) ExpectV4(names []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.v4Known = true
	k.r.mu.Lock()
	k.r.expect(NFSv4, names)
	k.r.mu.Unlock()
}

// Back records that an expected client came back (see Reclaims.Back).
func (k *Keeper) Back(m Manager, name string) { k.back(m, name, k.cfg.Now()) }

func (k *Keeper) back(m Manager, name string, now time.Time) {
	if first, last := k.r.back(m, name, now); first && k.cfg.OnBack != nil {
		k.cfg.OnBack(m, name, last)
	}
}

// Run polls the kernel and ends each grace period when the rule allows,
// until both are over or ctx ends.
func (k *Keeper) Run(ctx context.Context) {
	t := time.NewTicker(k.cfg.Poll)
	defer t.Stop()
	for {
		if k.step() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// step does one round; true once every present manager's grace is over.
func (k *Keeper) step() bool {
	now := k.cfg.Now()
	k.sampleLocks(now)
	k.sampleV40Clients(now)
	done := true
	for _, m := range Managers() {
		if !k.stepManager(m, now) {
			done = false
		}
	}
	return done
}

// stepManager ends m's grace if it may; true when m is done (its grace is
// over, or it does not run here).
func (k *Keeper) stepManager(m Manager, now time.Time) bool {
	if k.endedAlready(m) {
		return true
	}
	in, err := k.kernel.InGrace(m)
	k.mu.Lock()
	k.absent[m] = errors.Is(err, ErrNoManager)
	k.mu.Unlock()
	if errors.Is(err, ErrNoManager) {
		return true // not running here: nothing to end
	}
	if err != nil {
		k.setErr(err)
		return false
	}
	if !in {
		k.markEnded(m, k.endReason(m), now)
		return true
	}
	if m == NFSv4 && !k.v4Expected() {
		return false // nfsd's GraceStart not answered yet: the kernel decides
	}
	k.mu.Lock()
	a, pending := k.asked[m]
	k.mu.Unlock()
	if pending && now.Sub(a.at) < reaskAfter {
		return false // asked: the kernel ends it when it gets to it
	}
	ok, reason, _ := k.r.MayEnd(m, now)
	if !ok {
		return false
	}
	err = k.kernel.End(m)
	if errors.Is(err, syscall.EBUSY) {
		// nfsd answers EBUSY when its grace already ended, or when its
		// client tracking is not active (still starting, or none): which
		// one, the file says.
		if in, rerr := k.kernel.InGrace(m); rerr == nil && !in {
			k.markEnded(m, k.endReason(m), now)
			return true
		}
		k.setErr(fmt.Errorf("%w: still in grace, so nfsd's client tracking is not active (yet); its own timer ends grace otherwise", err))
		return false
	}
	if err != nil {
		k.setErr(err)
		return false
	}
	// Written. Older kernels end grace in the write; newer ones ask
	// nfsd's laundromat to, and the write returns before it did: the
	// end is what the file says, now or at a later round.
	k.mu.Lock()
	k.asked[m] = askedEnd{reason: reason, at: now}
	k.mu.Unlock()
	if in, err := k.kernel.InGrace(m); err == nil && !in {
		k.markEnded(m, reason, now)
		return true
	}
	return false
}

// endReason is why m's grace is over when it is seen over: the reason the
// Keeper asked for it with, or the kernel's own end.
func (k *Keeper) endReason(m Manager) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if a, ok := k.asked[m]; ok {
		return a.reason
	}
	return ReasonKernel
}

func (k *Keeper) v4Expected() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.v4Known
}

func (k *Keeper) endedAlready(m Manager) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.ended[m]
	return ok
}

func (k *Keeper) markEnded(m Manager, reason string, now time.Time) {
	e := End{At: now, After: now.Sub(k.started), Reason: reason}
	k.mu.Lock()
	k.ended[m] = e
	k.mu.Unlock()
	back, want := k.r.Progress(m)
	k.log.Info("grace ended", "manager", m, "reason", reason, "after", e.After.Round(time.Millisecond),
		"clients_back", back, "clients_expected", want)
	if k.cfg.OnEnd != nil {
		k.cfg.OnEnd(m, reason, e.After)
	}
}

func (k *Keeper) setErr(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lastErr != err.Error() {
		k.log.Warn("grace control", "err", err)
	}
	k.lastErr = err.Error()
}

// sampleLocks counts the POSIX locks in /proc/locks: during grace only
// reclaims are granted, so a new one is reclaim activity.
func (k *Keeper) sampleLocks(now time.Time) {
	root := k.cfg.Proc
	if root == "" {
		root = "/proc"
	}
	b, err := os.ReadFile(filepath.Join(root, "locks"))
	if err != nil {
		return
	}
	dev := lockDevice(k.cfg.LocksOn)
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) > 5 && string(f[1]) == "POSIX" && bytes.HasPrefix(f[5], dev) {
			n++
		}
	}
	k.mu.Lock()
	grew := k.locks >= 0 && n > k.locks
	k.locks = n
	k.mu.Unlock()
	if grew {
		k.r.Activity(now)
	}
}

// lockDevice is how /proc/locks names the device of the filesystem that
// holds path ("MAJ:MIN:", hex): the prefix of its locks' third field. Nil
// (every lock) without path or when it cannot be read: more locks counted
// only delays an end of grace, never hastens one.
func lockDevice(path string) []byte {
	if path == "" {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil
	}
	return fmt.Appendf(nil, "%02x:%02x:", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)))
}

// sampleV40Clients counts an NFSv4.0 client as back once nfsd lists it
// confirmed: NFSv4.0 has no RECLAIM_COMPLETE, and its reclaims send no
// Create upcall (a reclaimed open needs no OPEN_CONFIRM).
func (k *Keeper) sampleV40Clients(now time.Time) {
	if !k.v4Expected() {
		return
	}
	cs, err := k.kernel.Clients()
	if err != nil {
		return
	}
	for _, c := range cs {
		if c.Minor == 0 && c.Confirmed() {
			k.back(NFSv4, c.Name, now)
		}
	}
}

// Status is the state of both grace periods of one server incarnation.
type Status struct {
	// SMState is the sm_state of the incarnation.
	SMState int32
	Started time.Time
	Settle  time.Duration
	NLM     ManagerStatus
	NFSv4   ManagerStatus
	// Error is the last trouble ending a grace, or why nsmd does not.
	Error string
	// LastActivity is when reclaim activity was last seen (a client
	// back, a new lock in /proc/locks): nsmd ends a grace Settle after it.
	LastActivity time.Time
}

// Manager is the status of manager m.
func (s Status) Manager(m Manager) ManagerStatus {
	if m == NLM {
		return s.NLM
	}
	return s.NFSv4
}

// ManagerStatus is one lock manager's grace.
type ManagerStatus struct {
	// Expected is how many clients could reclaim; Back how many came back;
	// Missing names some that have not (at most 8).
	Expected int
	Back     int
	Missing  []string
	// Ended is how the grace ended (nil while it lasts).
	Ended *End
	// Absent: this lock manager does not run here (no lockd, or no nfsd).
	Absent bool
}

// Status reports both grace periods.
func (k *Keeper) Status() Status {
	s := Status{Started: k.started.UTC(), Settle: k.cfg.Settle, LastActivity: k.r.LastActivity().UTC()}
	k.mu.Lock()
	s.Error = k.lastErr
	ended := map[Manager]End{}
	for m, e := range k.ended {
		ended[m] = e
	}
	absent := map[Manager]bool{}
	for m, a := range k.absent {
		absent[m] = a
	}
	k.mu.Unlock()
	for m, ms := range map[Manager]*ManagerStatus{NLM: &s.NLM, NFSv4: &s.NFSv4} {
		ms.Back, ms.Expected = k.r.Progress(m)
		ms.Missing = k.r.Missing(m, 8)
		ms.Absent = absent[m]
		if e, ok := ended[m]; ok {
			e.At = e.At.UTC()
			ms.Ended = &e
		}
	}
	return s
}
