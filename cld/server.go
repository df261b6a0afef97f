//go:build linux

package cld

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Record is one client that may reclaim: what GraceStart sends the kernel.
type Record struct {
	Name      []byte // the client's nfs_client_id4 / client_owner4 id, 1..MaxNameLen bytes
	PrincHash []byte // SHA-256 of its principal, empty for AUTH_SYS; dropped for version 1 kernels
}

// Store keeps the client records, with nfsdcld's two epochs: records of
// the current epoch (clients that hold state now) and of the recovery
// epoch (clients that may reclaim during this grace period).
//
// Methods are called concurrently (a burst of Creates arrives together,
// so a store can commit them as one group), except where the kernel's
// order matters: calls on the same client name come one at a time in
// arrival order, and GraceStart and GraceDone run alone, after every
// earlier call returned and before any later one starts.
//
// A method returns nil only once the change is committed. It returns an
// error when it cannot commit, and one wrapping ErrNotServing when this
// node may not answer now; the kernel then gets an error status, never 0.
// Methods must return soon after ctx is done (Config.OpTimeout, or
// shutdown): the server answers the kernel at once then, but holds back
// later calls on the same name until the method returned.
type Store interface {
	// Create records a client in the current epoch (v2: with its
	// principal's hash, empty for AUTH_SYS).
	Create(ctx context.Context, name, princHash []byte) error
	// Remove forgets a client in the current epoch.
	Remove(ctx context.Context, name []byte) error
	// Check: may the client reclaim? If so it is recorded in the current
	// epoch too. Only kernels using the oldest ops send Check.
	Check(ctx context.Context, name []byte) (bool, error)
	// GraceStart starts a grace period and returns the clients that may
	// reclaim (the recovery epoch's records).
	GraceStart(ctx context.Context) ([]Record, error)
	// GraceDone ends the grace period: the recovery epoch is forgotten.
	GraceDone(ctx context.Context) error
}

// Defaults of Config.
const (
	DefaultOpTimeout     = 15 * time.Second
	DefaultMaxInflight   = 64
	DefaultRetryInterval = 5 * time.Second
	// readBufSize is more than the largest message, so that an oversized
	// one reads as such rather than as two.
	readBufSize = 4096
	// badLogInterval spaces the log lines about malformed upcalls and
	// failed store calls.
	badLogInterval = time.Minute
)

// Config configures a Server. The zero value of each field means its
// default.
type Config struct {
	// PipefsDir is where rpc_pipefs is mounted; the pipe is
	// PipefsDir/nfsd/cld. Default DefaultPipefsDir.
	PipefsDir string
	// MountPipefs: mount rpc_pipefs at PipefsDir when it is not mounted
	// (needs CAP_SYS_ADMIN).
	MountPipefs bool
	// OpTimeout bounds each upcall from the moment it is read: when it
	// passes, the kernel is answered -EREMOTEIO (Check: -EACCES).
	// Default DefaultOpTimeout.
	OpTimeout time.Duration
	// MaxInflight bounds the upcalls read and not yet answered (the
	// kernel keeps the rest queued). Default DefaultMaxInflight.
	MaxInflight int
	// RetryInterval: how often a missing rpc_pipefs, or a pipe that
	// exists but cannot be opened, is tried again. Default
	// DefaultRetryInterval.
	RetryInterval time.Duration
	// Logger receives the structured logs. Default: discard.
	Logger *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
	// OpenPipe opens the pipe file. Default OpenPipeFile; tests open a
	// socketpair end instead (cldtest.Kernel.OpenPipe).
	OpenPipe func(path string) (*Pipe, error)
	// IsPipefs reports whether dir is an rpc_pipefs mount. Default
	// IsRPCPipefs; tests that fake the kernel in a temporary directory
	// replace it (cldtest.Kernel.IsPipefs).
	IsPipefs func(dir string) (bool, error)
}

// withDefaults returns c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.PipefsDir == "" {
		c.PipefsDir = DefaultPipefsDir
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = DefaultRetryInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.OpenPipe == nil {
		c.OpenPipe = OpenPipeFile
	}
	if c.IsPipefs == nil {
		c.IsPipefs = IsRPCPipefs
	}
	return c
}

