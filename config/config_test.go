package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	c.NodeID = "n1"
	if err := c.Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
}

func TestFileThenEnvOverride(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nsmd.yaml")
	yaml := "node_id: from-file\ngrace_period: 30s\njoin: [10.77.0.1:7946, 10.77.0.2:7946]\nnotify_name: file.example\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Default()
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"NSMD_NOTIFY_NAME": "env.example", "NSMD_TRUSTED_CALLERS": "10.77.0.0/16, 10.78.0.0/16"}
	if err := c.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if c.NodeID != "from-file" || c.GracePeriod != 30*time.Second {
		t.Errorf("file values not applied: %+v", c)
	}
	if len(c.Join) != 2 || c.Join[1] != "10.77.0.2:7946" {
		t.Errorf("join list = %q", c.Join)
	}
	if c.NotifyName != "env.example" {
		t.Errorf("env did not override file: notify_name = %q", c.NotifyName)
	}
	if len(c.TrustedPrefixes()) != 2 {
		t.Errorf("trusted = %v", c.TrustedPrefixes())
	}
}

func TestUnknownKeyInFileIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("notfy_name: x\n"), 0o600)
	c := Default()
	if err := c.LoadFile(path); err == nil || !strings.Contains(err.Error(), "notfy_name") {
		t.Fatalf("want error naming the unknown key, got %v", err)
	}
}

func TestValidateNamesEveryBadKey(t *testing.T) {
	c := Default()
	c.NodeID = ""
	c.VIPMode = "loopback"
	c.VIP = "10.0.0.1/24"
	c.Rpcbind = "maybe"
	c.LeaderLeaseTimeout = time.Second
	c.TrustedCallers = []string{"nonsense"}
	err := c.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	for _, key := range []string{"node_id", "vip:", "rpcbind", "leader_lease_timeout", "trusted_callers"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error does not name %s:\n%v", key, err)
		}
	}
}

func TestSetRejectsBadValues(t *testing.T) {
	c := Default()
	for key, val := range map[string]string{"raft_port": "x", "grace_period": "90", "snapshot_threshold": "-1"} {
		if err := c.Set(key, val); err == nil {
			t.Errorf("Set(%s, %q) accepted", key, val)
		}
	}
	if err := c.Set("grace-period", "45s"); err != nil || c.GracePeriod != 45*time.Second {
		t.Errorf("flag spelling not accepted: %v %v", err, c.GracePeriod)
	}
}

func TestFieldNames(t *testing.T) {
	for _, f := range Fields() {
		c := Default()
		v, err := c.Get(f.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(f.Flag(), v); err != nil {
			t.Errorf("%s: round trip of default %q: %v", f.Key, v, err)
		}
		if !strings.HasPrefix(f.Env(), "NSMD_") {
			t.Errorf("env %s", f.Env())
		}
	}
}

// raft_log_store: auto is the default (cluster resolves it per data
// directory); auto, wal and bolt are accepted; anything else is not a
// store.
func TestRaftLogStore(t *testing.T) {
	c := Default()
	if c.RaftLogStore != "auto" {
		t.Fatalf("default raft_log_store %q, want auto", c.RaftLogStore)
	}
	for v, want := range map[string]string{"auto": "", "wal": "", "bolt": "", "leveldb": "not one of auto, wal, bolt", "": "not one of auto, wal, bolt"} {
		c := Default()
		if err := c.Set("raft_log_store", v); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		if want == "" && err != nil {
			t.Errorf("raft_log_store %q: %v", v, err)
		}
		if want != "" && (err == nil || !strings.Contains(err.Error(), "raft_log_store") || !strings.Contains(err.Error(), want)) {
			t.Errorf("raft_log_store %q: %v, want an error naming the key and %q", v, err, want)
		}
	}
}

func TestClusterIDFromFileEnvAndFlagSpelling(t *testing.T) {
	c := Default()
	if c.ClusterID != DefaultClusterID {
		t.Fatalf("default cluster_id %q, want %q", c.ClusterID, DefaultClusterID)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("node_id: n1\ncluster_id: prod-nfs.1\n"), 0o600)
	if err := c.LoadFile(path); err != nil || c.ClusterID != "prod-nfs.1" {
		t.Fatalf("file: %v %q", err, c.ClusterID)
	}
	env := map[string]string{"NSMD_CLUSTER_ID": "from-env"}
	if err := c.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil || c.ClusterID != "from-env" {
		t.Fatalf("env: %v %q", err, c.ClusterID)
	}
	if err := c.Set("cluster-id", "from-flag"); err != nil || c.ClusterID != "from-flag" {
		t.Fatalf("flag: %v %q", err, c.ClusterID)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "has space", "a/b", strings.Repeat("x", 65)} {
		c.ClusterID = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "cluster_id") {
			t.Errorf("cluster_id %q: %v, want an error naming cluster_id", bad, err)
		}
	}
}

