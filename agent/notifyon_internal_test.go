package agent

import (
	"net/netip"
	"testing"

	"github.com/nsmd/nsmd/config"
)

// TestNotifyIsTakenOnTheVIPOnly: with a VIP a node takes SM_NOTIFY sent to
// the VIP (also as an IPv4-mapped address: the server unmaps it) and no
// other; a witness takes none, whatever the shared configuration says;
// without a VIP every address is taken (nil).
func TestNotifyIsTakenOnTheVIPOnly(t *testing.T) {
	cfg := config.Default()
	cfg.VIPMode, cfg.VIP = config.VIPNetlink, "10.0.0.10/24"
	on := notifyOn(cfg)
	for addr, want := range map[string]bool{"10.0.0.10": true, "10.0.0.11": false, "127.0.0.1": false, "::1": false} {
		if got := on(netip.MustParseAddr(addr)); got != want {
			t.Errorf("VIP node, sent to %s: taken = %v, want %v", addr, got, want)
		}
	}
	if on(netip.Addr{}) {
		t.Error("VIP node takes a notification whose destination is unknown")
	}
	w := cfg
	w.Witness = true
	if notifyOn(w)(netip.MustParseAddr("10.0.0.10")) {
		t.Error("a witness takes SM_NOTIFY")
	}
	none := config.Default()
	none.VIPMode, none.VIP = config.VIPNone, ""
	if notifyOn(none) != nil {
		t.Error("without a VIP a node must take what is sent to it (nil)")
	}
}
