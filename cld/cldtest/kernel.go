//go:build linux

// Package cldtest is a FAKE of the Linux kernel's nfsd side of the NFSv4
// client-tracking pipe (rpc_pipefs nfsd/cld), for tests of package cld and
// of packages built on it. It is not the kernel: it reproduces the
// kernel's behaviour as far as the facts below go, over an AF_UNIX
// SOCK_SEQPACKET socketpair in a temporary directory. The real kernel is
// exercised by the e2e QEMU tier.
//
// What it reproduces (fs/nfsd/nfs4recover.c, net/sunrpc/rpc_pipe.c):
//   - nfsd start (Start): the pipe file appears (an inotify IN_CREATE in
//     <dir>/nfsd), the kernel waits about a second for a daemon to open
//     it (here: OpenWait, default 1 s, ended by the open itself, not by
//     polling), then sends GetVersion in a version 1 message, switches
//     to the version answered (clamped to 1..MaxVersion), and sends
//     GraceStart, collecting the -EINPROGRESS record downcalls. A nonzero
//     final GraceStart status removes the pipe (the kernel then starts
//     over with its oldest ops on a new pipe, or other tracking; the
//     oldest ops can be played with CreatePipe, WaitOpen and Check).
//   - every upcall has the size of the current version's message and a
//     fresh xid; many may be in flight; a downcall is matched by xid and
//     REJECTED (recorded in Rejected) when its length is not the current
//     message size, its xid is unknown, or it is an -EINPROGRESS downcall
//     for another command than GraceStart or with an empty name.
//   - upcalls sent while no daemon has the pipe open are queued and
//     delivered at the next open.
//   - nfsd stop (Stop): the file is removed (an inotify IN_DELETE) and the
//     pipe destroyed; pending upcalls fail. As in the kernel, destroying
//     a pipe with nothing queued wakes no reader (rpc_close_pipes wakes
//     the wait queue only when it purges messages): a daemon blocked in
//     poll on the old pipe learns of the stop only from the directory.
//     The daemon's end of a stopped pipe stays open, and reads nothing
//     more, until Close.
//
// Where it differs: a rejected downcall is recorded, not returned to the
// writer as -EINVAL (a socketpair write cannot fail that way); when the
// daemon closes the pipe, pending upcalls fail with ErrDaemonClosed (the
// kernel requeues those not yet read and waits for ever for those read);
// queued upcalls never time out (the kernel's 30 s); one daemon at a
// time (a new open replaces the previous one).
package cldtest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nsmd/nsmd/cld"
)

// The fake's own view of the wire format (include/uapi/linux/nfsd/cld.h),
// written independently of package cld's codec so that each checks the
// other.
const (
	v1Len        = 1034 // struct cld_msg
	v2Len        = 1067 // struct cld_msg_v2
	nameLenOff   = 8    // cm_u.cm_name.cn_len (u16)
	nameOff      = 10   // cm_u.cm_name.cn_id
	maxName      = 1024
	princLenOff  = 1034 // cm_u.cm_clntinfo.cc_princhash.cp_len (v2)
	princOff     = 1035
	maxPrinc     = 32
	einprogress  = -115
	readBufBytes = 8192
)

var ne = binary.NativeEndian

var (
	// ErrNFSDStopped: the upcall cannot be sent or answered: nfsd is not
	// running (no pipe), or stopped while it was pending.
	ErrNFSDStopped = errors.New("cldtest: nfsd not running")
	// ErrDaemonClosed: the daemon closed the pipe with the upcall pending.
	ErrDaemonClosed = errors.New("cldtest: daemon closed the pipe")
	// ErrNoDaemon: no daemon opened the pipe within OpenWait.
	ErrNoDaemon = errors.New("cldtest: no daemon opened the pipe")
)

// StatusError is an upcall answered with a nonzero status.
type StatusError struct {
	Cmd    cld.Command
	Status int16
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("cldtest: %v answered with status %d", e.Cmd, e.Status)
}

// Kernel is the fake. Its methods are safe for concurrent use.
type Kernel struct {
	dir, path string

	mu         sync.Mutex
	maxVersion uint8
	openWait   time.Duration
	up         bool
	version    uint8
	conn       *conn
	queue      [][]byte // upcalls waiting for an open
	nextXID    uint32
	pending    map[uint32]*Call
	opened     chan struct{} // closed at the next open
	rejected   []string
	dead       []*conn // kernel ends of stopped pipes: silent until Close

	wg sync.WaitGroup // one reader goroutine per open
}

