package agent

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cluster"
)

func TestBuildInfoForms(t *testing.T) {
	for _, c := range []struct {
		b            admin.BuildInfo
		str, gossip  string
		revisionSeen string
	}{
		{admin.BuildInfo{Version: "v1.2.0", GoVersion: "go1.26.8"}, "nsmd v1.2.0 go1.26.8", "v1.2.0", ""},
		{admin.BuildInfo{Version: "(devel)", Revision: "0123456789abcdef0123", Modified: true, GoVersion: "go1.26.8"},
			"nsmd (devel) (revision 0123456789abcdef0123, modified) go1.26.8", "(devel)+0123456789ab+modified", "0123456789abcdef0123+modified"},
		{admin.BuildInfo{Version: "0123456-dirty", Revision: "0123456789abcdef0123", Modified: true, GoVersion: "go1.26.8"},
			"nsmd 0123456-dirty (revision 0123456789abcdef0123, modified) go1.26.8", "0123456-dirty", "0123456789abcdef0123+modified"},
		{admin.BuildInfo{Version: "v0.0.0-20250101000000-0123456789ab", Revision: "0123456789abcdef", GoVersion: "go1.26.8"},
			"nsmd v0.0.0-20250101000000-0123456789ab (revision 0123456789abcdef) go1.26.8", "v0.0.0-20250101000000-0123456789ab", "0123456789abcdef"},
	} {
		if got := c.b.String(); got != c.str {
			t.Errorf("String() = %q, want %q", got, c.str)
		}
		if got := c.b.Gossip(); got != c.gossip {
			t.Errorf("Gossip() = %q, want %q", got, c.gossip)
		}
		if got := revisionLabel(c.b); got != c.revisionSeen {
			t.Errorf("revision label = %q, want %q", got, c.revisionSeen)
		}
	}
}

// TestAdminTypesAreTheClusterTypesJSON: the admin API's members, takeover
// timeline and disk status, converted from the cluster's, marshal to the
// same JSON the cluster's types always gave (names, omitempty).
func TestAdminTypesAreTheClusterTypesJSON(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, c := range []struct {
		name       string
		cl, viaAPI any
	}{
		{"member", cluster.MemberStatus{ID: "n1", GossipAddr: "a:1", RaftAddr: "a:2", NSMAddr: "a:3", Version: "v", State: "alive", Suffrage: "Voter", Leader: true, Role: "leader"},
			admin.Member(cluster.MemberStatus{ID: "n1", GossipAddr: "a:1", RaftAddr: "a:2", NSMAddr: "a:3", Version: "v", State: "alive", Suffrage: "Voter", Leader: true, Role: "leader"})},
		{"witness member", cluster.MemberStatus{ID: "w", Witness: true, Role: "witness"}, admin.Member(cluster.MemberStatus{ID: "w", Witness: true, Role: "witness"})},
		{"timeline", cluster.Timeline{Elected: at, Committed: at, VIP: at, OnLeaderDone: at, State: 5}, admin.Timeline(cluster.Timeline{Elected: at, Committed: at, VIP: at, OnLeaderDone: at, State: 5})},
		{"timeline, every step", fullTimeline(at), admin.Timeline(fullTimeline(at))},
		{"disk", cluster.DiskStatus{Writable: false, Since: at, Error: "EIO", Failures: 2}, admin.Disk(cluster.DiskStatus{Writable: false, Since: at, Error: "EIO", Failures: 2})},
		{"healthy disk", cluster.DiskStatus{Writable: true, Since: at}, admin.Disk(cluster.DiskStatus{Writable: true, Since: at})},
	} {
		want, _ := json.Marshal(c.cl)
		got, _ := json.Marshal(c.viaAPI)
		if string(got) != string(want) {
			t.Errorf("%s: admin JSON %s, cluster JSON %s", c.name, got, want)
		}
	}
}

// fullTimeline has every step of a takeover set, each a millisecond apart.
func fullTimeline(at time.Time) cluster.Timeline {
	step := func(i int) time.Time { return at.Add(time.Duration(i) * time.Millisecond) }
	return cluster.Timeline{PrevLeaderContact: step(0), Elected: step(1), Committed: step(2), VIP: step(3), HookStarted: step(4),
		NFSdGraceStart: step(5), OnLeaderDone: step(6), NotifyStarted: step(7), NotifyDone: step(8), NLMFirstBack: step(9),
		NLMAllBack: step(10), NFSv4FirstBack: step(11), NFSv4AllBack: step(12), NLMGraceEnd: step(13), NFSv4GraceEnd: step(14), State: 7}
}
