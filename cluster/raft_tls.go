package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/cluster/pki"
)

// tlsStream is raft's stream layer over mutual TLS (pki): every accepted
// connection completes its handshake — a client certificate from the
// cluster CA naming pki.ServerName — before raft sees a byte of it, so a
// peer without such a certificate can send no RequestVote, AppendEntries
// or InstallSnapshot. Handshakes run in their own goroutines (bounded, with
// a deadline), so one slow or silent peer cannot stall Accept; and at most
// perHost of them come from one IP address, so a host that opens silent
// connections (and reopens them as they time out) holds only its own share
// of the 64, never the members' handshakes out (elections need them).
type tlsStream struct {
	ln       net.Listener
	store    *pki.Store
	refusals *pki.Refusals
	conns    chan net.Conn
	done     chan struct{}
	sem      chan struct{} // handshakes in progress
	perHost  int
	wg       sync.WaitGroup
	once     sync.Once

	mu    sync.Mutex
	hosts map[netip.Addr]int // handshakes in progress per remote IP
}

const (
	tlsHandshakeTimeout = 5 * time.Second
	// maxRaftHandshakes bounds the handshakes in progress in all;
	// Config.RaftHandshakesPerHost (1…this) those from one address.
	maxRaftHandshakes = 64
)

// errTooManyHandshakes refuses a handshake over a cap.
var errTooManyHandshakes = fmt.Errorf("too many handshakes in progress: %w", pki.ErrTooManyHandshakes)

func newTLSStream(bind string, store *pki.Store, refusals *pki.Refusals, perHost int) (*tlsStream, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("raft TLS listener on %s: %w", bind, err)
	}
	s := &tlsStream{ln: ln, store: store, refusals: refusals, conns: make(chan net.Conn),
		done: make(chan struct{}), sem: make(chan struct{}, maxRaftHandshakes), perHost: min(perHost, maxRaftHandshakes),
		hosts: make(map[netip.Addr]int)}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

func (s *tlsStream) acceptLoop() {
	defer s.wg.Done()
	cfg := s.store.RaftServerConfig()
	for {
		raw, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t := time.NewTimer(10 * time.Millisecond) // EMFILE and the like
			select {
			case <-t.C:
			case <-s.done:
				t.Stop()
				return
			}
			continue
		}
		host := remoteIP(raw)
		if !s.takeHost(host) {
			s.refusals.Observe("raft", raw.RemoteAddr(), fmt.Errorf("from this address: %w", errTooManyHandshakes))
			raw.Close()
			continue
		}
		select {
		case s.sem <- struct{}{}:
		default: // a handshake flood: drop rather than queue
			s.giveHost(host)
			s.refusals.Observe("raft", raw.RemoteAddr(), errTooManyHandshakes)
			raw.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.sem; s.giveHost(host) }()
			tc := tls.Server(raw, cfg)
			tc.SetDeadline(time.Now().Add(tlsHandshakeTimeout))
			if err := tc.Handshake(); err != nil {
				s.refusals.Observe("raft", raw.RemoteAddr(), err)
				raw.Close()
				return
			}
			tc.SetDeadline(time.Time{})
			select {
			case s.conns <- tc:
			case <-s.done:
				tc.Close()
			}
		}()
	}
}

// remoteIP is c's remote IP address, IPv4-mapped addresses unmapped
// (invalid for a non-IP address: not counted per host).
func remoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// takeHost counts a handshake from host in, unless host has perHost in
// progress.
func (s *tlsStream) takeHost(host netip.Addr) bool {
	if !host.IsValid() {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hosts[host] >= s.perHost {
		return false
	}
	s.hosts[host]++
	return true
}

func (s *tlsStream) giveHost(host netip.Addr) {
	if !host.IsValid() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.hosts[host] - 1; n > 0 {
		s.hosts[host] = n
	} else {
		delete(s.hosts, host)
	}
}

// Accept implements net.Listener.
func (s *tlsStream) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener; it waits for the handshakes in progress.
func (s *tlsStream) Close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		err = s.ln.Close()
		s.wg.Wait()
	})
	return err
}

// Addr implements net.Listener.
func (s *tlsStream) Addr() net.Addr { return s.ln.Addr() }

// Dial implements raft.StreamLayer: TCP, then the TLS handshake, both
// within timeout.
func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	raw, err := d.Dial("tcp", string(address))
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, s.store.ClientConfig())
	if timeout <= 0 {
		timeout = tlsHandshakeTimeout
	}
	tc.SetDeadline(time.Now().Add(timeout))
	if err := tc.Handshake(); err != nil {
		s.refusals.Observe("raft_dial", raw.RemoteAddr(), err)
		raw.Close()
		return nil, fmt.Errorf("raft TLS handshake with %s: %w", address, err)
	}
	tc.SetDeadline(time.Time{})
	return tc, nil
}

// raftMaxRPCsInFlight = 1 turns raft's pipelined replication off. In
// hashicorp/raft v1.7 a follower's Success=false (a failed log write, a
// log mismatch) or a higher term ends the pipeline's decoder while the
// sender may still pick one more send; that send parks on an unbuffered
// channel nobody reads, for good (hashicorp/raft #612; grafana/pyroscope
// turned pipelining off for the same deadlock). The follower then gets
// heartbeats but never another entry, and the leader's Shutdown hangs.
// With pipelining, TestFollowerWithFlappingDiskIsReplicatedToAgain hits it
// in about 1 run in 6, and the full-disk tests hang. Without the pipeline each
// AppendEntries waits for its answer; nsmd's group commit puts many
// SM_MONs in one entry, so the cost is small (BENCHMARKS.md).
const raftMaxRPCsInFlight = 1

// newTLSTransport is raft's network transport over tlsStream.
// At most perHost handshakes are in progress from one IP address.
func newTLSTransport(bind string, advertise *net.TCPAddr, store *pki.Store, refusals *pki.Refusals, perHost int, logger hclog.Logger) (*raft.NetworkTransport, error) {
	if advertise.IP == nil || advertise.IP.IsUnspecified() {
		return nil, fmt.Errorf("raft address %s: not advertisable (give a specific IP)", bind)
	}
	s, err := newTLSStream(bind, store, refusals, perHost)
	if err != nil {
		return nil, err
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: &advertisedStream{tlsStream: s, addr: advertise}, MaxPool: 4, Timeout: 5 * time.Second, Logger: logger,
		MaxRPCsInFlight: raftMaxRPCsInFlight,
	}), nil
}

// advertisedStream reports the configured address (a bind on port 0 gets
// the real port from the listener).
type advertisedStream struct {
	*tlsStream
	addr *net.TCPAddr
}

func (a *advertisedStream) Addr() net.Addr {
	if a.addr.Port == 0 {
		return a.tlsStream.Addr()
	}
	return a.addr
}
