package drill

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
)

// hostile are node ids and addresses no config would accept, each of
// which would run a command if it reached the shell unquoted.
var hostile = []string{"n1; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "a'b", `a"b\`, "two words", "x\ntouch PWNED", "", "{node}", "*"}

// TestExpandQuotesEveryValue: {node} and {addr} reach the command as one
// word each, whatever they hold; nothing in them runs.
func TestExpandQuotesEveryValue(t *testing.T) {
	dir := t.TempDir()
	for _, v := range hostile {
		line := Expand(`printf '<%s>\n' {node} {addr} root@{addr}`, Target{ID: v, Addr: v + "!"})
		c := exec.Command("sh", "-c", line)
		c.Dir = dir
		out, err := c.Output()
		if err != nil {
			t.Fatalf("%q: %s: %v", v, line, err)
		}
		want := "<" + v + ">\n<" + v + "!>\n<root@" + v + "!>\n"
		if string(out) != want {
			t.Errorf("%q expanded to %s: got %q, want %q", v, line, out, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "PWNED")); err == nil {
		t.Fatal("a node id ran a command")
	}
	if got := Expand("ssh root@{addr} -- {node}", Target{ID: "nfs1", Addr: "10.0.0.11"}); got != "ssh root@10.0.0.11 -- nfs1" {
		t.Errorf("plain values: %q", got)
	}
	if got := Expand("ip netns exec {node}", Target{ID: "fd00::1"}); got != "ip netns exec fd00::1" {
		t.Errorf("ipv6: %q", got)
	}
}

func TestPlanNodeFault(t *testing.T) {
	tg := Target{ID: "nfs1", Addr: "10.0.0.11"}
	self := Peer{ID: "nfs1", RaftAddr: "10.0.0.11:7300", GossipAddr: "10.0.0.11:7946", NSMAddr: "0.0.0.0:662"}
	peers := []Peer{{ID: "nfs2", RaftAddr: "10.0.0.12:7300", GossipAddr: "10.0.0.12:7946", NSMAddr: "10.0.0.12:662"},
		{ID: "w", RaftAddr: "[fd00::13]:7300", GossipAddr: "[fd00::13]:7946", NSMAddr: "[::]:662"}}
	o := NodeOptions{NodeCmd: "ssh root@{addr}"}
	for _, f := range []string{FaultNSMDKill, FaultNSMDHang, FaultPartition} {
		p, err := planNodeFault(f, o, tg, 8*time.Second, self, peers)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if p.apply != "ssh root@10.0.0.11 sh -s" || !strings.Contains(p.script, appliedMarker) {
			t.Errorf("%s: apply %q", f, p.apply)
		}
		if f != FaultNSMDKill && p.undo != p.apply {
			t.Errorf("%s: undo %q", f, p.undo)
		}
		if _, err := planNodeFault(f, NodeOptions{}, tg, time.Second, self, peers); err == nil || !strings.Contains(err.Error(), "--node-cmd") {
			t.Errorf("%s without --node-cmd: %v", f, err)
		}
	}
	p, _ := planNodeFault(FaultNSMDHang, o, tg, 8500*time.Millisecond, self, peers)
	if !strings.Contains(p.script, "hold=8.5\n") || !strings.Contains(p.script, "systemctl show -p MainPID --value") {
		t.Errorf("hang script:\n%s", p.script)
	}
	p, _ = planNodeFault(FaultNSMDKill, NodeOptions{NodeCmd: "x", PIDFile: "/run/nsmd's/{node}.pid"}, Target{ID: "n1 $(x)"}, 0, self, peers)
	if !strings.Contains(p.script, `pidfile='/run/nsmd'\''s/n1 $(x).pid'`) {
		t.Errorf("pidfile not quoted:\n%s", p.script)
	}
	if strings.Contains(p.script, "pkill") || strings.Contains(p.script, "pgrep") || strings.Contains(p.script, "killall") {
		t.Error("the script looks nsmd up by name")
	}

	rules, err := nftRuleset(self, peers)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"table inet nsmd_drill\ndelete table inet nsmd_drill\n", "elements = { 10.0.0.12 }", "elements = { fd00::13 }",
		"{ 662, 7300, 7946 }", "ip saddr @peers4 tcp dport", "ip daddr @peers4 udp sport", "ip6 saddr @peers6 udp dport", "hook input", "hook output"} {
		if !strings.Contains(rules, w) {
			t.Errorf("ruleset lacks %q:\n%s", w, rules)
		}
	}
	if strings.Contains(rules, "10.0.0.11") || strings.Contains(rules, "0.0.0.0") || strings.Contains(rules, " :: ") {
		t.Errorf("ruleset cuts the node itself or an unspecified address:\n%s", rules)
	}
	if _, err := nftRuleset(self, nil); err == nil {
		t.Error("a partition from nobody")
	}

	if _, err := planNodeFault(FaultFreeze, NodeOptions{FreezeCmd: "virsh suspend {node}"}, tg, time.Second, self, peers); err == nil || !strings.Contains(err.Error(), "--thaw-cmd") {
		t.Errorf("freeze without --thaw-cmd: %v", err)
	}
	p, err = planNodeFault(FaultFreeze, NodeOptions{FreezeCmd: "virsh suspend {node}", ThawCmd: "virsh resume {node}"}, Target{ID: "vm 1"}, time.Second, self, peers)
	if err != nil || p.apply != "virsh suspend 'vm 1'" || p.undo != "virsh resume 'vm 1'" || p.script != "" || p.hold != time.Second {
		t.Errorf("freeze plan %+v, %v", p, err)
	}
}

// TestNFTRulesetParses: the partition's table is one nft accepts, checked
// (never committed) in a network namespace of the test's own.
func TestNFTRulesetParses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace of its own")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft")
	}
	rules, err := nftRuleset(Peer{RaftAddr: "10.77.0.1:7300", GossipAddr: "10.77.0.1:7946", NSMAddr: "10.77.0.1:6620"},
		[]Peer{{RaftAddr: "10.77.0.2:7300", GossipAddr: "10.77.0.2:7946", NSMAddr: "10.77.0.2:6620"}, {RaftAddr: "[fd77::3]:7300"}})
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command("unshare", "--net", "nft", "-c", "-f", "-")
	c.Stdin = strings.NewReader(rules)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("nft -c: %v: %s\n%s", err, out, rules)
	}
}

