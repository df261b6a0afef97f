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
// The notify and failover benches can bring their own in-process cluster;
// they start it through StartCluster, which cmd/nsmd provides (nsmd dev's
// cluster: the agent lives there), so nothing here imports the agent.
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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// ClusterSpec is an in-process cluster in the nsmd dev layout: node i on
// 127.0.0.i, every node on the same ports, a loopback VIP.
type ClusterSpec struct {
	Nodes                                    int
	DataDir                                  string // parent of the node directories
	VIP                                      string // address, no prefix length
	NSMPort, RaftPort, AdminPort, GossipPort int    // AdminPort 0: no admin API
	// LogLevel is the nodes' log level; "" discards their logs (and their
	// raft logs below error).
	LogLevel string
	LogTo    io.Writer
}

// StartCluster starts the cluster of spec and returns once every node
// runs (not yet once a leader is elected).
type StartCluster func(spec ClusterSpec) (Cluster, error)

// Cluster is an in-process cluster a bench starts, watches and faults.
type Cluster interface {
	// Nodes are the cluster's nodes in spec order.
	Nodes() []Node
	// Close stops every node (a graceful stop hands leadership over).
	Close() error
}

// Node is one node of a Cluster, seen from inside its process.
type Node interface {
	ID() string
	AdminURL() string
	// Leading: this node is the raft leader.
	Leading() bool
	VIPHeld() bool
	// State is the sm_state in this node's state machine; Registrations
	// the number of monitor registrations there.
	State() int32
	Registrations() int
	// LastTakeover is when this node last took over as leader (stamped by
	// it); zero if never.
	LastTakeover() time.Time
	// NotifyName is the name its SM_NOTIFYs carry.
	NotifyName() string
	// Metrics gathers its Prometheus registry.
	Metrics() prometheus.Gatherer
	// Kill crashes the node: it stops at once, without a graceful
	// handover, as SIGKILL would.
	Kill()
	// TransferLeadership hands leadership to another voter (a planned
	// failover); the node must lead.
	TransferLeadership() error
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
