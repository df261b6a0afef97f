package cluster

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// recLog is a slog.Handler that keeps the records (attributes added with
// With are dropped; tests give each node its own).
type recLog struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *recLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *recLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *recLog) WithGroup(string) slog.Handler            { return l }
func (l *recLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

// find returns the attributes of the records at level lv whose message
// contains msg.
func (l *recLog) find(lv slog.Level, msg string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.recs {
		if r.Level != lv || !strings.Contains(r.Message, msg) {
			continue
		}
		a := map[string]string{"msg": r.Message}
		r.Attrs(func(at slog.Attr) bool { a[at.Key] = at.Value.String(); return true })
		out = append(out, a)
	}
	return out
}

// twoClusters starts two 3-node clusters on loopback, a1-a3 and b1-b3, every
// node given both clusters' first nodes as gossip seeds (a1's only seed is
// b1 and b1's is a1: they keep trying the other cluster). tune sets each
// spec's cluster id and gossip key.
func twoClusters(t *testing.T, tune func(s *gossipSpec, cluster string)) (specs map[string][]*gossipSpec, nodes map[string][]*Node) {
	t.Helper()
	specs, nodes = map[string][]*gossipSpec{}, map[string][]*Node{}
	// Each spec is made just before its node starts: a port found free is
	// bound at once, before some outgoing connection takes it.
	for _, c := range []string{"a", "b"} {
		s := newGossipSpec(t, c+"1", 3)
		tune(s, c)
		specs[c] = []*gossipSpec{s}
	}
	seeds := []string{specs["a"][0].gossipAddr(), specs["b"][0].gossipAddr()}
	// Interleave the starts so both clusters form at the same time.
	for i := 1; i <= 3; i++ {
		for _, c := range []string{"a", "b"} {
			if i > 1 {
				s := newGossipSpec(t, fmt.Sprintf("%s%d", c, i), 3)
				tune(s, c)
				specs[c] = append(specs[c], s)
			}
			s := specs[c][i-1]
			s.join = seeds // the node's own address is dropped by newMembership
			nodes[c] = append(nodes[c], startGossipNode(t, s))
		}
	}
	return specs, nodes
}

// assertApart waits for each cluster to have exactly its own three members
// and voters and one leader, and returns the leaders.
func assertApart(t *testing.T, specs map[string][]*gossipSpec, nodes map[string][]*Node) map[string]*Node {
	t.Helper()
	leaders := map[string]*Node{}
	for _, c := range []string{"a", "b"} {
		want := wantVoters(specs[c]...)
		testutil.WaitFor(t, 15*time.Second, "cluster "+c+": its own 3 voters, members and one leader", func() bool {
			l := gossipLeader(nodes[c]...)
			if l == nil {
				return false
			}
			for _, n := range nodes[c] {
				if !slices.Equal(raftVoters(n), want) {
					return false
				}
			}
			leaders[c] = l
			return membersAgree(sortedSpecs(specs[c]...), nodes[c]...)
		})
	}
	return leaders
}

func refusedOn(nodes []*Node, reason string) float64 {
	var sum float64
	for _, n := range nodes {
		sum += n.member.refusals.count(reason)
	}
	return sum
}

// registeredNames lists the mon_names n's FSM holds.
func registeredNames(n *Node) []string {
	var out []string
	for _, r := range n.fsm.Registrations(fsm.MonID{}, 100, "") {
		out = append(out, r.ID.MonName)
	}
	return out
}

// checkClustersStayApart is the two-cluster scenario: the refusals are
// counted (under reason) on both sides, the clusters stay apart while the
// seeds keep trying the other cluster, and a write in one never reaches
// the other.
func checkClustersStayApart(t *testing.T, reason string, tune func(s *gossipSpec, cluster string)) {
	specs, nodes := twoClusters(t, tune)
	leaders := assertApart(t, specs, nodes)
	for _, c := range []string{"a", "b"} {
		testutil.WaitFor(t, 10*time.Second, "cluster "+c+" counting "+reason+" refusals", func() bool {
			return refusedOn(nodes[c], reason) > 0
		})
	}
	// a1 and b1 keep retrying each other (join backoff up to 5 s): wait
	// for more refusals, then check again that nothing merged.
	before := refusedOn(nodes["a"], reason) + refusedOn(nodes["b"], reason)
	testutil.WaitFor(t, 15*time.Second, "further refused join attempts", func() bool {
		return refusedOn(nodes["a"], reason)+refusedOn(nodes["b"], reason) > before
	})
	leaders = assertApart(t, specs, nodes)
	for _, c := range []string{"a", "b"} {
		for _, n := range nodes[c] {
			if got := len(n.member.list.Members()); got != 3 {
				t.Errorf("%s: memberlist has %d members, want 3", n.ID(), got)
			}
		}
	}

	// One write in each cluster: each lands in its own cluster only.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	want := map[string][]string{}
	for i, c := range []string{"a", "b"} {
		r := reg(i + 1)
		if _, err := leaders[c].Registry().Monitor(ctx, r); err != nil {
			t.Fatalf("cluster %s: Monitor: %v", c, err)
		}
		want[c] = []string{r.ID.MonName}
	}
	for _, c := range []string{"a", "b"} {
		idx := leaders[c].fsm.AppliedIndex()
		for _, n := range nodes[c] {
			testutil.WaitFor(t, 10*time.Second, n.ID()+" applying its cluster's write", func() bool {
				return n.fsm.AppliedIndex() >= idx
			})
			if got := registeredNames(n); !slices.Equal(got, want[c]) {
				t.Errorf("%s holds %v, want only its own cluster's %v", n.ID(), got, want[c])
			}
		}
	}
	if refusedOn(append(slices.Clone(nodes["a"]), nodes["b"]...), RefusedMetadata) != 0 {
		t.Error("metadata refusals counted; want none between two nsmd clusters")
	}
}

// TestClustersWithOtherIDsOnOneNetworkStayApart: two 3-node clusters with
// cluster ids alpha and beta (no gossip key) whose seeds point at each
// other: each keeps exactly its own members and raft voters with one
// leader, refusals are counted as cluster_id, and a write in one never
// appears in the other.
func TestClustersWithOtherIDsOnOneNetworkStayApart(t *testing.T) {
	t.Parallel()
	checkClustersStayApart(t, RefusedClusterID, func(s *gossipSpec, c string) {
		s.clusterID = map[string]string{"a": "alpha", "b": "beta"}[c]
	})
}

// TestClustersWithOtherGossipKeysOnOneNetworkStayApart: the same with one
// cluster id (the default) and two gossip keys: memberlist cannot decrypt
// the other cluster's join, and the refusals count as gossip_key.
func TestClustersWithOtherGossipKeysOnOneNetworkStayApart(t *testing.T) {
	t.Parallel()
	checkClustersStayApart(t, RefusedGossipKey, func(s *gossipSpec, c string) {
		s.key = bytes.Repeat([]byte{map[string]byte{"a": 0x11, "b": 0x22}[c]}, 32)
	})
}

// TestForeignMemberIsNeverAPeer: the checks behind memberlist's delegates
// (admit) and behind them (updatePeer) refuse a member of another cluster
// and one without nsmd metadata, and a member with no cluster id in its
// metadata (nsmd before cluster ids) counts as the default cluster.
func TestForeignMemberIsNeverAPeer(t *testing.T) {
	t.Parallel()
	s := newGossipSpec(t, "solo", 0)
	n := startGossipNode(t, s)
	m := n.member
	node := func(name, meta string) *memberlist.Node {
		return &memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 9), Port: 1, Meta: []byte(meta)}
	}
	cases := []struct {
		name, meta string
		reason     string // "" admitted
	}{
		{"x1", `{"v":1,"id":"x1","raft":"127.0.0.9:1","cid":"other"}`, RefusedClusterID},
		{"x2", `not json`, RefusedMetadata},
		{"x3", `{"v":1,"id":"x3","raft":"127.0.0.9:3"}`, ""},
		{"x4", `{"v":1,"id":"x4","raft":"127.0.0.9:4","cid":"nsmd"}`, ""},
	}
	for _, c := range cases {
		before := m.refusals.count(RefusedClusterID) + m.refusals.count(RefusedMetadata)
		err := (*mlAdmit)(m).NotifyAlive(node(c.name, c.meta))
		if (err != nil) != (c.reason != "") {
			t.Errorf("%s: NotifyAlive = %v, want refused=%v", c.name, err, c.reason != "")
		}
		if c.reason != "" {
			if got := m.refusals.count(c.reason) + m.refusals.count(otherReason(c.reason)); got != before+1 {
				t.Errorf("%s: refusals %v, want %v", c.name, got, before+1)
			}
			if !strings.Contains(err.Error(), refusalMarker) {
				t.Errorf("%s: error %q lacks the marker that demotes memberlist's own line", c.name, err)
			}
		}
	}
	// A join push-pull with one foreign member in it is refused whole.
	if err := (*mlAdmit)(m).NotifyMerge([]*memberlist.Node{node("x3", cases[2].meta), node("x1", cases[0].meta)}); err == nil {
		t.Error("NotifyMerge accepted a merge holding a member of another cluster")
	}
	// Behind the delegates: updatePeer never records a foreign member, so
	// bootstrap and reconcile never see it.
	m.updatePeer(node("x1", cases[0].meta), stateAlive)
	m.mu.Lock()
	_, there := m.peers["x1"]
	m.mu.Unlock()
	if there {
		t.Error("a member of another cluster became a peer (bootstrap/reconcile would see it)")
	}
	if got := len(n.Members()); got != 1 {
		t.Errorf("members %d, want 1 (itself)", got)
	}
}

