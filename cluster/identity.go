package cluster

// Cluster identity: every node advertises its cluster id and its nsmd
// version in its gossip metadata. A node of another cluster is refused on
// every path into the member list — memberlist's alive messages (gossip,
// periodic push-pull) through NotifyAlive and join push-pulls through
// NotifyMerge — and so it never reaches the peers that bootstrap and
// reconcile the raft configuration (updatePeer and reconcile check again).
// A node with another gossip key never gets that far: memberlist cannot
// decrypt it and says so in its log, which memberlistLogWriter turns into a
// counted refusal. Every refusal counts in
// nsmd_cluster_join_refused_total{reason}; the log gets at most one line per
// peer and minute.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nsmd/nsmd/cluster/pki"
)

// DefaultClusterID is the cluster id of a node not given one, and of a
// member whose metadata carries none (nsmd before cluster ids).
const DefaultClusterID = "nsmd"

// DefaultVersion is the version a node advertises when Config.Version is empty.
const DefaultVersion = "dev"

// maxVersionLen bounds the advertised version so the metadata always fits.
const maxVersionLen = 64

// Refusal reasons (the reason label of nsmd_cluster_join_refused_total).
const (
	RefusedClusterID = "cluster_id" // the member belongs to another cluster
	RefusedGossipKey = "gossip_key" // its gossip could not be decrypted (another key, or none)
	RefusedMetadata  = "metadata"   // its metadata is not nsmd's (cannot tell its cluster)
)

// refusalMarker starts every refusal error we hand memberlist, so its own
// log lines about them (one per message) can be told apart and demoted.
const refusalMarker = "nsmd refused member"

// errForeignMember is what NotifyAlive and NotifyMerge return to memberlist.
var errForeignMember = errors.New(refusalMarker)

// clusterOf is the cluster id a member advertises.
func (md nodeMeta) clusterOf() string {
	if md.Cluster == "" {
		return DefaultClusterID
	}
	return md.Cluster
}

// joinRefusals counts refused members and rate-limits the log about them:
// at most one line per reason, peer and interval, saying how many were
// suppressed since the last one.
type joinRefusals struct {
	log     *slog.Logger
	counter *prometheus.CounterVec
	limit   *pki.LogLimiter // keyed by reason + " " + peer
}

func newJoinRefusals(log *slog.Logger, now func() time.Time) *joinRefusals {
	r := &joinRefusals{
		log: log, limit: pki.NewLogLimiter(now, time.Minute),
		counter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_cluster_join_refused_total",
			Help: "Gossip members or messages refused, by reason: cluster_id (another cluster), gossip_key (cannot decrypt: another key or none), metadata (not an nsmd member).",
		}, []string{"reason"}),
	}
	for _, reason := range []string{RefusedClusterID, RefusedGossipKey, RefusedMetadata} {
		r.counter.WithLabelValues(reason)
	}
	return r
}

// observe counts one refusal and logs it unless this peer was logged for
// this reason less than an interval ago. peer is the rate-limit key.
func (r *joinRefusals) observe(reason, peer, msg string, attrs ...any) {
	r.counter.WithLabelValues(reason).Inc()
	ok, suppressed := r.limit.Allow(reason + " " + peer)
	if !ok {
		return
	}
	attrs = append(attrs, "reason", reason, "suppressed_since_last", suppressed)
	r.log.Warn(msg, attrs...)
}

// count is the refusals counted for reason (tests, status).
func (r *joinRefusals) count(reason string) float64 {
	c, err := r.counter.GetMetricWithLabelValues(reason)
	if err != nil {
		return 0
	}
	return counterValue(c)
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil || m.Counter == nil {
		return 0
	}
	return m.Counter.GetValue()
}

// admit decides whether node may enter the member list: its metadata must
// be nsmd's and name this node's cluster. via says which path asked
// ("alive" or "join").
func (m *membership) admit(n *memberlist.Node, via string) error {
	peer := n.Name + "@" + n.Address()
	md, err := decodeMeta(n.Meta)
	if err != nil {
		m.refusals.observe(RefusedMetadata, peer, "refused a gossip member whose metadata is not nsmd's",
			"member", n.Name, "addr", n.Address(), "via", via, "err", err)
		return fmt.Errorf("%w %s: %v", errForeignMember, n.Name, err)
	}
	if theirs := md.clusterOf(); theirs != m.clusterID {
		m.refusals.observe(RefusedClusterID, peer, "refused a gossip member of another cluster (not added to members or raft)",
			"member", n.Name, "addr", n.Address(), "via", via, "member_cluster_id", theirs, "cluster_id", m.clusterID)
		return fmt.Errorf("%w %s: cluster_id %q is not ours (%q)", errForeignMember, n.Name, theirs, m.clusterID)
	}
	return nil
}

