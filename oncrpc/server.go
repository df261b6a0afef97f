package oncrpc

import (
	"bufio"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ServerConfig tunes a Server. Zero values take the documented defaults.
type ServerConfig struct {
	Logger        *slog.Logger  // default: discard
	MaxRecordSize int           // TCP record (all fragments) cap; default 64 KiB
	IdleTimeout   time.Duration // TCP read deadline between records; default 2 min
	MaxInFlight   int           // concurrent calls per TCP connection; default 64
	// MaxConns caps the open TCP connections (default 1024). A connection
	// arriving at the cap makes room by closing the one idle the longest:
	// no call in flight, and the oldest last complete record (or accept if
	// it never sent one). Only if every connection has a call in flight is
	// the new one closed instead.
	MaxConns int
	// MaxConnsPerHost caps the open TCP connections from one remote IP
	// address, an IPv4-mapped IPv6 address counting as its IPv4 address
	// (default 64). A connection over the cap is closed at once. Connections
	// with no IP remote address (other listeners) are not counted per host.
	MaxConnsPerHost int
	// ReservedLocal: a connection from a loopback address and a privileged
	// source port (below 1024: only root binds one, e.g. the kernel's lockd)
	// is not counted per host, and up to ReservedLocal such connections are
	// admitted beyond MaxConns when no connection is idle (reported as
	// ConnAcceptedReserved). So other local users' connections, however
	// many, cannot lock lockd out. Default 32; negative: none beyond
	// MaxConns (they are still exempt from the per-host cap).
	ReservedLocal int
	// OnConn, when set, is called from the accept loop with ConnAccepted,
	// ConnRefusedPerHost, ConnRefusedTotal or ConnEvictedIdle for each
	// admission decision, so a caller can count them (Conns gives the open
	// connections). It must return quickly. Refusals and evictions are also
	// logged at Warn, at most once per minute per remote IP of the new
	// connection, with the counts of the lines held back.
	OnConn func(event string)
	// MaxInFlightUDP bounds concurrent calls per UDP socket (default 1024).
	// One socket carries every UDP client, and a call that waits for a raft
	// commit holds its slot for milliseconds: with 64, 64 pipelined clients
	// stalled the reader and lost datagrams to retransmission.
	MaxInFlightUDP int
	WriteTimeout   time.Duration // TCP write deadline for one reply; default 30 s
	// MaxConnBuffered, MaxHostBuffered and MaxBuffered cap the bytes of
	// call records being served and replies waiting to be written that one
	// TCP connection, the connections from one remote IP, and all of them
	// may hold (defaults 256 KiB, 4 MiB, 64 MiB; buflimit.go): at a cap,
	// the reader takes no further record until handlers give bytes back.
	// A connection from a privileged loopback port is held only by its own
	// cap.
	MaxConnBuffered int
	MaxHostBuffered int
	MaxBuffered     int
	// StallAfter: a connection whose reply write has been blocked this
	// long (its peer does not read) is the first to be closed for a new
	// connection, at MaxConns and at its IP's MaxConnsPerHost (default 1 s).
	StallAfter time.Duration
	// OnHold, when set, is called with HoldConn, HoldHost or HoldTotal
	// each time a reader starts waiting at a buffer cap. It must return
	// quickly.
	OnHold func(cap string)
	// Observe, when set, is called once per call after the reply is sent
	// (program, version, procedure, the accept status error or nil, duration).
	// For a handler that returned ErrNoReply it is called with that error;
	// for a rejected call (RPC_MISMATCH, AUTH_ERROR) with a *MismatchError or
	// *AuthError. Messages that are not decodable calls are not observed.
	// Over TCP the call's Args and credential bodies are nil by then (the
	// record they pointed into has been given back).
	Observe func(c *Call, err error, d time.Duration)
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxRecordSize <= 0 {
		c.MaxRecordSize = DefaultMaxRecordSize
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 1024
	}
	if c.MaxConnsPerHost <= 0 {
		c.MaxConnsPerHost = 64
	}
	if c.ReservedLocal == 0 {
		c.ReservedLocal = 32
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 64
	}
	if c.MaxInFlightUDP <= 0 {
		c.MaxInFlightUDP = 1024
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 30 * time.Second
	}
	if c.MaxConnBuffered <= 0 {
		c.MaxConnBuffered = 256 << 10
	}
	if c.MaxHostBuffered <= 0 {
		c.MaxHostBuffered = 4 << 20
	}
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = 64 << 20
	}
	if c.StallAfter <= 0 {
		c.StallAfter = time.Second
	}
	return c
}

