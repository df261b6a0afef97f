package oncrpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ClientConfig says how to reach a server.
type ClientConfig struct {
	Net        string        // "tcp" or "udp"
	Addr       string        // host:port
	Timeout    time.Duration // per call, including UDP retransmits; default 5 s
	Retransmit time.Duration // UDP: first retransmit interval, doubled each try; default 500 ms
	LocalAddr  netip.Addr    // optional source address (e.g. the VIP)
	Privileged bool          // bind a source port in 512..1023 (needs root or CAP_NET_BIND_SERVICE)
	Cred       OpaqueAuth    // default AUTH_NONE
	// MaxRecordSize caps a TCP reply record; default 1 MiB. A bigger reply
	// breaks the connection (ErrRecordTooBig).
	MaxRecordSize int
	// Within, when set, runs each dial (the socket's creation): a caller
	// in a network namespace of its own creates its sockets inside it.
	Within func(func() error) error
}

// Client makes calls to one server. It is safe for concurrent use; over TCP
// concurrent calls are pipelined on one connection and matched by XID. A
// broken TCP connection fails the calls in flight on it; the next call dials
// again.
type Client struct {
	cfg  ClientConfig
	xid  atomic.Uint32
	done chan struct{} // closed by Close

	mu     sync.Mutex
	closed bool
	cur    *clientConn
}

type reply struct {
	b   []byte
	err error
}

// clientConn is one connection (TCP) or connected socket (UDP) and the
// goroutine reading replies from it.
type clientConn struct {
	conn net.Conn
	udp  bool
	wmu  sync.Mutex // serialises TCP record writes

	mu      sync.Mutex
	pending map[uint32]chan reply
	err     error         // why the reader stopped
	dead    chan struct{} // closed when the reader has stopped
}

// Dial connects to cfg.Addr over cfg.Net. For UDP the socket is connected,
// so replies from other addresses are never seen.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	switch cfg.Net {
	case "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6":
	default:
		return nil, fmt.Errorf("oncrpc: dial %q: unsupported network %q", cfg.Addr, cfg.Net)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Retransmit <= 0 {
		cfg.Retransmit = 500 * time.Millisecond
	}
	if cfg.MaxRecordSize <= 0 {
		cfg.MaxRecordSize = DefaultClientMaxRecordSize
	}
	if len(cfg.Cred.Body) > MaxAuthBytes {
		return nil, fmt.Errorf("oncrpc: dial %q: credential of %d bytes: %w", cfg.Addr, len(cfg.Cred.Body), ErrTooLong)
	}
	c := &Client{cfg: cfg, done: make(chan struct{})}
	c.xid.Store(rand.Uint32())
	cc, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	c.cur = cc
	return c, nil
}

func (c *Client) isUDP() bool { return c.cfg.Net[:3] == "udp" }

// connect dials and starts the reply reader.
func (c *Client) connect(ctx context.Context) (*clientConn, error) {
	var conn net.Conn
	dial := func() (err error) {
		conn, err = dialFrom(ctx, c.cfg.Net, c.cfg.Addr, c.cfg.LocalAddr, c.cfg.Privileged)
		return err
	}
	var err error
	if c.cfg.Within != nil {
		err = c.cfg.Within(dial)
	} else {
		err = dial()
	}
	if err != nil {
		return nil, fmt.Errorf("oncrpc: dial %s %s: %w", c.cfg.Net, c.cfg.Addr, err)
	}
	cc := &clientConn{
		conn:    conn,
		udp:     c.isUDP(),
		pending: make(map[uint32]chan reply),
		dead:    make(chan struct{}),
	}
	go cc.readLoop(c.cfg.MaxRecordSize)
	return cc, nil
}

// dialFrom dials with an optional source address, and with privileged set
// tries source ports 512..1023 (from a random start) until one is free.
func dialFrom(ctx context.Context, network, addr string, local netip.Addr, privileged bool) (net.Conn, error) {
	udp := network[:3] == "udp"
	laddr := func(port int) net.Addr {
		if !local.IsValid() && port == 0 {
			return nil
		}
		ap := netip.AddrPortFrom(local, uint16(port))
		if udp {
			return net.UDPAddrFromAddrPort(ap)
		}
		return net.TCPAddrFromAddrPort(ap)
	}
	if !privileged {
		d := net.Dialer{LocalAddr: laddr(0)}
		return d.DialContext(ctx, network, addr)
	}
	const lo, n = 512, 512
	start := rand.IntN(n)
	var err error
	for i := range n {
		port := lo + (start+i)%n
		d := net.Dialer{LocalAddr: laddr(port)}
		var conn net.Conn
		conn, err = d.DialContext(ctx, network, addr)
		if err == nil {
			return conn, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("privileged source port %d: %w", port, err)
		}
	}
	return nil, fmt.Errorf("no free privileged source port: %w", err)
}

func (cc *clientConn) readLoop(maxRecord int) {
	var err error
	if cc.udp {
		buf := make([]byte, maxDatagram)
		for {
			var n int
			n, err = cc.conn.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					break
				}
				continue // e.g. ECONNREFUSED after an ICMP error: keep retransmitting
			}
			cc.deliver(append([]byte(nil), buf[:n]...))
		}
	} else {
		br := bufio.NewReaderSize(cc.conn, 4096)
		for {
			var rec []byte
			rec, err = ReadRecord(br, nil, maxRecord)
			if err != nil {
				break
			}
			cc.deliver(rec)
		}
	}
	cc.conn.Close()
	cc.mu.Lock()
	cc.err = err
	for xid, ch := range cc.pending {
		delete(cc.pending, xid)
		ch <- reply{err: fmt.Errorf("connection lost: %w", err)}
	}
	cc.mu.Unlock()
	close(cc.dead)
}

