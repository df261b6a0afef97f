package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/internal/testutil"
)

// gossipSpec is everything needed to (re)start one gossiping node.
type gossipSpec struct {
	id, dir, raftAddr, nsmAddr string
	port                       int
	join                       []string
	expect                     int
	key                        []byte
	clusterID, version         string        // "" takes the defaults
	log                        *slog.Logger  // nil: gossipTestLogger()
	tune                       func(*Config) // nil: none
}

func newGossipSpec(t testing.TB, id string, expect int, join ...string) *gossipSpec {
	t.Helper()
	return &gossipSpec{
		id: id, dir: filepath.Join(t.TempDir(), id), raftAddr: testutil.FreeAddr(t, "127.0.0.1"), nsmAddr: testutil.FreeAddr(t, "127.0.0.1"),
		port: testutil.FreePort(t), join: join, expect: expect,
	}
}

func (s *gossipSpec) gossipAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// gossipTestLogger logs to stderr when NSMD_TEST_LOG is set.
func gossipTestLogger() *slog.Logger {
	if os.Getenv("NSMD_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func startGossipNode(t testing.TB, s *gossipSpec) *Node {
	t.Helper()
	lg := s.log
	if lg == nil {
		lg = gossipTestLogger()
	}
	cfg := testDefaults(Config{
		NodeID: s.id, DataDir: s.dir, RaftBind: s.raftAddr, NSMAddr: s.nsmAddr, Version: s.version,
		Gossip: GossipConfig{
			Bind: "127.0.0.1", Port: s.port, Join: s.join, BootstrapExpect: s.expect, Key: s.key,
			ReconcileEvery: 250 * time.Millisecond, ClusterID: s.clusterID,
		},
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond,
		Logger:             lg,
		Registerer:         prometheus.NewRegistry(),
	})
	if s.tune != nil {
		s.tune(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatalf("start %s: %v", s.id, err)
	}
	n.Start()
	t.Cleanup(func() { n.Close() })
	return n
}

// raftVoters is a node's raft configuration as "id=addr" for voters, sorted.
func raftVoters(n *Node) []string {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var out []string
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, string(s.ID)+"="+string(s.Address))
		}
	}
	slices.Sort(out)
	return out
}

func wantVoters(specs ...*gossipSpec) []string {
	var out []string
	for _, s := range specs {
		out = append(out, s.id+"="+s.raftAddr)
	}
	slices.Sort(out)
	return out
}

// gossipLeader is the only node that leads, or nil.
func gossipLeader(nodes ...*Node) *Node {
	var l *Node
	for _, n := range nodes {
		if n.raft.State() == raft.Leader {
			if l != nil {
				return nil
			}
			l = n
		}
	}
	return l
}

// membersAgree: every node's members() lists exactly want, alive voters,
// with one leader that is the same on every node.
func membersAgree(want []*gossipSpec, nodes ...*Node) bool {
	leader := ""
	for _, n := range nodes {
		ms := n.Members()
		if len(ms) != len(want) {
			return false
		}
		leaders := 0
		for i, m := range ms {
			s := want[i]
			if m.ID != s.id || m.State != stateAlive || m.Suffrage != "Voter" || m.RaftAddr != s.raftAddr ||
				m.NSMAddr != s.nsmAddr || m.GossipAddr != s.gossipAddr() || m.Version != DefaultVersion {
				return false
			}
			if m.Leader {
				leaders++
				if leader != "" && leader != m.ID {
					return false
				}
				leader = m.ID
			}
		}
		if leaders != 1 {
			return false
		}
	}
	return true
}

func sortedSpecs(specs ...*gossipSpec) []*gossipSpec {
	out := slices.Clone(specs)
	slices.SortFunc(out, func(a, b *gossipSpec) int { return strings.Compare(a.id, b.id) })
	return out
}

// formGossipCluster starts specs (in the given order, each joining the
// first) with BootstrapExpect len(specs) and waits for one cluster.
func formGossipCluster(t testing.TB, ids ...string) ([]*gossipSpec, []*Node) {
	t.Helper()
	return formGossipClusterTuned(t, nil, ids...)
}

// formGossipClusterTuned is formGossipCluster with tune(id, cfg) applied
// to each node's configuration (tune may be nil).
func formGossipClusterTuned(t testing.TB, tune func(id string, cfg *Config), ids ...string) ([]*gossipSpec, []*Node) {
	t.Helper()
	var specs []*gossipSpec
	var nodes []*Node
	for i, id := range ids {
		var join []string
		if i > 0 {
			join = []string{specs[0].gossipAddr()}
		}
		s := newGossipSpec(t, id, len(ids), join...)
		if tune != nil {
			s.tune = func(cfg *Config) { tune(id, cfg) }
		}
		specs = append(specs, s)
		nodes = append(nodes, startGossipNode(t, s))
	}
	want := wantVoters(specs...)
	testutil.WaitFor(t, 10*time.Second, "one cluster with every node a voter", func() bool {
		if gossipLeader(nodes...) == nil {
			return false
		}
		for _, n := range nodes {
			if !slices.Equal(raftVoters(n), want) {
				return false
			}
		}
		return membersAgree(sortedSpecs(specs...), nodes...)
	})
	return specs, nodes
}

