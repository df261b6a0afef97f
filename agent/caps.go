package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/nsmd/nsmd/config"
)

// The Linux capabilities nsmd may need (linux/capability.h bit numbers).
// Run as root it has them all; the packaged systemd unit runs it as the
// nsmd user with exactly these three as ambient capabilities.
const (
	capNetBindService = 10 // ports below 1024: nsm_addr 662, embedded rpcbind 111
	capNetAdmin       = 12 // add and remove the VIP, create its TUN device
	capNetRaw         = 13 // AF_PACKET socket for gratuitous ARP / unsolicited NA
	capKill           = 5  // service namespaces: stop what their hooks left running in them
	capSysAdmin       = 21 // service namespaces: make and enter network namespaces, mount their filesystems
)

func capName(bit uint) string {
	switch bit {
	case capNetBindService:
		return "CAP_NET_BIND_SERVICE"
	case capNetAdmin:
		return "CAP_NET_ADMIN"
	case capNetRaw:
		return "CAP_NET_RAW"
	case capKill:
		return "CAP_KILL"
	case capSysAdmin:
		return "CAP_SYS_ADMIN"
	}
	return "capability " + strconv.Itoa(int(bit))
}

// capNeed is one capability the configuration needs, and what for.
type capNeed struct {
	bit uint
	why string
}

// neededCaps lists the capabilities cfg needs to run, in a stable order.
func neededCaps(cfg config.Config) []capNeed {
	var need []capNeed
	if cfg.VIPMode == config.VIPNetlink && !cfg.Witness {
		need = append(need,
			capNeed{capNetAdmin, fmt.Sprintf("vip_mode netlink: add the VIP %s on %s", cfg.VIP, cfg.VIPInterface)},
			capNeed{capNetRaw, fmt.Sprintf("vip_mode netlink: announce the VIP %s (gratuitous ARP / unsolicited NA) and send tickle ACKs from it", cfg.VIP)})
	}
	if cfg.Namespaced() {
		need = append(need,
			capNeed{capSysAdmin, "service_namespaces: make each service's network namespace, enter it and mount its nfsd and rpc_pipefs filesystems (run nsmd as root: the hooks-as-root.conf drop-in)"},
			capNeed{capKill, "service_namespaces: stop the processes a service's hooks left in its namespace"})
	}
	low := func(key, hostport string) {
		_, p, err := net.SplitHostPort(hostport)
		if err != nil {
			return // Validate reports it
		}
		if n, err := strconv.Atoi(p); err == nil && n > 0 && n < 1024 {
			need = append(need, capNeed{capNetBindService, fmt.Sprintf("%s %s: a port below 1024", key, hostport)})
		}
	}
	low("nsm_addr", cfg.NSMAddr)
	if cfg.Rpcbind == config.RpcbindEmbedded {
		low("rpcbind embedded", net.JoinHostPort("0.0.0.0", "111"))
	}
	low("raft_port", net.JoinHostPort(cfg.Bind, strconv.Itoa(cfg.RaftPort)))
	low("gossip_port", net.JoinHostPort(cfg.Bind, strconv.Itoa(cfg.GossipPort)))
	if cfg.AdminAddr != "" {
		low("admin_addr", cfg.AdminAddr)
	}
	return need
}

// checkCaps returns an error naming every capability that cfg needs and
// the effective set eff lacks, and what each is for.
func checkCaps(cfg config.Config, eff uint64) error {
	var errs []error
	for _, n := range neededCaps(cfg) {
		if eff&(1<<n.bit) == 0 {
			errs = append(errs, fmt.Errorf("missing capability %s, needed for %s (run as root, or grant it: AmbientCapabilities=%s in the systemd unit)",
				capName(n.bit), n.why, capName(n.bit)))
		}
	}
	return errors.Join(errs...)
}

// effectiveCaps reads this process's effective capability set (CapEff in
// /proc/self/status). ok is false where there is no such file (not Linux).
func effectiveCaps() (eff uint64, ok bool, err error) {
	f, err := os.Open("/proc/self/status")
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read capabilities: %w", err)
	}
	defer f.Close()
	return parseCapEff(f)
}

func parseCapEff(f io.Reader) (uint64, bool, error) {
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, found := strings.CutPrefix(sc.Text(), "CapEff:")
		if !found {
			continue
		}
		eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return 0, false, fmt.Errorf("parse CapEff %q: %w", strings.TrimSpace(v), err)
		}
		return eff, true, nil
	}
	if err := sc.Err(); err != nil {
		return 0, false, fmt.Errorf("read /proc/self/status: %w", err)
	}
	return 0, false, errors.New("no CapEff line in /proc/self/status")
}

// CheckCapabilities fails when this process lacks a capability cfg needs,
// so that an agent started without one stops at once with the name of
// what is missing rather than at its first takeover. Without
// CAP_NET_BIND_SERVICE lock-manager callbacks leave from an unprivileged
// port, which Linux lockd drops: that is only a warning (a node may have
// no local lockd).
func CheckCapabilities(cfg config.Config, log interface{ Warn(string, ...any) }) error {
	eff, ok, err := effectiveCaps()
	if err != nil {
		return err
	}
	if !ok {
		return nil
	}
	if err := checkCaps(cfg, eff); err != nil {
		return err
	}
	if eff&(1<<capNetBindService) == 0 && !cfg.Witness {
		log.Warn("no CAP_NET_BIND_SERVICE: callbacks to the lock manager will leave from an unprivileged port, which Linux lockd drops")
	}
	return nil
}
