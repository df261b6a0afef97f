package oncrpc

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"time"
)

// TCP admission events, passed to ServerConfig.OnConn.
const (
	// ConnAccepted: a TCP connection was admitted and is being served
	// (also after ConnEvictedIdle made room for it).
	ConnAccepted = "accepted"
	// ConnRefusedPerHost: a new connection was closed at once because its
	// remote IP already had MaxConnsPerHost connections open.
	ConnRefusedPerHost = "refused_per_host"
	// ConnRefusedTotal: a new connection was closed at once because
	// MaxConns connections were open and every one had a call in flight.
	ConnRefusedTotal = "refused_total"
	// ConnEvictedIdle: MaxConns connections were open, so the one idle the
	// longest was closed to admit a new one (reported before the new
	// connection's ConnAccepted).
	ConnEvictedIdle = "evicted_idle"
	// ConnAcceptedReserved: a connection from a privileged loopback port
	// (ServerConfig.ReservedLocal) was admitted although its IP was at
	// MaxConnsPerHost or MaxConns were open with none idle (instead of
	// ConnAccepted).
	ConnAcceptedReserved = "accepted_reserved"
	// ConnEvictedStalled: a connection whose reply write had been blocked
	// for StallAfter (its peer does not read) was closed to admit a new
	// one, at MaxConns or at its IP's MaxConnsPerHost (reported before the
	// new connection's ConnAccepted).
	ConnEvictedStalled = "evicted_stalled"
)

// connEvent indexes the admission events.
type connEvent uint8

const (
	evAccepted connEvent = iota
	evRefusedPerHost
	evRefusedTotal
	evEvictedIdle
	evAcceptedReserved
	evEvictedStalled
	evReadHeld     // not an admission: a reader waited for buffer room (buflimit.go)
	evRecordTooBig // not an admission: a connection closed for an oversized record
	evMartian      // not an admission: a datagram with a spoofed loopback source dropped
	numConnEvents
)

func (e connEvent) String() string {
	switch e {
	case evAccepted:
		return ConnAccepted
	case evRefusedPerHost:
		return ConnRefusedPerHost
	case evRefusedTotal:
		return ConnRefusedTotal
	case evEvictedIdle:
		return ConnEvictedIdle
	case evAcceptedReserved:
		return ConnAcceptedReserved
	case evEvictedStalled:
		return ConnEvictedStalled
	case evReadHeld:
		return "read_held"
	case evRecordTooBig:
		return "record_too_big"
	case evMartian:
		return "martian"
	}
	return "unknown"
}

// admission is the outcome of admitting one accepted TCP connection.
type admission struct {
	remote    netip.AddrPort // of the new connection
	event     connEvent      // evAccepted, evRefusedPerHost or evRefusedTotal
	sc        *serverConn    // the new connection, if accepted
	victim    *serverConn    // the stalled or idle connection dropped to make room, if any
	stalled   bool           // the victim was stalled (else idle)
	idle      time.Duration  // of the victim since its last record, or blocked writing
	hostConns int            // connections from the remote IP before this one
}

