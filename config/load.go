package config

import (
	"fmt"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// LoadFile applies a YAML file whose top-level keys are settings' keys.
// Lists may be YAML sequences or comma-separated strings.
func (c *Config) LoadFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config file: %w", err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("parse config file %s: %w", path, err)
	}
	for k, v := range m {
		var s string
		switch v := v.(type) {
		case []any:
			parts := make([]string, len(v))
			for i, p := range v {
				parts[i] = fmt.Sprint(p)
			}
			s = strings.Join(parts, ",")
		case nil:
			s = ""
		default:
			s = fmt.Sprint(v)
		}
		if err := c.Set(k, s); err != nil {
			return fmt.Errorf("config file %s: %w", path, err)
		}
	}
	return nil
}

// ApplyEnv applies every NSMD_<KEY> variable that lookup finds
// (pass os.LookupEnv).
func (c *Config) ApplyEnv(lookup func(string) (string, bool)) error {
	for _, f := range Fields() {
		if v, ok := lookup(f.Env()); ok {
			if err := c.Set(f.Key, v); err != nil {
				return fmt.Errorf("environment %s: %w", f.Env(), err)
			}
		}
	}
	return nil
}
