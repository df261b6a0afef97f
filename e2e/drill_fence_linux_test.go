package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/bench/drill"
	"github.com/nsmd/nsmd/internal/testutil"
)

// TestDrillFencedFaults: `nsmd drill --fault nsmd-hang`, `--fault
// partition` and `--fault nsmd-kill`, run by the built binary from a client host's namespace
// against three serving nodes (an on_leader hook each, no watchdog, a
// fence agent), reach the leader through `--node-cmd 'ip netns exec
// {node}'`-style prefixes, and report that the new leader had the old one
// fenced by the agent. The agent is a shell script that records what it
// was asked on stdin and exits 0: it stands in for a power switch, so the
// "fenced" node is not really powered off and comes back as the same
// process (after a kill -9 the test restarts it at once, as systemd
// would: the drill says it restarted, and it may have answered the new
// leader's question itself, a clean proof). The partition's nft table is gone from
// the old node afterwards.
func TestDrillFencedFaults(t *testing.T) {
	if why := canNetns(); why != "" {
		t.Skip(why)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (the partition drill needs it on the node)")
	}
	if filepath.Base(nsmdBin) != "nsmd" {
		t.Skipf("the drill signals only a process named nsmd; NSMD_BIN is %s", nsmdBin)
	}
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook") // on_leader and on_follower
	agentLog := filepath.Join(dir, "fenced.log")
	agent := filepath.Join(dir, "fence-agent")
	for path, body := range map[string]string{
		hook: "#!/bin/sh\nexit 0\n",
		// A stand-in for a power switch (fence_ipmilan, fence_virsh): it
		// records the request and says the node is off, without touching it.
		agent: "#!/bin/sh\n{ echo ---; cat; } >> " + agentLog + "\nexit 0\n",
	} {
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c := startClusterWith(t, clusterSpec{clients: 1, extraArgs: func(n *nsmNode) []string {
		return []string{"--on-leader", hook, "--on-follower", hook, "--fence-watchdog", "off", "--fence-agent", agent,
			"--fence-nodes", "n1:plug=n1,n2:plug=n2,n3:plug=n3", "--nfsv4-tracking", "off"}
	}})
	state := c.settle(t, 60*time.Second, 1).leaderStatus().SMState
	for _, n := range c.nodes {
		n.mu.Lock()
		pid := n.cmd.Process.Pid
		n.mu.Unlock()
		if err := os.WriteFile(filepath.Join(dir, n.id+".pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var admins []string
	for _, n := range c.nodes {
		admins = append(admins, n.admin)
	}
	client := c.top.hosts[0].ns
	nodeCmd := "ip netns exec " + c.top.prefix + "{node}"

	for _, fault := range []string{drill.FaultNSMDHang, drill.FaultPartition, drill.FaultNSMDKill} {
		t.Run(fault, func(t *testing.T) {
			c.settle(t, 60*time.Second, state)
			before, _ := os.ReadFile(agentLog)
			args := append([]string{"netns", "exec", client, nsmdBin, "drill", "--admin", strings.Join(admins, ","),
				"--fault", fault, "--node-cmd", nodeCmd, "--json", "--timeout", "40s"}, c.pki.cliArgs()...)
			switch fault {
			case drill.FaultNSMDHang:
				args = append(args, "--nsmd-pidfile", filepath.Join(dir, "{node}.pid"), "--hang-for", "10s")
			case drill.FaultNSMDKill:
				args = append(args, "--nsmd-pidfile", filepath.Join(dir, "{node}.pid"))
			default:
				args = append(args, "--cut-for", "10s")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "ip", args...)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if fault == drill.FaultNSMDKill {
				// The supervisor's part: start the killed node again.
				died := make(chan *nsmNode, len(c.nodes))
				for _, n := range c.nodes {
					n.mu.Lock()
					done := n.done
					n.mu.Unlock()
					go func() {
						select {
						case <-done:
							died <- n
						case <-ctx.Done():
						}
					}()
				}
				var leader *nsmNode
				select {
				case leader = <-died:
				case <-ctx.Done():
					t.Fatal("no node was killed")
				}
				// Once another node leads (restarted at once, the killed
				// node may win the new term itself: no fence wait to see).
				testutil.WaitFor(t, 30*time.Second, "another leader", func() bool {
					for _, n := range c.others(leader) {
						if st, err := n.status(); err == nil && st.Role == "leader" {
							return true
						}
					}
					return false
				})
				leader.start(t)
			}
			err := cmd.Wait()
			t.Logf("drill progress:\n%s", errOut.String())
			if err != nil {
				t.Fatalf("nsmd drill --fault %s: %v", fault, err)
			}
			var rep drill.Report
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Fatalf("--json: %v\n%s", err, out.String())
			}
			if len(rep.Runs) != 1 {
				t.Fatalf("runs %+v", rep.Runs)
			}
			r := rep.Runs[0]
			if !r.Complete() || r.NewLeader == "" || r.NewLeader == r.OldLeader {
				t.Fatalf("run %+v", r)
			}
			f := r.Fence
			// A killed node restarted at once may answer first: its stop at
			// start succeeded, a clean proof. Otherwise the agent fenced it.
			if f == nil || f.Mode != "agent" || !(f.By == "agent" || (fault == drill.FaultNSMDKill && f.By == "clean")) {
				t.Fatalf("fence %+v, want the old leader %s fenced by the agent", f, r.OldLeader)
			}
			// The stand-in agent left the node running: it comes back as
			// the same process, no longer leading; a killed one restarted.
			want := drill.OldKept
			if fault == drill.FaultNSMDKill {
				want = drill.OldRestarted
				if !f.Old.Unreachable || f.Old.BackAfterMS <= 0 {
					t.Errorf("killed node: %+v, want unreachable, then back", f.Old)
				}
			}
			if f.Old.Outcome != want || f.Old.Role == "leader" || f.Old.Serving {
				t.Errorf("old server %+v, want %s", f.Old, want)
			}
			after, _ := os.ReadFile(agentLog)
			asked := strings.TrimPrefix(string(after), string(before))
			if f.By == "agent" && (!strings.Contains(asked, "action=off") || !strings.Contains(asked, "nodename="+r.OldLeader) || !strings.Contains(asked, "plug="+r.OldLeader)) {
				t.Errorf("the fence agent was asked:\n%s", asked)
			}
			if !strings.Contains(errOut.String(), "old server "+r.OldLeader+": "+f.By) {
				t.Errorf("progress lacks the fence line")
			}
			if fault == drill.FaultPartition {
				if out, err := nsCmd(c.top.prefix+r.OldLeader, "nft", "list", "table", "inet", drill.NFTTable); err == nil {
					t.Errorf("table inet %s left on %s:\n%s", drill.NFTTable, r.OldLeader, out)
				}
			}
			state = c.settle(t, 60*time.Second, r.NewState).leaderStatus().SMState
		})
	}
}
