// Package bench holds the load and timing tools of `nsmd bench`, each a
// function that runs one measurement and returns a report that prints as
// a table, JSON or an SVG chart:
//
//   - mon.go: SM_MON (and SM_UNMON) load against any NSM server, nsmd or
//     rpc.statd: throughput, latency histogram, errors by kind;
//   - notify.go: the SM_NOTIFY fan-out after a takeover, to N fake client
//     hosts in a private network namespace (notify_linux.go), beside the
//     real sm-notify;
//   - failover.go: repeated failover drills (package bench/drill) and the
//     distribution of their times;
//   - plot.go: the latency histogram.
//
// The notify and failover benches can bring their own in-process cluster:
// nsmd dev's (agent.StartDev).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// startCluster starts an in-process cluster in the nsmd dev layout (node
// i on 127.0.0.i, every node on the same ports, a loopback VIP); a node it
// kills stays down. With o.LogLevel "" the nodes' logs (and their raft
// logs below error) are discarded, else written to logTo.
func startCluster(o agent.DevOptions, logTo io.Writer) (*agent.Dev, error) {
	log := agent.NewLogger(logTo, o.LogLevel, "text")
	if o.LogLevel == "" {
		o.LogLevel, log = "error", agent.NewLogger(io.Discard, "error", "text")
	}
	return agent.StartDev(o, agent.Options{Logger: log})
}

// Target resolves "HOST[:PORT]" to host:port for NSM over network
// ("tcp" or "udp"). Without a port it asks the portmapper on HOST:111
// (GETPORT 100024 v1 for that protocol); from says which it was.
func Target(ctx context.Context, addr, network string, timeout time.Duration) (hostport, from string, err error) {
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

// dash is s, or "-" when empty.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
