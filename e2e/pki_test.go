package e2e

import (
	"crypto/tls"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nsmd/nsmd/cluster/pki"
)

// clusterPKI is one cluster's certificates, gossip key and admin token,
// made by the shipped `nsmd tls init` (so the test covers it too).
type clusterPKI struct {
	dir string
}

// newClusterPKI runs nsmd tls init for nodes (id → IP).
func newClusterPKI(t *testing.T, nodes map[string]string) *clusterPKI {
	t.Helper()
	p := &clusterPKI{dir: t.TempDir()}
	args := []string{"tls", "init", "--dir", p.dir}
	for id, ip := range nodes {
		args = append(args, "--node", id+"="+ip)
	}
	if out, err := exec.Command(nsmdBin, args...).CombinedOutput(); err != nil {
		t.Fatalf("nsmd tls init: %v: %s", err, out)
	}
	return p
}

func (p *clusterPKI) file(name string) string { return filepath.Join(p.dir, name) }

// nodeArgs are agent flags for node id: mutual TLS, gossip key, token.
func (p *clusterPKI) nodeArgs(id string) []string {
	return []string{
		"--tls-ca", p.file("ca.pem"), "--tls-cert", p.file(id + ".pem"), "--tls-key", p.file(id + "-key.pem"),
		"--gossip-key-file", p.file("gossip.key"), "--admin-token-file", p.file("admin.token"),
	}
}

// cliArgs are the operator's flags for commands that call the admin API.
func (p *clusterPKI) cliArgs() []string {
	return []string{"--tls-ca", p.file("ca.pem"), "--tls-cert", p.file("operator.pem"), "--tls-key", p.file("operator-key.pem")}
}

// clientTLS is the operator's TLS config for the admin API.
func (p *clusterPKI) clientTLS(t *testing.T) *tls.Config {
	t.Helper()
	s, err := pki.Load(pki.Files{CA: p.file("ca.pem"), Cert: p.file("operator.pem"), Key: p.file("operator-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	return s.ClientConfig()
}