// child starts `sleep 60` as the stand-in for nsmd, with a PID file;
// wait returns how it ended.
func child(t *testing.T) (c *exec.Cmd, pidfile string, wait func() error) {
	t.Helper()
	c = exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var werr error
	go func() { werr = c.Wait(); close(exited) }()
	wait = func() error { <-exited; return werr }
	t.Cleanup(func() {
		c.Process.Kill()
		wait()
	})
	pidfile = filepath.Join(t.TempDir(), "nsmd.pid")
	if err := os.WriteFile(pidfile, []byte(strconv.Itoa(c.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return c, pidfile, wait
}

// procState is the state letter of /proc/PID/stat (T: stopped).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// TestNSMDKillScript: the nsmd-kill script, run through a prefix (env,
// standing in for ssh), kills exactly the process of the PID file, and
// refuses one that is not named as nsmd is.
func TestNSMDKillScript(t *testing.T) {
	c, pidfile, wait := child(t)
	p, err := planNodeFault(FaultNSMDKill, NodeOptions{NodeCmd: "env", PIDFile: pidfile, Comm: "nsmd"}, Target{ID: "n1"}, 0, Peer{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan error, 1)
	fr := runPlan(context.Background(), p, nil, 10*time.Second, applied)
	if err := <-applied; err == nil || !strings.Contains(err.Error(), "is sleep, not nsmd") {
		t.Fatalf("a PID file naming another program: %v (%+v)", err, fr)
	}
	if procState(c.Process.Pid) == "" {
		t.Fatal("the process named otherwise was signalled")
	}

	p, _ = planNodeFault(FaultNSMDKill, NodeOptions{NodeCmd: "env", PIDFile: pidfile, Comm: "sleep"}, Target{ID: "n1"}, 0, Peer{}, nil)
	fr = runPlan(context.Background(), p, nil, 10*time.Second, applied)
	if err := <-applied; err != nil || fr.err != nil {
		t.Fatalf("kill: %v %+v", err, fr)
	}
	err = wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the process ended with %v, want SIGKILL", err)
	}
	if !strings.Contains(fr.note, "kill -9 of nsmd (pid "+strconv.Itoa(c.Process.Pid)) {
		t.Errorf("note %q", fr.note)
	}

	os.WriteFile(pidfile, []byte("0\n"), 0o644)
	fr = runPlan(context.Background(), p, nil, 10*time.Second, applied)
	if err := <-applied; err == nil || !strings.Contains(err.Error(), "no nsmd process") {
		t.Fatalf("PID 0: %v %+v", err, fr)
	}
}

// TestNSMDHangScript: the process is stopped once the script says the
// fault is in place and continued when the hold ends — and when the drill
// is interrupted during the hold.
func TestNSMDHangScript(t *testing.T) {
	c, pidfile, _ := child(t)
	pid := c.Process.Pid
	o := NodeOptions{NodeCmd: "env", PIDFile: pidfile, Comm: "sleep"}
	p, err := planNodeFault(FaultNSMDHang, o, Target{ID: "n1"}, 300*time.Millisecond, Peer{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan error, 1)
	res := make(chan faultResult, 1)
	go func() { res <- runPlan(context.Background(), p, nil, 10*time.Second, applied) }()
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if st := procState(pid); st != "T" {
		t.Fatalf("state %q once applied, want T (stopped)", st)
	}
	fr := <-res
	if fr.err != nil || !strings.Contains(fr.note, "SIGCONT") {
		t.Fatalf("%+v", fr)
	}
	testutil.WaitFor(t, 5*time.Second, "the process continued", func() bool { return procState(pid) != "T" })

	p, _ = planNodeFault(FaultNSMDHang, o, Target{ID: "n1"}, time.Hour, Peer{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { res <- runPlan(ctx, p, nil, 2*time.Hour, applied) }()
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if st := procState(pid); st != "T" {
		t.Fatalf("state %q once applied, want T", st)
	}
	cancel()
	<-res
	testutil.WaitFor(t, 5*time.Second, "the process continued after the drill was interrupted", func() bool { return procState(pid) != "T" })
}

// TestPartitionScript: with a recording nft in PATH, the script loads the
// ruleset, says so, and deletes the table when the hold ends; the undo
// deletes it only while it exists.
func TestPartitionScript(t *testing.T) {
	bin := t.TempDir()
	log := filepath.Join(bin, "nft.log")
	fake := `#!/bin/sh
echo "nft $*" >> ` + log + `
case "$*" in
"-f -") cat >> ` + log + ` ;;
"list table inet nsmd_drill") [ -e ` + bin + `/table ] || exit 1 ;;
esac
[ "$*" = "-f -" ] && touch ` + bin + `/table
[ "$*" = "delete table inet nsmd_drill" ] && rm -f ` + bin + `/table
exit 0
`
	if err := os.WriteFile(filepath.Join(bin, "nft"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	self := Peer{RaftAddr: "10.77.0.1:7300", GossipAddr: "10.77.0.1:7946"}
	peers := []Peer{{RaftAddr: "10.77.0.2:7300", GossipAddr: "10.77.0.2:7946"}}
	p, err := planNodeFault(FaultPartition, NodeOptions{NodeCmd: "env"}, Target{ID: "n1"}, 100*time.Millisecond, self, peers)
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan error, 1)
	env := []string{"PATH=" + bin + ":" + os.Getenv("PATH")}
	fr := runPlan(context.Background(), p, env, 10*time.Second, applied)
	if err := <-applied; err != nil || fr.err != nil {
		t.Fatalf("%v %+v", err, fr)
	}
	b, _ := os.ReadFile(log)
	got := string(b)
	for _, w := range []string{"nft -f -\ntable inet nsmd_drill\n", "elements = { 10.77.0.2 }", "nft delete table inet nsmd_drill\nnft list table inet nsmd_drill\n"} {
		if !strings.Contains(got, w) {
			t.Errorf("nft calls lack %q:\n%s", w, got)
		}
	}
	if strings.Count(got, "nft delete") != 2 { // the script's own (and its EXIT trap's, which finds it gone)
		t.Errorf("deletes:\n%s", got)
	}
	if _, err := os.Stat(filepath.Join(bin, "table")); err == nil {
		t.Error("table left behind")
	}
}

// TestFreezeCommands: freeze, hold, thaw, in order, with {node} quoted.
func TestFreezeCommands(t *testing.T) {
	log := filepath.Join(t.TempDir(), "hv.log")
	o := NodeOptions{FreezeCmd: "echo suspend {node} >> " + log, ThawCmd: "echo resume {node} >> " + log}
	p, err := planNodeFault(FaultFreeze, o, Target{ID: "vm1; echo no"}, 50*time.Millisecond, Peer{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan error, 1)
	fr := runPlan(context.Background(), p, nil, 10*time.Second, applied)
	if err := <-applied; err != nil || fr.err != nil {
		t.Fatalf("%v %+v", err, fr)
	}
	if b, _ := os.ReadFile(log); string(b) != "suspend vm1; echo no\nresume vm1; echo no\n" {
		t.Errorf("hypervisor calls %q", b)
	}
	o.FreezeCmd = "echo no such domain >&2; exit 1"
	p, _ = planNodeFault(FaultFreeze, o, Target{ID: "vm1"}, time.Hour, Peer{}, nil)
	fr = runPlan(context.Background(), p, nil, 10*time.Second, applied)
	if err := <-applied; err == nil || !strings.Contains(err.Error(), "no such domain") || !fr.definitive {
		t.Fatalf("a failed freeze: %v %+v", err, fr)
	}
}

func TestDefaultHold(t *testing.T) {
	if d := defaultHoldFor(admin.Status{}); d != 8*time.Second {
		t.Errorf("without a watchdog: %v", d)
	}
	s := admin.Status{Fence: admin.Fence{Watchdog: &admin.FenceWatchdog{TimeoutSeconds: 5}}}
	if d := defaultHoldFor(s); d != 8*time.Second {
		t.Errorf("fence_timeout 5s: %v", d)
	}
	s.Fence.Watchdog.TimeoutSeconds = 10
	if d := defaultHoldFor(s); d != 13*time.Second {
		t.Errorf("fence_timeout 10s: %v", d)
	}
	if holdSeconds(1500*time.Microsecond) != "0.002" || holdSeconds(8*time.Second) != "8" {
		t.Error(holdSeconds(1500*time.Microsecond), holdSeconds(8*time.Second))
	}
}
