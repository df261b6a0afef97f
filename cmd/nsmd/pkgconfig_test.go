package main

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/nsmd/nsmd/config"
)

// packagedConfig is the /etc/nsmd/nsmd.yaml the .deb installs.
const packagedConfig = "../../deploy/etc/nsmd.yaml"

// TestPackagedConfigLoadsAndValidates loads the packaged default config as
// `nsmd agent --config /etc/nsmd/nsmd.yaml` does (file, environment,
// flags, Validate) and checks the settings it promises: a one-node statd
// replacement on port 662 registered with rpcbind, state in /var/lib/nsmd.
func TestPackagedConfigLoadsAndValidates(t *testing.T) {
	for _, f := range config.Fields() {
		if _, ok := os.LookupEnv(f.Env()); ok {
			t.Setenv(f.Env(), "") // the file alone decides below
			os.Unsetenv(f.Env())
		}
	}
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	load := configFlags(fs)
	if err := fs.Parse([]string{"--config", packagedConfig}); err != nil {
		t.Fatal(err)
	}
	cfg, err := load()
	if err != nil {
		t.Fatalf("packaged config does not load: %v", err)
	}
	for key, want := range map[string]string{
		"data_dir": "/var/lib/nsmd", "nsm_addr": "0.0.0.0:662", "rpcbind": "register",
		"admin_addr": "127.0.0.1:8024", "vip_mode": "none", "bind": "127.0.0.1",
	} {
		if got, _ := cfg.Get(key); got != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
	// What the packaged unit grants is what this config needs: agent's
	// TestPackagedConfigNeedsOnlyBindService.
}

// TestPackagedConfigCommentedKeysAreReal: every commented-out example
// (`# key: value`) names a real setting with a value it accepts, so an
// operator who uncomments one gets what the comment says.
func TestPackagedConfigCommentedKeysAreReal(t *testing.T) {
	f, err := os.Open(packagedConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^# ([a-z_]+): (\S.*?)\s*(#.*)?$`)
	var n int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n++
		v := strings.TrimSuffix(strings.TrimPrefix(m[2], "["), "]")
		v = strings.ReplaceAll(v, ", ", ",")
		c := config.Default()
		if err := c.Set(m[1], v); err != nil {
			t.Errorf("commented example %q: %v", sc.Text(), err)
		}
	}
	if n < 20 {
		t.Errorf("found %d commented examples, want the 20+ the file has", n)
	}
}

// TestPackagedConfigHooksComeAsAPair: the packaged config's hook examples,
// uncommented together, give a configuration the agent accepts; on_leader
// uncommented alone is refused, naming on_follower (a serving node
// always has a stop).
func TestPackagedConfigHooksComeAsAPair(t *testing.T) {
	b, err := os.ReadFile(packagedConfig)
	if err != nil {
		t.Fatal(err)
	}
	hooks := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^# (on_leader|on_follower): (\S+)`).FindAllStringSubmatch(string(b), -1) {
		hooks[m[1]] = m[2]
	}
	if hooks["on_leader"] == "" || hooks["on_follower"] == "" {
		t.Fatalf("the packaged config has no commented on_leader/on_follower examples: %v", hooks)
	}
	with := func(keys ...string) error {
		c := config.Default()
		c.NodeID = "nfs1"
		for _, k := range keys {
			if err := c.Set(k, hooks[k]); err != nil {
				t.Fatal(err)
			}
		}
		return c.Validate()
	}
	if err := with("on_leader", "on_follower"); err != nil {
		t.Errorf("both hooks: %v", err)
	}
	if err := with("on_leader"); err == nil || !strings.Contains(err.Error(), "on_follower") {
		t.Errorf("on_leader alone: %v, want refused naming on_follower", err)
	}
}