// deliver hands a reply to the call waiting for its XID; others are dropped.
func (cc *clientConn) deliver(b []byte) {
	xid, ok := decodeReplyXID(b)
	if !ok {
		return
	}
	cc.mu.Lock()
	ch, found := cc.pending[xid]
	if found {
		delete(cc.pending, xid)
	}
	cc.mu.Unlock()
	if found {
		ch <- reply{b: b}
	}
}

func (cc *clientConn) register(xid uint32, ch chan reply) error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.err != nil || cc.isDead() {
		return fmt.Errorf("connection lost: %w", cc.errOr())
	}
	cc.pending[xid] = ch
	return nil
}

func (cc *clientConn) isDead() bool {
	select {
	case <-cc.dead:
		return true
	default:
		return false
	}
}

func (cc *clientConn) errOr() error {
	if cc.err != nil {
		return cc.err
	}
	return ErrClosed
}

func (cc *clientConn) unregister(xid uint32) {
	cc.mu.Lock()
	delete(cc.pending, xid)
	cc.mu.Unlock()
}

// conn returns the live connection, dialling a new TCP one if the last broke.
func (c *Client) conn(ctx context.Context) (*clientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.cur != nil && !c.cur.isDead() {
		return c.cur, nil
	}
	if c.isUDP() {
		return nil, fmt.Errorf("udp socket: %w", c.cur.errOr())
	}
	cc, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	c.cur = cc
	return cc, nil
}

// Call sends one call and decodes the result into res (which may be nil for
// void). It gives up after cfg.Timeout (ErrTimeout) or when ctx ends. A
// non-SUCCESS reply comes back as an error wrapping the matching sentinel
// (ErrProgUnavail, ErrProcUnavail, ErrGarbageArgs, ErrSystemErr), a
// *MismatchError or an *AuthError.
func (c *Client) Call(ctx context.Context, prog, vers, proc uint32, args Marshaler, res Unmarshaler) error {
	if err := c.call(ctx, prog, vers, proc, args, res); err != nil {
		return fmt.Errorf("oncrpc: call %d/%d/%d to %s %s: %w", prog, vers, proc, c.cfg.Net, c.cfg.Addr, err)
	}
	return nil
}

func (c *Client) call(ctx context.Context, prog, vers, proc uint32, args Marshaler, res Unmarshaler) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cc, err := c.conn(ctx)
	if err != nil {
		return err
	}
	xid := c.xid.Add(1)
	w := Writer{buf: make([]byte, replyReserve, 256)}
	CallHeader{XID: xid, Prog: prog, Vers: vers, Proc: proc, Cred: c.cfg.Cred}.MarshalXDR(&w)
	if args != nil {
		args.MarshalXDR(&w)
	}
	msg := w.buf
	if cc.udp {
		msg = msg[replyReserve:]
		if len(msg) > maxDatagram {
			return fmt.Errorf("call of %d bytes does not fit a datagram: %w", len(msg), ErrRecordTooBig)
		}
	} else {
		putMarker(msg, len(msg)-replyReserve)
	}

	ch := make(chan reply, 1)
	if err := cc.register(xid, ch); err != nil {
		return err
	}
	defer cc.unregister(xid)

	deadline := time.Now().Add(c.cfg.Timeout)
	send := func() error {
		if cc.udp {
			_, err := cc.conn.Write(msg)
			if err != nil && !errors.Is(err, net.ErrClosed) {
				return nil // e.g. ECONNREFUSED: the retransmit may get through
			}
			return err
		}
		cc.wmu.Lock()
		defer cc.wmu.Unlock()
		cc.conn.SetWriteDeadline(deadline)
		if _, err := cc.conn.Write(msg); err != nil {
			cc.conn.Close() // a partial record breaks the stream
			return err
		}
		return nil
	}
	if err := send(); err != nil {
		return err
	}
	timeout := time.NewTimer(c.cfg.Timeout)
	defer timeout.Stop()
	var retrans <-chan time.Time
	interval := c.cfg.Retransmit
	var rt *time.Timer
	if cc.udp {
		rt = time.NewTimer(interval)
		defer rt.Stop()
		retrans = rt.C
	}
	for {
		select {
		case r := <-ch:
			if r.err != nil {
				return r.err
			}
			return decodeResult(r.b, res)
		case <-retrans:
			if err := send(); err != nil {
				return err
			}
			interval *= 2
			rt.Reset(interval)
		case <-timeout.C:
			return fmt.Errorf("no reply within %v: %w", c.cfg.Timeout, ErrTimeout)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
			}
			return ctx.Err()
		case <-c.done:
			return ErrClosed
		}
	}
}

// decodeResult decodes a reply message and its results.
func decodeResult(b []byte, res Unmarshaler) error {
	r := Reader{b: b}
	if _, err := decodeReply(&r); err != nil {
		return err
	}
	if res == nil {
		return nil
	}
	if err := res.UnmarshalXDR(&r); err != nil {
		return fmt.Errorf("decoding results: %w", err)
	}
	if err := r.Err(); err != nil {
		return fmt.Errorf("decoding results: %w", err)
	}
	return nil
}

// LocalAddr reports the source address and port of the current connection
// (IPv4-mapped addresses unmapped).
func (c *Client) LocalAddr() netip.AddrPort {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return netip.AddrPort{}
	}
	return addrPortOf(c.cur.conn.LocalAddr())
}

// Close closes the connection and stops its reader; calls in flight return
// ErrClosed. Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	cc := c.cur
	c.mu.Unlock()
	if cc != nil {
		err := cc.conn.Close()
		<-cc.dead
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("oncrpc: close: %w", err)
		}
	}
	return nil
}
