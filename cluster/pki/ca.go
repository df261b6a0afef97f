package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"regexp"
	"time"
)

// CA signs cluster certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	PEM  []byte // Cert, PEM encoded
}

// MakeCA makes a self-signed CA (ECDSA P-256) valid for validity and
// returns its certificate and private key in PEM.
func MakeCA(commonName string, validity time.Duration, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"nsmd"}},
		NotBefore:             now.Add(-5 * time.Minute), // clock skew between the machine that signs and the nodes
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// ParseCA reads a CA made by MakeCA (or any CA certificate and its key).
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	der, err := decodePEM(certPEM, "CERTIFICATE")
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("CA certificate: not a CA (basic constraints)")
	}
	kder, err := decodePEM(keyPEM, "PRIVATE KEY")
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kder)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key: %T cannot sign", k)
	}
	if !publicKeysEqual(signer.Public(), cert.PublicKey) {
		return nil, errors.New("CA key does not match the CA certificate")
	}
	return &CA{Cert: cert, Key: signer, PEM: certPEM}, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

// Request describes a certificate to issue.
type Request struct {
	// Node, when set, makes a node certificate (server and client
	// authentication; names ServerName and NodeName(Node)). Otherwise
	// Client names an operator certificate (client authentication only;
	// name ClientName).
	Node   string
	Client string
	IPs    []net.IP // extra IP SANs (node certificates)
	DNS    []string // extra DNS SANs (node certificates)
	// Validity is how long it is valid from Now.
	Validity time.Duration
	Now      time.Time
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// Issue signs a new certificate (ECDSA P-256 key) and returns it and its
// key in PEM.
func (ca *CA) Issue(r Request) (certPEM, keyPEM []byte, err error) {
	if (r.Node == "") == (r.Client == "") {
		return nil, nil, errors.New("issue: give exactly one of a node id or a client name")
	}
	if r.Validity <= 0 {
		return nil, nil, errors.New("issue: validity must be positive")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    r.Now.Add(-5 * time.Minute),
		NotAfter:     r.Now.Add(r.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter // a chain is only as valid as its CA
	}
	if r.Node != "" {
		if !idRE.MatchString(r.Node) {
			return nil, nil, fmt.Errorf("issue: node id %q is not usable in a DNS name (letters, digits, '.', '_', '-'; at most 63)", r.Node)
		}
		tmpl.Subject = pkix.Name{CommonName: NodeName(r.Node), Organization: []string{"nsmd"}}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.DNSNames = append([]string{ServerName, NodeName(r.Node), "localhost"}, r.DNS...)
		tmpl.IPAddresses = append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, r.IPs...)
	} else {
		tmpl.Subject = pkix.Name{CommonName: r.Client, Organization: []string{"nsmd"}}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		tmpl.DNSNames = []string{ClientName}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