// TestWrongTypedValueNamesKeyAndLine: a value of the wrong YAML shape is
// refused with the file, the line and the key.
func TestWrongTypedValueNamesKeyAndLine(t *testing.T) {
	for _, tc := range []struct{ yaml, key, line string }{
		{"node_id: n1\ncluster_id: [a, b]\n", "cluster_id", "line 2"},
		{"node_id: n1\n\ncluster_id:\n  prod: true\n", "cluster_id", "line 3"},
		{"cluster_id: true\n", "cluster_id", "line 1"},
		{"node_id: n1\nraft_port: [1, 2]\n", "raft_port", "line 2"},
		{"node_id: n1\nraft_port: many\n", "raft_port", "line 2"},
		{"node_id: n1\ncluster_id: a\ncluster_id: b\n", "cluster_id", "line 3"},
		{"node_id: n1\nnotfy_name: x\n", "notfy_name", "line 2"},
	} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(path, []byte(tc.yaml), 0o600)
		c := Default()
		err := c.LoadFile(path)
		if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.line+":") || !strings.Contains(err.Error(), path) {
			t.Errorf("%q: %v, want an error naming %s, %s and the file", tc.yaml, err, tc.key, tc.line)
		}
	}
	// Right shapes still load: lists as sequences or strings, quoted words, empty values.
	path := filepath.Join(t.TempDir(), "ok.yaml")
	os.WriteFile(path, []byte("cluster_id: \"true\"\njoin: [10.77.0.1:7946]\ntrusted_callers: 10.77.0.0/16, 10.78.0.0/16\nnotify_name:\ninsecure: true\nraft_port: 7301\n"), 0o600)
	c := Default()
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if c.ClusterID != "true" || len(c.Join) != 1 || len(c.TrustedCallers) != 2 || !c.Insecure || c.RaftPort != 7301 {
		t.Errorf("loaded %+v", c)
	}
}

func TestRaftProfileSetsTiming(t *testing.T) {
	for _, name := range Profiles() {
		c := Default()
		c.NodeID = "n1"
		if err := c.Set("raft_profile", name); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("raft_profile %s: %v", name, err)
		}
		want, ok := ProfileTiming(name)
		if !ok || want.HeartbeatTimeout == 0 || want.VIPLifetime == 0 {
			t.Fatalf("ProfileTiming(%s) = %+v, %v", name, want, ok)
		}
		if got := c.Timing(); got != want {
			t.Errorf("raft_profile %s: Timing() = %+v, want %+v", name, got, want)
		}
	}
	fast, _ := ProfileTiming(ProfileFast)
	def, _ := ProfileTiming(ProfileDefault)
	wan, _ := ProfileTiming(ProfileWAN)
	if !(fast.HeartbeatTimeout < def.HeartbeatTimeout && def.HeartbeatTimeout < wan.HeartbeatTimeout) {
		t.Errorf("heartbeat timeouts not ordered fast < default < wan: %v %v %v", fast.HeartbeatTimeout, def.HeartbeatTimeout, wan.HeartbeatTimeout)
	}
	// The default profile keeps the timings nsmd had before profiles.
	c := Default()
	if got := c.Timing(); got.HeartbeatTimeout != 300*time.Millisecond || got.ElectionTimeout != 300*time.Millisecond ||
		got.LeaderLeaseTimeout != 150*time.Millisecond || got.VIPLifetime != 2*time.Second {
		t.Errorf("Default().Timing() = %+v", got)
	}
}

