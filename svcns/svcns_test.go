package svcns

import (
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{Name: "nsmd-a", RunDir: "/run/nsmd/services/a", Parent: "eth0"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	if got := ok.withDefaults().Link; got != "eth0" {
		t.Errorf("Link defaults to %q, want the parent eth0", got)
	}
	for _, c := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"empty name", func(c *Config) { c.Name = "" }, "namespace name"},
		{"slash in name", func(c *Config) { c.Name = "a/b" }, "namespace name"},
		{"dot dot", func(c *Config) { c.Name = ".." }, "namespace name"},
		{"leading dash", func(c *Config) { c.Name = "-a" }, "namespace name"},
		{"long name", func(c *Config) { c.Name = strings.Repeat("a", MaxNameLen+1) }, "namespace name"},
		{"relative run dir", func(c *Config) { c.RunDir = "run/a" }, "run directory"},
		{"unclean run dir", func(c *Config) { c.RunDir = "/run/../a" }, "run directory"},
		{"root run dir", func(c *Config) { c.RunDir = "/" }, "run directory"},
		{"no parent", func(c *Config) { c.Parent = "" }, "parent interface is not set"},
		{"bad parent", func(c *Config) { c.Parent = "a b" }, "parent interface"},
		{"long link", func(c *Config) { c.Link = "abcdefghijklmnop" }, "link name"},
		{"colon link", func(c *Config) { c.Link = "eth0:1" }, "link name"},
		{"loopback link", func(c *Config) { c.Parent = "lo" }, "own loopback"},
	} {
		cfg := ok
		c.mod(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v, want an error about %q", c.name, err, c.want)
		}
	}
}
