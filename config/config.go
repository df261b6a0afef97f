// Package config holds nsmd's one Config struct and the rules that fill it:
// defaults, then a YAML file, then NSMD_* environment variables, then
// command-line flags, each overriding the one before. Every setting has one
// snake_case key that names it in all three places: the YAML key
// `notify_name`, the variable NSMD_NOTIFY_NAME and the flag --notify-name.
//
// Validate reports every problem at once, each naming the key to fix.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/service"
)

// DefaultClusterID is the cluster id of a node not given one: the one that
// members advertising none in their gossip metadata count as.
const DefaultClusterID = cluster.DefaultClusterID

func validClusterID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// VIP modes.
const (
	VIPNetlink  = "netlink"  // the leader adds the VIP to an interface
	VIPLoopback = "loopback" // the leader listens on a loopback VIP (dev, tests)
	VIPNone     = "none"     // no floating address
)

// NFSv4 client-tracking modes (nfsv4_tracking).
const (
	TrackingAuto = "auto" // on when this kernel has nfsd
	TrackingOn   = "on"
	TrackingOff  = "off"
)

// Tickle modes (tickle).
const (
	TickleOn  = "on"  // the node that takes the VIP tickles the connections the previous holder had
	TickleOff = "off" // the clients reconnect by their own TCP timers
)

// MaxTickleConns is the largest tickle_max_conns: one answer of the
// leader's connection list must fit a forwarded reply.
const MaxTickleConns = 16384

// Grace-end modes (grace_end).
const (
	GraceEndAuto  = "auto"  // end the kernel's grace once every client that could reclaim has
	GraceEndTimer = "timer" // leave it to the kernel's timer
)

// Timing profiles (raft_profile): the raft timeouts and the netlink VIP
// lifetime in one name. A key set explicitly (heartbeat_timeout,
// election_timeout, leader_lease_timeout, vip_lifetime) overrides its
// profile's value, whichever layer (file, environment, flag) set either.
const (
	ProfileFast    = "fast"    // failover in ~0.2-0.3 s: a low-latency LAN and disks that do not stall
	ProfileDefault = "default" // the timings before profiles existed
	ProfileWAN     = "wan"     // long links: raft's library defaults
)

// Timing is what a raft_profile sets: the values a node runs with once
// explicit keys are applied over the profile's (Config.Timing).
type Timing struct {
	Profile            string
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	VIPLifetime        time.Duration
}

// ProfileTiming is the timing of profile name; false for an unknown name.
//
// A follower starts an election once it has not heard from the leader for
// a random 1-2 heartbeat timeouts, and the other follower votes only once
// its own timer ran out too, so a killed leader is replaced after about
// 2 heartbeat timeouts (at most 3); the rest of a failover (pre-vote, vote,
// the takeover commit, the VIP) takes milliseconds (BENCHMARKS.md).
func ProfileTiming(name string) (Timing, bool) {
	switch name {
	case ProfileFast:
		return Timing{name, 100 * time.Millisecond, 100 * time.Millisecond, 50 * time.Millisecond, 1 * time.Second}, true
	case ProfileDefault:
		return Timing{name, 300 * time.Millisecond, 300 * time.Millisecond, 150 * time.Millisecond, 2 * time.Second}, true
	case ProfileWAN:
		return Timing{name, 1 * time.Second, 1 * time.Second, 500 * time.Millisecond, 2 * time.Second}, true
	}
	return Timing{}, false
}

// Profiles are the names raft_profile accepts.
func Profiles() []string { return []string{ProfileFast, ProfileDefault, ProfileWAN} }

// Timing is the node's timing: raft_profile's values, each replaced by its
// key when that was set (non-zero). An unknown profile counts as default
// (Validate refuses it).
func (c Config) Timing() Timing {
	t, ok := ProfileTiming(c.RaftProfile)
	if !ok {
		t, _ = ProfileTiming(ProfileDefault)
		t.Profile = c.RaftProfile
	}
	for _, o := range []struct{ set, to *time.Duration }{
		{&c.HeartbeatTimeout, &t.HeartbeatTimeout},
		{&c.ElectionTimeout, &t.ElectionTimeout},
		{&c.LeaderLeaseTimeout, &t.LeaderLeaseTimeout},
		{&c.VIPLifetime, &t.VIPLifetime},
	} {
		if *o.set != 0 {
			*o.to = *o.set
		}
	}
	return t
}

// rpcbind modes.
const (
	RpcbindRegister = "register" // register 100024 with the local rpcbind
	RpcbindEmbedded = "embedded" // serve PMAP v2 ourselves on port 111
	RpcbindOff      = "off"
)