// TestGossipBootstrapExpectFormsOneCluster: three fresh nodes started in a
// shuffled order with --bootstrap-expect 3 form one cluster of three
// voters with one leader, and every node's members() shows all three alive.
func TestGossipBootstrapExpectFormsOneCluster(t *testing.T) {
	t.Parallel()
	specs, nodes := formGossipCluster(t, "n3", "n1", "n2")
	l := gossipLeader(nodes...)
	var ls *gossipSpec
	for i, n := range nodes {
		if n == l {
			ls = specs[i]
		}
	}
	for _, n := range nodes {
		if addr, ok := n.member.nsmAddr(l.ID()); !ok || addr != ls.nsmAddr {
			t.Errorf("%s: nsmAddr(%s) = %q %v, want %q", n.ID(), l.ID(), addr, ok, ls.nsmAddr)
		}
		if got := testutil.MetricValue(t, n.member.membersGauge.WithLabelValues(stateAlive)); got != 3 {
			t.Errorf("%s: nsmd_members{state=alive} = %v, want 3", n.ID(), got)
		}
	}
	if got := testutil.MetricValue(t, l.member.changes.WithLabelValues("add_voter")); got != 0 {
		t.Errorf("leader made %v add_voter changes; bootstrap-expect should have formed the whole cluster", got)
	}
}

// TestGossipLateJoinerBecomesVoter: a fourth fresh node (bootstrap-expect 3)
// joining a formed cluster does not bootstrap a cluster of its own: the
// leader adds it as a voter.
func TestGossipLateJoinerBecomesVoter(t *testing.T) {
	t.Parallel()
	specs, nodes := formGossipCluster(t, "n2", "n3", "n1")
	s4 := newGossipSpec(t, "n4", 3, specs[1].gossipAddr())
	n4 := startGossipNode(t, s4)
	all := append(slices.Clone(nodes), n4)
	want := wantVoters(append(slices.Clone(specs), s4)...)
	testutil.WaitFor(t, 10*time.Second, "n4 a voter on every node", func() bool {
		for _, n := range all {
			if !slices.Equal(raftVoters(n), want) {
				return false
			}
		}
		return membersAgree(sortedSpecs(append(slices.Clone(specs), s4)...), all...)
	})
	l := gossipLeader(all...)
	if l == nil || l == n4 {
		t.Fatalf("leader %v: want one of the original nodes", l)
	}
	testutil.WaitFor(t, 5*time.Second, "add_voter counted", func() bool {
		return testutil.MetricValue(t, l.member.changes.WithLabelValues("add_voter")) >= 1
	})
}

// TestGossipGracefulLeaveRemovesServer: a follower that leaves on purpose
// is removed from the raft configuration; then the leader leaves too
// (leadership is handed over first) and is removed by the new leader.
func TestGossipGracefulLeaveRemovesServer(t *testing.T) {
	t.Parallel()
	// The last of two voters removes the leaving leader only once gossip
	// reports it left, which is when the leaver stops raft: the removal
	// must be appended within the survivor's lease, which then lacks the
	// leaver's acknowledgements. A 150 ms lease missed that on a loaded
	// machine (and a survivor without quorum cannot elect itself).
	slow := func(_ string, cfg *Config) {
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
	}
	specs, nodes := formGossipClusterTuned(t, slow, "n1", "n2", "n3")
	l := gossipLeader(nodes...)
	var rest []*Node
	var restSpecs []*gossipSpec
	fi := -1
	for i, n := range nodes {
		if n != l && fi < 0 {
			fi = i
			continue
		}
		rest, restSpecs = append(rest, n), append(restSpecs, specs[i])
	}
	f := nodes[fi]
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, f.ID()+" removed from the raft configuration", func() bool {
		return slices.Equal(raftVoters(l), wantVoters(restSpecs...))
	})
	testutil.WaitFor(t, 5*time.Second, f.ID()+" shown as left", func() bool {
		for _, m := range l.Members() {
			if m.ID == f.ID() {
				return m.State == stateLeft && m.Suffrage == ""
			}
		}
		return false
	})
	// The configuration changes when the leader appends the entry; the
	// metric when the change has committed, on whichever node led then
	// (leadership may move on a loaded machine): once in all.
	testutil.WaitForSeen(t, 5*time.Second, "remove_server counted once", func() (bool, string) {
		sum := 0.0
		for _, n := range rest {
			sum += testutil.MetricValue(t, n.member.changes.WithLabelValues("remove_server"))
		}
		return sum == 1, fmt.Sprint(sum)
	})

	// Now the leader leaves: it hands leadership over, and the new leader
	// removes it.
	var last *Node
	var lastSpec *gossipSpec
	for i, n := range rest {
		if n != l {
			last, lastSpec = n, restSpecs[i]
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the last node leading alone", func() bool {
		return last.IsLeader() && slices.Equal(raftVoters(last), wantVoters(lastSpec))
	})
}