// Server serves Programs over any number of TCP listeners and UDP sockets.
type Server struct {
	progs  Programs
	vers   map[uint32][2]uint32 // program → lowest, highest registered version
	cfg    ServerConfig
	log    *slog.Logger
	ctx    context.Context // handed to handlers; cancelled by Shutdown
	cancel context.CancelFunc

	shutting atomic.Bool
	done     chan struct{} // closed when Shutdown starts

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	pconns    map[net.PacketConn]struct{}
	conns     *list.List         // of *serverConn, by last record or accept, oldest first
	hosts     map[netip.Addr]int // open TCP connections per remote IP
	hostBufs  map[netip.Addr]*hostBuf
	localPriv int            // open TCP connections from a privileged loopback port
	calls     sync.WaitGroup // in-flight calls; Add only under mu while !shutting
	workers   sync.WaitGroup // connection goroutines; Add only under mu while !shutting
	finished  chan struct{}  // closed when Shutdown returns

	bufs    sync.Pool       // *[]byte, receive and reply buffers
	buf     *bufAccount     // bytes held by TCP connections (buflimit.go)
	connLog *hostLogLimiter // Warn lines about refused and evicted connections
}

// NewServer returns a Server for the programs p. The map is copied.
func NewServer(p Programs, cfg ServerConfig) *Server {
	cfg = cfg.withDefaults()
	s := &Server{
		progs:     make(Programs, len(p)),
		vers:      make(map[uint32][2]uint32),
		cfg:       cfg,
		log:       cfg.Logger,
		done:      make(chan struct{}),
		finished:  make(chan struct{}),
		listeners: make(map[net.Listener]struct{}),
		pconns:    make(map[net.PacketConn]struct{}),
		conns:     list.New(),
		hosts:     make(map[netip.Addr]int),
		hostBufs:  make(map[netip.Addr]*hostBuf),
		buf:       newBufAccount(),
		connLog:   newHostLogLimiter(connLogInterval, connLogHosts),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.bufs.New = func() any { b := make([]byte, 0, 1024); return &b }
	for pv, h := range p {
		s.progs[pv] = h
		r, ok := s.vers[pv.Prog]
		if !ok {
			r = [2]uint32{pv.Vers, pv.Vers}
		}
		r[0], r[1] = min(r[0], pv.Vers), max(r[1], pv.Vers)
		s.vers[pv.Prog] = r
	}
	return s
}

const maxPooledBuf = 128 << 10

func (s *Server) getBuf() *[]byte { return s.bufs.Get().(*[]byte) }

func (s *Server) putBuf(b *[]byte) {
	if cap(*b) > maxPooledBuf {
		return
	}
	*b = (*b)[:0]
	s.bufs.Put(b)
}

// callStart accounts for one more in-flight call, unless shutting down.
func (s *Server) callStart() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting.Load() {
		return false
	}
	s.calls.Add(1)
	return true
}

// replyReserve is the room kept in front of a reply for a record marker.
const replyReserve = 4

// exchange is the state of one call being served.
type exchange struct {
	call  Call
	args  Reader
	start time.Time
}