// Validate reports the first value out of range, wrapping ErrConfig.
// Zero values are valid: they mean the defaults.
func (c Config) Validate() error {
	switch {
	case c.PipefsDir != "" && !filepath.IsAbs(c.PipefsDir):
		return fmt.Errorf("%w: PipefsDir %q is not an absolute path", ErrConfig, c.PipefsDir)
	case c.OpTimeout < 0:
		return fmt.Errorf("%w: OpTimeout %v is negative", ErrConfig, c.OpTimeout)
	case c.MaxInflight < 0:
		return fmt.Errorf("%w: MaxInflight %d is negative", ErrConfig, c.MaxInflight)
	case c.RetryInterval < 0:
		return fmt.Errorf("%w: RetryInterval %v is negative", ErrConfig, c.RetryInterval)
	}
	return nil
}

// States of Status.State.
const (
	StateStopped  = "stopped"   // Run is not running
	StateNoPipefs = "no_pipefs" // rpc_pipefs is not mounted at PipefsDir (Err says why)
	StateWaiting  = "waiting"   // waiting for nfsd to create the pipe
	StateOpen     = "open"      // the pipe is open and served
	StateError    = "error"     // the pipe or its directory cannot be used (Err says why)
)

// Status is the server's state for the status API and metrics.
type Status struct {
	Pipe  string    // the pipe's path
	State string    // one of the State constants
	Err   string    // why, in StateNoPipefs and StateError
	Since time.Time // when State (or Err) last changed
	// Version is the message version the kernel uses on this pipe: that
	// of the last well-formed upcall other than GetVersion since the pipe
	// was opened (0 before one).
	Version               uint8
	LastGraceStart        time.Time
	LastGraceStartRecords int
	// Upcalls counts the upcalls answered, by command ("create",
	// "remove", "check", "grace_done", "grace_start", "get_version").
	Upcalls map[string]uint64
	Failed  uint64 // answered with an error status (store failure, timeout, not serving)
	Refused uint64 // malformed, answered -EINVAL or -EOPNOTSUPP
}

// Server serves the kernel nfsd's client-tracking pipe for a Store, as
// nfs-utils' nfsdcld does.
type Server struct {
	store Store
	cfg   Config
	log   *slog.Logger
	m     *metrics
	path  string

	order    *order
	sem      chan struct{} // a slot per upcall read and not answered
	handlers sync.WaitGroup
	running  atomic.Bool

	badLog   logLimiter // malformed upcalls
	storeLog logLimiter // failed store calls and downcalls

	mu      sync.Mutex
	st      Status
	changed chan struct{} // closed and replaced when st changes, except counters

	onRead    func(Msg, error) // tests: called for each message read, in order
	onBlocked func(Msg)        // tests: called when an upcall must wait for earlier ones
	onAnswer  func(Msg)        // tests: called before an upcall's answer is written
}

// NewServer checks cfg, fills in its defaults and registers the metrics.
func NewServer(store Store, cfg Config) (*Server, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil Store", ErrConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		store:    store,
		cfg:      cfg,
		log:      cfg.Logger,
		m:        m,
		path:     filepath.Join(cfg.PipefsDir, pipeDir, pipeName),
		order:    newOrder(),
		sem:      make(chan struct{}, cfg.MaxInflight),
		badLog:   logLimiter{interval: badLogInterval},
		storeLog: logLimiter{interval: badLogInterval},
		changed:  make(chan struct{}),
	}
	s.st = Status{Pipe: s.path, State: StateStopped, Since: time.Now(), Upcalls: make(map[string]uint64)}
	return s, nil
}

// Status returns a copy of the server's state.
func (s *Server) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Upcalls = maps.Clone(s.st.Upcalls)
	return st
}

