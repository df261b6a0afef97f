package agent

import (
	"container/list"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// adminConns caps the admin API's open connections (admin_max_conns): a
// connection over the cap closes the one idle the longest (a keep-alive
// connection between requests) to make room, or, if none is idle, is
// closed at once. Both are counted in nsmd_admin_connections_total.
type adminConns struct {
	max    int
	events *prometheus.CounterVec

	mu    sync.Mutex
	open  map[net.Conn]*list.Element // every open connection
	idle  *list.List                 // idle ones, longest idle first (of net.Conn)
	count int
}

func newAdminConns(max int, reg prometheus.Registerer) (*adminConns, error) {
	c := &adminConns{
		max: max,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_admin_connections_total",
			Help: "Admin API connections by event: accepted, evicted_idle (an idle keep-alive connection closed to admit a new one at admin_max_conns), refused (at admin_max_conns, none idle).",
		}, []string{"event"}),
		open: map[net.Conn]*list.Element{},
		idle: list.New(),
	}
	if err := reg.Register(c.events); err != nil {
		return nil, err
	}
	return c, nil
}

// listener wraps ln: connections over the cap are refused or make room.
func (c *adminConns) listener(ln net.Listener) net.Listener { return &capListener{Listener: ln, c: c} }

type capListener struct {
	net.Listener
	c *adminConns
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.c.admit(conn) {
			return conn, nil
		}
		conn.Close()
	}
}

// admit counts conn in, closing the longest-idle connection if at the cap;
// false: at the cap with none idle.
func (c *adminConns) admit(conn net.Conn) bool {
	c.mu.Lock()
	var victim net.Conn
	if c.max > 0 && c.count >= c.max {
		e := c.idle.Front()
		if e == nil {
			c.mu.Unlock()
			c.events.WithLabelValues("refused").Inc()
			return false
		}
		victim = c.idle.Remove(e).(net.Conn)
		delete(c.open, victim)
		c.count--
	}
	c.open[conn] = nil
	c.count++
	c.mu.Unlock()
	if victim != nil {
		victim.Close()
		c.events.WithLabelValues("evicted_idle").Inc()
	}
	c.events.WithLabelValues("accepted").Inc()
	return true
}

// connState is the http.Server's ConnState hook: it keeps the idle list
// and forgets closed connections.
func (c *adminConns) connState(conn net.Conn, st http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, known := c.open[conn]
	if !known {
		return // evicted already, or refused
	}
	if e != nil {
		c.idle.Remove(e)
		c.open[conn] = nil
	}
	switch st {
	case http.StateIdle:
		c.open[conn] = c.idle.PushBack(conn)
	case http.StateClosed, http.StateHijacked:
		delete(c.open, conn)
		c.count--
	}
}