// Config is every setting of one nsmd node.
type Config struct {
	NodeID          string
	ClusterID       string
	DataDir         string
	Bind            string
	RaftPort        int
	GossipPort      int
	NSMAddr         string
	AdminAddr       string
	Join            []string
	BootstrapExpect int
	VIP             string
	VIPInterface    string
	VIPMode         string
	VIPLifetime     time.Duration // 0: raft_profile's (Timing)
	VIPBind         string
	NotifyName      string
	TrustedCallers  []string
	GracePeriod     time.Duration
	NotifyWindow    time.Duration
	Rpcbind         string
	GossipKeyFile   string
	TLSCA           string
	TLSCert         string
	TLSKey          string
	AdminTokenFile  string
	// AdminLocalTokenFile: where the agent keeps the local admin token
	// (LocalTokenPath); "none" turns it off.
	AdminLocalTokenFile string
	Insecure            bool
	LogLevel            string
	LogFormat           string
	OnLeader            string
	OnFollower          string
	OnFault             string
	HookTimeout         time.Duration
	// Fencing: FenceWatchdog is the watchdog device a serving node arms
	// ("off": none), FenceTimeout its timeout; FenceAgent a fence agent
	// (ClusterLabs API) run against another node that may still serve,
	// with FenceAgentArgs (key=value) for every node and FenceNodes
	// (ID:key=value) for one.
	FenceWatchdog     string
	FenceTimeout      time.Duration
	FenceAgent        string
	FenceAgentArgs    []string
	FenceNodes        []string
	FenceAgentTimeout time.Duration
	DrillCrash        bool
	Witness           bool
	PmapPort          int
	NSMMaxConns       int
	NSMMaxConnsHost   int
	// NSMReservedLocal: nsm_reserved_local_conns.
	NSMReservedLocal int
	// NSMMaxConnBuffer, NSMMaxHostBuffer, NSMMaxBuffer: nsm_max_conn_buffer,
	// nsm_max_host_buffer, nsm_max_buffer (bytes).
	NSMMaxConnBuffer int
	NSMMaxHostBuffer int
	NSMMaxBuffer     int
	// RaftHandshakesPerHost: raft_handshakes_per_host.
	RaftHandshakesPerHost int
	// NotifyStrictSender: notify_strict_sender.
	NotifyStrictSender bool
	// MaxRegistrations: max_registrations.
	MaxRegistrations int
	// AdminMaxConns, AdminIdleTimeout: admin_max_conns, admin_idle_timeout.
	AdminMaxConns    int
	AdminIdleTimeout time.Duration
	// NotifyBurst, NotifyEvery: notify_accept_burst, notify_accept_every.
	NotifyBurst int
	NotifyEvery time.Duration
	// MonUnprivBurst, MonUnprivEvery: mon_unprivileged_burst,
	// mon_unprivileged_every.
	MonUnprivBurst int
	MonUnprivEvery time.Duration
	NFSv4Tracking  string
	RPCPipefs      string
	GraceEnd       string
	GraceSettle    time.Duration
	// ServiceFailback, ServiceSettle: service_failback, service_settle.
	ServiceFailback bool
	ServiceSettle   time.Duration
	// ServiceNamespaces (service_namespaces): auto, on or off; Namespaced
	// says what it means for this configuration.
	ServiceNamespaces string
	// Tickle, TickleMaxConns: tickle, tickle_max_conns.
	Tickle         string
	TickleMaxConns int
	// DiskSlowThreshold: data directory writes slower than this (median
	// over 2 s) keep the node out of leadership; 0: never.
	DiskSlowThreshold time.Duration

	// Raft timing: 0 is raft_profile's value (Timing).
	RaftProfile        string
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	SnapshotThreshold  uint64
	RaftLogStore       string // auto | wal | bolt
	TrailingLogs       uint64

	// Services are the cluster's NFS services (services:, in the file
	// only: config/services.go); nil: one service on vip, as without them.
	Services     []service.Spec
	servicesFrom *serviceSource // where Services were read, for errors
}

// Default returns the settings used when nothing overrides them.
func Default() Config {
	host, _ := os.Hostname()
	return Config{
		NodeID:                host,
		ClusterID:             DefaultClusterID,
		DataDir:               "/var/lib/nsmd",
		Bind:                  "127.0.0.1",
		RaftPort:              7300,
		GossipPort:            7946,
		NSMAddr:               "0.0.0.0:0",
		AdminAddr:             "127.0.0.1:8024",
		BootstrapExpect:       1,
		VIPMode:               VIPNone,
		VIPBind:               "auto",
		GracePeriod:           90 * time.Second,
		NotifyWindow:          15 * time.Minute,
		Rpcbind:               RpcbindRegister,
		PmapPort:              111,
		NSMMaxConns:           1024,
		NSMMaxConnsHost:       64,
		NSMReservedLocal:      32,
		NSMMaxConnBuffer:      256 << 10,
		NSMMaxHostBuffer:      4 << 20,
		NSMMaxBuffer:          64 << 20,
		RaftHandshakesPerHost: 8,
		MaxRegistrations:      250000,
		AdminMaxConns:         64,
		AdminIdleTimeout:      time.Minute,
		NotifyBurst:           4,
		NotifyEvery:           10 * time.Second,
		MonUnprivBurst:        32,
		MonUnprivEvery:        10 * time.Minute,
		NFSv4Tracking:         TrackingAuto,
		RPCPipefs:             "/var/lib/nfs/rpc_pipefs",
		GraceEnd:              GraceEndAuto,
		GraceSettle:           3 * time.Second,
		ServiceSettle:         30 * time.Second,
		ServiceNamespaces:     ServiceNamespacesAuto,
		Tickle:                TickleOn,
		TickleMaxConns:        4096,
		DiskSlowThreshold:     50 * time.Millisecond,
		HookTimeout:           30 * time.Second,
		FenceWatchdog:         "/dev/watchdog",
		FenceTimeout:          5 * time.Second,
		FenceAgentTimeout:     60 * time.Second,
		LogLevel:              "info",
		LogFormat:             "text",
		RaftProfile:           ProfileDefault,
		HeartbeatTimeout:      0, // these three 0: raft_profile's (Timing); a key set overrides it
		ElectionTimeout:       0,
		LeaderLeaseTimeout:    0,
		SnapshotThreshold:     16_384,
		RaftLogStore:          "auto",
		TrailingLogs:          10_240,
	}
}