// StatusChanged returns a channel closed at the next change of Status
// (other than its counters). Take it before reading Status, to miss no
// change.
func (s *Server) StatusChanged() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Run serves the pipe until ctx is done: it makes sure rpc_pipefs is
// mounted, watches PipefsDir/nfsd for the pipe, opens it as soon as nfsd
// creates it (nfsd waits only about a second for a daemon), serves it,
// and when nfsd destroys it, closes it and waits for the next one. Every
// goroutine it starts has ended when it returns: upcalls in flight are
// answered (with an error status, their context being done) before the
// pipe is closed. It returns nil once ctx is done, and ErrRunning if
// another Run of s is running.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer s.running.Store(false)
	defer s.setState(StateStopped, "")
	nfsdDir := filepath.Join(s.cfg.PipefsDir, pipeDir)
	for ctx.Err() == nil {
		if err := s.ensurePipefs(); err != nil {
			s.setState(StateNoPipefs, err.Error())
			s.sleep(ctx, s.cfg.RetryInterval)
			continue
		}
		w, err := newDirWatch(nfsdDir)
		if err != nil {
			s.setState(StateError, fmt.Sprintf("cannot watch %s for nfsd's pipe: %v", nfsdDir, err))
			s.sleep(ctx, s.cfg.RetryInterval)
			continue
		}
		retry := s.watch(ctx, w)
		w.close()
		if retry {
			s.sleep(ctx, s.cfg.RetryInterval)
		}
	}
	s.handlers.Wait()
	return nil
}

// watch opens the pipe whenever it exists, serves it until it goes, and
// waits for the next one. It returns when ctx is done or the watch ended
// (retry: after a pause).
func (s *Server) watch(ctx context.Context, w *dirWatch) (retry bool) {
	for {
		// Events queued while the pipe was served are stale: this open
		// sees the directory as it is now.
		ev, err := w.drain()
		if err != nil {
			s.setState(StateError, fmt.Sprintf("watching %s: %v", w.dir, err))
			return true
		}
		if ev.invalid {
			return false
		}
		timeout := time.Duration(-1)
		p, err := s.cfg.OpenPipe(s.path)
		switch {
		case err == nil:
			gone, invalid, serr := s.serveWatched(ctx, w, p)
			if !gone {
				// Shutdown: answer what is in flight, then close.
				s.handlers.Wait()
				p.Close()
				s.pipeClosed()
				return false
			}
			// Upcalls still in the store finish on their own; their
			// answers have nowhere to go.
			p.Close()
			s.pipeClosed()
			if invalid {
				return false
			}
			if serr != nil {
				s.setState(StateError, fmt.Sprintf("reading %s: %v", s.path, serr))
				timeout = s.cfg.RetryInterval
				break
			}
			continue // the next pipe may be there already
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENXIO):
			// ENXIO: the file is there but nfsd is destroying the pipe.
			s.setState(StateWaiting, "")
		case errors.Is(err, fs.ErrPermission):
			s.setState(StateError, fmt.Sprintf("%v: opening %s needs root or CAP_DAC_OVERRIDE", err, s.path))
			timeout = s.cfg.RetryInterval
		default:
			s.setState(StateError, fmt.Sprintf("opening %s: %v", s.path, err))
			timeout = s.cfg.RetryInterval
		}
		ev, err = w.wait(ctx, timeout)
		if ctx.Err() != nil {
			return false
		}
		if err != nil {
			s.setState(StateError, fmt.Sprintf("watching %s: %v", w.dir, err))
			return true
		}
		if ev.invalid {
			return false
		}
	}
}

// errPipeReplaced ends the reads of a pipe whose file left the directory.
var errPipeReplaced = errors.New("cld: the pipe file was removed or replaced")

// serveWatched serves p while watching the directory: the kernel destroys
// a pipe without waking a reader blocked in poll when no upcall is queued
// (rpc_close_pipes wakes the wait queue only when it purges messages), so
// a stopped nfsd is seen in the directory (the file removed, or a new
// one created) rather than on the pipe. invalid: the watch itself ended.
func (s *Server) serveWatched(ctx context.Context, w *dirWatch, p *Pipe) (gone, invalid bool, err error) {
	rctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var watchDone sync.WaitGroup
	watchDone.Add(1)
	go func() {
		defer watchDone.Done()
		for {
			ev, err := w.wait(rctx, -1)
			switch {
			case rctx.Err() != nil:
				return
			case err != nil:
				s.log.Warn("cld: watching the pipe's directory", "dir", w.dir, "err", err)
				invalid = true
				stop(errPipeReplaced)
				return
			case ev.invalid:
				invalid = true
				stop(errPipeReplaced)
				return
			case ev.removed:
				// Not ev.created: the creation of the pipe being served
				// may come in after it was opened.
				stop(errPipeReplaced)
				return
			}
		}
	}()
	gone, err = s.serve(ctx, rctx, p)
	stop(nil)
	watchDone.Wait()
	return gone, invalid, err
}

