package cluster

import "github.com/nsmd/nsmd/vip"

// vip.Netlink and vip.Loopback are what the agent gives a Node in
// vip_mode netlink and loopback. Package vip does not import cluster, so
// nothing but this says they still fit: FloatingAddr, and for Netlink the
// optional methods Kill (abandoner) and the crash fast path (processBound)
// look for.
var (
	_ FloatingAddr = (*vip.Loopback)(nil)
	_ FloatingAddr = (*vip.Netlink)(nil)
	_ abandoner    = (*vip.Netlink)(nil)
	_ processBound = (*vip.Netlink)(nil)
)
