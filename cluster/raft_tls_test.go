package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/cluster/pki"
	"github.com/nsmd/nsmd/internal/testutil"
)

// testPKI is a cluster CA with node certificates, and the certificates an
// attacker might hold: another CA's, an operator's (same CA, no node
// name) and an expired node certificate.
type testPKI struct {
	dir string
	ca  *pki.CA
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	p.ca = p.makeCA(t, "ca")
	return p
}

func (p *testPKI) makeCA(t *testing.T, name string) *pki.CA {
	t.Helper()
	c, k, err := pki.MakeCA("test "+name, 24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	p.write(t, name+".pem", c)
	ca, err := pki.ParseCA(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func (p *testPKI) write(t *testing.T, name string, b []byte) string {
	t.Helper()
	f := filepath.Join(p.dir, name)
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// store issues a certificate from ca (caFile is the CA the holder trusts)
// and loads it.
func (p *testPKI) store(t *testing.T, ca *pki.CA, caFile, name string, req pki.Request) *pki.Store {
	t.Helper()
	if req.Validity == 0 {
		req.Validity = time.Hour
	}
	if req.Now.IsZero() {
		req.Now = time.Now()
	}
	c, k, err := ca.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	files := pki.Files{CA: filepath.Join(p.dir, caFile), Cert: p.write(t, name+".pem", c), Key: p.write(t, name+"-key.pem", k)}
	s, err := pki.Load(files)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return s
}

// tcpNode is a node of a cluster with raft over real TCP.
type tcpNode struct {
	id   string
	addr string
	n    *Node
}

// startTCPCluster starts 3 nodes with raft on 127.0.0.1 TCP ports, over
// mutual TLS when stores is not nil, and waits for a committed takeover.
func startTCPCluster(t *testing.T, stores []*pki.Store, refusals *pki.Refusals) []*tcpNode {
	t.Helper()
	ids := map[string]int{"n1": 0, "n2": 1, "n3": 2}
	nodes, took := tcpCluster(t, []string{t.TempDir(), t.TempDir(), t.TempDir()}, func(c *Config) {
		if stores != nil {
			c.RaftTLS, c.TLSRefusals = stores[ids[c.NodeID]], refusals
			// Three members, and the forger, on one address: each would
			// be a host of its own in a cluster.
			c.RaftHandshakesPerHost = maxRaftHandshakes
		}
	})
	select {
	case <-took:
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover within 10s")
	}
	for _, tn := range nodes {
		// raftMaxRPCsInFlight: pipelined replication can wedge (see there).
		if _, err := tn.n.trans.AppendEntriesPipeline("nobody", "127.0.0.1:1"); !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
			t.Fatalf("%s (TLS %v): raft transport offers pipelined replication (%v), which can wedge a follower's replication for good", tn.id, stores != nil, err)
		}
	}
	return nodes
}

// clusterView is what a forged message must not change.
type clusterView struct {
	leader  string
	terms   [3]uint64
	states  [3]int32
	digests [3][32]byte
}

func viewOf(t *testing.T, nodes []*tcpNode) clusterView {
	t.Helper()
	var v clusterView
	// Wait until every node applied what the leader committed, so the
	// digests compare equal state (after the control's forgery: a new
	// election).
	testutil.WaitForSeen(t, 10*time.Second, "the cluster to settle", func() (bool, string) {
		_, lid := nodes[0].n.raft.LeaderWithID()
		v.leader = string(lid)
		ok := v.leader != ""
		var idx uint64
		for i, tn := range nodes {
			v.terms[i] = tn.n.raft.CurrentTerm()
			v.states[i] = tn.n.fsm.State()
			v.digests[i] = tn.n.fsm.Digest()
			if i == 0 {
				idx = tn.n.fsm.AppliedIndex()
			} else if tn.n.fsm.AppliedIndex() != idx {
				ok = false
			}
		}
		return ok && v.digests[0] == v.digests[1] && v.digests[1] == v.digests[2], fmt.Sprintf("%+v", v)
	})
	return v
}

// forge sends a RequestVote for a member with a huge term and the
// leadership-transfer flag (which makes a follower vote although it has a
// leader), then an AppendEntries with a huge term carrying a command,
// through trans, to every node. It returns the errors.
func forge(trans raft.Transport, nodes []*tcpNode) []error {
	var errs []error
	for _, tn := range nodes {
		for _, other := range nodes {
			if other == tn {
				continue
			}
			var vr raft.RequestVoteResponse
			err := trans.RequestVote(raft.ServerID(tn.id), raft.ServerAddress(tn.addr), &raft.RequestVoteRequest{
				RPCHeader:          raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(other.id), Addr: []byte(other.addr)},
				Term:               1_000_000,
				LastLogIndex:       1 << 40,
				LastLogTerm:        999_999,
				LeadershipTransfer: true,
			}, &vr)
			errs = append(errs, err)
			var ar raft.AppendEntriesResponse
			err = trans.AppendEntries(raft.ServerID(tn.id), raft.ServerAddress(tn.addr), &raft.AppendEntriesRequest{
				RPCHeader:    raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(other.id), Addr: []byte(other.addr)},
				Term:         2_000_000,
				PrevLogEntry: 0, PrevLogTerm: 0,
				Entries:           []*raft.Log{{Index: 1, Term: 2_000_000, Type: raft.LogCommand, Data: []byte("forged")}},
				LeaderCommitIndex: 1,
			}, &ar)
			errs = append(errs, err)
		}
	}
	return errs
}

func quietHclog() hclog.Logger { return hclog.New(&hclog.LoggerOptions{Output: io.Discard}) }

// TestForgedRaftMessagesChangeNothingUnderTLS shows what raft over mutual
// TLS stops: forged RequestVote and AppendEntries messages, sent to a TLS
// cluster's raft ports in plaintext, with a certificate of another CA,
// with an operator certificate of the cluster's own CA and with an expired
// node certificate, are refused at the handshake; leader, terms, sm_state and
// the FSM digests stay as they were, and every refusal is counted by
// reason. The control: the same forgery against a plaintext cluster
// deposes its leader.
func TestForgedRaftMessagesChangeNothingUnderTLS(t *testing.T) {
	t.Run("control-plaintext-cluster-is-deposed", func(t *testing.T) {
		nodes := startTCPCluster(t, nil, nil)
		before := viewOf(t, nodes)
		attacker, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, time.Second, quietHclog())
		if err != nil {
			t.Fatal(err)
		}
		defer attacker.Close()
		forge(attacker, nodes)
		after := viewOf(t, nodes)
		if after.terms[0] < 1_000_000 {
			t.Fatalf("control: the forged vote did not move the term (%d → %d): the attack this test guards against does not work, so the TLS half proves nothing", before.terms[0], after.terms[0])
		}
		t.Logf("control: plaintext cluster deposed: term %d → %d, sm_state %d → %d", before.terms[0], after.terms[0], before.states[0], after.states[0])
	})

	p := newTestPKI(t)
	var stores []*pki.Store
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("n%d", i)
		stores = append(stores, p.store(t, p.ca, "ca.pem", id, pki.Request{Node: id}))
	}
	reg := prometheus.NewRegistry()
	refusals, err := pki.NewRefusals(slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	nodes := startTCPCluster(t, stores, refusals)
	before := viewOf(t, nodes)

	foreign := p.makeCA(t, "foreign")
	attackers := []struct {
		name   string
		reason string
		trans  func() raft.Transport
	}{
		{"plaintext", "plaintext", func() raft.Transport {
			tr, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, time.Second, quietHclog())
			if err != nil {
				t.Fatal(err)
			}
			return tr
		}},
		{"tls-without-certificate", "no_certificate", func() raft.Transport { return attackerTransport(t, nil) }},
		{"foreign-ca-node-certificate", "unknown_authority", func() raft.Transport {
			return attackerTransport(t, issueRaw(t, foreign, pki.Request{Node: "n2", Validity: time.Hour, Now: time.Now()}))
		}},
		{"operator-certificate-of-the-cluster-ca", "wrong_name", func() raft.Transport {
			return attackerTransport(t, issueRaw(t, p.ca, pki.Request{Client: "operator", Validity: time.Hour, Now: time.Now()}))
		}},
		{"expired-node-certificate-of-the-cluster-ca", "expired", func() raft.Transport {
			return attackerTransport(t, issueRaw(t, p.ca, pki.Request{Node: "n2", Validity: time.Hour, Now: time.Now().Add(-3 * time.Hour)}))
		}},
	}
	for _, a := range attackers {
		t.Run(a.name, func(t *testing.T) {
			tr := a.trans()
			defer tr.(io.Closer).Close()
			for i, err := range forge(tr, nodes) {
				if err == nil {
					t.Fatalf("forged message %d was answered", i)
				}
			}
			after := viewOf(t, nodes)
			// The forgery's marks are its terms: a node that took one of its
			// messages would be at term ≥ 1,000,000 with such an entry in
			// its log (the plaintext control shows it). An election of the
			// cluster's own, which a loaded machine may cause during the
			// attack, moves the term by a little and commits a takeover.
			for i, tn := range nodes {
				lastLogTerm, err := strconv.ParseUint(tn.n.raft.Stats()["last_log_term"], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				if after.terms[i] >= 1_000_000 || lastLogTerm >= 1_000_000 {
					t.Fatalf("%s took a forged message: term %d, last log term %d\nbefore %+v\nafter  %+v", tn.id, after.terms[i], lastLogTerm, before, after)
				}
			}
			if after != before {
				t.Logf("the cluster held an election of its own during the attack (a loaded machine): before %+v, after %+v", before, after)
				before = after
			}
			if got := refusals.Count("raft", a.reason); got < 3 {
				mf, _ := reg.Gather()
				for _, f := range mf {
					for _, m := range f.GetMetric() {
						t.Logf("%s %v %v", f.GetName(), m.GetLabel(), m.GetCounter().GetValue())
					}
				}
				t.Fatalf("refusals{raft,%s} = %v, want ≥ 3 (one per node at least)", a.reason, got)
			}
			t.Logf("%d forged messages refused at the handshake (reason %s); leader %s, term %d, sm_state %d, digest %x unchanged",
				len(nodes)*(len(nodes)-1)*2, a.reason, after.leader, after.terms[0], after.states[0], after.digests[0][:6])
		})
	}
}