// serve decodes the call in rec, runs its handler and encodes the reply into
// *out after replyReserve bytes. It returns the reply (without the reserved
// bytes; nil for no reply), the status for Observe, and whether the message
// was a decodable call at all (false: drop it, close a TCP connection).
func (s *Server) serve(x *exchange, rec []byte, out *[]byte) (reply []byte, status error, ok bool) {
	c := &x.call
	r := &x.args
	r.Reset(rec)
	var h CallHeader
	if err := h.UnmarshalXDR(r); err != nil {
		var de *callDecodeError
		errors.As(err, &de)
		c.XID, c.Prog, c.Vers, c.Proc = h.XID, h.Prog, h.Vers, h.Proc
		w := Writer{buf: (*out)[:replyReserve]}
		switch de.stage {
		case stageRPCVers:
			putRPCMismatch(&w, h.XID)
			status = &MismatchError{Err: ErrRPCMismatch, Low: RPCVersion, High: RPCVersion}
		case stageCred:
			putAuthError(&w, h.XID, AuthBadCred)
			status = &AuthError{Stat: AuthBadCred}
		case stageVerf:
			putAuthError(&w, h.XID, AuthBadVerf)
			status = &AuthError{Stat: AuthBadVerf}
		default:
			s.log.Debug("oncrpc: dropping undecodable message", "net", c.Net, "remote", c.Remote.String(), "err", err)
			return nil, nil, false
		}
		s.log.Debug("oncrpc: call rejected", "net", c.Net, "remote", c.Remote.String(), "err", err)
		*out = w.buf
		return w.buf[replyReserve:], status, true
	}
	c.XID, c.Prog, c.Vers, c.Proc = h.XID, h.Prog, h.Vers, h.Proc
	c.Cred, c.Verf = h.Cred, h.Verf
	c.Args = r
	switch h.Cred.Flavor {
	case AuthNone:
	case AuthSys:
		p, err := parseAuthSys(h.Cred.Body)
		if err != nil {
			s.log.Debug("oncrpc: bad AUTH_SYS credential", "net", c.Net, "remote", c.Remote.String(), "err", err)
			w := Writer{buf: (*out)[:replyReserve]}
			putAuthError(&w, h.XID, AuthBadCred)
			*out = w.buf
			return w.buf[replyReserve:], &AuthError{Stat: AuthBadCred}, true
		}
		c.Sys = p
	default:
		w := Writer{buf: (*out)[:replyReserve]}
		putAuthError(&w, h.XID, AuthBadCred)
		*out = w.buf
		return w.buf[replyReserve:], &AuthError{Stat: AuthBadCred}, true
	}

	handler, found := s.progs[ProgVers{h.Prog, h.Vers}]
	var err error
	var low, high uint32
	res := Writer{buf: (*out)[:replyReserve+successHeaderLen], base: replyReserve + successHeaderLen}
	switch {
	case found:
		err = s.invoke(handler, c, &res)
	default:
		if r, known := s.vers[h.Prog]; known {
			low, high = r[0], r[1]
			err = &MismatchError{Err: ErrProgMismatch, Low: low, High: high}
		} else {
			err = ErrProgUnavail
		}
	}
	*out = res.buf
	if errors.Is(err, ErrNoReply) {
		return nil, err, true
	}
	w := Writer{buf: res.buf[:replyReserve]}
	switch {
	case err == nil:
		putAccepted(&w, h.XID, AcceptSuccess)
		return res.buf[replyReserve:], nil, true
	case errors.Is(err, ErrProgMismatch):
		putAcceptedError(&w, h.XID, AcceptProgMismatch, low, high)
	case errors.Is(err, ErrProgUnavail):
		putAcceptedError(&w, h.XID, AcceptProgUnavail, 0, 0)
	default:
		st := acceptStat(err)
		if st == AcceptSystemErr && !errors.Is(err, ErrSystemErr) {
			s.log.Error("oncrpc: handler failed", "prog", h.Prog, "vers", h.Vers, "proc", h.Proc,
				"net", c.Net, "remote", c.Remote.String(), "err", err)
		}
		putAcceptedError(&w, h.XID, st, 0, 0)
	}
	*out = w.buf
	return w.buf[replyReserve:], err, true
}

// invoke runs a handler, turning a panic into SYSTEM_ERR.
func (s *Server) invoke(h Handler, c *Call, res *Writer) (err error) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("oncrpc: handler panic", "prog", c.Prog, "vers", c.Vers, "proc", c.Proc,
				"net", c.Net, "remote", c.Remote.String(), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			res.Reset()
			err = fmt.Errorf("handler panic: %v: %w", v, ErrSystemErr)
		}
	}()
	return h.ServeRPC(s.ctx, c, res)
}

func (s *Server) observe(x *exchange, status error) {
	if s.cfg.Observe != nil {
		s.cfg.Observe(&x.call, status, time.Since(x.start))
	}
}

func (x *exchange) begin(s *Server, network string, remote, local netip.AddrPort) {
	x.call = Call{Net: network, Remote: remote, Local: local}
	if s.cfg.Observe != nil {
		x.start = time.Now()
	}
}

// ---- TCP -------------------------------------------------------------------