// TestGossipFailedNodeStaysVoter: a node that dies without leaving is
// marked dead but stays a voter (only a leave removes a server).
func TestGossipFailedNodeStaysVoter(t *testing.T) {
	t.Parallel()
	specs, nodes := formGossipCluster(t, "n1", "n2", "n3")
	l := gossipLeader(nodes...)
	var victim *Node
	for _, n := range nodes {
		if n != l {
			victim = n
			break
		}
	}
	// Crash: no leave, raft and its transport gone.
	victim.member.shutdown()
	victim.raft.Shutdown().Error()
	if c, ok := victim.trans.(io.Closer); ok {
		c.Close()
	}
	testutil.WaitFor(t, 10*time.Second, victim.ID()+" marked dead by the leader", func() bool {
		for _, m := range l.Members() {
			if m.ID == victim.ID() {
				return m.State == stateDead
			}
		}
		return false
	})
	// Leadership may move between the survivors on a loaded machine (a
	// lapsed lease): whoever leads reconciles, so count the passes and
	// changes of both.
	var survivors []*Node
	for _, n := range nodes {
		if n != victim {
			survivors = append(survivors, n)
		}
	}
	reconciles := func() (sum uint64) {
		for _, n := range survivors {
			sum += n.member.reconciles.Load()
		}
		return sum
	}
	before := reconciles()
	testutil.WaitFor(t, 5*time.Second, "two more reconcile passes", func() bool { return reconciles() >= before+2 })
	if got, want := raftVoters(l), wantVoters(specs...); !slices.Equal(got, want) {
		t.Errorf("voters after a failure %v, want unchanged %v", got, want)
	}
	if got := testutil.MetricValue(t, l.member.membersGauge.WithLabelValues(stateDead)); got != 1 {
		t.Errorf("nsmd_members{state=dead} = %v, want 1", got)
	}
	for _, n := range survivors {
		if got := testutil.MetricValue(t, n.member.changes.WithLabelValues("remove_server")); got != 0 {
			t.Errorf("%s: remove_server changes %v, want 0", n.ID(), got)
		}
	}
}

// TestGossipWipedRestartRejoins: a voter leaves, loses its data and comes
// back with the same id and address and no bootstrap: the leader adds it
// again and it catches up with the log.
func TestGossipWipedRestartRejoins(t *testing.T) {
	t.Parallel()
	specs, nodes := formGossipCluster(t, "n1", "n2", "n3")
	l := gossipLeader(nodes...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 10 {
		if _, err := l.Registry().Monitor(ctx, reg(i)); err != nil {
			t.Fatalf("Monitor %d: %v", i, err)
		}
	}
	var vs *gossipSpec
	var victim *Node
	for i, n := range nodes {
		if n != l {
			vs, victim = specs[i], n
			break
		}
	}
	if err := victim.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, vs.id+" removed", func() bool { return len(raftVoters(l)) == 2 })
	if err := os.RemoveAll(vs.dir); err != nil {
		t.Fatal(err)
	}
	re := *vs
	re.expect, re.join = 0, []string{l.member.list.LocalNode().Address()}
	n := startGossipNode(t, &re)
	testutil.WaitFor(t, 10*time.Second, vs.id+" a voter again", func() bool {
		return slices.Equal(raftVoters(l), wantVoters(specs...))
	})
	if _, err := l.Registry().Monitor(ctx, reg(10)); err != nil {
		t.Fatal(err)
	}
	want := l.fsm.AppliedIndex()
	testutil.WaitFor(t, 10*time.Second, "the wiped node catching up", func() bool {
		return n.fsm.AppliedIndex() >= want
	})
	if got := n.fsm.Len(); got != 11 {
		t.Errorf("wiped node has %d registrations, want 11", got)
	}
	if n.fsm.Digest() != l.fsm.Digest() && n.fsm.AppliedIndex() == l.fsm.AppliedIndex() {
		t.Error("FSM digests differ at the same applied index")
	}
}