type conn struct {
	f    *os.File // the kernel's end
	wmu  sync.Mutex
	dead bool // its pipe was stopped: whatever the daemon writes is dropped (mu)
}

// New makes dir play rpc_pipefs: it creates dir/nfsd, where Start
// creates the pipe file cld.
func New(dir string) (*Kernel, error) {
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(filepath.Join(dir, "nfsd"), 0o755); err != nil {
		return nil, fmt.Errorf("cldtest: %w", err)
	}
	return &Kernel{
		dir:        dir,
		path:       filepath.Join(dir, "nfsd", "cld"),
		maxVersion: 2,
		openWait:   time.Second,
		version:    1,
		pending:    make(map[uint32]*Call),
		opened:     make(chan struct{}),
	}, nil
}

// SetMaxVersion sets CLD_UPCALL_VERSION of the faked kernel (1 for
// kernels before principal hashes, 2 by default).
func (k *Kernel) SetMaxVersion(v uint8) {
	k.mu.Lock()
	k.maxVersion = v
	k.mu.Unlock()
}

// SetOpenWait sets how long Start waits for a daemon to open the pipe.
func (k *Kernel) SetOpenWait(d time.Duration) {
	k.mu.Lock()
	k.openWait = d
	k.mu.Unlock()
}

// Dir is the directory playing rpc_pipefs (cld.Config.PipefsDir).
func (k *Kernel) Dir() string { return k.dir }

// PipePath is the pipe file's path, Dir()/nfsd/cld.
func (k *Kernel) PipePath() string { return k.path }

// IsPipefs fits cld.Config.IsPipefs: Dir() counts as rpc_pipefs; any
// other directory is asked of cld.IsRPCPipefs.
func (k *Kernel) IsPipefs(dir string) (bool, error) {
	if filepath.Clean(dir) == k.dir {
		return true, nil
	}
	return cld.IsRPCPipefs(dir)
}

// Version is the message version the fake uses now.
func (k *Kernel) Version() uint8 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.version
}

// Rejected lists the downcalls the fake refused, and why.
func (k *Kernel) Rejected() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.rejected...)
}

// OpenPipe fits cld.Config.OpenPipe: while nfsd runs, opening PipePath()
// connects a new socketpair and returns the daemon's end; otherwise, or
// for another path, it fails like open(2) on a missing file.
func (k *Kernel) OpenPipe(path string) (*cld.Pipe, error) {
	notFound := &os.PathError{Op: "open", Path: path, Err: unix.ENOENT}
	if filepath.Clean(path) != k.path {
		return nil, notFound
	}
	k.mu.Lock()
	up := k.up
	k.mu.Unlock()
	if !up {
		return nil, notFound
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cldtest: socketpair: %w", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("cldtest: %w", err)
	}
	p, err := cld.NewPipe(fds[1])
	if err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	cn := &conn{f: os.NewFile(uintptr(fds[0]), "cld-kernel-end")}
	cn.wmu.Lock() // queued upcalls go out before any new one
	k.mu.Lock()
	if !k.up { // nfsd stopped meanwhile
		k.mu.Unlock()
		cn.wmu.Unlock()
		cn.f.Close()
		p.Close()
		return nil, notFound
	}
	old := k.conn
	if old != nil {
		k.failAllLocked(ErrDaemonClosed)
	}
	k.conn = cn
	queue := k.queue
	k.queue = nil
	close(k.opened)
	k.opened = make(chan struct{})
	k.wg.Add(2)
	go k.readLoop(cn)
	// The queue goes out once the daemon reads, which it starts to do
	// only after this returns.
	go func() {
		defer k.wg.Done()
		defer cn.wmu.Unlock()
		for _, b := range queue {
			if _, err := cn.f.Write(b); err != nil {
				return // the reader sees the end and fails what is pending
			}
		}
	}()
	k.mu.Unlock()
	if old != nil {
		old.f.Close()
	}
	return p, nil
}

// CreatePipe is the first step of nfsd's start: the pipe file appears.
func (k *Kernel) CreatePipe() error {
	k.mu.Lock()
	if k.up {
		k.mu.Unlock()
		return fmt.Errorf("cldtest: nfsd already running")
	}
	k.up, k.version = true, 1
	k.mu.Unlock()
	if err := os.WriteFile(k.path, nil, 0o600); err != nil {
		k.Stop()
		return fmt.Errorf("cldtest: create pipe file: %w", err)
	}
	return nil
}