// ServeTCP accepts connections until l is closed or the server shuts down.
// After Shutdown it returns ErrClosed.
func (s *Server) ServeTCP(l net.Listener) error {
	s.mu.Lock()
	if s.shutting.Load() {
		s.mu.Unlock()
		l.Close()
		return ErrClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	backoff := time.Duration(0)
	for {
		conn, err := l.Accept()
		if err != nil {
			if s.shutting.Load() {
				return ErrClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("oncrpc: accept on %v: %w", l.Addr(), err)
			}
			// Out of file descriptors and the like: back off and retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("oncrpc: accept failed", "addr", l.Addr().String(), "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.done:
				t.Stop()
				return ErrClosed
			}
			continue
		}
		backoff = 0
		a, ok := s.admit(conn)
		if !ok {
			conn.Close()
			return ErrClosed
		}
		if a.victim != nil {
			a.victim.c.Close() // its serve goroutine sees the error and exits
			ev := evEvictedIdle
			if a.stalled {
				ev = evEvictedStalled
			}
			s.reportConn(ev, &a)
		}
		if a.sc == nil {
			conn.Close()
			s.reportConn(a.event, &a)
			continue
		}
		go a.sc.serve()
		s.reportConn(a.event, &a)
	}
}

// serverConn is one accepted TCP connection.
type serverConn struct {
	s             *Server
	c             net.Conn
	remote, local netip.AddrPort
	sem           chan struct{} // in-flight calls on this connection
	wg            sync.WaitGroup
	wmu           sync.Mutex // serialises reply writes

	gone chan struct{} // closed when dropped (evicted or closed)
	// writing: when the reply write in progress started (Unix ns), 0 if none.
	writing atomic.Int64

	// held: bytes of records being served and replies waiting (buflimit.go).
	held    atomic.Int64
	hostBuf *hostBuf // of its remote IP; nil without one

	// Under s.mu:
	elem *list.Element // in s.conns; nil once dropped (evicted or closed)
	// privLocal: from a privileged loopback port (ServerConfig.ReservedLocal).
	privLocal bool
	last      time.Time // accept or last complete record
}

// busy reports whether a call read from sc has not been answered yet.
func (sc *serverConn) busy() bool { return len(sc.sem) > 0 }

// startCall accounts for a call just read from sc and makes sc the most
// recently active connection, unless the server is shutting down or sc was
// evicted.
func (sc *serverConn) startCall(now time.Time) bool {
	s := sc.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting.Load() || sc.elem == nil {
		return false
	}
	s.calls.Add(1)
	sc.last = now
	s.conns.MoveToBack(sc.elem)
	return true
}

func (sc *serverConn) serve() {
	s := sc.s
	defer s.workers.Done()
	br := bufio.NewReaderSize(sc.c, 4096)
	for {
		sc.c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		if s.shutting.Load() || !sc.awaitRoom() {
			break
		}
		bufp := s.getBuf()
		rec, err := ReadRecord(br, *bufp, s.cfg.MaxRecordSize)
		*bufp = rec
		if err != nil {
			s.putBuf(bufp)
			switch {
			case errors.Is(err, ErrRecordTooBig):
				// At most a line a minute per remote IP: anyone may send one.
				if ok, _ := s.connLog.allow(sc.remote.Addr(), evRecordTooBig); ok {
					s.log.Warn("oncrpc: closing connection", "remote", sc.remote.String(), "err", err)
				}
			case errors.Is(err, io.EOF), s.shutting.Load():
			default:
				s.log.Debug("oncrpc: closing connection", "remote", sc.remote.String(), "err", err)
			}
			break
		}
		sc.sem <- struct{}{}
		if !sc.startCall(time.Now()) {
			<-sc.sem
			s.putBuf(bufp)
			break
		}
		n := cap(rec)
		sc.hold(n)
		sc.wg.Add(1)
		go sc.handle(bufp, n)
	}
	sc.wg.Wait()
	sc.c.Close()
	s.mu.Lock()
	s.dropConn(sc)
	s.mu.Unlock()
}

