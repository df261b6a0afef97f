package agent

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
)

// Set at link time by `make build` (-ldflags -X
// github.com/nsmd/nsmd/agent.version=…), which builds with
// -buildvcs=false; they override what the Go toolchain stamped.
var (
	version  string // git describe
	revision string // full commit hash
	modified string // "true" when the work tree had changes
)

// Build is what this binary says about itself: the module version, VCS
// revision and Go version the toolchain stamped
// (runtime/debug.ReadBuildInfo), overridden by the link-time values.
// Every agent of a process reports it (/v1/status, gossip, metrics).
func Build() admin.BuildInfo {
	b := admin.BuildInfo{Version: "(devel)", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			b.Version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			b.GoVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	if version != "" {
		b.Version = version
	}
	if revision != "" {
		b.Revision = revision
	}
	if modified != "" {
		b.Modified = modified == "true"
	}
	return b
}

// registerBuildInfo exports nsmd_build_info{version,revision,goversion} 1.
func registerBuildInfo(reg prometheus.Registerer, b admin.BuildInfo) error {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nsmd_build_info",
		Help: "Always 1; the labels say which build of nsmd runs (revision ends in +modified for a build from a changed work tree).",
		ConstLabels: prometheus.Labels{
			"version": b.Version, "revision": revisionLabel(b), "goversion": b.GoVersion,
		},
	})
	g.Set(1)
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register nsmd_build_info: %w", err)
	}
	return nil
}

func revisionLabel(b admin.BuildInfo) string {
	if b.Modified && b.Revision != "" {
		return b.Revision + "+modified"
	}
	return b.Revision
}
