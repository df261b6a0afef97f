//go:build linux

package vip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nsmd/nsmd/internal/rtnl"
)

// rtnetlink (RTM_NEWADDR/DELADDR/GETADDR) and AF_PACKET, straight on
// golang.org/x/sys/unix. Both sockets belong to the network namespace the
// VIP was made in.

const nlTimeout = 5 * time.Second

type netlinkLink struct {
	prefix      netip.Prefix
	iface       string
	life        uint32 // seconds
	family      uint8
	log         *slog.Logger
	within      func(func() error) error // runs interface lookups (NetlinkConfig.Within)
	prefixRoute bool
	mu          sync.Mutex // guards everything below
	nl          int        // NETLINK_ROUTE socket
	pkt         int        // AF_PACKET/SOCK_DGRAM socket that receives nothing
	seq         uint32
	ifindex     int              // the configured interface: announcements go out there
	mac         net.HardwareAddr // nil: no announcements on this interface
	// addrIndex is where the address is added: ifindex, or with bind
	// process the TUN device held open by tun.
	addrIndex int
	tun       int // the TUN device's descriptor, -1 without one
	tunName   string
}

func newLink(cfg NetlinkConfig, log *slog.Logger) (link, error) {
	l := &netlinkLink{prefix: cfg.Prefix, iface: cfg.Interface, life: uint32(cfg.Lifetime / time.Second),
		family: unix.AF_INET, log: log, nl: -1, pkt: -1, tun: -1, within: cfg.Within, prefixRoute: cfg.PrefixRoute}
	if cfg.Prefix.Addr().Is6() {
		l.family = unix.AF_INET6
	}
	// Every socket and device is made where Within runs it (a network
	// namespace's, for good); the interface is looked up there too.
	in := func(fn func() error) error {
		if l.within != nil {
			return l.within(fn)
		}
		return fn()
	}
	if err := in(l.openSockets); err != nil {
		l.close()
		return nil, err
	}
	if err := l.resolve(); err != nil {
		l.close()
		return nil, err
	}
	switch cfg.Bind {
	case BindInterface:
	case BindProcess:
		if err := in(l.bindToProcess); err != nil {
			l.close()
			return nil, err
		}
	default: // auto
		if !cfg.Prefix.Addr().Is4() {
			break
		}
		if err := in(l.bindToProcess); err != nil {
			log.Warn("VIP bound to the interface: it outlives a killed process by its lifetime", "why", err)
		}
	}
	if l.tun >= 0 {
		log.Info("VIP bound to this process", "device", l.tunName)
	}
	return l, nil
}

// openSockets opens the netlink socket and the packet socket of the
// announcements.
func (l *netlinkLink) openSockets() error {
	var err error
	l.nl, err = rtnl.Open(nlTimeout)
	if err != nil {
		return fmt.Errorf("vip: %w", err)
	}
	// Protocol 0: the socket only sends; the link header's type comes from
	// each sendto's address.
	l.pkt, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("vip: open packet socket for announcements (needs CAP_NET_RAW): %w", err)
	}
	return nil
}

// bindToProcess creates the TUN device that will carry the address: not
// persistent, so the kernel deletes it (and the address) when the last
// descriptor closes, i.e. when this process dies, however it dies.
func (l *netlinkLink) bindToProcess() error {
	for _, conf := range []string{"all", l.iface} {
		b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + conf + "/arp_ignore")
		if err != nil {
			return fmt.Errorf("vip: bind process: read arp_ignore: %w", err)
		}
		if v := strings.TrimSpace(string(b)); v != "0" {
			return fmt.Errorf("vip: bind process needs net.ipv4.conf.%s.arp_ignore = 0 (is %s): the kernel must answer ARP on %s for an address on another device", conf, v, l.iface)
		}
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("vip: bind process: open /dev/net/tun: %w", err)
	}
	name, err := func() (string, error) {
		ifr, err := unix.NewIfreq("nsmdvip%d")
		if err != nil {
			return "", err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return "", fmt.Errorf("TUNSETIFF: %w", err)
		}
		name := ifr.Name()
		// No IPv6 on it: nothing would read what the kernel sends there.
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(s)
		up, err := unix.NewIfreq(name)
		if err != nil {
			return "", err
		}
		if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, up); err != nil {
			return "", fmt.Errorf("get flags of %s: %w", name, err)
		}
		up.SetUint16(up.Uint16() | unix.IFF_UP)
		if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, up); err != nil {
			return "", fmt.Errorf("set %s up: %w", name, err)
		}
		return name, nil
	}()
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("vip: bind process: %w", err)
	}
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("vip: bind process: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tun, l.tunName, l.addrIndex = fd, name, ifi.Index
	return nil
}