// mlAdmit is memberlist's AliveDelegate and MergeDelegate. Both are called
// with memberlist's node lock held: decide and log only.
type mlAdmit membership

func (a *mlAdmit) NotifyAlive(n *memberlist.Node) error {
	return (*membership)(a).admit(n, "alive")
}

// NotifyMerge refuses a whole join push-pull if any member in it is
// foreign: a cluster is never merged with another one in part.
func (a *mlAdmit) NotifyMerge(nodes []*memberlist.Node) error {
	for _, n := range nodes {
		if err := (*membership)(a).admit(n, "join"); err != nil {
			return err
		}
	}
	return nil
}

// keyFailures are the memberlist log messages that mean a peer's gossip
// could not be read with our key: it has another key, or one of us has
// none. (memberlist v0.5.4 reports these only in its log.)
var keyFailures = []string{
	"no installed keys could decrypt",
	"Decrypt packet failed",
	"encryption is configured but remote state is not encrypted",
	"remote state is encrypted and encryption is not configured",
}

// gossipKeyFailure reports whether a memberlist log message is a gossip
// key failure, and the peer address it names ("from=ADDR" or "failed to
// join ADDR:").
func gossipKeyFailure(msg string) (peer string, ok bool) {
	if !slices.ContainsFunc(keyFailures, func(s string) bool { return strings.Contains(msg, s) }) {
		return "", false
	}
	if i := strings.LastIndex(msg, "from="); i >= 0 {
		return strings.TrimSpace(msg[i+len("from="):]), true
	}
	if rest, ok := strings.CutPrefix(msg, "failed to join "); ok {
		if i := strings.Index(rest, ": "); i > 0 {
			return rest[:i], true
		}
	}
	return "unknown", true
}

// peerIP is the host part of addr: a peer's stream connections come from
// new ports each time, so rate limits key on the IP.
func peerIP(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// memberlistLine routes one memberlist log message: key failures become
// counted refusals, memberlist's own lines about refusals we made (one per
// message) go to debug; everything else keeps its level.
func (m *membership) memberlistLine(lv slog.Level, msg string) {
	if peer, ok := gossipKeyFailure(msg); ok {
		m.refusals.observe(RefusedGossipKey, peerIP(peer),
			"refused gossip that cannot be decrypted: the peer has another gossip key, or one side has none",
			"peer", peer, "detail", msg)
		lv = slog.LevelDebug
	} else if strings.Contains(msg, refusalMarker) {
		lv = slog.LevelDebug
	}
	m.log.Log(context.Background(), lv, msg)
}

// versionSetLocked returns the versions of the live members, sorted, and
// a member → version map; call with m.mu held.
func (m *membership) versionSetLocked() ([]string, map[string]string) {
	var vs []string
	by := map[string]string{}
	for id, p := range m.peers {
		if !p.metaOK || p.state != stateAlive {
			continue
		}
		v := p.meta.Version
		if v == "" {
			v = "unknown"
		}
		by[id] = v
		if !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	return vs, by
}

// checkVersionsLocked returns a warning to log (outside the lock) the first
// time the live members run this particular set of different versions.
func (m *membership) checkVersionsLocked() func() {
	vs, by := m.versionSetLocked()
	if len(vs) < 2 {
		return nil
	}
	key := strings.Join(vs, " ")
	if _, done := m.versionsWarned[key]; done {
		return nil
	}
	if len(m.versionsWarned) >= 64 { // bounded; a new mix after 64 warns again
		clear(m.versionsWarned)
	}
	m.versionsWarned[key] = struct{}{}
	return func() {
		m.log.Warn("cluster members run different nsmd versions (fine during a rolling upgrade; finish it)",
			"versions", vs, "members", by)
	}
}
