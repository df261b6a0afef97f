package cluster

import "github.com/nsmd/nsmd/vip"

// vip.Netlink is what the agent gives a Node in vip_mode netlink. Package
// vip does not import cluster, so nothing but this says it still fits:
// FloatingAddr, and the optional methods Kill (abandoner) and the crash
// fast path (processBound) look for.
var (
	_ FloatingAddr = (*vip.Netlink)(nil)
	_ abandoner    = (*vip.Netlink)(nil)
	_ processBound = (*vip.Netlink)(nil)
)