// admit decides whether conn is served, under the per-host and total caps.
// An accepted connection is registered (it counts against the caps and
// Shutdown waits for it); a victim has been dropped and must be closed by
// the caller. ok is false if the server is shutting down.
func (s *Server) admit(conn net.Conn) (a admission, ok bool) {
	remote := addrPortOf(conn.RemoteAddr())
	host := remote.Addr()
	a.remote = remote
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting.Load() {
		return a, false
	}
	privLocal := privilegedLoopback(remote)
	reserved := false
	if host.IsValid() {
		a.hostConns = s.hosts[host]
	}
	if host.IsValid() && !privLocal {
		if a.hostConns >= s.cfg.MaxConnsPerHost {
			// Its own stalled connection makes room; else refused.
			a.victim = s.mostStalled(now, host)
			if a.victim == nil {
				a.event = evRefusedPerHost
				return a, true
			}
			a.stalled = true
			a.idle = now.Sub(time.Unix(0, a.victim.writing.Load()))
			s.dropConn(a.victim)
		}
	}
	if a.victim == nil && s.conns.Len() >= s.cfg.MaxConns {
		if a.victim = s.mostStalled(now, netip.Addr{}); a.victim != nil {
			a.stalled = true
			a.idle = now.Sub(time.Unix(0, a.victim.writing.Load()))
		} else if a.victim = s.longestIdle(); a.victim != nil {
			a.idle = now.Sub(a.victim.last)
		}
		switch {
		case a.victim != nil:
			s.dropConn(a.victim)
		case privLocal && s.localPriv < s.cfg.ReservedLocal:
			reserved = true
		default:
			a.event = evRefusedTotal
			return a, true
		}
	}
	sc := &serverConn{
		s:         s,
		c:         conn,
		gone:      make(chan struct{}),
		remote:    remote,
		local:     addrPortOf(conn.LocalAddr()),
		sem:       make(chan struct{}, s.cfg.MaxInFlight),
		last:      now,
		privLocal: privLocal,
	}
	sc.elem = s.conns.PushBack(sc)
	if host.IsValid() {
		hb := s.hostBufs[host]
		if hb == nil {
			hb = &hostBuf{}
			s.hostBufs[host] = hb
		}
		hb.conns++
		sc.hostBuf = hb
	}
	switch {
	case privLocal:
		s.localPriv++
		if host.IsValid() && s.hosts[host] >= s.cfg.MaxConnsPerHost {
			reserved = true // over its IP's cap, thanks to the exemption
		}
	case host.IsValid():
		s.hosts[host]++
	}
	s.workers.Add(1)
	a.event, a.sc = evAccepted, sc
	if reserved {
		a.event = evAcceptedReserved
	}
	return a, true
}

// privilegedLoopback reports whether a connection comes from a loopback
// address and a privileged port (below 1024), which only root can bind.
func privilegedLoopback(remote netip.AddrPort) bool {
	return remote.Addr().IsLoopback() && remote.Port() > 0 && remote.Port() < 1024
}

// mostStalled returns the connection (from host, if valid) whose reply
// write has been blocked the longest, at least StallAfter, or nil.
// Called with s.mu held.
func (s *Server) mostStalled(now time.Time, host netip.Addr) *serverConn {
	var worst *serverConn
	var since int64
	for e := s.conns.Front(); e != nil; e = e.Next() {
		sc := e.Value.(*serverConn)
		if host.IsValid() && sc.remote.Addr() != host {
			continue
		}
		if !sc.stalled(now) {
			continue
		}
		if w := sc.writing.Load(); worst == nil || w < since {
			worst, since = sc, w
		}
	}
	return worst
}

// longestIdle returns the connection without calls in flight whose last
// complete record (or accept) is the oldest, or nil if every connection is
// busy. s.conns is kept in that order, so this walks past busy connections
// only. A connection whose record has just been read but whose call has not
// started yet counts as idle: startCall then drops that call, as if the
// record had arrived after the close. Called with s.mu held.
func (s *Server) longestIdle() *serverConn {
	for e := s.conns.Front(); e != nil; e = e.Next() {
		if sc := e.Value.(*serverConn); !sc.busy() {
			return sc
		}
	}
	return nil
}

// dropConn removes sc from the accounting: it no longer counts against the
// caps and takes no new calls. It is a no-op for a dropped connection.
// Called with s.mu held.
func (s *Server) dropConn(sc *serverConn) {
	if sc.elem == nil {
		return
	}
	s.conns.Remove(sc.elem)
	sc.elem = nil
	close(sc.gone)
	if hb := sc.hostBuf; hb != nil {
		if hb.conns--; hb.conns == 0 {
			delete(s.hostBufs, sc.remote.Addr())
		}
	}
	if sc.privLocal {
		s.localPriv--
		return
	}
	if h := sc.remote.Addr(); h.IsValid() {
		if n := s.hosts[h] - 1; n > 0 {
			s.hosts[h] = n
		} else {
			delete(s.hosts, h)
		}
	}
}