// WaitOpen waits until a daemon has the pipe open, or ctx is done.
func (k *Kernel) WaitOpen(ctx context.Context) error {
	k.mu.Lock()
	if k.conn != nil {
		k.mu.Unlock()
		return nil
	}
	ch := k.opened
	k.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Start starts nfsd as the kernel does: it creates the pipe, waits up to
// OpenWait for a daemon to open it (else stops, ErrNoDaemon), asks
// GetVersion (a status error there is ignored, as the kernel does: it
// stays at version 1), and sends GraceStart; it returns the records of
// the clients that may reclaim. A GraceStart answered with a nonzero
// status stops nfsd's use of the pipe (Stop) and returns *StatusError.
func (k *Kernel) Start(ctx context.Context) ([]cld.Record, error) {
	if err := k.CreatePipe(); err != nil {
		return nil, err
	}
	k.mu.Lock()
	wait := k.openWait
	k.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, wait)
	err := k.WaitOpen(wctx)
	cancel()
	if err != nil {
		k.Stop()
		return nil, fmt.Errorf("%w within %v", ErrNoDaemon, wait)
	}
	var se *StatusError
	if _, err := k.GetVersion(ctx); err != nil && !errors.As(err, &se) {
		return nil, err
	}
	recs, err := k.GraceStart(ctx)
	if errors.As(err, &se) {
		k.Stop()
	}
	return recs, err
}

// Stop stops nfsd: the pipe file goes, the pipe is destroyed, pending
// upcalls fail with ErrNFSDStopped.
func (k *Kernel) Stop() {
	k.mu.Lock()
	if !k.up {
		k.mu.Unlock()
		return
	}
	k.up, k.version = false, 1
	os.Remove(k.path)
	cn := k.conn
	k.conn, k.queue = nil, nil
	k.failAllLocked(ErrNFSDStopped)
	if cn != nil {
		cn.dead = true
		k.dead = append(k.dead, cn)
	}
	k.mu.Unlock()
}

// Close stops nfsd, closes the ends of stopped pipes and waits for the
// fake's goroutines.
func (k *Kernel) Close() {
	k.Stop()
	k.mu.Lock()
	dead := k.dead
	k.dead = nil
	k.mu.Unlock()
	for _, cn := range dead {
		cn.f.Close()
	}
	k.wg.Wait()
}

// Call is one upcall in flight.
type Call struct {
	XID     uint32
	Cmd     cld.Command
	Version uint8
	raw     bool
	done    chan struct{}

	// set before done is closed
	reply   []byte
	records []cld.Record
	err     error
}

// Reply is the daemon's answer to one upcall.
type Reply struct {
	Status  int16
	Version uint8        // GetVersion: cm_u.cm_version
	Records []cld.Record // GraceStart: the -EINPROGRESS downcalls before the final one
	Raw     []byte       // the final downcall as written
}

// Done is closed once the call is answered or failed.
func (c *Call) Done() <-chan struct{} { return c.done }

// Wait waits for the answer. A nonzero status is not an error here.
func (c *Call) Wait(ctx context.Context) (Reply, error) {
	select {
	case <-c.done:
	case <-ctx.Done():
		return Reply{}, ctx.Err()
	}
	if c.err != nil {
		return Reply{}, c.err
	}
	r := Reply{Raw: c.reply, Records: c.records}
	if len(c.reply) >= 8 {
		r.Status = int16(ne.Uint16(c.reply[2:4]))
	}
	if len(c.reply) > 8 {
		r.Version = c.reply[8]
	}
	return r, nil
}

// Send sends an upcall of m.Cmd with m.Name, m.PrincHash (version 2
// Create) and m.GraceTime (version 1 GraceDone, as the oldest kernel ops
// send it), in the current version with a fresh xid, and returns at once.
// Upcalls sent one after the other by one goroutine arrive in that order.
func (k *Kernel) Send(m cld.Msg) (*Call, error) {
	k.mu.Lock()
	if !k.up {
		k.mu.Unlock()
		return nil, ErrNFSDStopped
	}
	ver := k.version
	xid := k.allocXIDLocked()
	b, err := encodeUpcall(ver, m, xid)
	if err != nil {
		k.mu.Unlock()
		return nil, err
	}
	c := &Call{XID: xid, Cmd: m.Cmd, Version: ver, done: make(chan struct{})}
	return c, k.sendLocked(c, b)
}

