package pki

import (
	"bytes"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type fixture struct {
	dir string
	ca  *CA
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{dir: t.TempDir()}
	f.ca = f.newCA(t, "ca.pem")
	return f
}

func (f *fixture) newCA(t *testing.T, name string) *CA {
	c, k, err := MakeCA("test", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f.write(t, name, c)
	ca, err := ParseCA(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func (f *fixture) write(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *fixture) issue(t *testing.T, ca *CA, name string, r Request) Files {
	t.Helper()
	if r.Validity == 0 {
		r.Validity = time.Hour
	}
	if r.Now.IsZero() {
		r.Now = time.Now()
	}
	c, k, err := ca.Issue(r)
	if err != nil {
		t.Fatal(err)
	}
	return Files{CA: filepath.Join(f.dir, "ca.pem"), Cert: f.write(t, name+".pem", c), Key: f.write(t, name+"-key.pem", k)}
}

// handshake runs one raft-style handshake between two stores over a pipe
// and returns the server's error.
func handshake(t *testing.T, server, client *Store) error {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	errc := make(chan error, 1)
	go func() {
		c := tls.Client(b, client.ClientConfig())
		err := c.Handshake()
		if err == nil { // TLS 1.3: the server's verdict on our certificate arrives with the first read
			_, err = c.Read(make([]byte, 1))
		}
		errc <- err
		b.Close()
	}()
	s := tls.Server(a, server.RaftServerConfig())
	err := s.Handshake()
	if err == nil {
		s.Write([]byte{1})
	}
	a.Close()
	<-errc
	return err
}

func TestNodeCertificatesHandshakeAndOperatorsDoNotJoinRaft(t *testing.T) {
	f := newFixture(t)
	n1, err := Load(f.issue(t, f.ca, "n1", Request{Node: "n1", IPs: []net.IP{net.ParseIP("10.0.0.1")}}))
	if err != nil {
		t.Fatal(err)
	}
	n2, err := Load(f.issue(t, f.ca, "n2", Request{Node: "n2"}))
	if err != nil {
		t.Fatal(err)
	}
	op, err := Load(f.issue(t, f.ca, "op", Request{Client: "alice"}))
	if err != nil {
		t.Fatal(err)
	}
	if !n1.IsNode() || op.IsNode() {
		t.Fatalf("IsNode: node %v operator %v", n1.IsNode(), op.IsNode())
	}
	leaf := n1.Leaf()
	for _, want := range []string{ServerName, NodeName("n1")} {
		if !strings.Contains(strings.Join(leaf.DNSNames, " "), want) {
			t.Fatalf("node certificate names %v, want %s", leaf.DNSNames, want)
		}
	}
	if err := handshake(t, n1, n2); err != nil {
		t.Fatalf("node to node: %v", err)
	}
	err = handshake(t, n1, op)
	if !errors.Is(err, ErrWrongName) || Reason(err) != "wrong_name" {
		t.Fatalf("operator certificate on raft: %v (reason %s), want wrong_name", err, Reason(err))
	}
}

func TestLoadNamesTheFileAtFault(t *testing.T) {
	f := newFixture(t)
	good := f.issue(t, f.ca, "n1", Request{Node: "n1"})
	other := newFixture(t)
	foreign := other.issue(t, other.ca, "x", Request{Node: "x"})
	cases := []struct {
		name  string
		files Files
		want  string
	}{
		{"missing CA", Files{CA: filepath.Join(f.dir, "nope.pem"), Cert: good.Cert, Key: good.Key}, "tls_ca: open " + filepath.Join(f.dir, "nope.pem")},
		{"missing key", Files{CA: good.CA, Cert: good.Cert, Key: filepath.Join(f.dir, "nokey")}, "tls_key: open"},
		{"CA not PEM", Files{CA: good.Key, Cert: good.Cert, Key: good.Key}, "no PEM certificate"},
		{"key of another cert", Files{CA: good.CA, Cert: good.Cert, Key: foreign.Key}, "private key does not match"},
		{"cert of another CA", Files{CA: good.CA, Cert: foreign.Cert, Key: foreign.Key}, "does not verify against tls_ca"},
		{"partial", Files{CA: good.CA}, "missing [tls_cert tls_key]"},
	}
	for _, c := range cases {
		_, err := Load(c.files)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
	expired := f.issue(t, f.ca, "old", Request{Node: "old", Now: time.Now().Add(-2 * time.Hour), Validity: time.Hour})
	if _, err := Load(expired); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired: %v", err)
	}
}

func TestReloadSwapsCertificatesAndKeepsThemOnError(t *testing.T) {
	f := newFixture(t)
	files := f.issue(t, f.ca, "n1", Request{Node: "n1"})
	s, err := Load(files)
	if err != nil {
		t.Fatal(err)
	}
	first := s.Leaf().SerialNumber
	c, k, _ := f.ca.Issue(Request{Node: "n1", Validity: 2 * time.Hour, Now: time.Now()})
	f.write(t, "n1.pem", c)
	f.write(t, "n1-key.pem", k)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if s.Leaf().SerialNumber.Cmp(first) == 0 {
		t.Fatal("reload kept the old certificate")
	}
	second := s.Leaf().SerialNumber
	f.write(t, "n1.pem", []byte("garbage"))
	if err := s.Reload(); err == nil {
		t.Fatal("reload of a broken file succeeded")
	}
	if s.Leaf().SerialNumber.Cmp(second) != 0 {
		t.Fatal("a failed reload replaced the certificate")
	}
}

func TestRefusalsLogOncePerPeerAndInterval(t *testing.T) {
	var buf bytes.Buffer
	r, err := NewRefusals(slog.New(slog.NewTextHandler(&buf, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	r.SetClock(func() time.Time { return now }, time.Minute)
	peer := &net.TCPAddr{IP: net.ParseIP("10.0.0.9"), Port: 4000}
	plain := tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}
	for i := range 100 {
		peer.Port = 4000 + i // same host, new source port each time
		r.Observe("raft", peer, plain)
	}
	r.Observe("raft", &net.TCPAddr{IP: net.ParseIP("10.0.0.10"), Port: 1}, plain)
	if n := strings.Count(buf.String(), "TLS handshake refused"); n != 2 {
		t.Fatalf("%d log lines for 101 refusals from 2 hosts, want 2:\n%s", n, buf.String())
	}
	now = now.Add(time.Minute)
	r.Observe("raft", peer, plain)
	if !strings.Contains(buf.String(), "suppressed_since_last=99") {
		t.Fatalf("no suppressed count after the interval:\n%s", buf.String())
	}
	if got := r.Count("raft", "plaintext"); got != 102 {
		t.Fatalf("metric %v, want 102", got)
	}
}