// Conns returns the number of open TCP connections being served.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns.Len()
}

// reportConn logs a refusal or eviction, at most one line per remote IP
// (of the new connection) per connLog interval, then hands ev to OnConn.
func (s *Server) reportConn(ev connEvent, a *admission) {
	if ev != evAccepted {
		s.logConn(ev, a)
	}
	if s.cfg.OnConn != nil {
		s.cfg.OnConn(ev.String())
	}
}

func (s *Server) logConn(ev connEvent, a *admission) {
	ok, held := s.connLog.allow(a.remote.Addr(), ev)
	if !ok {
		return
	}
	args := []any{"remote", a.remote.String()}
	for e, n := range held {
		if n > 0 {
			args = append(args, "suppressed_"+connEvent(e).String(), n)
		}
	}
	switch ev {
	case evRefusedPerHost:
		s.log.Warn("oncrpc: TCP connection refused: too many from this host",
			append(args, "host_conns", a.hostConns, "max_per_host", s.cfg.MaxConnsPerHost)...)
	case evRefusedTotal:
		s.log.Warn("oncrpc: TCP connection refused: at the connection cap and none idle",
			append(args, "max", s.cfg.MaxConns)...)
	case evAcceptedReserved:
		s.log.Warn("oncrpc: admitted a connection from a privileged loopback port beyond the caps (others hold them)",
			append(args, "host_conns", a.hostConns, "max_per_host", s.cfg.MaxConnsPerHost, "max", s.cfg.MaxConns)...)
	case evEvictedIdle:
		s.log.Warn("oncrpc: closed the longest-idle TCP connection to admit a new one",
			append(args, "evicted", a.victim.remote.String(), "idle", a.idle, "max", s.cfg.MaxConns)...)
	case evEvictedStalled:
		s.log.Warn("oncrpc: closed a TCP connection that does not read its replies to admit a new one",
			append(args, "evicted", a.victim.remote.String(), "blocked", a.idle, "max", s.cfg.MaxConns,
				"max_per_host", s.cfg.MaxConnsPerHost)...)
	}
}

// Defaults of the connection log limiter.
const (
	connLogInterval = time.Minute
	connLogHosts    = 4096
)

// hostLogLimiter lets through at most one log line per remote IP per
// interval and counts, per event, the lines it held back, to be reported
// with the IP's next line. It remembers at most max IPs: beyond that it
// forgets the one whose last line is the oldest, with its counts (OnConn
// still sees every event).
type hostLogLimiter struct {
	interval time.Duration
	max      int
	now      func() time.Time

	mu    sync.Mutex
	hosts map[netip.Addr]*list.Element // of *hostLog
	order *list.List                   // oldest line first
}

type hostLog struct {
	ip   netip.Addr
	at   time.Time // last line let through
	held [numConnEvents]int
}

func newHostLogLimiter(interval time.Duration, max int) *hostLogLimiter {
	return &hostLogLimiter{
		interval: interval,
		max:      max,
		now:      time.Now,
		hosts:    make(map[netip.Addr]*list.Element),
		order:    list.New(),
	}
}

// allow reports whether a line about ev from ip may be logged now and, if
// so, how many events of each kind from ip were held back since its last
// line.
func (l *hostLogLimiter) allow(ip netip.Addr, ev connEvent) (ok bool, held [numConnEvents]int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, found := l.hosts[ip]; found {
		h := e.Value.(*hostLog)
		if now.Sub(h.at) < l.interval {
			h.held[ev]++
			return false, held
		}
		held, h.held, h.at = h.held, [numConnEvents]int{}, now
		l.order.MoveToBack(e)
		return true, held
	}
	if l.order.Len() >= l.max {
		old := l.order.Remove(l.order.Front()).(*hostLog)
		delete(l.hosts, old.ip)
	}
	l.hosts[ip] = l.order.PushBack(&hostLog{ip: ip, at: now})
	return true, held
}
