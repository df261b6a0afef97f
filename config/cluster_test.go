package config

import (
	"strings"
	"testing"
	"time"
)

// TestClusterConfigOfTheDefaultsIsValid: every value the replication layer
// needs comes from here. The default settings give a cluster.Config that
// cluster.Config.Validate accepts once the agent adds its version — no
// zero the node would have to replace with a default of its own.
func TestClusterConfigOfTheDefaultsIsValid(t *testing.T) {
	for _, profile := range Profiles() {
		t.Run(profile, func(t *testing.T) {
			c := Default()
			c.NodeID, c.RaftProfile = "n1", profile
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			cc := c.ClusterConfig()
			cc.Version = "test"
			if err := cc.Validate(); err != nil {
				t.Fatalf("cluster refuses the defaults' config: %v", err)
			}
			tm := c.Timing()
			if cc.HeartbeatTimeout != tm.HeartbeatTimeout || cc.ElectionTimeout != tm.ElectionTimeout || cc.LeaderLeaseTimeout != tm.LeaderLeaseTimeout {
				t.Errorf("raft timing %v/%v/%v, profile %s has %+v", cc.HeartbeatTimeout, cc.ElectionTimeout, cc.LeaderLeaseTimeout, profile, tm)
			}
			if cc.SnapshotThreshold != 16_384 || cc.TrailingLogs != 10_240 {
				t.Errorf("snapshot every %d, %d trailing: want the keys' 16,384 and 10,240", cc.SnapshotThreshold, cc.TrailingLogs)
			}
			if cc.DiskSlowThreshold != 50*time.Millisecond || cc.GracePeriod != 90*time.Second || cc.HookTimeout != 30*time.Second {
				t.Errorf("disk_slow_threshold %v, grace %v, hook_timeout %v", cc.DiskSlowThreshold, cc.GracePeriod, cc.HookTimeout)
			}
			if cc.RaftBind != "127.0.0.1:7300" || cc.Gossip.Bind != "127.0.0.1" || cc.Gossip.Port != 7946 || cc.Gossip.ClusterID != DefaultClusterID {
				t.Errorf("addresses raft %s gossip %s:%d cluster %q", cc.RaftBind, cc.Gossip.Bind, cc.Gossip.Port, cc.Gossip.ClusterID)
			}
			if !cc.Bootstrap {
				t.Error("a lone node (bootstrap_expect 1, no join) does not bootstrap")
			}
		})
	}
}

// TestClusterConfigDerivesFromTheKeys: the values that depend on other
// settings are derived here, each from the keys it depends on.
func TestClusterConfigDerivesFromTheKeys(t *testing.T) {
	base := func() Config {
		c := Default()
		c.NodeID = "n1"
		return c
	}
	c := base()
	c.DiskSlowThreshold = 0
	if got := c.ClusterConfig().DiskSlowThreshold; got != 0 {
		t.Errorf("disk_slow_threshold 0 (off) became %v", got)
	}

	c = base()
	c.Join = []string{"10.0.0.1:7946"}
	if c.ClusterConfig().Bootstrap {
		t.Error("a node given join bootstraps a cluster of its own")
	}
	c = base()
	c.BootstrapExpect = 3
	if c.ClusterConfig().Bootstrap {
		t.Error("bootstrap_expect 3 bootstraps a one-node cluster")
	}

	c = base()
	if got := c.ClusterConfig().StandDownWait; got != time.Second {
		t.Errorf("stand-down wait without on_follower %v, want 1s", got)
	}
	c.OnLeader, c.OnFollower, c.HookTimeout = "/bin/true", "/bin/true", 20*time.Second
	if got := c.ClusterConfig().StandDownWait; got != 21*time.Second {
		t.Errorf("stand-down wait with on_follower %v, want hook_timeout + 1s", got)
	}
	if got := c.ClusterConfig().FenceTimeout; got != c.FenceTimeout {
		t.Errorf("a serving node's fence timeout %v, want fence_timeout %v", got, c.FenceTimeout)
	}
	c.FenceWatchdog = FenceOff
	if got := c.ClusterConfig().FenceTimeout; got != 0 {
		t.Errorf("fence_watchdog off: fence timeout %v, want none", got)
	}
	c = base()
	if got := c.ClusterConfig().FenceTimeout; got != 0 {
		t.Errorf("a node without on_leader serves nothing, yet waits a fence timeout %v", got)
	}
}

// TestZeroGraceAndTrailingLogsAreRefused: neither has a meaning at 0, and
// the node takes no default for them, so a 0 is an error naming the key.
func TestZeroGraceAndTrailingLogsAreRefused(t *testing.T) {
	for _, key := range []string{"grace_period", "trailing_logs"} {
		c := Default()
		c.NodeID = "n1"
		if err := c.Set(key, "0"); err != nil {
			t.Fatalf("set %s: %v", key, err)
		}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s 0: %v, want an error naming it", key, err)
		}
	}
}
