package cluster

import (
	"fmt"
	"time"

	gometrics "github.com/armon/go-metrics"
	gmprom "github.com/armon/go-metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// BridgeRaftMetrics exports hashicorp/raft's own metrics (commit and
// apply times, replication, elections …) on reg as nsmd_raft_* series.
//
// raft reports through go-metrics' process-wide global, so this is
// process-wide too: call it once, from main, in a process that runs one
// node (`nsmd agent`), never from a library or a multi-node process.
func BridgeRaftMetrics(reg prometheus.Registerer) error {
	sink, err := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{Registerer: reg, Expiration: 5 * time.Minute})
	if err != nil {
		return fmt.Errorf("cluster: raft metrics sink: %w", err)
	}
	cfg := gometrics.DefaultConfig("nsmd")
	cfg.EnableHostname = false
	cfg.EnableRuntimeMetrics = false
	cfg.EnableServiceLabel = false
	if _, err := gometrics.NewGlobal(cfg, sink); err != nil {
		return fmt.Errorf("cluster: raft metrics: %w", err)
	}
	return nil
}