// serve reads upcalls from p until ctx is done (gone false) or the pipe
// goes (gone true; err set when reading failed otherwise than by the
// pipe's end): read errors, or rctx ended by its directory watch.
func (s *Server) serve(ctx, rctx context.Context, p *Pipe) (gone bool, err error) {
	s.pipeOpened()
	buf := make([]byte, readBufSize)
	for {
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			return false, nil
		case <-rctx.Done():
			if ctx.Err() != nil {
				return false, nil
			}
			s.log.Info("cld: nfsd removed its client-tracking pipe", "pipe", s.path)
			return true, nil
		}
		n, err := p.ReadMsg(rctx, buf)
		read := time.Now()
		if err != nil {
			<-s.sem
			switch {
			case ctx.Err() != nil:
				return false, nil
			case errors.Is(context.Cause(rctx), errPipeReplaced):
				s.log.Info("cld: nfsd removed its client-tracking pipe", "pipe", s.path)
				return true, nil
			case errors.Is(err, ErrPipeGone):
				s.log.Info("cld: nfsd removed its client-tracking pipe", "pipe", s.path)
				return true, nil
			}
			return true, err
		}
		m, derr := Decode(buf[:n])
		if s.onRead != nil {
			s.onRead(m, derr)
		}
		if derr != nil {
			s.refuse(p, buf[:n], m, derr, read)
			<-s.sem
			continue
		}
		if m.Cmd == GetVersion {
			s.answerVersion(p, m, read)
			<-s.sem
			continue
		}
		s.noteVersion(m.Version)
		t := s.order.add(string(m.Name), m.Cmd == GraceStart || m.Cmd == GraceDone)
		s.handlers.Add(1)
		go func() {
			defer s.handlers.Done()
			defer func() { <-s.sem }()
			s.handle(ctx, p, t, m, read)
		}()
	}
}

// outcome is what the store said about one upcall.
type outcome struct {
	status  int16
	records []Record // GraceStart
	err     error
}

// failed is the outcome of an upcall the store did not (or not in time)
// answer: an error status, never 0.
func failed(c Command, err error) outcome {
	if c == Check {
		return outcome{status: StatusAccessDenied, err: err}
	}
	return outcome{status: StatusRemoteIO, err: err}
}

// handle runs one upcall in its turn and answers it, within OpTimeout of
// its reading.
func (s *Server) handle(ctx context.Context, p *Pipe, t *task, m Msg, read time.Time) {
	defer s.order.finish(t)
	octx, cancel := context.WithDeadline(ctx, read.Add(s.cfg.OpTimeout))
	defer cancel()
	if s.onBlocked != nil && !t.ready() {
		s.onBlocked(m)
	}
	if err := t.wait(octx); err != nil {
		s.answer(p, m, failed(m.Cmd, fmt.Errorf("waiting for earlier upcalls: %w", err)), read)
		t.waitAll()
		return
	}
	res := make(chan outcome, 1)
	go func() { res <- s.call(octx, m) }() // received below before handle returns
	select {
	case out := <-res:
		s.answer(p, m, out, read)
	case <-octx.Done():
		s.answer(p, m, failed(m.Cmd, fmt.Errorf("store: %w", octx.Err())), read)
		<-res // later upcalls on this name wait until the store returned
	}
}

// call asks the store.
func (s *Server) call(ctx context.Context, m Msg) outcome {
	var out outcome
	switch m.Cmd {
	case Create:
		out.err = s.store.Create(ctx, m.Name, m.PrincHash)
	case Remove:
		out.err = s.store.Remove(ctx, m.Name)
	case Check:
		var ok bool
		ok, out.err = s.store.Check(ctx, m.Name)
		if !ok {
			out.status = StatusAccessDenied
		}
	case GraceStart:
		out.records, out.err = s.store.GraceStart(ctx)
		var dups int
		if out.records, dups = uniqueRecords(out.records); dups > 0 {
			// nfsd adds a reclaim record per downcall: a name sent twice
			// would be counted twice against the clients that must
			// reclaim, and "every client reclaimed" would never come.
			s.log.Warn("cld: the store returned a client name more than once; sent to nfsd once", "duplicates", dups)
		}
	case GraceDone:
		out.err = s.store.GraceDone(ctx)
	}
	if out.err != nil {
		return failed(m.Cmd, fmt.Errorf("store: %w", out.err))
	}
	return out
}