// An explicit key wins over the profile whichever layer set either: here
// the file sets a key and the environment the profile, and the other way
// round.
func TestRaftProfileExplicitKeysOverride(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ file, envKey, envVal string }{
		{"raft_profile: fast\n", "NSMD_ELECTION_TIMEOUT", "250ms"},
		{"election_timeout: 250ms\n", "NSMD_RAFT_PROFILE", "fast"},
	} {
		path := filepath.Join(dir, "nsmd.yaml")
		if err := os.WriteFile(path, []byte("node_id: n1\n"+tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		c := Default()
		if err := c.LoadFile(path); err != nil {
			t.Fatal(err)
		}
		if err := c.ApplyEnv(func(k string) (string, bool) { return tc.envVal, k == tc.envKey }); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		want, _ := ProfileTiming(ProfileFast)
		want.ElectionTimeout = 250 * time.Millisecond
		if got := c.Timing(); got != want {
			t.Errorf("file %q, %s=%s: Timing() = %+v, want %+v", tc.file, tc.envKey, tc.envVal, got, want)
		}
		if v, _ := c.Get("heartbeat_timeout"); v != "" {
			t.Errorf("heartbeat_timeout not set, yet Get says %q (want empty: the profile's)", v)
		}
		if v, _ := c.Get("election_timeout"); v != "250ms" {
			t.Errorf("Get(election_timeout) = %q", v)
		}
	}
	// "" gives a key back to the profile.
	c := Default()
	c.RaftProfile = ProfileWAN
	for _, v := range []string{"100ms", ""} {
		if err := c.Set("heartbeat_timeout", v); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := c.Timing().HeartbeatTimeout, time.Second; got != want {
		t.Errorf("heartbeat_timeout reset to the profile's: %v, want %v", got, want)
	}
	if err := c.Set("heartbeat_timeout", "-1s"); err == nil {
		t.Error("a negative heartbeat_timeout accepted")
	}
}

func TestRaftProfileUnknownIsRefused(t *testing.T) {
	c := Default()
	c.NodeID = "n1"
	if err := c.Set("raft-profile", "turbo"); err != nil { // checked by Validate, with every other key
		t.Fatal(err)
	}
	err := c.Validate()
	if err == nil {
		t.Fatal("raft_profile turbo accepted")
	}
	if want := `raft_profile: "turbo" is not one of fast, default, wan`; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}

// An explicit key that does not fit the profile's others is refused,
// saying which values came from the profile.
func TestRaftProfileConflictNamesTheProfile(t *testing.T) {
	c := Default()
	c.NodeID = "n1"
	c.RaftProfile = ProfileWAN
	c.HeartbeatTimeout = 100 * time.Millisecond
	err := c.Validate()
	if err == nil {
		t.Fatal("heartbeat_timeout 100ms under the wan profile's 500ms lease accepted")
	}
	for _, want := range []string{"leader_lease_timeout: 500ms (raft_profile wan's) must be positive and not longer than heartbeat_timeout (100ms)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	c.RaftProfile = ProfileFast
	c.HeartbeatTimeout = 200 * time.Millisecond
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "election_timeout: 100ms (raft_profile fast's) must be at least heartbeat_timeout (200ms)") {
		t.Errorf("fast with heartbeat_timeout 200ms: %v", err)
	}
	c.HeartbeatTimeout = 0
	c.VIPLifetime = 1500 * time.Millisecond
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "vip_lifetime: 1.5s must be whole seconds") {
		t.Errorf("vip_lifetime 1.5s: %v", err)
	}
}

// tickle: on by default, on or off; tickle_max_conns: 4096 by default,
// 1 to MaxTickleConns.
func TestTickleKeys(t *testing.T) {
	c := Default()
	if c.Tickle != TickleOn || c.TickleMaxConns != 4096 {
		t.Fatalf("defaults tickle %q, tickle_max_conns %d; want on, 4096", c.Tickle, c.TickleMaxConns)
	}
	for _, tc := range []struct{ key, val, want string }{
		{"tickle", "on", ""},
		{"tickle", "off", ""},
		{"tickle", "yes", `tickle: "yes" is not one of on, off`},
		{"tickle_max_conns", "1", ""},
		{"tickle_max_conns", "16384", ""},
		{"tickle_max_conns", "0", "tickle_max_conns: 0 must be 1 to 16384"},
		{"tickle_max_conns", "16385", "tickle_max_conns: 16385 must be 1 to 16384"},
	} {
		c := Default()
		if err := c.Set(tc.key, tc.val); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		if tc.want == "" && err != nil {
			t.Errorf("%s %q: %v", tc.key, tc.val, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s %q: %v, want %q", tc.key, tc.val, err, tc.want)
		}
	}
}

// TestServingNodeNeedsAStop: on_leader without on_follower is refused,
// naming on_follower; with both, or with neither, or on a witness (which
// runs no hook), the same configuration is valid. The control: the pair
// that differs only by on_follower passes.
func TestServingNodeNeedsAStop(t *testing.T) {
	for _, c := range []struct {
		name                 string
		onLeader, onFollower string
		witness              bool
		refused              bool
	}{
		{name: "start without stop", onLeader: "/usr/lib/nsmd/hooks/nfsd-ha", refused: true},
		{name: "start and stop", onLeader: "/usr/lib/nsmd/hooks/nfsd-ha", onFollower: "/usr/lib/nsmd/hooks/nfsd-ha"},
		{name: "no hooks (a plain statd replacement)"},
		{name: "stop alone", onFollower: "/usr/lib/nsmd/hooks/nfsd-ha"},
		{name: "witness ignores the hooks", onLeader: "/usr/lib/nsmd/hooks/nfsd-ha", witness: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := Default()
			cfg.OnLeader, cfg.OnFollower, cfg.Witness = c.onLeader, c.onFollower, c.witness
			err := cfg.Validate()
			switch {
			case c.refused && (err == nil || !strings.Contains(err.Error(), "on_follower: is empty but on_leader is set")):
				t.Fatalf("Validate = %v, want on_follower refused", err)
			case !c.refused && err != nil:
				t.Fatalf("Validate = %v, want valid", err)
			}
		})
	}
}