// TestGossipWipedRestartAtNewAddressReplacesVoter: a voter crashes (no
// leave), and a replacement with the same id but a new raft address and
// no data joins: the leader updates the voter's address.
func TestGossipWipedRestartAtNewAddressReplacesVoter(t *testing.T) {
	t.Parallel()
	specs, nodes := formGossipCluster(t, "n1", "n2", "n3")
	l := gossipLeader(nodes...)
	i := slices.IndexFunc(nodes, func(n *Node) bool { return n != l })
	victim, vs := nodes[i], specs[i]
	victim.member.shutdown()
	victim.raft.Shutdown().Error()
	if c, ok := victim.trans.(io.Closer); ok {
		c.Close()
	}
	testutil.WaitFor(t, 10*time.Second, vs.id+" marked dead", func() bool {
		for _, m := range l.Members() {
			if m.ID == vs.id {
				return m.State == stateDead
			}
		}
		return false
	})
	re := newGossipSpec(t, vs.id, 3, specs[slices.Index(nodes, l)].gossipAddr())
	re.port = vs.port // same gossip address: memberlist lets it refute its death
	n := startGossipNode(t, re)
	specs[i] = re
	testutil.WaitFor(t, 10*time.Second, "the voter's raft address replaced", func() bool {
		return slices.Equal(raftVoters(l), wantVoters(specs...))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := l.Registry().Monitor(ctx, reg(1)); err != nil {
		t.Fatal(err)
	}
	want := l.fsm.AppliedIndex()
	testutil.WaitFor(t, 10*time.Second, "the replacement catching up", func() bool {
		return n.fsm.AppliedIndex() >= want
	})
}

// TestGossipEncryptionRefusesPlaintextAndOtherKeys: nodes of a keyed
// cluster refuse a node without the key, or with another key.
func TestGossipEncryptionRefusesPlaintextAndOtherKeys(t *testing.T) {
	t.Parallel()
	key := bytes.Repeat([]byte{0x5a}, 32)
	s1 := newGossipSpec(t, "k1", 2)
	s1.key = key
	k1 := startGossipNode(t, s1)
	s2 := newGossipSpec(t, "k2", 2, s1.gossipAddr())
	s2.key = key
	k2 := startGossipNode(t, s2)
	testutil.WaitFor(t, 10*time.Second, "the keyed cluster", func() bool {
		return gossipLeader(k1, k2) != nil && membersAgree(sortedSpecs(s1, s2), k1, k2)
	})

	for name, k := range map[string][]byte{"no key": nil, "other key": bytes.Repeat([]byte{0xa5}, 16)} {
		s := newGossipSpec(t, "x-"+fmt.Sprint(len(k)), 0)
		s.key = k
		x := startGossipNode(t, s)
		if n, err := x.member.list.Join([]string{s1.gossipAddr()}); err == nil || n != 0 {
			t.Errorf("%s: joined a keyed cluster (contacted %d, err %v)", name, n, err)
		}
		if got := len(x.member.list.Members()); got != 1 {
			t.Errorf("%s: outsider sees %d members, want only itself", name, got)
		}
		for _, k := range []*Node{k1, k2} {
			if got := len(k.Members()); got != 2 {
				t.Errorf("%s: %s lists %d members, want 2", name, k.ID(), got)
			}
		}
	}
}

func TestParseMemberlistLine(t *testing.T) {
	for _, c := range []struct {
		in   string
		lv   slog.Level
		want string
	}{
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:1\n", slog.LevelDebug, "Stream connection from=127.0.0.1:1"},
		{"[WARN] memberlist: Refuting a dead message (from: a)", slog.LevelWarn, "Refuting a dead message (from: a)"},
		{"[ERR] memberlist: Failed fallback ping: EOF", slog.LevelError, "Failed fallback ping: EOF"},
		{"[INFO] memberlist: Suspect n2 has failed", slog.LevelInfo, "Suspect n2 has failed"},
		{"no level at all", slog.LevelInfo, "no level at all"},
	} {
		lv, msg := parseMemberlistLine(c.in)
		if lv != c.lv || msg != c.want {
			t.Errorf("parse(%q) = %v %q, want %v %q", c.in, lv, msg, c.lv, c.want)
		}
	}
}

func TestGossipMetaRoundTrip(t *testing.T) {
	md := nodeMeta{V: metaVersion, ID: "n1", Raft: "10.0.0.1:7300", NSM: "10.0.0.1:6620", Version: DefaultVersion, Cluster: "c1", HasState: true}
	b, err := json.Marshal(md)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeMeta(b)
	if err != nil || got != md {
		t.Fatalf("round trip %s: %+v %v", b, got, err)
	}
	if _, err := decodeMeta([]byte(`{"v":1,"id":"n1"}`)); err == nil {
		t.Error("metadata without a raft address accepted")
	}
	if _, err := decodeMeta([]byte("\x00garbage")); err == nil {
		t.Error("garbage metadata accepted")
	}
}
