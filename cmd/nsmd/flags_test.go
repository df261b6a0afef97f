package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/nsmd/nsmd/config"
)

// Every config key's flag shows its real type in `nsmd agent --help`
// (bool flags none: they take no value), and a bad value is refused while
// the flags are parsed, naming the flag and the key.
func TestAgentFlagsAreTyped(t *testing.T) {
	out, err := runCLI(t, "agent", "--help")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"string": "string", "int": "int", "uint": "uint", "duration": "duration", "list": "strings", "bool": ""}
	for _, f := range config.Fields() {
		re := regexp.MustCompile(`(?m)^\s+--` + regexp.QuoteMeta(f.Flag()) + `(?: (\S+))?\s{2,}`)
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Errorf("--%s missing from agent --help", f.Flag())
			continue
		}
		if m[1] != want[f.Kind] {
			t.Errorf("--%s shows type %q in help, want %q (%s)", f.Flag(), m[1], want[f.Kind], f.Kind)
		}
	}
	for _, tc := range []struct{ args []string }{
		{[]string{"agent", "--bootstrap-expect", "three"}},
		{[]string{"agent", "--grace-period", "90"}},
		{[]string{"agent", "--witness=maybe"}},
	} {
		_, err := runCLI(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), "invalid argument") || !strings.Contains(err.Error(), strings.TrimLeft(strings.SplitN(tc.args[1], "=", 2)[0], "-")) {
			t.Errorf("%v: %v, want a parse error naming the flag", tc.args, err)
		}
	}
	// A bool flag alone means true.
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	load := configFlags(fs)
	if err := fs.Parse([]string{"--witness", "--drill-crash=false", "--node-id", "n1", "--data-dir", t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	c, err := load()
	if err != nil {
		t.Fatal(err)
	}
	if !c.Witness || c.DrillCrash {
		t.Fatalf("--witness --drill-crash=false gave witness=%v drill_crash=%v", c.Witness, c.DrillCrash)
	}
}