// handle serves one call read off sc, whose record holds n bytes of the
// connection's buffer cap. The record is given back as soon as the handler
// returned; a reply that must wait for another reply's write is copied to
// its own size first, so that a peer that does not read holds little.
func (sc *serverConn) handle(rec *[]byte, n int) {
	s := sc.s
	defer func() {
		<-sc.sem
		s.calls.Done()
		sc.wg.Done()
	}()
	var x exchange
	x.begin(s, "tcp", sc.remote, sc.local)
	out := s.getBuf()
	reply, status, ok := s.serve(&x, *rec, out)
	// The call's arguments and credentials point into the record.
	x.call.Args, x.call.Cred.Body, x.call.Verf.Body = nil, nil, nil
	s.putBuf(rec)
	sc.release(n)
	if !ok {
		sc.c.Close() // not an RPC call: the stream cannot be trusted
	} else if reply != nil {
		b := (*out)[:replyReserve+len(reply)]
		putMarker(b, len(reply))
		held := 0
		if !sc.wmu.TryLock() {
			b = append([]byte(nil), b...)
			s.putBuf(out)
			out = nil
			held = len(b)
			sc.hold(held)
			sc.wmu.Lock()
		}
		sc.writing.Store(time.Now().UnixNano())
		sc.c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		_, err := sc.c.Write(b)
		sc.writing.Store(0)
		sc.wmu.Unlock()
		sc.release(held)
		if err != nil {
			s.log.Debug("oncrpc: writing reply", "remote", sc.remote.String(), "err", err)
			sc.c.Close()
		}
	}
	if ok {
		s.observe(&x, status)
	}
	if out != nil {
		s.putBuf(out)
	}
}

// ---- UDP -------------------------------------------------------------------

// maxDatagram is the largest UDP payload.
const maxDatagram = 65535

// ServeUDP serves datagrams until pc is closed or the server shuts down.
// Replies leave from the address the call was sent to (IP_PKTINFO /
// IPV6_PKTINFO), so a socket bound to 0.0.0.0 answers a VIP from the VIP.
// This needs pc to be a *net.UDPConn on Linux; other PacketConns are served
// with plain ReadFrom/WriteTo. After Shutdown it returns ErrClosed.
func (s *Server) ServeUDP(pc net.PacketConn) error {
	s.mu.Lock()
	if s.shutting.Load() {
		s.mu.Unlock()
		pc.Close()
		return ErrClosed
	}
	s.pconns[pc] = struct{}{}
	s.mu.Unlock()

	u := &udpSocket{s: s, pc: pc, local: addrPortOf(pc.LocalAddr())}
	if uc, ok := pc.(*net.UDPConn); ok {
		u.uc = uc
		pi, err := enablePktinfo(uc)
		if err != nil {
			s.log.Warn("oncrpc: no destination-address info on UDP socket; replies use the routing table's source address",
				"addr", pc.LocalAddr().String(), "err", err)
		}
		u.pi = pi
	}
	lo := loopbackIndexes()
	sem := make(chan struct{}, s.cfg.MaxInFlightUDP)
	buf := make([]byte, maxDatagram)
	oob := make([]byte, 256)
	for {
		var (
			n      int
			from   netip.AddrPort
			dst    netip.Addr
			ifx    int
			err    error
			oobn   int
			rawSrc net.Addr
		)
		if u.uc != nil {
			n, oobn, _, from, err = u.uc.ReadMsgUDPAddrPort(buf, oob)
			if err == nil && u.pi != nil {
				dst, ifx = parsePktinfo(oob[:oobn])
			}
		} else {
			n, rawSrc, err = pc.ReadFrom(buf)
			if err == nil {
				from = addrPortOf(rawSrc)
			}
		}
		if err != nil {
			if s.shutting.Load() {
				return ErrClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("oncrpc: reading UDP on %v: %w", pc.LocalAddr(), err)
			}
			s.log.Debug("oncrpc: UDP read", "addr", pc.LocalAddr().String(), "err", err)
			continue
		}
		if martian(from, ifx, lo) {
			if ok, held := s.connLog.allow(from.Addr().Unmap(), evMartian); ok {
				s.log.Warn("oncrpc: dropped a datagram with a loopback source that came from a network interface (spoofed; is net.ipv4.conf.*.route_localnet on?)",
					"remote", from.String(), "ifindex", ifx, "suppressed", held[evMartian])
			}
			continue
		}
		sem <- struct{}{}
		if !s.callStart() {
			<-sem
			return ErrClosed
		}
		bufp := s.getBuf()
		*bufp = append((*bufp)[:0], buf[:n]...)
		local := u.local
		if dst.IsValid() {
			local = netip.AddrPortFrom(dst.Unmap(), u.local.Port())
		}
		go func() {
			defer func() {
				<-sem
				s.calls.Done()
			}()
			u.handle(bufp, from, dst, ifx, local, rawSrc)
		}()
	}
}

