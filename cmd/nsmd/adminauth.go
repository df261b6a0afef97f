package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/nsmd/nsmd/cluster/pki"
)

// adminAuth is how a command reaches the admin API: plaintext, or HTTPS
// checked against the cluster CA with an operator (or node) certificate,
// and/or a bearer token.
type adminAuth struct {
	ca, cert, key string
	tokenFile     string
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (o *adminAuth) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ca, "tls-ca", envOr("NSMD_TLS_CA", ""), "cluster CA (PEM): talk HTTPS to the admin API [env NSMD_TLS_CA]")
	fs.StringVar(&o.cert, "tls-cert", envOr("NSMD_TLS_CERT", ""), "client certificate (nsmd tls cert --client) [env NSMD_TLS_CERT]")
	fs.StringVar(&o.key, "tls-key", envOr("NSMD_TLS_KEY", ""), "its key [env NSMD_TLS_KEY]")
	fs.StringVar(&o.tokenFile, "token-file", envOr("NSMD_ADMIN_TOKEN_FILE", ""), "file with the admin bearer token [env NSMD_ADMIN_TOKEN_FILE]")
}

// scheme is https with a CA, else http.
func (o *adminAuth) scheme() string {
	if o.ca != "" {
		return "https"
	}
	return "http"
}

// base is addr as a URL (host:port gets the scheme).
func (o *adminAuth) base(addr string) string {
	if !strings.Contains(addr, "://") {
		addr = o.scheme() + "://" + addr
	}
	return strings.TrimRight(addr, "/")
}

// transport builds the HTTP transport for these settings.
func (o *adminAuth) transport() (*http.Transport, error) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
	}
	switch {
	case o.cert != "" || o.key != "":
		st, err := pki.Load(pki.Files{CA: o.ca, Cert: o.cert, Key: o.key})
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = st.ClientConfig()
	case o.ca != "":
		c, err := pki.VerifyOnlyConfig(o.ca)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		tr.TLSClientConfig = c
	}
	return tr, nil
}

// authorize adds the bearer token, if any, to req.
func (o *adminAuth) authorize(req *http.Request) error {
	if o.tokenFile == "" {
		return nil
	}
	b, err := os.ReadFile(o.tokenFile)
	if err != nil {
		return fmt.Errorf("--token-file: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+string(bytes.TrimSpace(b)))
	return nil
}