func otherReason(r string) string {
	if r == RefusedClusterID {
		return RefusedMetadata
	}
	return RefusedClusterID
}

// TestJoinRefusalsLogOncePerPeerPerMinute: every refusal is counted; the
// log gets one line per reason and peer per minute, then one saying how
// many were suppressed.
func TestJoinRefusalsLogOncePerPeerPerMinute(t *testing.T) {
	var rec recLog
	now := time.Unix(1700000000, 0)
	r := newJoinRefusals(slog.New(&rec), func() time.Time { return now })
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.counter)
	for range 3 {
		r.observe(RefusedGossipKey, "10.0.0.1", "refused")
	}
	r.observe(RefusedGossipKey, "10.0.0.2", "refused")
	r.observe(RefusedClusterID, "10.0.0.1", "refused")
	if got := len(rec.find(slog.LevelWarn, "refused")); got != 3 {
		t.Fatalf("%d lines, want 3 (10.0.0.1 key, 10.0.0.2 key, 10.0.0.1 cluster id)", got)
	}
	now = now.Add(59 * time.Second)
	r.observe(RefusedGossipKey, "10.0.0.1", "refused")
	if got := len(rec.find(slog.LevelWarn, "refused")); got != 3 {
		t.Fatalf("%d lines after 59 s, want still 3", got)
	}
	now = now.Add(2 * time.Second)
	r.observe(RefusedGossipKey, "10.0.0.1", "refused")
	lines := rec.find(slog.LevelWarn, "refused")
	if len(lines) != 4 || lines[3]["suppressed_since_last"] != "3" || lines[3]["reason"] != RefusedGossipKey {
		t.Fatalf("after a minute: %v, want a 4th line with suppressed_since_last=3", lines)
	}
	if got, want := r.count(RefusedGossipKey), 6.0; got != want {
		t.Errorf("gossip_key count %v, want %v", got, want)
	}
	if got := r.count(RefusedClusterID); got != 1 {
		t.Errorf("cluster_id count %v, want 1", got)
	}
}

