package agent

import (
	"net/netip"

	"github.com/nsmd/nsmd/config"
)

// notifyOn is where this node takes SM_NOTIFY from the wire
// (nsm.Config.NotifyOn). A rebooted client notifies the server it
// monitored, the name it mounted: the VIP. So with a VIP only a
// notification sent to the VIP is taken — by the one node that holds it —
// and a sender spraying every member's own address gets the budgets of
// one node, not of each member. A witness takes none (no client mounts
// it). Without a VIP (a single node, or one statd per node) every node
// takes what is sent to it, with its own budgets.
func notifyOn(cfg config.Config) func(local netip.Addr) bool {
	if cfg.Witness || len(cfg.Services) > 0 {
		// With services: clients mount the services' addresses, and each
		// service's own NSM takes what is sent there (servicensm.go).
		return func(netip.Addr) bool { return false }
	}
	vip := cfg.VIPAddr()
	if !vip.IsValid() {
		return nil
	}
	vip = vip.Unmap()
	return func(local netip.Addr) bool { return local == vip }
}
