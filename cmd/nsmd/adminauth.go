package main

import (
	"os"

	"github.com/spf13/pflag"

	"github.com/nsmd/nsmd/admin"
)

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// authFlags adds the flags of how a command reaches the admin API: the
// cluster CA, an operator (or node) certificate and its key, the token.
func authFlags(fs *pflag.FlagSet, o *admin.Auth) {
	fs.StringVar(&o.CA, "tls-ca", envOr("NSMD_TLS_CA", ""), "cluster CA (PEM): talk HTTPS to the admin API [env NSMD_TLS_CA]")
	fs.StringVar(&o.Cert, "tls-cert", envOr("NSMD_TLS_CERT", ""), "client certificate (nsmd tls cert --client) [env NSMD_TLS_CERT]")
	fs.StringVar(&o.Key, "tls-key", envOr("NSMD_TLS_KEY", ""), "its key [env NSMD_TLS_KEY]")
	fs.StringVar(&o.TokenFile, "token-file", envOr("NSMD_ADMIN_TOKEN_FILE", ""), "file with the admin bearer token [env NSMD_ADMIN_TOKEN_FILE]")
	fs.StringVar(&o.LocalTokenFile, "local-token-file", envOr("NSMD_ADMIN_LOCAL_TOKEN_FILE", admin.DefaultLocalTokenFile), "the local agent's admin token (its admin_local_token_file), sent to a loopback address when --token-file is not given and the file is readable [env NSMD_ADMIN_LOCAL_TOKEN_FILE]")
}
