package agent

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/service"
)

// Only a serving node with a netlink VIP and tickle on tickles: a loopback
// VIP's nodes share one kernel, a witness never holds the VIP.
func TestTicklerOnlyWithANetlinkVIP(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*config.Config)
		want bool
	}{
		{"netlink", func(*config.Config) {}, true},
		{"tickle off", func(c *config.Config) { c.Tickle = config.TickleOff }, false},
		{"loopback VIP", func(c *config.Config) { c.VIPMode = config.VIPLoopback }, false},
		{"no VIP", func(c *config.Config) { c.VIPMode, c.VIP = config.VIPNone, "" }, false},
		{"witness", func(c *config.Config) { c.Witness = true }, false},
		{"services, netlink", withServices, true},
		{"services, tickle off", func(c *config.Config) { withServices(c); c.Tickle = config.TickleOff }, false},
		{"services, loopback", func(c *config.Config) { withServices(c); c.VIPMode = config.VIPLoopback }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.VIP, cfg.VIPMode, cfg.VIPInterface = "10.77.4.100/24", config.VIPNetlink, "eth0"
			tc.set(&cfg)
			tk, err := newTickler(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if (tk != nil) != tc.want {
				t.Fatalf("tickler %v, want one: %v", tk != nil, tc.want)
			}
			if tk != nil && (tk.svc != nil) != (len(cfg.Services) > 0) {
				t.Fatalf("services' tickler %v with %d services", tk.svc != nil, len(cfg.Services))
			}
			tk.stop() // nil-safe, and stops one never started
		})
	}
}

// withServices gives c one service instead of the VIP.
func withServices(c *config.Config) {
	c.VIP, c.VIPInterface = "", ""
	c.Services = []service.Spec{{ID: "home", Address: netip.MustParsePrefix("10.77.4.101/24"), Interface: "eth0"}}
}