// answer writes the downcalls of one upcall: for a GraceStart that
// succeeded, one -EINPROGRESS downcall per record first; then the upcall
// itself with its status.
func (s *Server) answer(p *Pipe, m Msg, out outcome, read time.Time) {
	if s.onAnswer != nil {
		s.onAnswer(m)
	}
	if m.Cmd == GraceStart && out.err == nil {
		if err := s.sendRecords(p, m, out.records); err != nil {
			out = failed(m.Cmd, err)
		}
	}
	reply := m
	reply.Status = out.status
	b, err := Encode(reply)
	// Counted before the answer goes, so that whoever saw the answer sees
	// it counted.
	s.m.upcall(m.Cmd, resultOf(out.err), time.Since(read))
	s.count(m.Cmd, out.err != nil, false)
	if m.Cmd == GraceStart && out.err == nil {
		s.mu.Lock()
		s.st.LastGraceStart, s.st.LastGraceStartRecords = time.Now(), len(out.records)
		s.notifyLocked()
		s.mu.Unlock()
		s.log.Info("cld: grace period starts; clients that may reclaim sent to nfsd", "records", len(out.records), "version", m.Version)
	}
	if err == nil {
		err = p.WriteMsg(b)
	}
	if out.err != nil {
		if ok, held := s.storeLog.allow(); ok {
			s.log.Warn("cld: upcall answered with an error status", "command", m.Cmd.String(), "xid", m.XID,
				"status", out.status, "err", out.err, "not_logged_since_last", held)
		}
	}
	s.logWriteErr(m, err)
}

// uniqueRecords keeps the first record of each client name, in order,
// and says how many it dropped.
func uniqueRecords(recs []Record) ([]Record, int) {
	seen := make(map[string]bool, len(recs))
	out := recs[:0:0]
	for _, r := range recs {
		if seen[string(r.Name)] {
			continue
		}
		seen[string(r.Name)] = true
		out = append(out, r)
	}
	return out, len(recs) - len(out)
}

// sendRecords writes one -EINPROGRESS downcall per record.
func (s *Server) sendRecords(p *Pipe, m Msg, recs []Record) error {
	for i, r := range recs {
		rm := Msg{Version: m.Version, Cmd: GraceStart, Status: StatusInProgress, XID: m.XID, Name: r.Name, PrincHash: r.PrincHash}
		if m.Version < 2 {
			rm.PrincHash = nil // version 1 records have no principal
		}
		b, err := Encode(rm)
		if err != nil {
			return fmt.Errorf("record %d of %d from the store: %w", i+1, len(recs), err)
		}
		if err := p.WriteMsg(b); err != nil {
			return fmt.Errorf("record %d of %d: %w", i+1, len(recs), err)
		}
	}
	return nil
}

// answerVersion answers GetVersion at once: we speak UpcallVersion (the
// kernel takes the lower of that and its own).
func (s *Server) answerVersion(p *Pipe, m Msg, read time.Time) {
	reply := m
	reply.Status, reply.UpcallVersion = StatusOK, UpcallVersion
	b, err := Encode(reply)
	s.m.upcall(m.Cmd, resultOK, time.Since(read))
	s.count(m.Cmd, false, false)
	if err == nil {
		err = p.WriteMsg(b)
	}
	s.log.Info("cld: nfsd asked for the upcall version", "answered", UpcallVersion, "asked_in_version", m.Version)
	s.logWriteErr(m, err)
}