// Field describes one setting.
type Field struct {
	Key  string // snake_case
	Help string
	Kind string // string, int, uint, duration, list
}

// Flag is the command-line flag name of a key.
func (f Field) Flag() string { return strings.ReplaceAll(f.Key, "_", "-") }

// Env is the environment variable of a key.
func (f Field) Env() string { return "NSMD_" + strings.ToUpper(f.Key) }

// Fields lists every setting in declaration order.
func Fields() []Field {
	var c Config
	out := make([]Field, 0, 32)
	for _, b := range c.bindings() {
		out = append(out, b.Field)
	}
	return out
}

// ErrUnknownKey is returned by Set for a key no setting has.
var ErrUnknownKey = errors.New("unknown setting")

// Set parses value into the setting named key (snake_case, or the flag
// spelling with dashes).
func (c *Config) Set(key, value string) error {
	key = strings.ReplaceAll(key, "-", "_")
	for _, b := range c.bindings() {
		if b.Key == key {
			if err := b.set(strings.TrimSpace(value)); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%q: %w", key, ErrUnknownKey)
}

// Get formats the current value of key (as Set would accept it).
func (c *Config) Get(key string) (string, error) {
	key = strings.ReplaceAll(key, "-", "_")
	for _, b := range c.bindings() {
		if b.Key == key {
			return b.get(), nil
		}
	}
	return "", fmt.Errorf("%q: %w", key, ErrUnknownKey)
}

type binding struct {
	Field
	set func(string) error
	get func() string
}

// bindings ties each key to its field. It is the one table behind Set,
// Get, Fields, the environment and the flags.
func (c *Config) bindings() []binding {
	return []binding{
		str("node_id", "unique node name (default: hostname)", &c.NodeID),
		str("cluster_id", "name of the cluster this node belongs to: gossip members with another one are refused, never merged or made raft voters (letters, digits, . _ -; at most 64)", &c.ClusterID),
		str("data_dir", "directory for the raft log, stable store and snapshots", &c.DataDir),
		str("bind", "IP address for raft, gossip and cluster traffic", &c.Bind),
		integer("raft_port", "raft TCP port", &c.RaftPort),
		integer("gossip_port", "memberlist gossip port (TCP and UDP)", &c.GossipPort),
		str("nsm_addr", "host:port for NSM over UDP and TCP (port 0 picks one)", &c.NSMAddr),
		str("admin_addr", "host:port of the admin HTTP API (empty disables)", &c.AdminAddr),
		list("join", "gossip seed addresses (host:port), comma separated", &c.Join),
		integer("bootstrap_expect", "form a new cluster once this many nodes see each other", &c.BootstrapExpect),
		str("vip", "floating address held by the leader, in CIDR form", &c.VIP),
		str("vip_interface", "interface for the VIP in netlink mode", &c.VIPInterface),
		str("vip_mode", "netlink | loopback | none", &c.VIPMode),
		profiled("vip_lifetime", "netlink VIP valid_lft: how long the address outlives a holder that dies (whole seconds; default: raft_profile's)", &c.VIPLifetime),
		str("vip_bind", "netlink VIP: process (IPv4; on a TUN device that dies with nsmd, so a killed leader's VIP goes at once) | interface (on vip_interface; outlives a killed process by vip_lifetime) | auto (process when possible)", &c.VIPBind),
		str("notify_name", "name sent in SM_NOTIFY (default: the VIP, else the hostname)", &c.NotifyName),
		list("trusted_callers", "CIDRs allowed to SM_MON besides loopback, comma separated", &c.TrustedCallers),
		duration("grace_period", "NLM grace period opened at every takeover", &c.GracePeriod),
		duration("notify_window", "how long to keep retrying SM_NOTIFY to a host", &c.NotifyWindow),
		str("nfsv4_tracking", "auto | on | off: serve the kernel's NFSv4 client-tracking upcall (what nfsdcld does) from the replicated table, so NFSv4 clients reclaim on any node; auto: when this kernel has nfsd", &c.NFSv4Tracking),
		str("rpc_pipefs", "where rpc_pipefs is (or is mounted): the tracking pipe is <rpc_pipefs>/nfsd/cld", &c.RPCPipefs),
		str("grace_end", "auto | timer: auto ends lockd's and nfsd's grace as soon as every client that could reclaim has come back and reclaims are quiet for grace_settle; timer leaves it to the kernel", &c.GraceEnd),
		duration("grace_settle", "grace_end auto: how long reclaims must be quiet after the last client came back", &c.GraceSettle),
		boolean("service_failback", "services: a service goes back to a more preferred server of its prefer list once that server is healthy again (off: it stays where it runs until an operator moves it)", &c.ServiceFailback),
		duration("service_settle", "services: a new leader places services that have no server yet only once every server is alive and has declared its services, or this long after it began leading", &c.ServiceSettle),
		str("service_namespaces", "auto | on | off: each service a server serves runs in a network namespace of its own (its own kernel nfsd, lockd and grace, so a move of one service never puts another's clients in grace), which nsmd makes with the service's address on a macvlan of its interface; auto: on with services: and vip_mode netlink; off: the services share this host's nfsd", &c.ServiceNamespaces),
		str("tickle", "on | off: the node that takes the VIP over sends every NFS client connection the previous holder had a tickle ACK, so the client's TCP is reset and it reconnects at once instead of by its own retransmission timers (vip_mode netlink; CAP_NET_RAW)", &c.Tickle),
		integer("tickle_max_conns", "connections on the VIP (nfsd's port 2049, lockd's when fixed) the leader shares with the other nodes for tickling, at most (1 to 16384); those beyond reconnect by their own timers", &c.TickleMaxConns),
		str("rpcbind", "register | embedded | off", &c.Rpcbind),
		str("gossip_key_file", "file with a base64 16/24/32-byte gossip encryption key", &c.GossipKeyFile),
		str("tls_ca", "PEM file with the cluster CA: raft and the admin API use mutual TLS (nsmd tls init makes one)", &c.TLSCA),
		str("tls_cert", "PEM file with this node's certificate (signed by tls_ca)", &c.TLSCert),
		str("tls_key", "PEM file with this node's private key", &c.TLSKey),
		str("admin_token_file", "file with a bearer token that authorises admin API writes (besides a client certificate)", &c.AdminTokenFile),
		str("admin_local_token_file", "an admin API on loopback without TLS and admin_token_file needs this token for writes and registrations; the agent creates it at first start (random, mode 0640: root and the nsmd group), and nsmd commands on this host read it (default <data_dir>/admin.token; none: every local user may use the admin API, as before)", &c.AdminLocalTokenFile),
		boolean("insecure", "allow raft, gossip or the admin API on a non-loopback address without TLS and a gossip key (said in the log, /v1/status and nsmd_insecure)", &c.Insecure),
		str("log_level", "debug | info | warn | error", &c.LogLevel),
		str("log_format", "text | json", &c.LogFormat),
		str("on_leader", "script run after this node becomes leader", &c.OnLeader),
		str("on_follower", "script run after this node stops being leader", &c.OnFollower),
		str("on_fault", "script run when the node hits a fault it cannot fix (VIP, takeover, hook)", &c.OnFault),
		duration("hook_timeout", "how long a hook script may run before it is killed", &c.HookTimeout),
		str("fence_watchdog", "watchdog device a serving node (one with an on_leader hook) arms before on_leader and feeds only while a quorum confirms its leadership; it resets the node when it dies, hangs, loses its quorum or cannot stop; off: no watchdog (then only fence_agent fences, or nothing: say so explicitly)", &c.FenceWatchdog),
		duration("fence_timeout", "watchdog timeout of every serving node (whole seconds, at least 2s): a new leader that cannot ask the previous serving node waits election + heartbeat_timeout + this + 2s before it serves, unless fence_agent reports that node off first", &c.FenceTimeout),
		str("fence_agent", "fence agent (ClusterLabs API: key=value lines on stdin, e.g. /usr/sbin/fence_ipmilan) a new leader runs with action=off against another serving node that may still serve; it serves only once the agent succeeded or the node said it stopped", &c.FenceAgent),
		list("fence_agent_args", "key=value arguments for fence_agent, for every node, comma separated (e.g. ip=…,username=…,password_script=…)", &c.FenceAgentArgs),
		list("fence_nodes", "per-node fence_agent arguments, NODE_ID:key=value, comma separated (e.g. s1:plug=s1,s2:plug=s2)", &c.FenceNodes),
		duration("fence_agent_timeout", "how long one fence_agent run may take before it is killed (then retried)", &c.FenceAgentTimeout),
		duration("disk_slow_threshold", "a node whose data_dir writes (fsync included) take longer than this, median over 2s, hands leadership away and stays out of elections while they do; 0 turns this off", &c.DiskSlowThreshold),
		boolean("witness", "a voter that never holds the VIP, runs no hook and sends no SM_NOTIFY: the third vote of a server pair", &c.Witness),
		boolean("drill_crash", "allow POST /v1/drill/crash to kill this node (failover drills)", &c.DrillCrash),
		integer("nsm_max_conns", "open NSM TCP connections at most; at the cap the longest-idle one is closed for a new one", &c.NSMMaxConns),
		integer("nsm_max_conns_per_host", "open NSM TCP connections from one IP address at most", &c.NSMMaxConnsHost),
		integer("admin_max_conns", "open admin API connections at most: over it the longest-idle keep-alive connection is closed, or the new one if none is idle (nsmd_admin_connections_total); 0: no cap", &c.AdminMaxConns),
		duration("admin_idle_timeout", "an admin API keep-alive connection idle this long is closed", &c.AdminIdleTimeout),
		integer("notify_accept_burst", "SM_NOTIFYs committed per sender address and per mon_name at once; beyond, one more every notify_accept_every; held back ones get no reply (the peer retransmits) and count as nsmd_notify_received_total{result=\"rate_limited\"}; -1: no limit", &c.NotifyBurst),
		duration("notify_accept_every", "one more SM_NOTIFY per sender and per mon_name this often (notify_accept_burst)", &c.NotifyEvery),
		integer("mon_unprivileged_burst", "new hosts (a mon_name no registration names yet) that local callers (loopback) from an unprivileged source port may have monitored at once, together; beyond, one more every mon_unprivileged_every, the rest answered stat_fail (nsmd_mon_refused_total{reason=\"unprivileged_limit\"}); lockd and lock managers running as root call from a privileged port and are not bounded, nor are trusted_callers; -1: no bound", &c.MonUnprivBurst),
		duration("mon_unprivileged_every", "one more new host from unprivileged local callers this often (mon_unprivileged_burst)", &c.MonUnprivEvery),
		integer("max_registrations", "registrations at most: an SM_MON that would add one more is answered stat_fail (nsmd_mon_refused_total{reason=\"registrations_cap\"}); nsmd_registrations_max exports it for an alert before it is hit; 0: no cap", &c.MaxRegistrations),
		integer("nsm_reserved_local_conns", "NSM TCP connections from a privileged loopback port (lockd: only root binds one) are exempt from nsm_max_conns_per_host, and this many are admitted beyond nsm_max_conns when every other one is busy, so other local users cannot lock lockd out (-1: none beyond)", &c.NSMReservedLocal),
		integer("nsm_max_conn_buffer", "bytes of NSM calls being served and replies not yet written that one TCP connection may hold; at it nsmd reads no further call from it until they are (nsmd_nsm_tcp_reads_held_total{cap=\"conn\"}): a peer that pipelines calls and never reads holds little", &c.NSMMaxConnBuffer),
		integer("nsm_max_host_buffer", "the same, for all NSM TCP connections from one IP address (cap=\"host\"); lockd's (a privileged loopback port) are exempt", &c.NSMMaxHostBuffer),
		integer("nsm_max_buffer", "the same, for all NSM TCP connections (cap=\"total\"); lockd's are exempt", &c.NSMMaxBuffer),
		integer("raft_handshakes_per_host", "raft TLS handshakes in progress from one IP address at most (64 in all); more are closed at once (nsmd_tls_handshake_failures_total{listener=\"raft\",reason=\"too_many\"}), so silent connections from one host cannot hold the others out", &c.RaftHandshakesPerHost),
		boolean("notify_strict_sender", "accept an SM_NOTIFY only when it comes from an address of the host it names (rpc.statd also accepts it when only the name or only the sender matches a monitored host); ignored ones count as nsmd_notify_received_total{result=\"wrong_sender\"}", &c.NotifyStrictSender),
		integer("pmap_port", "portmapper port queried on monitored hosts and for lock-manager callbacks", &c.PmapPort),
		str("raft_profile", "fast | default | wan: the raft timeouts and vip_lifetime in one name (heartbeat/election/lease, vip_lifetime: fast 100/100/50 ms, 1s; default 300/300/150 ms, 2s; wan 1s/1s/500ms, 2s); heartbeat_timeout, election_timeout, leader_lease_timeout and vip_lifetime, when set, override it (docs/running.md)", &c.RaftProfile),
		profiled("heartbeat_timeout", "raft heartbeat timeout (default: raft_profile's)", &c.HeartbeatTimeout),
		profiled("election_timeout", "raft election timeout (default: raft_profile's)", &c.ElectionTimeout),
		profiled("leader_lease_timeout", "raft leader lease, not longer than the heartbeat timeout (default: raft_profile's)", &c.LeaderLeaseTimeout),
		unsigned("snapshot_threshold", "log entries between snapshots", &c.SnapshotThreshold),
		str("raft_log_store", "auto | wal | bolt: where raft's log lives (wal: hashicorp/raft-wal, one fsync per append; bolt: raft-boltdb/v2, two); auto keeps the store the data directory has and takes wal in a new one; a named store refuses a directory that has the other", &c.RaftLogStore),
		unsigned("trailing_logs", "log entries kept after a snapshot", &c.TrailingLogs),
	}
}

func str(key, help string, p *string) binding {
	return binding{Field{key, help, "string"},
		func(s string) error { *p = s; return nil },
		func() string { return *p }}
}

func integer(key, help string, p *int) binding {
	return binding{Field{key, help, "int"},
		func(s string) error {
			v, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("not an integer: %q", s)
			}
			*p = v
			return nil
		},
		func() string { return strconv.Itoa(*p) }}
}

func unsigned(key, help string, p *uint64) binding {
	return binding{Field{key, help, "uint"},
		func(s string) error {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return fmt.Errorf("not a non-negative integer: %q", s)
			}
			*p = v
			return nil
		},
		func() string { return strconv.FormatUint(*p, 10) }}
}

