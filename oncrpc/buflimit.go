package oncrpc

import (
	"net/netip"
	"sync"
	"time"
)

// Buffer caps: what a TCP peer may make the server hold.
//
// A connection holds the records of the calls it sent that are being
// served (a handler has not returned yet) and the replies waiting to be
// written to it. A record is given back as soon as its handler returns,
// before the reply is written, and a reply that has to wait for the
// connection's writer is kept at its own size; so a peer that pipelines
// calls and never reads holds its replies only — a few dozen bytes each,
// at most MaxInFlight of them. Before the reader takes the next record off
// a connection, the connection must be under MaxConnBuffered, its remote
// IP under MaxHostBuffered and the server under MaxBuffered; otherwise the
// reader waits (TCP pushes back on the peer) until handlers give bytes
// back. A connection from a privileged loopback port (lockd) waits only
// for its own cap. What one connection holds is at most its cap plus one
// record of MaxRecordSize (the one being read).

// TCP read holds, passed to ServerConfig.OnHold.
const (
	// HoldConn: a connection's reader waited because the connection held
	// MaxConnBuffered bytes (its peer does not read its replies, or its
	// calls wait).
	HoldConn = "conn"
	// HoldHost: a reader waited because the connections from its remote IP
	// held MaxHostBuffered bytes.
	HoldHost = "host"
	// HoldTotal: a reader waited because all connections held MaxBuffered
	// bytes.
	HoldTotal = "total"
)

// bufAccount counts the bytes held per connection, per remote IP and in
// total, and wakes the readers that wait for room.
type bufAccount struct {
	mu      sync.Mutex
	total   int
	hosts   map[netip.Addr]int
	waiters int
	freed   chan struct{} // closed (and replaced) when bytes are given back while someone waits
}

func newBufAccount() *bufAccount {
	return &bufAccount{hosts: make(map[netip.Addr]int), freed: make(chan struct{})}
}

// hold adds n bytes held by sc.
func (sc *serverConn) hold(n int) {
	b := sc.s.buf
	b.mu.Lock()
	sc.held += n
	b.total += n
	if h := sc.remote.Addr(); h.IsValid() {
		b.hosts[h] += n
	}
	b.mu.Unlock()
}

// release gives back n bytes held by sc and wakes the readers waiting for
// room.
func (sc *serverConn) release(n int) {
	if n == 0 {
		return
	}
	b := sc.s.buf
	b.mu.Lock()
	sc.held -= n
	b.total -= n
	if h := sc.remote.Addr(); h.IsValid() {
		if v := b.hosts[h] - n; v > 0 {
			b.hosts[h] = v
		} else {
			delete(b.hosts, h)
		}
	}
	if b.waiters > 0 {
		close(b.freed)
		b.freed = make(chan struct{})
	}
	b.mu.Unlock()
}

// overCap returns the cap that keeps sc's reader from taking another
// record ("" if none), and the channel closed when bytes are given back.
// With a cap, the caller counts itself as a waiter until it calls
// doneWaiting.
func (sc *serverConn) overCap() (string, <-chan struct{}) {
	s := sc.s
	b := s.buf
	b.mu.Lock()
	defer b.mu.Unlock()
	var over string
	switch {
	case sc.held >= s.cfg.MaxConnBuffered:
		over = HoldConn
	case sc.privLocal:
	case sc.remote.Addr().IsValid() && b.hosts[sc.remote.Addr()] >= s.cfg.MaxHostBuffered:
		over = HoldHost
	case b.total >= s.cfg.MaxBuffered:
		over = HoldTotal
	}
	if over != "" {
		b.waiters++
	}
	return over, b.freed
}

func (b *bufAccount) doneWaiting() {
	b.mu.Lock()
	b.waiters--
	b.mu.Unlock()
}

// awaitRoom returns once sc may read another record (true), or false when
// sc was dropped or the server shuts down. Each wait is reported to
// OnHold and logged at most once a minute per remote IP.
func (sc *serverConn) awaitRoom() bool {
	s := sc.s
	reported := false
	for {
		over, freed := sc.overCap()
		if over == "" {
			return true
		}
		if !reported {
			reported = true
			s.reportHold(sc, over)
		}
		select {
		case <-freed:
			s.buf.doneWaiting()
		case <-sc.gone:
			s.buf.doneWaiting()
			return false
		case <-s.done:
			s.buf.doneWaiting()
			return false
		}
	}
}

// Buffered returns the bytes that TCP connections hold (records being
// served, replies waiting to be written).
func (s *Server) Buffered() int {
	s.buf.mu.Lock()
	defer s.buf.mu.Unlock()
	return s.buf.total
}

func (s *Server) reportHold(sc *serverConn, over string) {
	if s.cfg.OnHold != nil {
		s.cfg.OnHold(over)
	}
	if ok, _ := s.connLog.allow(sc.remote.Addr(), evReadHeld); !ok {
		return
	}
	s.buf.mu.Lock()
	conn, host, total := sc.held, s.buf.hosts[sc.remote.Addr()], s.buf.total
	s.buf.mu.Unlock()
	s.log.Warn("oncrpc: not reading from a TCP connection until its buffered calls and replies are served",
		"remote", sc.remote.String(), "cap", over, "conn_bytes", conn, "host_bytes", host, "total_bytes", total,
		"max_conn", s.cfg.MaxConnBuffered, "max_host", s.cfg.MaxHostBuffered, "max_total", s.cfg.MaxBuffered)
}

// stalled reports whether a reply write to sc has been blocked for at
// least StallAfter at now: its peer does not read what it asked for.
func (sc *serverConn) stalled(now time.Time) bool {
	w := sc.writing.Load()
	return w != 0 && now.Sub(time.Unix(0, w)) >= sc.s.cfg.StallAfter
}
