package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// Network faults inside the namespaces: cutting a host off from some peers
// and random packet loss on client links. Each picks a tool this machine
// has; a fault that has none makes its schedule skip, saying so.

// step is one change to a namespace and the ip arguments that undo it.
type step struct{ do, undo []string }

// applySteps applies steps in order; on a failure it undoes the applied
// ones and returns the error. It returns the undo list, latest first.
func applySteps(steps []step) ([][]string, error) {
	var undo [][]string
	for _, st := range steps {
		if _, err := ipCmd(st.do...); err != nil {
			for _, u := range undo {
				ipCmd(u...)
			}
			return nil, err
		}
		undo = append([][]string{st.undo}, undo...)
	}
	return undo, nil
}

// cut isolates h from peers in both directions, dropping silently like a
// dead link: with iptables DROP rules in h's namespace when iptables is
// installed and works, else with blackhole routes on both sides (only ip
// is needed). It returns the tool used and the heal function, which also
// runs when the test ends.
func cut(t *testing.T, h *netHost, peers []*netHost) (string, func()) {
	t.Helper()
	var ipt, routes []step
	for _, p := range peers {
		for _, rule := range [][]string{{"INPUT", "-s"}, {"OUTPUT", "-d"}} {
			r := []string{rule[0], rule[1], p.ip.String(), "-j", "DROP"}
			ipt = append(ipt, step{
				do:   append([]string{"netns", "exec", h.ns, "iptables", "-w", "-A"}, r...),
				undo: append([]string{"netns", "exec", h.ns, "iptables", "-w", "-D"}, r...),
			})
		}
		routes = append(routes,
			step{do: []string{"-n", h.ns, "route", "add", "blackhole", p.ip.String() + "/32"},
				undo: []string{"-n", h.ns, "route", "del", "blackhole", p.ip.String() + "/32"}},
			step{do: []string{"-n", p.ns, "route", "add", "blackhole", h.ip.String() + "/32"},
				undo: []string{"-n", p.ns, "route", "del", "blackhole", h.ip.String() + "/32"}})
	}
	tool := "blackhole routes"
	var undo [][]string
	var err error
	if _, lerr := exec.LookPath("iptables"); lerr == nil {
		if undo, err = applySteps(ipt); err == nil {
			tool = "iptables"
		} else {
			t.Logf("iptables does not work here, using blackhole routes: %v", err)
		}
	}
	if tool != "iptables" {
		if undo, err = applySteps(routes); err != nil {
			t.Fatalf("cutting %s off: %v", h.name, err)
		}
	}
	var once sync.Once
	heal := func() {
		once.Do(func() {
			for _, u := range undo {
				if _, err := ipCmd(u...); err != nil {
					t.Errorf("healing the cut of %s: %v", h.name, err)
				}
			}
		})
	}
	t.Cleanup(heal)
	return tool, heal
}

// lossRule is one way to drop a share of a link's packets.
type lossRule struct {
	tool  string
	add   func(h *netHost, sw string, pct int) [][]string // ip argument lists
	undo  func(h *netHost, sw string) [][]string
	needs string // program that must exist
}

var lossRules = []lossRule{
	{
		tool: "tc netem", needs: "tc",
		add: func(h *netHost, sw string, pct int) [][]string {
			loss := fmt.Sprintf("%d%%", pct)
			return [][]string{
				{"netns", "exec", h.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "loss", loss},
				{"netns", "exec", sw, "tc", "qdisc", "add", "dev", h.swPort, "root", "netem", "loss", loss},
			}
		},
		undo: func(h *netHost, sw string) [][]string {
			return [][]string{
				{"netns", "exec", h.ns, "tc", "qdisc", "del", "dev", "eth0", "root"},
				{"netns", "exec", sw, "tc", "qdisc", "del", "dev", h.swPort, "root"},
			}
		},
	},
	{
		tool: "iptables statistic", needs: "iptables",
		add: func(h *netHost, _ string, pct int) [][]string {
			p := fmt.Sprintf("0.%02d", pct)
			return [][]string{
				{"netns", "exec", h.ns, "iptables", "-w", "-A", "INPUT", "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"},
				{"netns", "exec", h.ns, "iptables", "-w", "-A", "OUTPUT", "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"},
			}
		},
		undo: func(h *netHost, _ string) [][]string {
			return [][]string{
				{"netns", "exec", h.ns, "iptables", "-w", "-F", "INPUT"},
				{"netns", "exec", h.ns, "iptables", "-w", "-F", "OUTPUT"},
			}
		},
	},
	{
		tool: "nft numgen", needs: "nft",
		add: func(h *netHost, _ string, pct int) [][]string {
			rules := fmt.Sprintf(`table inet nsmde2e {
	chain in { type filter hook input priority 0; numgen random mod 100 < %d drop; }
	chain out { type filter hook output priority 0; numgen random mod 100 < %d drop; }
}`, pct, pct)
			return [][]string{{"netns", "exec", h.ns, "nft", rules}}
		},
		undo: func(h *netHost, _ string) [][]string {
			return [][]string{{"netns", "exec", h.ns, "nft", "delete", "table", "inet", "nsmde2e"}}
		},
	},
}

// addLoss drops pct % of the packets on every client host's link, both
// ways, with the first tool that works here. It returns the tool and the
// function that removes the loss (also run when the test ends), or skips
// the test when no tool works.
func addLoss(t *testing.T, top *topology, hosts []*netHost, pct int) (string, func()) {
	t.Helper()
	var tried []string
	for _, r := range lossRules {
		if _, err := exec.LookPath(r.needs); err != nil {
			tried = append(tried, fmt.Sprintf("%s: %s not installed", r.tool, r.needs))
			continue
		}
		var undo [][]string
		var failed error
		for _, h := range hosts {
			for _, args := range r.add(h, top.sw, pct) {
				if _, err := ipCmd(args...); err != nil {
					failed = err
					break
				}
			}
			undo = append(undo, r.undo(h, top.sw)...)
			if failed != nil {
				break
			}
		}
		remove := func() {
			for _, u := range undo {
				ipCmd(u...) // a half-applied rule may be missing: errors are expected
			}
		}
		if failed != nil {
			remove()
			tried = append(tried, fmt.Sprintf("%s: %v", r.tool, failed))
			continue
		}
		var once sync.Once
		removeOnce := func() { once.Do(remove) }
		t.Cleanup(removeOnce)
		return r.tool, removeOnce
	}
	t.Skipf("no way to add packet loss here (install nftables or iptables, or a kernel with sch_netem): %s", strings.Join(tried, "; "))
	return "", nil
}