// SendRaw sends b as it is, for malformed upcalls. If b is long enough to
// carry an xid (8 bytes), the returned call waits for the downcall with
// that xid, whatever its length; otherwise no answer can be matched and
// the call is nil.
func (k *Kernel) SendRaw(b []byte) (*Call, error) {
	b = append([]byte(nil), b...)
	k.mu.Lock()
	if !k.up {
		k.mu.Unlock()
		return nil, ErrNFSDStopped
	}
	var c *Call
	if len(b) >= 8 {
		xid := ne.Uint32(b[4:8])
		if _, busy := k.pending[xid]; busy {
			k.mu.Unlock()
			return nil, fmt.Errorf("cldtest: xid %d is in flight", xid)
		}
		c = &Call{XID: xid, Cmd: cld.Command(b[1]), Version: b[0], raw: true, done: make(chan struct{})}
	}
	return c, k.sendLocked(c, b)
}

// sendLocked registers c (if any) and writes b, or queues it while no
// daemon has the pipe open. It unlocks k.mu.
func (k *Kernel) sendLocked(c *Call, b []byte) error {
	if c != nil {
		k.pending[c.XID] = c
	}
	cn := k.conn
	if cn == nil {
		k.queue = append(k.queue, b)
		k.mu.Unlock()
		return nil
	}
	k.mu.Unlock()
	cn.wmu.Lock()
	_, err := cn.f.Write(b)
	cn.wmu.Unlock()
	if err != nil && c != nil {
		k.mu.Lock()
		k.failLocked(c, ErrDaemonClosed)
		k.mu.Unlock()
	}
	return nil
}

func (k *Kernel) allocXIDLocked() uint32 {
	for {
		xid := k.nextXID
		k.nextXID++
		if _, busy := k.pending[xid]; !busy {
			return xid
		}
	}
}

func (k *Kernel) failLocked(c *Call, err error) {
	if k.pending[c.XID] != c {
		return
	}
	delete(k.pending, c.XID)
	c.err = err
	close(c.done)
}

func (k *Kernel) failAllLocked(err error) {
	for _, c := range k.pending {
		k.failLocked(c, err)
	}
}

func (k *Kernel) rejectLocked(format string, args ...any) {
	k.rejected = append(k.rejected, fmt.Sprintf(format, args...))
}

func (k *Kernel) readLoop(cn *conn) {
	defer k.wg.Done()
	buf := make([]byte, readBufBytes)
	for {
		n, err := cn.f.Read(buf)
		if err != nil {
			k.mu.Lock()
			if k.conn == cn { // the daemon closed
				k.conn = nil
				k.failAllLocked(ErrDaemonClosed)
			}
			k.mu.Unlock()
			cn.f.Close()
			return
		}
		k.downcall(cn, buf[:n])
	}
}

// downcall handles one message from the daemon as cld_pipe_downcall does.
func (k *Kernel) downcall(cn *conn, b []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if cn.dead {
		return // a write to a destroyed pipe: EPIPE for the writer, nothing here
	}
	if len(b) < 8 {
		k.rejectLocked("downcall of %d bytes, shorter than a header", len(b))
		return
	}
	cmd := cld.Command(b[1])
	status := int16(ne.Uint16(b[2:4]))
	xid := ne.Uint32(b[4:8])
	c := k.pending[xid]
	if c == nil {
		k.rejectLocked("xid %d: no upcall waits for it (%v, status %d)", xid, cmd, status)
		return
	}
	msglen := v1Len
	if k.version >= 2 {
		msglen = v2Len
	}
	if !c.raw && len(b) != msglen {
		k.rejectLocked("xid %d: downcall of %d bytes, the kernel's messages have %d", xid, len(b), msglen)
		return
	}
	if status == einprogress {
		if cmd != cld.GraceStart {
			k.rejectLocked("xid %d: -EINPROGRESS downcall for %v", xid, cmd)
			return
		}
		r, err := parseRecord(b, k.version)
		if err != nil {
			k.rejectLocked("xid %d: record: %v", xid, err)
			return
		}
		c.records = append(c.records, r)
		return
	}
	delete(k.pending, xid)
	c.reply = append([]byte(nil), b...)
	if !c.raw && c.Cmd == cld.GetVersion && status == 0 && len(b) > 8 {
		v := min(max(b[8], 1), k.maxVersion)
		k.version = v
	}
	close(c.done)
}