func duration(key, help string, p *time.Duration) binding {
	return binding{Field{key, help, "duration"},
		func(s string) error {
			v, err := time.ParseDuration(s)
			if err != nil {
				return fmt.Errorf("not a duration (like 90s or 15m): %q", s)
			}
			*p = v
			return nil
		},
		func() string { return p.String() }}
}

// profiled is a duration whose zero value (also given as "") means "the
// raft_profile's" (Config.Timing).
func profiled(key, help string, p *time.Duration) binding {
	b := duration(key, help, p)
	set := b.set
	b.set = func(s string) error {
		if s == "" {
			*p = 0
			return nil
		}
		if err := set(s); err != nil {
			return err
		}
		if *p <= 0 {
			return fmt.Errorf("%v must be positive (or empty for raft_profile's)", *p)
		}
		return nil
	}
	b.get = func() string {
		if *p == 0 {
			return ""
		}
		return p.String()
	}
	return b
}

func boolean(key, help string, p *bool) binding {
	return binding{Field{key, help, "bool"},
		func(s string) error {
			v, err := strconv.ParseBool(s)
			if err != nil {
				return fmt.Errorf("not true or false: %q", s)
			}
			*p = v
			return nil
		},
		func() string { return strconv.FormatBool(*p) }}
}

func list(key, help string, p *[]string) binding {
	return binding{Field{key, help, "list"},
		func(s string) error {
			*p = nil
			for _, part := range strings.Split(s, ",") {
				if part = strings.TrimSpace(part); part != "" {
					*p = append(*p, part)
				}
			}
			return nil
		},
		func() string { return strings.Join(*p, ",") }}
}

