package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/nsm"
)

// TestImportAndExportStatdDirectory: a statd directory (sm/ records and a
// state of 41) imported through a follower lands on every node, the
// cluster's sm_state goes above 41 (odd), and export-statd writes the same
// records back in statd's format.
func TestImportAndExportStatdDirectory(t *testing.T) {
	d, _ := agenttest.Dev(t, "127.0.0.104", 3)
	lead := agenttest.Leader(t, d, nil, 10*time.Second)
	var follower *agent.Agent
	for _, a := range d.Agents() {
		if a != lead {
			follower = a
		}
	}
	src := t.TempDir()
	var in nsm.StatdDir
	in.State = 41
	for i := range 5 {
		line := fmt.Sprintf("0100007f 000186b5 00000004 00000010 %032x 10.77.3.%d nfs-old-%d", i+1, i+1, i%2)
		r, err := nsm.ParseStatdRecord(line)
		if err != nil {
			t.Fatal(err)
		}
		in.Records = append(in.Records, r)
	}
	if err := nsm.WriteStatdDir(src, in); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := rootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			t.Fatalf("nsmd %s: %v", strings.Join(args, " "), err)
		}
		return out.String()
	}
	t.Log(run("import-statd", src, "--admin", strings.TrimPrefix(follower.AdminURL(), "http://")))
	if st := lead.Node().View().State(); st <= 41 || st%2 != 1 {
		t.Errorf("sm_state after import %d, want odd and above 41", st)
	}
	for _, a := range d.Agents() {
		agenttest.WaitApplied(t, a, lead.Node().View().AppliedIndex())
		if n := a.Node().View().Count(); n != 5 {
			t.Errorf("%s has %d registrations after import, want 5", a.Config().NodeID, n)
		}
	}
	dst := t.TempDir()
	t.Log(run("export-statd", dst, "--admin", strings.TrimPrefix(lead.AdminURL(), "http://")))
	out, err := nsm.ReadStatdDir(dst)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != lead.Node().View().State() {
		t.Errorf("exported state %d, want %d", out.State, lead.Node().View().State())
	}
	lines := func(d nsm.StatdDir) []string {
		var s []string
		for _, r := range d.Records {
			s = append(s, r.String())
		}
		slices.Sort(s)
		return s
	}
	if got, want := lines(out), lines(in); !slices.Equal(got, want) {
		t.Errorf("exported records\n%v\nwant\n%v", got, want)
	}
}
