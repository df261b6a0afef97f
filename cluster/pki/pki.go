// Package pki is nsmd's cluster certificate authority and mutual TLS:
// it makes a CA and the certificates signed by it (MakeCA, CA.Issue), loads
// the three files a node runs with (Load) and re-reads them on Reload
// (SIGHUP), and builds the tls.Configs of the raft port and the admin API
// from whatever was loaded last, so a reload takes effect at the next
// handshake without a restart.
//
// Names, not addresses, are verified: every node certificate carries the DNS
// name ServerName ("server.nsmd") and "<node-id>.server.nsmd", and operator
// certificates carry ClientName ("client.nsmd"). A raft peer must present a
// certificate from the cluster CA naming ServerName, so an operator
// certificate can call the admin API but cannot vote or append entries; a
// client of either port checks that the server's certificate names
// ServerName, so certificates need not list every address a node is reached
// at (a VIP, NAT). TLS 1.3 only.
package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
)

// The names certificates are verified by.
const (
	// ServerName is in every node certificate: raft peers and admin clients
	// require it.
	ServerName = "server.nsmd"
	// ClientName is in operator certificates (nsmd tls cert --client): the
	// admin API accepts them, raft does not.
	ClientName = "client.nsmd"
)

// NodeName is the node-specific DNS name in a node certificate.
func NodeName(id string) string { return id + "." + ServerName }

// Files names the three PEM files a node or a client runs with.
type Files struct {
	CA   string // the cluster CA certificate(s)
	Cert string // this node's (or client's) certificate, optionally followed by intermediates
	Key  string // its private key
}

// Enabled reports whether any file is named.
func (f Files) Enabled() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Check reports a partial set: all three are needed, or none.
func (f Files) Check() error {
	if !f.Enabled() || (f.CA != "" && f.Cert != "" && f.Key != "") {
		return nil
	}
	var missing []string
	for _, m := range []struct{ key, v string }{{"tls_ca", f.CA}, {"tls_cert", f.Cert}, {"tls_key", f.Key}} {
		if m.v == "" {
			missing = append(missing, m.key)
		}
	}
	return fmt.Errorf("TLS needs tls_ca, tls_cert and tls_key together; missing %v", missing)
}

// material is one loaded set of files.
type material struct {
	pool *x509.CertPool
	cert *tls.Certificate
	leaf *x509.Certificate
}

// Store holds the loaded files; Reload replaces them atomically.
type Store struct {
	files Files
	mu    sync.RWMutex
	cur   *material
}

// Load reads and checks the three files. Errors name the file.
func Load(f Files) (*Store, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	if !f.Enabled() {
		return nil, errors.New("pki: no TLS files given")
	}
	m, err := load(f)
	if err != nil {
		return nil, err
	}
	return &Store{files: f, cur: m}, nil
}

func load(f Files) (*material, error) {
	pool, err := loadPool(f.CA)
	if err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(f.Cert)
	if err != nil {
		return nil, fmt.Errorf("tls_cert: %w", err)
	}
	keyPEM, err := os.ReadFile(f.Key)
	if err != nil {
		return nil, fmt.Errorf("tls_key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls_cert %s / tls_key %s: %w", f.Cert, f.Key, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tls_cert %s: %w", f.Cert, err)
		}
	}
	// Our own certificate must verify against the CA we will demand of
	// peers: a node started with a mismatched pair would be refused by
	// every peer, which is better said at start.
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("tls_cert %s does not verify against tls_ca %s: %w", f.Cert, f.CA, err)
	}
	return &material{pool: pool, cert: &cert, leaf: leaf}, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls_ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("tls_ca %s: no PEM certificate in it", caFile)
	}
	return pool, nil
}

// VerifyOnlyConfig is a client config that checks the server against the
// CA in caFile and presents no certificate (reads, or the token).
func VerifyOnlyConfig(caFile string) (*tls.Config, error) {
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: ServerName}, nil
}

// Reload re-reads the files; on error the loaded ones stay in use.
func (s *Store) Reload() error {
	m, err := load(s.files)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cur = m
	s.mu.Unlock()
	return nil
}

func (s *Store) get() *material {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur
}

// Leaf is the loaded certificate.
func (s *Store) Leaf() *x509.Certificate { return s.get().leaf }

// IsNode reports whether the loaded certificate is a node certificate.
func (s *Store) IsNode() bool { return slices.Contains(s.get().leaf.DNSNames, ServerName) }

// Expiry is when the loaded certificate stops being valid.
func (s *Store) Expiry() time.Time { return s.get().leaf.NotAfter }

// ErrWrongName is a peer certificate that verifies against the CA but does
// not carry the name this port requires.
var ErrWrongName = errors.New("certificate does not name an allowed role")

// RaftServerConfig is the raft listener's config: a client certificate
// from the CA naming ServerName is required.
func (s *Store) RaftServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.get()
			return &tls.Config{
				MinVersion:       tls.VersionTLS13,
				Certificates:     []tls.Certificate{*m.cert},
				ClientAuth:       tls.RequireAndVerifyClientCert,
				ClientCAs:        m.pool,
				VerifyConnection: requireName(ServerName),
			}, nil
		},
	}
}

// AdminServerConfig is the admin API's config: a client certificate is
// asked for and, when given, must verify; the handler decides which
// requests need one (PeerRole).
func (s *Store) AdminServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.get()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{*m.cert},
				ClientAuth:   tls.VerifyClientCertIfGiven,
				ClientCAs:    m.pool,
				NextProtos:   []string{"http/1.1"},
			}, nil
		},
	}
}

// ClientConfig is the config for dialing a node (raft peers, the CLI): the
// server must present a certificate from the CA naming ServerName; ours
// goes along.
func (s *Store) ClientConfig() *tls.Config {
	m := s.get()
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    m.pool,
		ServerName: ServerName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.get().cert, nil
		},
	}
}

// requireName checks, after chain verification, that the peer's
// certificate carries one of names.
func requireName(names ...string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no peer certificate")
		}
		leaf := cs.PeerCertificates[0]
		for _, n := range names {
			if slices.Contains(leaf.DNSNames, n) {
				return nil
			}
		}
		return fmt.Errorf("%w: %v (want %v)", ErrWrongName, leaf.DNSNames, names)
	}
}

// PeerRole is the role a verified peer certificate carries: "node",
// "client" or "" (none, or not verified).
func PeerRole(cs *tls.ConnectionState) string {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return ""
	}
	names := cs.PeerCertificates[0].DNSNames
	switch {
	case slices.Contains(names, ServerName):
		return "node"
	case slices.Contains(names, ClientName):
		return "client"
	}
	return ""
}

// decodePEM returns the DER of the first block of type typ.
func decodePEM(b []byte, typ string) ([]byte, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("no %s PEM block", typ)
		}
		if blk.Type == typ {
			return blk.Bytes, nil
		}
	}
}
