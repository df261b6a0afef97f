package config

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// LoadFile applies a YAML file whose top-level keys are settings' keys,
// and services: (a list of mappings: config/services.go). Lists may be
// YAML sequences or comma-separated strings. Every error names the file,
// the line and the key; a file with an error changes nothing.
func (c *Config) LoadFile(path string) error {
	n := *c
	if err := n.loadFile(path); err != nil {
		return err
	}
	*c = n
	return nil
}

func (c *Config) loadFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("parse config file %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("config file %s: line %d: want key: value pairs at the top level", path, root.Line)
	}
	kinds := map[string]string{}
	for _, f := range Fields() {
		kinds[f.Key] = f.Kind
	}
	first := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		key := strings.ReplaceAll(k.Value, "-", "_")
		err := func() error {
			if key == ServicesKey {
				if l, dup := first[key]; dup {
					return fmt.Errorf("%s: given again (first on line %d)", key, l)
				}
				first[key] = k.Line
				specs, src, err := loadServices(path, v)
				if err != nil {
					return errPositioned{err}
				}
				c.Services, c.servicesFrom = specs, src
				return nil
			}
			kind, ok := kinds[key]
			if !ok {
				return fmt.Errorf("%q: %w", k.Value, ErrUnknownKey)
			}
			if l, dup := first[key]; dup {
				return fmt.Errorf("%s: given again (first on line %d)", key, l)
			}
			first[key] = k.Line
			s, err := yamlValue(kind, v)
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			return c.Set(key, s)
		}()
		var positioned errPositioned
		if errors.As(err, &positioned) {
			return positioned.error // each of its errors names the file and its line
		}
		if err != nil {
			return fmt.Errorf("config file %s: line %d: %w", path, k.Line, err)
		}
	}
	return nil
}

// errPositioned carries errors that already name the file and their lines.
type errPositioned struct{ error }

// errType is a YAML value of the wrong shape for its setting.
var errType = errors.New("wrong type")

// yamlValue is the text Set parses for a YAML value of a setting of kind.
func yamlValue(kind string, v *yaml.Node) (string, error) {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	switch v.Kind {
	case yaml.ScalarNode:
		switch {
		case v.Tag == "!!null":
			return "", nil
		case v.Tag == "!!bool" && (kind == "string" || kind == "list"):
			return "", fmt.Errorf("%w: want a %s, got the boolean %s (quote it to mean the word)", errType, kind, v.Value)
		}
		return v.Value, nil
	case yaml.SequenceNode:
		if kind != "list" {
			return "", fmt.Errorf("%w: want a %s, got a list", errType, kind)
		}
		parts := make([]string, len(v.Content))
		for i, p := range v.Content {
			if p.Kind != yaml.ScalarNode {
				return "", fmt.Errorf("%w: list item on line %d is not a plain value", errType, p.Line)
			}
			parts[i] = p.Value
		}
		return strings.Join(parts, ","), nil
	case yaml.MappingNode:
		return "", fmt.Errorf("%w: want a %s, got a mapping (key: value pairs)", errType, kind)
	}
	return "", fmt.Errorf("%w: want a %s", errType, kind)
}

// ApplyEnv applies every NSMD_<KEY> variable that lookup finds
// (pass os.LookupEnv).
func (c *Config) ApplyEnv(lookup func(string) (string, bool)) error {
	if err := checkServicesEnv(lookup); err != nil {
		return err
	}
	for _, f := range Fields() {
		if v, ok := lookup(f.Env()); ok {
			if err := c.Set(f.Key, v); err != nil {
				return fmt.Errorf("environment %s: %w", f.Env(), err)
			}
		}
	}
	return nil
}
