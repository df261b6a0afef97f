// Package vip holds nsmd's floating address (VIP): the address the serving
// leader answers NSM on and sends SM_NOTIFY from. Two kinds: [Netlink]
// (vip_mode netlink, Linux) and [Loopback] (vip_mode loopback, the dev
// cluster: holding the address means serving NSM on a loopback address,
// through the Serve function the agent gives it).
//
// A [Netlink] adds the address over rtnetlink with a kernel lifetime
// (valid_lft = preferred_lft = [NetlinkConfig.Lifetime], whole seconds,
// default 2 s), noprefixroute so it is never picked as a default source,
// and nodad for IPv6; it announces it with gratuitous ARP (a request and a
// reply, RFC 5227) or an unsolicited neighbour advertisement (RFC 4861
// 7.2.6) on acquire, and every Refresh (default Lifetime/4) renews the
// lifetime, re-adds an address someone removed and announces it again.
// Acquired under [WithQuietStart] it is added and renewed but announced
// only from [Netlink.Announce] on (a new leader announces once its NFS
// server listens). Release deletes it at once. A holder that is killed, stopped or wedged
// stops renewing, so the kernel drops the address by itself one lifetime
// later: that is the dead-man's switch the cluster's hand-over rule counts
// on. With [BindProcess] (IPv4; the default under [BindAuto] when
// /dev/net/tun and arp_ignore 0 allow it) the address sits on a TUN device
// that only this process holds open, so it also goes the moment the
// process dies, by SIGKILL too.
//
// The package decides nothing about who may hold the address or when:
// the cluster's leader loop does (cluster/DESIGN.md, "The floating
// address"), through the small cluster.FloatingAddr interface that
// *Netlink and *Loopback satisfy without importing cluster (cluster's
// handover.go says when a new leader may take it).
//
// Use:
//
//	v, err := vip.NewNetlink(vip.NetlinkConfig{
//		Prefix:    netip.MustParsePrefix("10.0.0.10/24"),
//		Interface: "eth0",
//		Logger:    log, Registerer: reg,
//	})
//	if err != nil { ... } // CAP_NET_ADMIN and CAP_NET_RAW; Linux only
//	defer v.Close()       // drops the address
//	err = v.Acquire(ctx)  // held until Release, Close or ctx ends
//
// It exports nsmd_vip_acquired_total, nsmd_vip_readded_total and
// nsmd_vip_announcements_total on the Registerer it is given.
package vip
