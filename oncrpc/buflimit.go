package oncrpc

import (
	"sync"
	"sync/atomic"
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

// bufAccount counts the bytes held in total and wakes the readers that
// wait for room; per connection and per remote IP the counts are in
// serverConn.held and hostBuf. Counting is a few atomic adds per call; the
// lock is taken only while a reader waits.
type bufAccount struct {
	total   atomic.Int64
	waiters atomic.Int32
	mu      sync.Mutex
	freed   chan struct{} // closed (and replaced) when bytes are given back while someone waits
}

// hostBuf is what the open connections from one remote IP hold. It lives
// while a connection from that IP is open (Server.hostBufs, under s.mu);
// a connection keeps its own pointer, so bytes it gives back after it was
// dropped still land on the right count.
type hostBuf struct {
	bytes atomic.Int64
	conns int // under s.mu
}

func newBufAccount() *bufAccount {
	return &bufAccount{freed: make(chan struct{})}
}

// hold adds n bytes held by sc.
func (sc *serverConn) hold(n int) {
	sc.held.Add(int64(n))
	sc.s.buf.total.Add(int64(n))
	if sc.hostBuf != nil {
		sc.hostBuf.bytes.Add(int64(n))
	}
}

// release gives back n bytes held by sc and wakes the readers waiting for
// room.
func (sc *serverConn) release(n int) {
	if n == 0 {
		return
	}
	sc.held.Add(-int64(n))
	b := sc.s.buf
	b.total.Add(-int64(n))
	if sc.hostBuf != nil {
		sc.hostBuf.bytes.Add(-int64(n))
	}
	if b.waiters.Load() > 0 {
		b.mu.Lock()
		close(b.freed)
		b.freed = make(chan struct{})
		b.mu.Unlock()
	}
}

// over returns the cap that keeps sc's reader from taking another record,
// or "".
func (sc *serverConn) over() string {
	s := sc.s
	switch {
	case sc.held.Load() >= int64(s.cfg.MaxConnBuffered):
		return HoldConn
	case sc.privLocal:
		return ""
	case sc.hostBuf != nil && sc.hostBuf.bytes.Load() >= int64(s.cfg.MaxHostBuffered):
		return HoldHost
	case s.buf.total.Load() >= int64(s.cfg.MaxBuffered):
		return HoldTotal
	}
	return ""
}

// overCap returns the cap that keeps sc's reader from taking another
// record ("" if none) and, with a cap, the channel closed when bytes are
// given back; the caller then counts as a waiter until it calls
// doneWaiting. Registering before the second look means no release is
// missed: one that came before it shows in the counts, one after it
// closes the channel.
func (sc *serverConn) overCap() (string, <-chan struct{}) {
	if sc.over() == "" {
		return "", nil
	}
	b := sc.s.buf
	b.waiters.Add(1)
	b.mu.Lock()
	freed := b.freed
	b.mu.Unlock()
	over := sc.over()
	if over == "" {
		b.waiters.Add(-1)
	}
	return over, freed
}

func (b *bufAccount) doneWaiting() { b.waiters.Add(-1) }

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
func (s *Server) Buffered() int { return int(s.buf.total.Load()) }

func (s *Server) reportHold(sc *serverConn, over string) {
	if s.cfg.OnHold != nil {
		s.cfg.OnHold(over)
	}
	if ok, _ := s.connLog.allow(sc.remote.Addr(), evReadHeld); !ok {
		return
	}
	conn, host, total := sc.held.Load(), int64(0), s.buf.total.Load()
	if sc.hostBuf != nil {
		host = sc.hostBuf.bytes.Load()
	}
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
