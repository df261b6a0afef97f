// Package agenttest starts nsmd nodes for tests: a dev cluster on free
// loopback ports that stops when the test ends, the wait for its leader,
// the PKI of `nsmd tls init`, and reads of a node's state and metrics.
// Tests of package agent itself, of cmd/nsmd and of the benches use it.
package agenttest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/cluster/pki"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// DevOptions lays out a dev cluster of nodes nodes (at most 3) with the
// loopback VIP vip, each port free on every address, an admin API, logs at
// warn.
func DevOptions(t testing.TB, vip string, nodes int) agent.DevOptions {
	t.Helper()
	ips := []string{vip}
	for i := range max(nodes, 3) {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", i+1))
	}
	p := testutil.FreePorts(t, 4, ips...)
	return agent.DevOptions{
		Nodes: nodes, DataDir: t.TempDir(), VIP: vip, LogLevel: "warn",
		NSMPort: p[0], RaftPort: p[1], AdminPort: p[2], GossipPort: p[3],
	}
}

// Logger logs at level and above to stderr.
func Logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// StartDev starts a dev cluster laid out by o with opts (Logger: warnings
// to stderr when nil); it closes when the test ends.
func StartDev(t testing.TB, o agent.DevOptions, opts agent.Options) *agent.Dev {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = Logger(slog.LevelWarn)
	}
	d, err := agent.StartDev(o, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// Dev starts a dev cluster of nodes nodes with the VIP vip on free ports.
func Dev(t testing.TB, vip string, nodes int) (*agent.Dev, agent.DevOptions) {
	t.Helper()
	o := DevOptions(t, vip, nodes)
	return StartDev(t, o, agent.Options{}), o
}

// Leader waits for the agent of d, other than skip, that leads and holds
// the VIP.
func Leader(t testing.TB, d *agent.Dev, skip *agent.Agent, timeout time.Duration) *agent.Agent {
	t.Helper()
	var lead *agent.Agent
	testutil.WaitFor(t, timeout, "a leader holding the VIP", func() bool {
		for _, a := range d.Agents() {
			if a != skip && a.Node().Leading() && a.VIPHeld() {
				lead = a
				return true
			}
		}
		return false
	})
	return lead
}

// WaitApplied waits until a has applied index.
func WaitApplied(t testing.TB, a *agent.Agent, index uint64) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("%s to apply index %d", a.Config().NodeID, index), func() bool {
		return a.Node().View().AppliedIndex() >= index
	})
}

// SMStat calls SM_STAT at addr over network ("udp" or "tcp").
func SMStat(ctx context.Context, network, addr string) (nsm.SMStatRes, error) {
	var res nsm.SMStatRes
	c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: network, Addr: addr, Timeout: 200 * time.Millisecond, Retransmit: 50 * time.Millisecond})
	if err != nil {
		return res, err
	}
	defer c.Close()
	err = c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: "x"}, &res)
	return res, err
}

// PKI writes into dir what `nsmd tls init --node node1=127.0.0.1 …` does
// for nodes node1..nodeN: ca.pem and ca-key.pem, <id>.pem and
// <id>-key.pem per node, operator.pem and operator-key.pem, gossip.key
// and admin.token.
func PKI(t testing.TB, dir string, nodes int) {
	t.Helper()
	now := time.Now()
	write := func(name string, b []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The validities of nsmd tls init: no certificate-expiry alert fires.
	caPEM, caKey, err := pki.MakeCA("nsmd cluster CA", 10*365*24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	write("ca.pem", caPEM)
	write("ca-key.pem", caKey)
	ca, err := pki.ParseCA(caPEM, caKey)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []pki.Request{{Client: "operator"}}
	for i := range nodes {
		reqs = append(reqs, pki.Request{Node: fmt.Sprintf("node%d", i+1), IPs: []net.IP{net.IPv4(127, 0, 0, byte(i+1))}})
	}
	for _, r := range reqs {
		r.Validity, r.Now = 825*24*time.Hour, now
		c, k, err := ca.Issue(r)
		if err != nil {
			t.Fatal(err)
		}
		name := r.Node + r.Client
		write(name+".pem", c)
		write(name+"-key.pem", k)
	}
	key, tok := make([]byte, 32), make([]byte, 32)
	rand.Read(key)
	rand.Read(tok)
	write("gossip.key", []byte(base64.StdEncoding.EncodeToString(key)+"\n"))
	write("admin.token", []byte(hex.EncodeToString(tok)+"\n"))
}

// UsePKI makes a node config use the files PKI wrote into dir: TLS on raft
// and the admin API, the gossip key and the admin token.
func UsePKI(dir string, c *config.Config) {
	c.TLSCA = filepath.Join(dir, "ca.pem")
	c.TLSCert = filepath.Join(dir, c.NodeID+".pem")
	c.TLSKey = filepath.Join(dir, c.NodeID+"-key.pem")
	c.GossipKeyFile = filepath.Join(dir, "gossip.key")
	c.AdminTokenFile = filepath.Join(dir, "admin.token")
}

// TLSDev starts a 3-node dev cluster with mutual TLS on raft, HTTPS on the
// admin API, a gossip key and an admin token, and returns it with its
// layout and the directory of its PKI.
func TLSDev(t testing.TB, vip string) (*agent.Dev, agent.DevOptions, string) {
	t.Helper()
	dir := t.TempDir()
	PKI(t, dir, 3)
	o := DevOptions(t, vip, 3)
	o.Tune = func(c *config.Config) { UsePKI(dir, c) }
	return StartDev(t, o, agent.Options{}), o, dir
}