// Validate checks every setting and returns all problems joined.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, a...)))
	}
	if c.MonUnprivBurst > 0 && c.MonUnprivEvery <= 0 {
		bad("mon_unprivileged_every", "%v must be positive while mon_unprivileged_burst bounds new hosts (-1 turns the bound off)", c.MonUnprivEvery)
	}
	if c.NodeID == "" {
		bad("node_id", "must not be empty")
	} else if strings.ContainsAny(c.NodeID, " \t\n/") || len(c.NodeID) > 128 {
		bad("node_id", "%q must be at most 128 characters without spaces or '/'", c.NodeID)
	}
	if !validClusterID(c.ClusterID) {
		bad("cluster_id", "%q must be 1 to 64 letters, digits, '.', '_' or '-'", c.ClusterID)
	}
	if c.DataDir == "" {
		bad("data_dir", "must not be empty")
	}
	if _, err := netip.ParseAddr(c.Bind); err != nil {
		bad("bind", "%q is not an IP address", c.Bind)
	}
	port := func(key string, p int, zeroOK bool) {
		if p < 0 || p > 65535 || (p == 0 && !zeroOK) {
			bad(key, "%d is not a port", p)
		}
	}
	port("raft_port", c.RaftPort, false)
	port("gossip_port", c.GossipPort, false)
	port("pmap_port", c.PmapPort, false)
	hostPort := func(key, v string, emptyOK bool) {
		if v == "" {
			if !emptyOK {
				bad(key, "must not be empty")
			}
			return
		}
		if _, p, err := net.SplitHostPort(v); err != nil {
			bad(key, "%q is not host:port", v)
		} else if n, err := strconv.Atoi(p); err != nil || n < 0 || n > 65535 {
			bad(key, "%q has a bad port", v)
		}
	}
	hostPort("nsm_addr", c.NSMAddr, false)
	hostPort("admin_addr", c.AdminAddr, true)
	for _, j := range c.Join {
		hostPort("join", j, false)
	}
	if c.NSMMaxConns < 1 {
		bad("nsm_max_conns", "must be at least 1")
	}
	if c.NSMMaxConnsHost < 1 || c.NSMMaxConnsHost > c.NSMMaxConns {
		bad("nsm_max_conns_per_host", "%d must be between 1 and nsm_max_conns (%d)", c.NSMMaxConnsHost, c.NSMMaxConns)
	}
	for _, b := range []struct {
		key string
		v   int
	}{{"nsm_max_conn_buffer", c.NSMMaxConnBuffer}, {"nsm_max_host_buffer", c.NSMMaxHostBuffer}, {"nsm_max_buffer", c.NSMMaxBuffer}} {
		if b.v < 64<<10 {
			bad(b.key, "%d bytes: must be at least 65536 (one NSM record)", b.v)
		}
	}
	if c.RaftHandshakesPerHost < 1 || c.RaftHandshakesPerHost > 64 {
		bad("raft_handshakes_per_host", "%d must be between 1 and 64", c.RaftHandshakesPerHost)
	}
	if c.BootstrapExpect < 0 {
		bad("bootstrap_expect", "must not be negative")
	}
	switch c.VIPMode {
	case VIPNone:
	case VIPLoopback, VIPNetlink:
		if c.Services != nil {
			break // each service's address: validateServices
		}
		p, err := netip.ParsePrefix(c.VIP)
		if err != nil {
			bad("vip", "%q is not an address in CIDR form (like 10.0.0.10/24), needed by vip_mode %s", c.VIP, c.VIPMode)
		} else if c.VIPMode == VIPLoopback && !p.Addr().IsLoopback() {
			bad("vip", "%s is not a loopback address, needed by vip_mode loopback", p.Addr())
		}
		if c.VIPMode == VIPNetlink && c.VIPInterface == "" {
			bad("vip_interface", "must name an interface for vip_mode netlink")
		}
	default:
		bad("vip_mode", "%q is not one of netlink, loopback, none", c.VIPMode)
	}
	switch c.RaftLogStore {
	case "auto", "wal", "bolt":
	default:
		bad("raft_log_store", "%q is not one of auto, wal, bolt", c.RaftLogStore)
	}
	switch c.VIPBind {
	case "auto", "interface":
	case "process":
		if p, err := netip.ParsePrefix(c.VIP); err == nil && !p.Addr().Is4() {
			bad("vip_bind", "process needs an IPv4 VIP (%s is not)", p.Addr())
		}
	default:
		bad("vip_bind", "%q is not one of auto, process, interface", c.VIPBind)
	}
	tm := c.Timing()
	if _, ok := ProfileTiming(c.RaftProfile); !ok {
		bad("raft_profile", "%q is not one of %s", c.RaftProfile, strings.Join(Profiles(), ", "))
	}
	// from names where a value came from, so an error names the key to set.
	from := func(set time.Duration) string {
		if set == 0 {
			return fmt.Sprintf(" (raft_profile %s's)", tm.Profile)
		}
		return ""
	}
	if tm.VIPLifetime < time.Second || tm.VIPLifetime%time.Second != 0 {
		bad("vip_lifetime", "%v must be whole seconds, at least 1s (the kernel's valid_lft unit)", tm.VIPLifetime)
	}
	for _, t := range c.TrustedCallers {
		if _, err := netip.ParsePrefix(t); err != nil {
			bad("trusted_callers", "%q is not a CIDR", t)
		}
	}
	if c.GracePeriod <= 0 {
		bad("grace_period", "must be positive")
	}
	if c.NotifyWindow <= 0 {
		bad("notify_window", "must be positive")
	}
	switch c.NFSv4Tracking {
	case TrackingAuto, TrackingOn, TrackingOff:
	default:
		bad("nfsv4_tracking", "%q is not one of auto, on, off", c.NFSv4Tracking)
	}
	if c.NFSv4Tracking != TrackingOff && !filepath.IsAbs(c.RPCPipefs) {
		bad("rpc_pipefs", "%q must be an absolute path", c.RPCPipefs)
	}
	switch c.GraceEnd {
	case GraceEndAuto, GraceEndTimer:
	default:
		bad("grace_end", "%q is not one of auto, timer", c.GraceEnd)
	}
	if c.ServiceSettle < 0 || c.ServiceSettle > 10*time.Minute {
		bad("service_settle", "%v is outside 0…10m", c.ServiceSettle)
	}
	if c.GraceSettle < 0 {
		bad("grace_settle", "must not be negative")
	}
	switch c.Tickle {
	case TickleOn, TickleOff:
	default:
		bad("tickle", "%q is not one of on, off", c.Tickle)
	}
	if c.TickleMaxConns < 1 || c.TickleMaxConns > MaxTickleConns {
		bad("tickle_max_conns", "%d must be 1 to %d", c.TickleMaxConns, MaxTickleConns)
	}
	switch c.Rpcbind {
	case RpcbindRegister, RpcbindEmbedded, RpcbindOff:
	default:
		bad("rpcbind", "%q is not one of register, embedded, off", c.Rpcbind)
	}
	if c.GossipKeyFile != "" {
		if _, err := os.Stat(c.GossipKeyFile); err != nil {
			bad("gossip_key_file", "%v", err)
		}
	}
	tlsFiles := map[string]string{"tls_ca": c.TLSCA, "tls_cert": c.TLSCert, "tls_key": c.TLSKey, "admin_token_file": c.AdminTokenFile}
	for _, key := range []string{"tls_ca", "tls_cert", "tls_key", "admin_token_file"} {
		if f := tlsFiles[key]; f != "" {
			if _, err := os.Stat(f); err != nil {
				bad(key, "%v", err)
			}
		}
	}
	if n := countSet(c.TLSCA, c.TLSCert, c.TLSKey); n != 0 && n != 3 {
		bad("tls_ca", "tls_ca, tls_cert and tls_key go together (%d of 3 given)", n)
	}
	if !c.Insecure {
		for _, e := range c.Exposures() {
			bad(e.Key, "%s", e.Why)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		bad("log_format", "%q is not one of text, json", c.LogFormat)
	}
	if c.HookTimeout <= 0 {
		bad("hook_timeout", "must be positive")
	}
	for key, p := range map[string]string{"on_leader": c.OnLeader, "on_follower": c.OnFollower, "on_fault": c.OnFault} {
		if p != "" && !filepath.IsAbs(p) {
			bad(key, "%q must be an absolute path", p)
		}
	}
	if c.OnLeader != "" && c.OnFollower == "" && !c.Witness {
		// The stop is what makes "not serving" true: without it the node
		// would disarm its watchdog and tell a successor it stopped while
		// nfsd and the mount live on.
		bad("on_follower", "is empty but on_leader is set: a node that starts serving (on_leader) needs the script that stops it (on_follower; the shipped hook does both: /usr/lib/nsmd/hooks/nfsd-ha)")
	}
	if tm.HeartbeatTimeout < 5*time.Millisecond {
		bad("heartbeat_timeout", "%v is too short (at least 5ms)", tm.HeartbeatTimeout)
	}
	if tm.ElectionTimeout < tm.HeartbeatTimeout {
		bad("election_timeout", "%v%s must be at least heartbeat_timeout (%v%s)", tm.ElectionTimeout, from(c.ElectionTimeout), tm.HeartbeatTimeout, from(c.HeartbeatTimeout))
	}
	if tm.LeaderLeaseTimeout <= 0 || tm.LeaderLeaseTimeout > tm.HeartbeatTimeout {
		bad("leader_lease_timeout", "%v%s must be positive and not longer than heartbeat_timeout (%v%s)", tm.LeaderLeaseTimeout, from(c.LeaderLeaseTimeout), tm.HeartbeatTimeout, from(c.HeartbeatTimeout))
	}
	c.validateFencing(bad)
	c.validateServices(bad)
	if c.DiskSlowThreshold < 0 {
		bad("disk_slow_threshold", "%v must not be negative (0 turns the check off)", c.DiskSlowThreshold)
	}
	if c.SnapshotThreshold == 0 {
		bad("snapshot_threshold", "must be positive")
	}
	if c.TrailingLogs == 0 {
		bad("trailing_logs", "must be positive")
	}
	return errors.Join(errs...)
}

