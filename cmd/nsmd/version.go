package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

// Set at link time by `make build` (-ldflags -X), which builds with
// -buildvcs=false; they override what the Go toolchain stamped.
var (
	version  string // git describe
	revision string // full commit hash
	modified string // "true" when the work tree had changes
)

// BuildInfo is what this binary says about itself: `nsmd version`,
// /v1/status (version) and nsmd_build_info.
type BuildInfo struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
}

// readBuildInfo reads the module version, VCS revision and Go version the
// toolchain stamped (runtime/debug.ReadBuildInfo), then applies the link
// time values.
func readBuildInfo() BuildInfo {
	b := BuildInfo{Version: "(devel)", GoVersion: runtime.Version()}
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

// shortRevision is the first 12 hex digits of the revision.
func (b BuildInfo) shortRevision() string {
	if len(b.Revision) > 12 {
		return b.Revision[:12]
	}
	return b.Revision
}

// String is the one-line form: `nsmd VERSION (revision REV, modified) GO`.
func (b BuildInfo) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "nsmd %s", b.Version)
	if b.Revision != "" {
		fmt.Fprintf(&s, " (revision %s", b.Revision)
		if b.Modified {
			s.WriteString(", modified")
		}
		s.WriteString(")")
	}
	fmt.Fprintf(&s, " %s", b.GoVersion)
	return s.String()
}

// Gossip is the compact version each node advertises to the others: the
// version, plus the short revision when the version does not already name
// it, plus "+modified". Two builds differ here when they differ in code.
func (b BuildInfo) Gossip() string {
	v := b.Version
	if r := b.shortRevision(); r != "" && !strings.Contains(v, r[:min(7, len(r))]) {
		v += "+" + r
	}
	if b.Modified && !strings.Contains(v, "dirty") {
		v += "+modified"
	}
	return v
}

// registerBuildInfo exports nsmd_build_info{version,revision,goversion} 1.
func registerBuildInfo(reg prometheus.Registerer, b BuildInfo) error {
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

func revisionLabel(b BuildInfo) string {
	if b.Modified && b.Revision != "" {
		return b.Revision + "+modified"
	}
	return b.Revision
}

func versionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print nsmd's version, VCS revision and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := readBuildInfo()
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(b)
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), b.String())
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
