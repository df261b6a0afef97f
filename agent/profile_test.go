package agent_test

import (
	"sync"
	"testing"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/config"
)

// TestRaftProfileReachesRaft starts a node with each raft_profile and reads
// the timeouts back from its running raft (heartbeat, election) and from
// the cluster config the agent built (the lease, which raft does not
// report), so a profile that stopped reaching raft fails here.
func TestRaftProfileReachesRaft(t *testing.T) {
	for _, profile := range []string{config.ProfileFast, config.ProfileWAN} {
		t.Run(profile, func(t *testing.T) {
			want, _ := config.ProfileTiming(profile)
			o := agenttest.DevOptions(t, "127.0.0.102", 1)
			o.RaftProfile = profile
			var (
				mu  sync.Mutex
				got cluster.Config
			)
			d := agenttest.StartDev(t, o, agent.Options{TuneCluster: func(c *cluster.Config) {
				mu.Lock()
				got = *c
				mu.Unlock()
			}})
			a := d.Agent(0)
			if tm := a.Config().Timing(); tm != want {
				t.Errorf("node timing %+v, want %+v", tm, want)
			}
			rc := a.Node().RaftStatus()
			if rc.HeartbeatTimeout != want.HeartbeatTimeout || rc.ElectionTimeout != want.ElectionTimeout {
				t.Errorf("raft runs with heartbeat %v, election %v; profile %s has %v, %v",
					rc.HeartbeatTimeout, rc.ElectionTimeout, profile, want.HeartbeatTimeout, want.ElectionTimeout)
			}
			mu.Lock()
			defer mu.Unlock()
			if got.LeaderLeaseTimeout != want.LeaderLeaseTimeout || got.HeartbeatTimeout != want.HeartbeatTimeout {
				t.Errorf("cluster config lease %v, heartbeat %v; profile %s has %v, %v",
					got.LeaderLeaseTimeout, got.HeartbeatTimeout, profile, want.LeaderLeaseTimeout, want.HeartbeatTimeout)
			}
		})
	}
}