// VIPAddr is the VIP's address, or the zero Addr when there is none.
func (c *Config) VIPAddr() netip.Addr {
	if c.VIPMode == VIPNone {
		return netip.Addr{}
	}
	p, err := netip.ParsePrefix(c.VIP)
	if err != nil {
		return netip.Addr{}
	}
	return p.Addr()
}

// EffectiveNotifyName is the name sent in SM_NOTIFY.
func (c *Config) EffectiveNotifyName() string {
	if c.NotifyName != "" {
		return c.NotifyName
	}
	if a := c.VIPAddr(); a.IsValid() {
		return a.String()
	}
	host, _ := os.Hostname()
	return host
}

func countSet(v ...string) int {
	n := 0
	for _, s := range v {
		if s != "" {
			n++
		}
	}
	return n
}

// TLS reports whether tls_ca, tls_cert and tls_key are all given.
func (c *Config) TLS() bool { return countSet(c.TLSCA, c.TLSCert, c.TLSKey) == 3 }

// Exposure is a port open beyond loopback without the protection it needs.
type Exposure struct {
	Key string // the setting that exposes it
	Why string
}

// Exposures lists what this configuration leaves unauthenticated on a
// non-loopback address: raft without TLS, gossip without a key, the admin
// API without TLS. Validate refuses any unless insecure is set; with it,
// the agent reports them.
func (c *Config) Exposures() []Exposure {
	var out []Exposure
	const hint = "(nsmd tls init makes the files; insecure: true runs without, and says so)"
	if ip, err := netip.ParseAddr(c.Bind); err == nil && !ip.IsLoopback() {
		if !c.TLS() {
			out = append(out, Exposure{"bind", fmt.Sprintf("raft on %s (not loopback) needs tls_ca, tls_cert and tls_key %s", c.Bind, hint)})
		}
		if c.GossipKeyFile == "" && c.GossipPort != 0 {
			out = append(out, Exposure{"gossip_key_file", fmt.Sprintf("gossip on %s (not loopback) needs gossip_key_file %s", c.Bind, hint)})
		}
	}
	if c.AdminAddr != "" && !c.TLS() {
		if host, _, err := net.SplitHostPort(c.AdminAddr); err == nil && !isLoopbackHost(host) {
			out = append(out, Exposure{"admin_addr", fmt.Sprintf("admin API on %s (not loopback) needs tls_ca, tls_cert and tls_key %s", c.AdminAddr, hint)})
		}
	}
	return out
}