func parseRecord(b []byte, version uint8) (cld.Record, error) {
	if len(b) < nameOff {
		return cld.Record{}, fmt.Errorf("%d bytes", len(b))
	}
	n := int(ne.Uint16(b[nameLenOff:]))
	if n == 0 || n > maxName || nameOff+n > len(b) {
		return cld.Record{}, fmt.Errorf("name length %d", n)
	}
	r := cld.Record{Name: append([]byte(nil), b[nameOff:nameOff+n]...)}
	if version >= 2 && len(b) > princLenOff {
		pn := int(b[princLenOff])
		if pn > maxPrinc || princOff+pn > len(b) {
			return cld.Record{}, fmt.Errorf("principal hash length %d", pn)
		}
		if pn > 0 {
			r.PrincHash = append([]byte(nil), b[princOff:princOff+pn]...)
		}
	}
	return r, nil
}

// encodeUpcall builds an upcall as the kernel does (a zeroed buffer of
// the version's size, then the fields the command uses).
func encodeUpcall(ver uint8, m cld.Msg, xid uint32) ([]byte, error) {
	size := v1Len
	if ver >= 2 {
		size = v2Len
	}
	b := make([]byte, size)
	b[0], b[1] = ver, byte(m.Cmd)
	ne.PutUint32(b[4:8], xid)
	switch m.Cmd {
	case cld.Create, cld.Remove, cld.Check:
		if len(m.Name) == 0 || len(m.Name) > maxName {
			return nil, fmt.Errorf("cldtest: %v name of %d bytes", m.Cmd, len(m.Name))
		}
		ne.PutUint16(b[nameLenOff:], uint16(len(m.Name)))
		copy(b[nameOff:], m.Name)
		if len(m.PrincHash) > 0 {
			if m.Cmd != cld.Create || ver < 2 || len(m.PrincHash) > maxPrinc {
				return nil, fmt.Errorf("cldtest: a version %d %v cannot carry a %d-byte principal hash", ver, m.Cmd, len(m.PrincHash))
			}
			b[princLenOff] = byte(len(m.PrincHash))
			copy(b[princOff:], m.PrincHash)
		}
	case cld.GraceDone:
		if m.GraceTime != 0 {
			if ver != 1 {
				return nil, fmt.Errorf("cldtest: only version 1 GraceDone carries a grace time")
			}
			ne.PutUint64(b[8:16], uint64(m.GraceTime))
		}
	}
	return b, nil
}

func (k *Kernel) call(ctx context.Context, m cld.Msg) (Reply, error) {
	c, err := k.Send(m)
	if err != nil {
		return Reply{}, err
	}
	r, err := c.Wait(ctx)
	if err != nil {
		return r, err
	}
	if r.Status != 0 {
		return r, &StatusError{Cmd: m.Cmd, Status: r.Status}
	}
	return r, nil
}

// GetVersion asks the daemon's version and returns the version the fake
// switched to.
func (k *Kernel) GetVersion(ctx context.Context) (uint8, error) {
	if _, err := k.call(ctx, cld.Msg{Cmd: cld.GetVersion}); err != nil {
		return k.Version(), err
	}
	return k.Version(), nil
}

// GraceStart sends GraceStart and returns the records of the
// -EINPROGRESS downcalls.
func (k *Kernel) GraceStart(ctx context.Context) ([]cld.Record, error) {
	r, err := k.call(ctx, cld.Msg{Cmd: cld.GraceStart})
	return r.Records, err
}

// Create sends Create (princHash only in version 2; nil for AUTH_SYS).
func (k *Kernel) Create(ctx context.Context, name, princHash []byte) error {
	_, err := k.call(ctx, cld.Msg{Cmd: cld.Create, Name: name, PrincHash: princHash})
	return err
}

// Remove sends Remove.
func (k *Kernel) Remove(ctx context.Context, name []byte) error {
	_, err := k.call(ctx, cld.Msg{Cmd: cld.Remove, Name: name})
	return err
}

// Check sends Check, as kernels using the oldest ops do: nil means the
// client may reclaim; a *StatusError with -EACCES that it may not.
func (k *Kernel) Check(ctx context.Context, name []byte) error {
	_, err := k.call(ctx, cld.Msg{Cmd: cld.Check, Name: name})
	return err
}

// GraceDone sends GraceDone.
func (k *Kernel) GraceDone(ctx context.Context) error {
	_, err := k.call(ctx, cld.Msg{Cmd: cld.GraceDone})
	return err
}
