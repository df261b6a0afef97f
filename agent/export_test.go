package agent

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
)

// Seams for the tests of package agent_test.

// SetAgent replaces node i's agent (a test restarted it by hand).
func (d *Dev) SetAgent(i int, a *Agent) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.agents[i] = a
}

// NSMConns is the number of open connections of a's own NSM server.
func (a *Agent) NSMConns() int { return a.server.Conns() }

// TrackingStatusFile is the file a's hooks read about NFSv4 tracking.
func (a *Agent) TrackingStatusFile() string { return a.v4.statusPath }

// NFSv4Clients is GET /v1/nfsv4/clients of a.
func (a *Agent) NFSv4Clients() admin.V4ClientPage { return a.v4.clients() }

// ClientLastSeen is when a's node knows NFSv4 client name was last seen.
func (a *Agent) ClientLastSeen(name string) (time.Time, bool) { return a.v4.seen.lastSeen(name) }

// Services is GET /v1/services of a.
func (a *Agent) Services() []admin.ServiceStatus { return a.services() }

// MoveService is POST /v1/services/move on a.
func (a *Agent) MoveService(ctx context.Context, service, to string) error {
	return a.moveService(ctx, service, to)
}

// NamespacedServiceMetrics are the names of the series a service has only
// with service namespaces (its NFSv4 tracking and grace:
// servicev4metrics.go), which a cluster without them never exports.
func NamespacedServiceMetrics() map[string]bool {
	ch := make(chan *prometheus.Desc, 16)
	go func() {
		serviceV4Collector{}.Describe(ch)
		close(ch)
	}()
	out := map[string]bool{}
	for d := range ch {
		// A Desc says its name only in its String: Desc{fqName: "…", …}.
		_, rest, _ := strings.Cut(d.String(), `fqName: "`)
		name, _, _ := strings.Cut(rest, `"`)
		out[name] = true
	}
	return out
}