func (l *netlinkLink) diesWithProcess() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tun >= 0
}

func (l *netlinkLink) resolve() error {
	var ifi *net.Interface
	lookup := func() (err error) {
		ifi, err = net.InterfaceByName(l.iface)
		return err
	}
	var err error
	if l.within != nil {
		err = l.within(lookup)
	} else {
		err = lookup()
	}
	if err != nil {
		return fmt.Errorf("interface %q: %w", l.iface, err)
	}
	var mac net.HardwareAddr
	if len(ifi.HardwareAddr) == 6 && ifi.Flags&(net.FlagLoopback|net.FlagPointToPoint) == 0 {
		mac = ifi.HardwareAddr
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ifindex != 0 && l.ifindex != ifi.Index {
		l.log.Warn("VIP interface has a new index", "old", l.ifindex, "new", ifi.Index)
	}
	l.ifindex, l.mac = ifi.Index, mac
	if l.tun < 0 {
		l.addrIndex = ifi.Index
	}
	return nil
}

func (l *netlinkLink) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, fd := range []*int{&l.nl, &l.pkt, &l.tun} {
		if *fd >= 0 {
			errs = append(errs, unix.Close(*fd))
			*fd = -1
		}
	}
	return errors.Join(errs...)
}

// ifaddrmsg is struct ifaddrmsg.
func (l *netlinkLink) ifaddrmsg(index, prefixLen int, flags uint8) []byte {
	b := make([]byte, unix.SizeofIfAddrmsg)
	b[0] = l.family
	b[1] = uint8(prefixLen)
	b[2] = flags
	b[3] = unix.RT_SCOPE_UNIVERSE
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	return b
}

// addrAttrs are the attributes naming the address: IPv4 by its local
// address (which matches a copy of any prefix length on delete), IPv6 by
// IFA_ADDRESS.
func (l *netlinkLink) addrAttrs(b []byte) []byte {
	a := l.prefix.Addr().AsSlice()
	if l.family == unix.AF_INET {
		return rtnl.AppendAttr(b, unix.IFA_LOCAL, a)
	}
	return rtnl.AppendAttr(b, unix.IFA_ADDRESS, a)
}

func (l *netlinkLink) replace() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	flags := uint32(unix.IFA_F_NOPREFIXROUTE)
	if l.prefixRoute {
		flags = 0
	}
	if l.family == unix.AF_INET6 {
		flags |= unix.IFA_F_NODAD
	}
	b := l.ifaddrmsg(l.addrIndex, l.prefix.Bits(), uint8(flags))
	b = l.addrAttrs(b)
	if l.family == unix.AF_INET {
		b = rtnl.AppendAttr(b, unix.IFA_ADDRESS, l.prefix.Addr().AsSlice())
	}
	ci := make([]byte, 16) // struct ifa_cacheinfo: prefered, valid, cstamp, tstamp
	binary.NativeEndian.PutUint32(ci[0:4], l.life)
	binary.NativeEndian.PutUint32(ci[4:8], l.life)
	b = rtnl.AppendAttr(b, unix.IFA_CACHEINFO, ci)
	b = rtnl.AppendAttr(b, unix.IFA_FLAGS, rtnl.U32(flags))
	return l.exchange(unix.RTM_NEWADDR, unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_REPLACE, b, nil)
}

func (l *netlinkLink) remove() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A stale copy may be on the interface (an earlier run bound to it).
	copies, err := l.lookupLocked(l.addrIndex, l.ifindex)
	if err != nil {
		return false, err
	}
	for _, c := range copies {
		b := l.addrAttrs(l.ifaddrmsg(c.ifindex, c.PrefixLen, 0))
		err := l.exchange(unix.RTM_DELADDR, unix.NLM_F_ACK, b, nil)
		if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENODEV) {
			return true, err
		}
	}
	return len(copies) > 0, nil
}

