package nsm

import (
	"net/netip"
	"strings"
)

// defaultLoopback is who counts as "the local lock manager": every IPv4
// loopback address and ::1. (rpc.statd itself accepts only 127.0.0.1 over
// IPv4; nsmd also accepts the rest of 127.0.0.0/8 and ::1, which are just
// as local.)
func defaultLoopback() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
}

// callerAddr normalises a caller's address: IPv4-mapped IPv6 is unmapped and
// any zone dropped, so prefix checks and stored addresses compare as equal.
func callerAddr(ap netip.AddrPort) netip.Addr {
	return ap.Addr().Unmap().WithZone("")
}

// trusted reports whether a caller may use SM_MON, SM_UNMON, SM_UNMON_ALL
// and SM_SIMU_CRASH: it is on a loopback prefix (Config.LoopbackTrusted) or
// a configured trusted prefix (Config.Trusted). XNFS leaves access control
// to the implementation; rpc.statd allows only the local host.
func (s *Service) trusted(ap netip.AddrPort) bool {
	a := callerAddr(ap)
	if !a.IsValid() {
		return false
	}
	for _, p := range s.cfg.LoopbackTrusted {
		if p.Contains(a) {
			return true
		}
	}
	for _, p := range s.cfg.Trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// privileged reports whether a caller's source port is below 1024 (a port
// only root may bind), as rpc.statd requires for SM_SIMU_CRASH.
func privileged(ap netip.AddrPort) bool {
	return ap.Port() != 0 && ap.Port() < 1024
}

// isLoopback reports whether the caller is on this host.
func isLoopback(ap netip.AddrPort) bool {
	return callerAddr(ap).IsLoopback()
}

// ValidName reports whether a host name may be monitored: rpc.statd
// refuses an empty name, one containing '/' (it names a file in its
// monitor directory) and one starting with '.'. Lengths above SM_MAXSTRLEN
// never get here: the decoder refuses them.
func ValidName(name string) bool {
	return name != "" && len(name) <= MaxStrLen && !strings.ContainsRune(name, '/') && name[0] != '.'
}