// issueRaw issues a certificate without checking it (an attacker's).
func issueRaw(t *testing.T, ca *pki.CA, req pki.Request) *tls.Certificate {
	t.Helper()
	c, k, err := ca.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return &cert
}

// attackerStream dials raft over TLS with whatever certificate it holds
// (nil: none) and trusts any server.
type attackerStream struct {
	net.Listener
	cert *tls.Certificate
}

func (s *attackerStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	if s.cert != nil {
		// Always send it: Go's client would otherwise leave out a
		// certificate whose issuer the server did not list.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return s.cert, nil }
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(addr), cfg)
	if err != nil {
		return nil, err
	}
	// Under TLS 1.3 a refused client certificate shows on the first read;
	// raft would write its message first, so do one read here to surface
	// the server's alert as raft would.
	c.SetReadDeadline(time.Now().Add(timeout))
	if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
		c.Close()
		return nil, err
	}
	c.SetReadDeadline(time.Time{})
	return c, nil
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func attackerTransport(t *testing.T, cert *tls.Certificate) raft.Transport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return raft.NewNetworkTransportWithLogger(&attackerStream{Listener: ln, cert: cert}, 2, time.Second, quietHclog())
}

// TestSilentHandshakesFromOneAddressDoNotHoldMembersOut: a host opens 64
// silent TCP connections to a raft TLS port (the total handshake cap) and
// keeps them open; a member's dial, with a real certificate over loopback,
// still completes its handshake at once, and the excess connections are
// counted as too_many. The negative control, with the per-address cap at
// the total, shows the test catching the stall: the member is refused.
func TestSilentHandshakesFromOneAddressDoNotHoldMembersOut(t *testing.T) {
	p := newTestPKI(t)
	server := p.store(t, p.ca, "ca.pem", "n1", pki.Request{Node: "n1"})
	member := p.store(t, p.ca, "ca.pem", "n2", pki.Request{Node: "n2"})
	for _, tc := range []struct {
		name    string
		perHost int
		served  bool
	}{
		{"per-address cap", testRaftHandshakesPerHost, true},
		{"negative control: no per-address cap", maxRaftHandshakes, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refusals, err := pki.NewRefusals(slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := newTLSStream("127.0.0.1:0", server, refusals, tc.perHost)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := s.Accept(); err == nil {
					accepted <- c
				}
			}()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 90)}, Timeout: 5 * time.Second}
			for range maxRaftHandshakes {
				c, err := d.Dial("tcp", s.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
			}
			// Every silent connection has been taken by the accept loop
			// (handshaking or refused) before the member dials.
			testutil.WaitFor(t, 5*time.Second, "the silent connections accepted", func() bool {
				s.mu.Lock()
				n := s.hosts[netip.MustParseAddr("127.0.0.90")]
				s.mu.Unlock()
				return n == tc.perHost && int(refusals.Count("raft", "too_many")) == maxRaftHandshakes-tc.perHost
			})
			dialer := &tlsStream{store: member, refusals: refusals}
			c, err := dialer.Dial(raft.ServerAddress(s.Addr().String()), 2*time.Second)
			if !tc.served {
				if err == nil {
					c.Close()
					t.Fatal("negative control: the member was served although the silent connections hold every handshake")
				}
				return
			}
			if err != nil {
				t.Fatalf("member's dial while one address holds silent connections: %v", err)
			}
			defer c.Close()
			select {
			case ac := <-accepted:
				ac.Close()
			case <-time.After(5 * time.Second):
				t.Fatal("the member's connection was not handed to raft")
			}
		})
	}
}