// TestGossipKeyFailureLines: memberlist v0.5.4's messages for gossip it
// cannot decrypt (as memberlistLogWriter hands them on) are recognised and
// name the peer; others are not.
func TestGossipKeyFailureLines(t *testing.T) {
	for _, c := range []struct {
		msg, peer string
		ok        bool
	}{
		{"failed to receive: no installed keys could decrypt the message from=127.0.0.1:40122", "127.0.0.1:40122", true},
		{"Decrypt packet failed: no installed keys could decrypt the message from=127.0.0.1:7946", "127.0.0.1:7946", true},
		{"failed to join 127.0.0.1:7946: no installed keys could decrypt the message", "127.0.0.1:7946", true},
		{"failed to receive: encryption is configured but remote state is not encrypted from=[::1]:5", "[::1]:5", true},
		{"failed to receive: remote state is encrypted and encryption is not configured from=127.0.0.2:9", "127.0.0.2:9", true},
		{"Failed push/pull merge: nsmd refused member x: cluster_id from=127.0.0.1:1", "", false},
		{"Stream connection from=127.0.0.1:1", "", false},
	} {
		peer, ok := gossipKeyFailure(c.msg)
		if ok != c.ok || peer != c.peer {
			t.Errorf("gossipKeyFailure(%q) = %q %v, want %q %v", c.msg, peer, ok, c.peer, c.ok)
		}
	}
	if got := peerIP("[::1]:5"); got != "::1" {
		t.Errorf("peerIP = %q", got)
	}
}

