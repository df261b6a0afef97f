package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/cluster/pki"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	certValidity = 825 * 24 * time.Hour
)

func tlsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tls",
		Short: "Make the cluster's CA, node and operator certificates, gossip key and admin token",
		Long: `Every node runs with tls_ca (the cluster CA), tls_cert and tls_key (its own
certificate, naming server.nsmd and <id>.server.nsmd) and gossip_key_file.
Operators talk to the admin API with a client certificate (naming
client.nsmd, accepted by the admin API and refused by raft) or the admin token.

  nsmd tls init --dir /etc/nsmd/tls --node n1=10.0.0.1 --node n2=10.0.0.2 --node w=10.0.0.3

makes all of it at once; tls ca and tls cert make one piece (a new node, a
renewed certificate). Keys are written 0600 and never overwritten. Nodes
re-read their files on SIGHUP.`,
	}
	cmd.AddCommand(tlsInitCmd(), tlsCACmd(), tlsCertCmd())
	return cmd
}

// writeNew writes a file that must not exist yet.
func writeNew(dir, name string, data []byte, mode fs.FileMode) (string, error) {
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return p, fmt.Errorf("%s exists: not overwriting it (move it away to make a new one)", p)
		}
		return p, err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return p, err
	}
	return p, f.Close()
}

func makeCA(dir string, out io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	certPEM, keyPEM, err := pki.MakeCA("nsmd cluster CA", caValidity, time.Now())
	if err != nil {
		return err
	}
	// Key first: a crash between the two leaves no CA certificate without its key.
	kp, err := writeNew(dir, "ca-key.pem", keyPEM, 0o600)
	if err != nil {
		return err
	}
	cp, err := writeNew(dir, "ca.pem", certPEM, 0o644)
	if err != nil {
		os.Remove(kp)
		return err
	}
	fmt.Fprintf(out, "CA          %s (key %s: keep it off the nodes)\n", cp, kp)
	return nil
}

func loadCA(dir string) (*pki.CA, error) {
	c, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return nil, fmt.Errorf("CA: %w (make one with nsmd tls ca --dir %s)", err, dir)
	}
	k, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	return pki.ParseCA(c, k)
}

func issue(ca *pki.CA, dir string, req pki.Request, out io.Writer) error {
	name := req.Node
	kind := "node"
	if name == "" {
		name, kind = req.Client, "client"
	}
	certPEM, keyPEM, err := ca.Issue(req)
	if err != nil {
		return err
	}
	kp, err := writeNew(dir, name+"-key.pem", keyPEM, 0o600)
	if err != nil {
		return err
	}
	cp, err := writeNew(dir, name+".pem", certPEM, 0o644)
	if err != nil {
		os.Remove(kp)
		return err
	}
	fmt.Fprintf(out, "%-11s %s (key %s)\n", kind+" "+name, cp, kp)
	return nil
}

func parseIPs(list []string) ([]net.IP, error) {
	var ips []net.IP
	for _, s := range list {
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part == "" {
				continue
			}
			ip := net.ParseIP(part)
			if ip == nil {
				return nil, fmt.Errorf("%q is not an IP address", part)
			}
			ips = append(ips, ip)
		}
	}
	return ips, nil
}

func tlsCACmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Make a cluster CA: DIR/ca.pem and DIR/ca-key.pem",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return makeCA(dir, cmd.OutOrStdout()) },
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "directory for the files")
	return cmd
}

func tlsCertCmd() *cobra.Command {
	var (
		dir, node, client string
		ips, dns          []string
		validity          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Sign a node certificate (--node ID --ip ...) or an operator one (--client NAME) with DIR's CA",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ca, err := loadCA(dir)
			if err != nil {
				return err
			}
			ipList, err := parseIPs(ips)
			if err != nil {
				return fmt.Errorf("--ip: %w", err)
			}
			return issue(ca, dir, pki.Request{Node: node, Client: client, IPs: ipList, DNS: dns, Validity: validity, Now: time.Now()}, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", ".", "directory with ca.pem and ca-key.pem; the new files go there")
	f.StringVar(&node, "node", "", "node id (a node certificate: raft and the admin API)")
	f.StringVar(&client, "client", "", "operator name (a client certificate: the admin API only)")
	f.StringSliceVar(&ips, "ip", nil, "extra IP addresses in the certificate (node; comma separated or repeated)")
	f.StringSliceVar(&dns, "dns", nil, "extra DNS names in the certificate (node)")
	f.DurationVar(&validity, "validity", certValidity, "how long the certificate is valid")
	cmd.MarkFlagsMutuallyExclusive("node", "client")
	cmd.MarkFlagsOneRequired("node", "client")
	return cmd
}

func tlsInitCmd() *cobra.Command {
	var (
		dir, client string
		nodes       []string
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Make a CA, a certificate per --node ID=IP[,IP], an operator certificate, a gossip key and an admin token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if len(nodes) == 0 {
				return errors.New("give at least one --node ID=IP")
			}
			type nodeReq struct {
				id  string
				ips []net.IP
			}
			var reqs []nodeReq
			for _, n := range nodes {
				id, ipList, _ := strings.Cut(n, "=")
				ips, err := parseIPs([]string{ipList})
				if err != nil {
					return fmt.Errorf("--node %s: %w", n, err)
				}
				reqs = append(reqs, nodeReq{id, ips})
			}
			if err := makeCA(dir, out); err != nil {
				return err
			}
			ca, err := loadCA(dir)
			if err != nil {
				return err
			}
			now := time.Now()
			for _, r := range reqs {
				if err := issue(ca, dir, pki.Request{Node: r.id, IPs: r.ips, Validity: certValidity, Now: now}, out); err != nil {
					return err
				}
			}
			if client != "" {
				if err := issue(ca, dir, pki.Request{Client: client, Validity: certValidity, Now: now}, out); err != nil {
					return err
				}
			}
			key := make([]byte, 32)
			tok := make([]byte, 32)
			if _, err := rand.Read(key); err != nil {
				return err
			}
			if _, err := rand.Read(tok); err != nil {
				return err
			}
			p, err := writeNew(dir, "gossip.key", []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "gossip key  %s\n", p)
			if p, err = writeNew(dir, "admin.token", []byte(hex.EncodeToString(tok)+"\n"), 0o600); err != nil {
				return err
			}
			fmt.Fprintf(out, "admin token %s\n", p)
			abs, _ := filepath.Abs(dir)
			fmt.Fprintf(out, "\nCopy to node ID: ca.pem, ID.pem, ID-key.pem, gossip.key (and admin.token), then in its nsmd.yaml:\n"+
				"  tls_ca: %[1]s/ca.pem\n  tls_cert: %[1]s/ID.pem\n  tls_key: %[1]s/ID-key.pem\n  gossip_key_file: %[1]s/gossip.key\n  admin_token_file: %[1]s/admin.token\n", abs)
			if client != "" {
				fmt.Fprintf(out, "Operators: nsmd status --tls-ca %[1]s/ca.pem --tls-cert %[1]s/%[2]s.pem --tls-key %[1]s/%[2]s-key.pem --admin NODE:8024\n", abs, client)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", ".", "directory for the files")
	f.StringArrayVar(&nodes, "node", nil, "node id and its IP addresses: ID=IP[,IP...] (repeat per node)")
	f.StringVar(&client, "client", "operator", "operator certificate name (empty: none)")
	return cmd
}
