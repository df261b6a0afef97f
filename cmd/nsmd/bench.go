package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// benchCmd is `nsmd bench`: load and timing tools an operator points at
// any NSM server (nsmd or rpc.statd) or cluster.
func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: SM_MON load, notify fan-out, failover distribution",
		Long: `bench measures an NSM server or an nsmd cluster:

  nsmd bench mon --addr HOST[:PORT] -c CONNS -n CALLS   SM_MON (and SM_UNMON) load, latency, errors
  nsmd bench notify --hosts N [--sm-notify]             takeover fan-out to N fake client statds (root)
  nsmd bench failover --runs K                          repeated leader kills, failover distribution

Every subcommand prints a table, or JSON with --json, and draws a chart
with --plot FILE.svg.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(benchMonCmd(), benchNotifyCmd(), benchFailoverCmd())
	return cmd
}

// printResult writes rep as indented JSON (--json) or as the command's
// table; the drill and every bench subcommand print this way.
func printResult(w io.Writer, asJSON bool, rep any, table func(io.Writer) error) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return table(w)
}

// benchTarget resolves "HOST[:PORT]" to host:port for NSM over network
// ("tcp" or "udp"). Without a port it asks the portmapper on HOST:111
// (GETPORT 100024 v1 for that protocol); from says which it was.
func benchTarget(ctx context.Context, addr, network string, timeout time.Duration) (hostport, from string, err error) {
	if addr == "" {
		return "", "", errors.New("no address (--addr HOST[:PORT])")
	}
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return "", "", fmt.Errorf("--addr %q: bad port: %w", addr, err)
		}
		return net.JoinHostPort(host, port), "given", nil
	}
	host = strings.Trim(addr, "[]")
	prot := oncrpc.IPProtoTCP
	if network == "udp" {
		prot = oncrpc.IPProtoUDP
	}
	pm := oncrpc.NewPmapClient(host, oncrpc.ClientConfig{Timeout: timeout})
	p, err := pm.GetPort(ctx, nsm.Program.Prog, nsm.Program.Vers, prot)
	if err != nil {
		return "", "", fmt.Errorf("--addr %s has no port and the portmapper did not give one: %w", addr, err)
	}
	return net.JoinHostPort(host, strconv.Itoa(int(p))), "portmapper", nil
}