func (l *netlinkLink) lookup() (addrInfo, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	copies, err := l.lookupLocked(l.addrIndex)
	if err != nil || len(copies) == 0 {
		return addrInfo{}, false, err
	}
	return copies[0], true, nil
}

// lookupLocked dumps the family's addresses and keeps the copies of ours
// on the given interfaces.
func (l *netlinkLink) lookupLocked(indexes ...int) ([]addrInfo, error) {
	want := l.prefix.Addr()
	var found []addrInfo
	req := make([]byte, unix.SizeofIfAddrmsg)
	req[0] = l.family
	err := l.exchange(unix.RTM_GETADDR, unix.NLM_F_DUMP, req, func(typ uint16, m []byte) {
		if typ != unix.RTM_NEWADDR || len(m) < unix.SizeofIfAddrmsg || m[0] != l.family {
			return
		}
		idx := int(binary.NativeEndian.Uint32(m[4:8]))
		if !slices.Contains(indexes, idx) {
			return
		}
		info := addrInfo{PrefixLen: int(m[1]), Flags: uint32(m[2]), ifindex: idx}
		var local, address netip.Addr
		rtnl.EachAttr(m[unix.SizeofIfAddrmsg:], func(at uint16, d []byte) {
			switch at {
			case unix.IFA_LOCAL:
				local, _ = netip.AddrFromSlice(d)
			case unix.IFA_ADDRESS:
				address, _ = netip.AddrFromSlice(d)
			case unix.IFA_FLAGS:
				if len(d) >= 4 {
					info.Flags = binary.NativeEndian.Uint32(d)
				}
			case unix.IFA_CACHEINFO:
				if len(d) >= 8 {
					info.Preferred = binary.NativeEndian.Uint32(d[0:4])
					info.Valid = binary.NativeEndian.Uint32(d[4:8])
				}
			}
		})
		a := address
		if local.IsValid() { // IPv4 (and IPv6 peer addresses): the local side is ours
			a = local
		}
		if a == want {
			found = append(found, info)
		}
	})
	return found, err
}

// exchange sends one request and reads until its ack, error or dump end,
// handing every other message of the request to each. Callers hold l.mu.
func (l *netlinkLink) exchange(typ, flags uint16, body []byte, each func(typ uint16, m []byte)) error {
	if l.nl < 0 {
		return errors.New("netlink socket closed")
	}
	l.seq++
	return rtnl.Exchange(l.nl, nlTimeout, rtnl.Request{Type: typ, Flags: flags, Seq: l.seq, Body: body}, each)
}

func (l *netlinkLink) announce() (int, error) {
	l.mu.Lock()
	fd, ifindex, mac := l.pkt, l.ifindex, l.mac
	// Hold the lock while sending so close cannot reuse the descriptor.
	defer l.mu.Unlock()
	if mac == nil || fd < 0 {
		return 0, nil
	}
	addr := l.prefix.Addr()
	sent := 0
	send := func(proto uint16, dst net.HardwareAddr, p []byte) error {
		sa := &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifindex, Halen: 6}
		copy(sa.Addr[:], dst)
		if err := unix.Sendto(fd, p, 0, sa); err != nil {
			return fmt.Errorf("send announcement on %s: %w", l.iface, err)
		}
		sent++
		return nil
	}
	if addr.Is4() {
		if err := send(unix.ETH_P_ARP, ethBroadcast, arpAnnouncement(arpOpRequest, mac, addr)); err != nil {
			return sent, err
		}
		return sent, send(unix.ETH_P_ARP, ethBroadcast, arpAnnouncement(arpOpReply, mac, addr))
	}
	return sent, send(unix.ETH_P_IPV6, ethAllNodesV6, unsolicitedNA(mac, addr))
}

// htons puts v in network byte order, as sockaddr_ll wants its protocol.
func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

func isNoDevice(err error) bool { return errors.Is(err, unix.ENODEV) }