// refuse answers a malformed upcall with an error downcall of the same
// length as what was read (the kernel accepts only that length), if it is
// long enough to carry an xid.
func (s *Server) refuse(p *Pipe, b []byte, m Msg, derr error, read time.Time) {
	status := StatusInvalid
	if errors.Is(derr, ErrUnknownCommand) {
		status = StatusNotSupported
	}
	c := Command(255) // label "unknown"
	if len(b) >= HeaderSize {
		c = m.Cmd
	}
	s.m.upcall(c, resultRefused, time.Since(read))
	s.count(c, false, true)
	var werr error
	answered := len(b) >= HeaderSize
	if answered {
		byteOrder.PutUint16(b[2:4], uint16(status))
		werr = p.WriteMsg(b)
	}
	if ok, held := s.badLog.allow(); ok {
		s.log.Warn("cld: malformed upcall refused", "err", derr, "bytes", len(b), "answered", answered,
			"status", status, "not_logged_since_last", held)
	}
	if answered {
		s.logWriteErr(m, werr)
	}
}

func (s *Server) logWriteErr(m Msg, err error) {
	switch {
	case err == nil:
	case isGone(err):
		s.log.Debug("cld: answer not delivered: the pipe is gone", "command", m.Cmd.String(), "xid", m.XID)
	default:
		if ok, held := s.storeLog.allow(); ok {
			s.log.Error("cld: nfsd refused a downcall", "command", m.Cmd.String(), "xid", m.XID, "err", err,
				"not_logged_since_last", held)
		}
	}
}

// ensurePipefs checks that rpc_pipefs is mounted at PipefsDir, mounting
// it if so configured.
func (s *Server) ensurePipefs() error {
	dir := s.cfg.PipefsDir
	ok, err := s.cfg.IsPipefs(dir)
	if err == nil && ok {
		return nil
	}
	why := "not an rpc_pipefs mount"
	if err != nil {
		why = err.Error()
	}
	if !s.cfg.MountPipefs {
		return fmt.Errorf("%w at %s (%s): mount it (mount -t rpc_pipefs sunrpc %s, which needs CAP_SYS_ADMIN) or let nsmd mount it", ErrNoPipefs, dir, why, dir)
	}
	if err := mountPipefs(dir); err != nil {
		return fmt.Errorf("%w at %s (%s), and %v", ErrNoPipefs, dir, why, err)
	}
	if ok, err := s.cfg.IsPipefs(dir); err != nil || !ok {
		return fmt.Errorf("%w at %s: mounted, but statfs does not see rpc_pipefs there (%v)", ErrNoPipefs, dir, err)
	}
	s.log.Info("cld: mounted rpc_pipefs", "dir", dir)
	return nil
}

func (s *Server) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// setState records a state change and logs it, once per change.
func (s *Server) setState(state, errText string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.State == state && s.st.Err == errText {
		return
	}
	s.st.State, s.st.Err, s.st.Since = state, errText, time.Now()
	bad := state == StateError || state == StateNoPipefs
	if bad {
		s.m.trackingError.Set(1)
		s.log.Error("cld: NFSv4 client tracking unavailable", "state", state, "pipe", s.path, "err", errText)
	} else {
		s.m.trackingError.Set(0)
		s.log.Info("cld: client-tracking pipe", "state", state, "pipe", s.path)
	}
	s.notifyLocked()
}

func (s *Server) pipeOpened() {
	s.m.pipeOpen.Set(1)
	s.mu.Lock()
	s.st.Version = 0
	s.mu.Unlock()
	s.setState(StateOpen, "")
}

func (s *Server) pipeClosed() {
	s.m.pipeOpen.Set(0)
	s.mu.Lock()
	s.st.Version = 0
	s.notifyLocked()
	s.mu.Unlock()
	s.setState(StateWaiting, "")
}

func (s *Server) noteVersion(v uint8) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Version != v {
		s.st.Version = v
		s.notifyLocked()
	}
}

func (s *Server) count(c Command, failed, refused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case refused:
		s.st.Refused++
	case failed:
		s.st.Failed++
	}
	s.st.Upcalls[c.label()]++
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// logLimiter lets through one log line per interval and counts the ones
// it held back.
type logLimiter struct {
	interval time.Duration
	mu       sync.Mutex
	last     time.Time
	held     int
}

func (l *logLimiter) allow() (ok bool, held int) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < l.interval {
		l.held++
		return false, 0
	}
	held, l.held, l.last = l.held, 0, now
	return true, held
}