// martian reports whether a datagram from a loopback address arrived on
// an interface that is not a loopback one (ifx from IP_PKTINFO; lo the
// loopback interfaces' indexes). Only a spoofed packet does: the kernel
// drops them unless route_localnet is set, and a caller trusted for being
// on this host must not be forged that way. Unknown indexes pass.
func martian(from netip.AddrPort, ifx int, lo []int) bool {
	return ifx > 0 && len(lo) > 0 && from.Addr().Unmap().IsLoopback() && !slices.Contains(lo, ifx)
}

// loopbackIndexes are the indexes of the loopback interfaces (nil if they
// cannot be listed).
func loopbackIndexes() []int {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var lo []int
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 {
			lo = append(lo, i.Index)
		}
	}
	return lo
}

// udpSocket is one socket served by ServeUDP.
type udpSocket struct {
	s     *Server
	pc    net.PacketConn
	uc    *net.UDPConn // nil for other PacketConns
	pi    *pktinfo     // nil without destination-address support
	local netip.AddrPort
}

func (u *udpSocket) handle(rec *[]byte, from netip.AddrPort, dst netip.Addr, ifx int, local netip.AddrPort, rawSrc net.Addr) {
	s := u.s
	var x exchange
	remote := netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	x.begin(s, "udp", remote, local)
	out := s.getBuf()
	reply, status, ok := s.serve(&x, *rec, out)
	if ok && reply != nil {
		var err error
		switch {
		case u.uc != nil:
			var cm []byte
			if u.pi != nil && dst.IsValid() {
				var cmb [64]byte
				cm = u.pi.marshal(cmb[:0], dst, ifx)
			}
			_, _, err = u.uc.WriteMsgUDPAddrPort(reply, cm, from)
			if err != nil && cm != nil {
				// The destination may not be usable as a source (a
				// broadcast address, say): let the kernel choose.
				_, _, err = u.uc.WriteMsgUDPAddrPort(reply, nil, from)
			}
		default:
			_, err = u.pc.WriteTo(reply, rawSrc)
		}
		if err != nil {
			s.log.Debug("oncrpc: writing UDP reply", "remote", remote.String(), "err", err)
		}
	}
	if ok {
		s.observe(&x, status)
	}
	s.putBuf(out)
	s.putBuf(rec)
}

// ---- Shutdown --------------------------------------------------------------

// Shutdown stops accepting, closes idle connections, waits for in-flight
// calls until ctx ends, then cancels the context handed to handlers and
// closes every listener, socket and connection. Serve* return ErrClosed.
// It returns ctx.Err() if the wait was cut short. Later calls wait for the
// first to finish and return nil.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.shutting.Load() {
		s.mu.Unlock()
		select {
		case <-s.finished:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.shutting.Store(true)
	close(s.done)
	past := time.Unix(1, 0)
	for l := range s.listeners {
		l.Close()
	}
	for pc := range s.pconns {
		pc.SetReadDeadline(past) // wake the reader; replies still go out
	}
	for e := s.conns.Front(); e != nil; e = e.Next() {
		e.Value.(*serverConn).c.SetReadDeadline(past)
	}
	s.mu.Unlock()

	drained := make(chan struct{})
	go func() { // owned by Shutdown; ends when the last handler returns
		s.calls.Wait()
		close(drained)
	}()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.cancel()
	s.mu.Lock()
	for e := s.conns.Front(); e != nil; e = e.Next() {
		e.Value.(*serverConn).c.Close()
	}
	for pc := range s.pconns {
		pc.Close()
	}
	s.mu.Unlock()
	if err == nil {
		s.workers.Wait()
	}
	close(s.finished)
	return err
}

// addrPortOf converts a net.Addr to an AddrPort with IPv4-mapped addresses
// unmapped.
func addrPortOf(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		if a == nil {
			return ap
		}
		ap, _ = netip.ParseAddrPort(a.String())
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
