package agent

import (
	"strings"
	"testing"

	"github.com/nsmd/nsmd/config"
)

func TestParseCapEff(t *testing.T) {
	status := "Name:\tnsmd\nCapInh:\t0000000000000000\nCapPrm:\t0000000000003400\nCapEff:\t0000000000003400\nCapBnd:\t0000000000003400\n"
	eff, ok, err := parseCapEff(strings.NewReader(status))
	if err != nil || !ok || eff != 1<<capNetAdmin|1<<capNetRaw|1<<capNetBindService {
		t.Fatalf("parseCapEff = %#x %v %v, want 0x3400", eff, ok, err)
	}
	if _, _, err := parseCapEff(strings.NewReader("Name:\tx\n")); err == nil {
		t.Error("no CapEff line: want an error")
	}
	if _, _, err := parseCapEff(strings.NewReader("CapEff:\tzz\n")); err == nil {
		t.Error("bad CapEff: want an error")
	}
}

// TestCapabilityCheckNamesWhatIsMissing: an agent configured for a VIP
// and low ports refuses to start without the capabilities that needs, and
// the error names each missing capability and the setting that needs it.
func TestCapabilityCheckNamesWhatIsMissing(t *testing.T) {
	const all = 1<<capNetAdmin | 1<<capNetRaw | 1<<capNetBindService
	prod := func(c *config.Config) {
		c.VIP, c.VIPInterface, c.VIPMode = "10.77.0.10/24", "eth0", config.VIPNetlink
		c.NSMAddr = "0.0.0.0:662"
	}
	for _, tc := range []struct {
		name string
		tune func(*config.Config)
		eff  uint64
		want []string // substrings of the error; none: no error
		not  []string
	}{
		{"defaults need nothing", func(*config.Config) {}, 0, nil, nil},
		{"all three granted", prod, all, nil, nil},
		{"no NET_ADMIN", prod, all &^ (1 << capNetAdmin),
			[]string{"missing capability CAP_NET_ADMIN", "vip_mode netlink: add the VIP 10.77.0.10/24 on eth0", "AmbientCapabilities=CAP_NET_ADMIN"},
			[]string{"CAP_NET_RAW", "CAP_NET_BIND_SERVICE"}},
		{"no NET_RAW", prod, all &^ (1 << capNetRaw),
			[]string{"missing capability CAP_NET_RAW", "gratuitous ARP"}, []string{"CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE"}},
		{"no NET_BIND_SERVICE", prod, all &^ (1 << capNetBindService),
			[]string{"missing capability CAP_NET_BIND_SERVICE", "nsm_addr 0.0.0.0:662"}, []string{"CAP_NET_ADMIN"}},
		{"none at all: every one named", prod, 0,
			[]string{"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_NET_BIND_SERVICE"}, nil},
		{"embedded rpcbind binds 111", func(c *config.Config) { c.Rpcbind = config.RpcbindEmbedded }, 0,
			[]string{"CAP_NET_BIND_SERVICE", "rpcbind embedded"}, nil},
		{"a witness holds no VIP", func(c *config.Config) { prod(c); c.Witness = true; c.NSMAddr = "0.0.0.0:0" }, 0, nil, nil},
		{"loopback VIP needs nothing", func(c *config.Config) { c.VIP, c.VIPMode = "127.0.0.100/32", config.VIPLoopback }, 0, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			tc.tune(&cfg)
			err := checkCaps(cfg, tc.eff)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one naming %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error %q names %q, which is granted", err, w)
				}
			}
		})
	}
}

// TestPackagedConfigNeedsOnlyBindService: what the packaged unit grants
// (AmbientCapabilities=CAP_NET_BIND_SERVICE) is what the packaged config
// (/etc/nsmd/nsmd.yaml of the .deb) needs.
func TestPackagedConfigNeedsOnlyBindService(t *testing.T) {
	cfg := config.Default()
	if err := cfg.LoadFile("../deploy/etc/nsmd.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := checkCaps(cfg, 1<<capNetBindService); err != nil {
		t.Errorf("packaged config needs more than CAP_NET_BIND_SERVICE: %v", err)
	}
}