// TestMixedVersionsWarnOncePerSet: members of one cluster running two
// versions are logged once (not per gossip message); a third version is a
// new set and logged once more; members show each one's version.
func TestMixedVersionsWarnOncePerSet(t *testing.T) {
	t.Parallel()
	var rec recLog
	s1 := newGossipSpec(t, "v1", 2)
	s1.version, s1.log = "1.0.0", slog.New(&rec)
	n1 := startGossipNode(t, s1)
	s2 := newGossipSpec(t, "v2", 2, s1.gossipAddr())
	s2.version = "1.1.0"
	n2 := startGossipNode(t, s2)
	versionsShown := func(want map[string]string, nodes ...*Node) bool {
		for _, n := range nodes {
			got := map[string]string{}
			for _, m := range n.Members() {
				if m.State == stateAlive {
					got[m.ID] = m.Version
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return false
			}
		}
		return true
	}
	testutil.WaitFor(t, 10*time.Second, "both members with their versions and a leader", func() bool {
		return gossipLeader(n1, n2) != nil && versionsShown(map[string]string{"v1": "1.0.0", "v2": "1.1.0"}, n1, n2)
	})
	// The mixed set is seen again at every member event (joins, metadata
	// updates such as raft state): wait for v2's update after bootstrap.
	testutil.WaitFor(t, 10*time.Second, "v1 seeing v2's metadata update", func() bool {
		n1.member.mu.Lock()
		defer n1.member.mu.Unlock()
		p := n1.member.peers["v2"]
		return p != nil && p.meta.HasState && n1.member.events.Load() >= 3
	})
	warns := rec.find(slog.LevelWarn, "different nsmd versions")
	if len(warns) != 1 || warns[0]["versions"] != "[1.0.0 1.1.0]" {
		t.Fatalf("version warnings %v, want exactly one for [1.0.0 1.1.0]", warns)
	}

	s3 := newGossipSpec(t, "v3", 2, s1.gossipAddr())
	s3.version = "2.0.0"
	n3 := startGossipNode(t, s3)
	testutil.WaitFor(t, 10*time.Second, "the third member with its version", func() bool {
		return versionsShown(map[string]string{"v1": "1.0.0", "v2": "1.1.0", "v3": "2.0.0"}, n1, n2, n3)
	})
	testutil.WaitFor(t, 5*time.Second, "a warning for the new set", func() bool {
		return len(rec.find(slog.LevelWarn, "different nsmd versions")) == 2
	})
	testutil.WaitFor(t, 10*time.Second, "v1 seeing v3 join raft", func() bool {
		n1.member.mu.Lock()
		defer n1.member.mu.Unlock()
		p := n1.member.peers["v3"]
		return p != nil && p.meta.HasState
	})
	if warns := rec.find(slog.LevelWarn, "different nsmd versions"); len(warns) != 2 || warns[1]["versions"] != "[1.0.0 1.1.0 2.0.0]" {
		t.Fatalf("version warnings %v, want two: the second for [1.0.0 1.1.0 2.0.0]", warns)
	}
}