// AdminLocalTokenNone turns the local admin token off (admin_local_token_file).
const AdminLocalTokenNone = "none"

// LocalTokenPath is the local admin token file the agent creates and
// requires, or "" when there is none: it is used only for an admin API on
// loopback with neither TLS nor admin_token_file, unless
// admin_local_token_file is "none". Default <data_dir>/admin.token.
func (c *Config) LocalTokenPath() string {
	if c.AdminAddr == "" || !c.AdminLoopback() || c.TLS() || c.AdminTokenFile != "" || c.AdminLocalTokenFile == AdminLocalTokenNone {
		return ""
	}
	if c.AdminLocalTokenFile != "" {
		return c.AdminLocalTokenFile
	}
	return filepath.Join(c.DataDir, "admin.token")
}

// AdminLoopback reports whether the admin API listens on loopback only.
func (c *Config) AdminLoopback() bool {
	host, _, err := net.SplitHostPort(c.AdminAddr)
	return err == nil && isLoopbackHost(host)
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.IsLoopback()
}

// TrustedPrefixes parses TrustedCallers (call after Validate).
func (c *Config) TrustedPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, t := range c.TrustedCallers {
		if p, err := netip.ParsePrefix(t); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// FenceOff is the fence_watchdog value that turns the watchdog off.
const FenceOff = "off"

// Serves reports whether this node serves storage when it leads: it is
// not a witness and runs an on_leader hook. Fencing applies to such nodes.
func (c *Config) Serves() bool { return !c.Witness && c.OnLeader != "" }

// Fenced reports whether a serving node of this configuration is fenced
// (a watchdog, a fence agent, or both).
func (c *Config) Fenced() bool { return c.FenceWatchdog != FenceOff || c.FenceAgent != "" }

// FenceArgs parses fence_agent_args and fence_nodes: the arguments for
// every node, and per node ID.
func (c *Config) FenceArgs() (common map[string]string, nodes map[string]map[string]string, err error) {
	common, nodes = map[string]string{}, map[string]map[string]string{}
	var errs []error
	for _, kv := range c.FenceAgentArgs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !fenceKey(k) {
			errs = append(errs, fmt.Errorf("fence_agent_args: %q is not key=value (key: lower-case letters, digits, _ and -)", kv))
			continue
		}
		common[k] = v
	}
	for _, item := range c.FenceNodes {
		id, kv, ok := strings.Cut(item, ":")
		k, v, ok2 := strings.Cut(kv, "=")
		if !ok || !ok2 || id == "" || !fenceKey(k) {
			errs = append(errs, fmt.Errorf("fence_nodes: %q is not NODE_ID:key=value", item))
			continue
		}
		if nodes[id] == nil {
			nodes[id] = map[string]string{}
		}
		nodes[id][k] = v
	}
	return common, nodes, errors.Join(errs...)
}

func fenceKey(k string) bool {
	if k == "" || k == "action" {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func (c *Config) validateFencing(bad func(key, format string, a ...any)) {
	if c.FenceWatchdog == "" {
		bad("fence_watchdog", "is empty: name the watchdog device (default /dev/watchdog) or say off")
	} else if c.FenceWatchdog != FenceOff && !filepath.IsAbs(c.FenceWatchdog) {
		bad("fence_watchdog", "%q must be an absolute path or off", c.FenceWatchdog)
	}
	if c.FenceTimeout < 2*time.Second || c.FenceTimeout%time.Second != 0 {
		bad("fence_timeout", "%v must be whole seconds, at least 2s (the watchdog counts whole seconds)", c.FenceTimeout)
	}
	if c.FenceAgent != "" && !filepath.IsAbs(c.FenceAgent) {
		bad("fence_agent", "%q must be an absolute path", c.FenceAgent)
	}
	if c.FenceAgentTimeout <= 0 {
		bad("fence_agent_timeout", "must be positive")
	}
	if _, _, err := c.FenceArgs(); err != nil {
		bad("fence_agent_args", "%v", err)
	}
}
