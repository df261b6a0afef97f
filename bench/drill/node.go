package drill

// Node-level faults: what the drill runs on the leader's machine (through
// the operator's --node-cmd prefix, e.g. `ssh root@{addr}`) or on its
// hypervisor (--freeze-cmd, --thaw-cmd). Each built-in fault is a small
// POSIX sh script given on the standard input of `PREFIX sh -s`, so the
// prefix may be ssh (which would re-split a command line) or `ip netns
// exec` (which would not) alike. A script prints one line starting with
// appliedMarker once the fault is in place — the drill's clock starts
// there — holds it for the fault's duration and undoes it itself when it
// ends, is interrupted or loses its connection; the drill then runs an
// undo script of its own as well, which does nothing when there is
// nothing left to undo.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nsmd/nsmd/admin"
)

// Node-level fault kinds (FaultKill and FaultTransfer are the API's).
const (
	FaultNSMDKill  = "nsmd-kill" // kill -9 of the leader's nsmd (nsmd dev: the in-process crash)
	FaultNSMDHang  = "nsmd-hang" // SIGSTOP of the leader's nsmd for HangFor, then SIGCONT
	FaultPartition = "partition" // the leader's cluster traffic dropped for CutFor (nft)
	FaultFreeze    = "freeze"    // the leader's machine paused by FreezeCmd for FreezeFor, then ThawCmd
)

// Faults are the values of --fault, in the order the help lists them.
func Faults() []string {
	return []string{FaultTransfer, FaultKill, FaultNSMDKill, FaultNSMDHang, FaultPartition, FaultFreeze}
}

// NFTTable is the nft table a partition drill creates on the leader's
// node (family inet) and deletes again.
const NFTTable = "nsmd_drill"

// appliedMarker starts the line a fault script prints once the fault is
// in place.
const appliedMarker = "nsmd-drill: applied"

// defaultHold is how long a hang, cut or freeze lasts when the leader's
// status has no watchdog timeout to add holdMargin to.
const (
	defaultHold = 8 * time.Second
	holdMargin  = 3 * time.Second
	undoTimeout = 30 * time.Second // one undo command (run even after ^C)
)

// Target is the node a node-level fault hits, as the templates see it.
type Target struct {
	ID   string // {node}: the node id
	Addr string // {addr}: the host of its admin (else NSM) address
}

// ShellQuote quotes s as one word for a POSIX shell.
func ShellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+=,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Expand fills an operator's command template: {node} and {addr} become
// the target's node id and address, each quoted as one shell word
// (`ssh root@{addr}` → `ssh root@10.0.0.11`; a value with a quote or a
// space stays one word and runs nothing). Other braces are left as they are.
func Expand(tmpl string, t Target) string {
	r := strings.NewReplacer("{node}", ShellQuote(t.ID), "{addr}", ShellQuote(t.Addr))
	return r.Replace(tmpl)
}

// NodeOptions say how to reach the leader's machine and what to do there.
type NodeOptions struct {
	// NodeCmd is the prefix that runs a command on the target node
	// (`ssh root@{addr}`, `ip netns exec {node}`).
	NodeCmd string
	// PIDFile is where the node keeps nsmd's PID ({node} and {addr} are
	// filled in); "" asks systemd (`systemctl show -p MainPID --value UNIT`).
	PIDFile string
	Unit    string // systemd unit, default nsmd
	// Comm is the expected process name (/proc/PID/comm) of nsmd, default
	// nsmd: a stale PID file naming another process is refused.
	Comm string
	// HangFor, CutFor, FreezeFor: how long the fault lasts; 0 = the
	// leader's watchdog timeout + 3 s, or 8 s without one.
	HangFor, CutFor, FreezeFor time.Duration
	// FreezeCmd and ThawCmd pause and resume the target's machine; run
	// on this machine, templates like NodeCmd (`virsh suspend {node}`).
	FreezeCmd, ThawCmd string
}

// faultPlan is one node-level fault ready to run: shell command lines for
// this machine's sh.
type faultPlan struct {
	label string // what it does, for the progress and the report
	// apply applies the fault; with script set it is `PREFIX sh -s`
	// reading script and the fault is in place at appliedMarker, else
	// (freeze) once apply exited 0.
	apply, script string
	hold          time.Duration // how long the fault lasts (the scripts hold by themselves; freeze: before undo)
	// undo undoes what apply may have left behind ("" nothing); with
	// undoScript set it is `PREFIX sh -s` reading undoScript.
	undo, undoScript string
}

// Peer is another cluster member as a partition sees it: the addresses
// whose traffic to and from the target is dropped, and the ports.
type Peer struct {
	ID                            string
	RaftAddr, GossipAddr, NSMAddr string
}

// planNodeFault builds fault's commands against t. hold is the duration
// (already defaulted); peers are the other members (partition), self the
// target's own member entry.
func planNodeFault(fault string, o NodeOptions, t Target, hold time.Duration, self Peer, peers []Peer) (*faultPlan, error) {
	prefix := ""
	if fault != FaultFreeze {
		if strings.TrimSpace(o.NodeCmd) == "" {
			return nil, fmt.Errorf("--fault %s runs on the leader's machine: give --node-cmd, how to run a command there (e.g. 'ssh root@{addr}' or 'ssh root@{node}')", fault)
		}
		prefix = Expand(o.NodeCmd, t) + " "
	}
	secs := holdSeconds(hold)
	find := pidScript(o, t)
	p := &faultPlan{hold: hold}
	switch fault {
	case FaultNSMDKill:
		p.label = "kill -9 of nsmd"
		p.script = find + `main() {
	nsmd_pid || exit 3
	kill -KILL "$pid" || exit 3
	echo "` + appliedMarker + `: kill -9 of nsmd (pid $pid from $src)"
}
main </dev/null
`
	case FaultNSMDHang:
		p.label = "SIGSTOP of nsmd for " + secs + "s"
		p.script = find + `hold=` + secs + `
main() {
	nsmd_pid || exit 3
	trap 'kill -CONT "$pid" 2>/dev/null' EXIT
	trap 'exit 1' HUP INT TERM
	kill -STOP "$pid" || exit 3
	n=0
	while [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)" != T ] && [ $n -lt 200 ]; do
		sleep 0.01; n=$((n+1))
	done
	echo "` + appliedMarker + `: SIGSTOP to nsmd (pid $pid from $src) for ${hold}s"
	sleep "$hold"
	kill -CONT "$pid" && echo "nsmd-drill: SIGCONT to nsmd (pid $pid)"
}
main </dev/null
`
		p.undoScript = find + `main() {
	nsmd_pid 2>/dev/null || { echo "nsmd-drill: no nsmd process to continue"; exit 0; }
	kill -CONT "$pid"
}
main </dev/null
`
	case FaultPartition:
		rules, err := nftRuleset(self, peers)
		if err != nil {
			return nil, err
		}
		p.label = "cluster links cut for " + secs + "s"
		p.script = `hold=` + secs + `
main() {
	command -v nft >/dev/null || { echo "nsmd-drill: nft (nftables) is not installed on this node" >&2; exit 3; }
	trap 'nft delete table inet ` + NFTTable + ` 2>/dev/null' EXIT
	trap 'exit 1' HUP INT TERM
	nft -f - <<'NSMD_DRILL_NFT' || exit 3
` + rules + `NSMD_DRILL_NFT
	echo "` + appliedMarker + `: nft table inet ` + NFTTable + ` drops the cluster traffic to and from ` + strconv.Itoa(len(peers)) + ` other member(s) for ${hold}s"
	sleep "$hold"
	nft delete table inet ` + NFTTable + ` && echo "nsmd-drill: table inet ` + NFTTable + ` deleted"
}
main </dev/null
`
		p.undoScript = `main() {
	if nft list table inet ` + NFTTable + ` >/dev/null 2>&1; then
		nft delete table inet ` + NFTTable + ` && echo "nsmd-drill: table inet ` + NFTTable + ` deleted"
	fi
}
main </dev/null
`
	case FaultFreeze:
		if strings.TrimSpace(o.FreezeCmd) == "" || strings.TrimSpace(o.ThawCmd) == "" {
			return nil, errors.New("--fault freeze pauses the leader's machine through its hypervisor: give --freeze-cmd and --thaw-cmd (e.g. 'virsh suspend {node}' and 'virsh resume {node}')")
		}
		p.label = "machine frozen for " + secs + "s"
		p.apply = Expand(o.FreezeCmd, t)
		p.undo = Expand(o.ThawCmd, t)
		return p, nil
	default:
		return nil, fmt.Errorf("drill: %q is not a node-level fault", fault)
	}
	p.apply = prefix + "sh -s"
	if p.undoScript != "" {
		p.undo = prefix + "sh -s"
	}
	return p, nil
}

// holdSeconds formats d for sleep(1): whole milliseconds, in seconds.
func holdSeconds(d time.Duration) string {
	ms := int64(math.Ceil(float64(d) / float64(time.Millisecond)))
	return strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64)
}

// pidScript defines nsmd_pid: it sets pid (and src, where it came from)
// to nsmd's PID from the PID file or systemd, and refuses a PID that is
// not a running process named Comm. Never a search by name: another
// nsmd (a test's, a second instance) must not be hit.
func pidScript(o NodeOptions, t Target) string {
	unit, comm := orDefault(o.Unit, "nsmd"), orDefault(o.Comm, "nsmd")
	pidfile := strings.NewReplacer("{node}", t.ID, "{addr}", t.Addr).Replace(o.PIDFile)
	return `pidfile=` + ShellQuote(pidfile) + `
unit=` + ShellQuote(unit) + `
want=` + ShellQuote(comm) + `
nsmd_pid() {
	if [ -n "$pidfile" ]; then
		src="$pidfile"
		pid=$(cat -- "$pidfile" 2>/dev/null) || { echo "nsmd-drill: cannot read the PID file $pidfile" >&2; return 1; }
	else
		src="systemctl show -p MainPID $unit"
		pid=$(systemctl show -p MainPID --value -- "$unit" 2>/dev/null) || { echo "nsmd-drill: $src failed (no systemd? give --nsmd-pidfile)" >&2; return 1; }
	fi
	pid=$(echo $pid)
	case $pid in
	''|0|*[!0-9]*) echo "nsmd-drill: no nsmd process (PID '$pid' from $src)" >&2; return 1 ;;
	esac
	comm=$(cat "/proc/$pid/comm" 2>/dev/null) || { echo "nsmd-drill: PID $pid (from $src) is not running" >&2; return 1; }
	[ "$comm" = "$want" ] || { echo "nsmd-drill: PID $pid (from $src) is $comm, not $want: refusing to signal it" >&2; return 1; }
}
`
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// nftRuleset is the partition's nft table: every packet between self and
// the other members' addresses to or from a raft, gossip or NSM port
// (the forward program, which also carries the "do you serve" question,
// shares NSM's port) is dropped, both ways. Nothing else is touched:
// clients (any other address) still reach NSM and NFS on the node.
// The first two lines replace a table a killed drill left behind.
func nftRuleset(self Peer, peers []Peer) (string, error) {
	var v4, v6 []string
	var ports []int
	addPort := func(addr string) {
		if _, p, err := net.SplitHostPort(addr); err == nil {
			if n, err := strconv.Atoi(p); err == nil && n > 0 && !slices.Contains(ports, n) {
				ports = append(ports, n)
			}
		}
	}
	selfIPs := map[netip.Addr]bool{}
	for _, a := range []string{self.RaftAddr, self.GossipAddr, self.NSMAddr} {
		if h, _, err := net.SplitHostPort(a); err == nil {
			if ip, err := netip.ParseAddr(h); err == nil {
				selfIPs[ip.Unmap()] = true
			}
		}
		addPort(a)
	}
	for _, p := range peers {
		for _, a := range []string{p.RaftAddr, p.GossipAddr, p.NSMAddr} {
			addPort(a)
			h, _, err := net.SplitHostPort(a)
			if err != nil {
				continue
			}
			ip, err := netip.ParseAddr(h)
			if err != nil || ip.IsUnspecified() || selfIPs[ip.Unmap()] {
				continue
			}
			ip = ip.Unmap()
			s := ip.String()
			if ip.Is4() && !slices.Contains(v4, s) {
				v4 = append(v4, s)
			} else if ip.Is6() && !slices.Contains(v6, s) {
				v6 = append(v6, s)
			}
		}
	}
	if len(v4)+len(v6) == 0 {
		return "", errors.New("partition: the other members have no address of their own to cut off (/v1/members)")
	}
	if len(ports) == 0 {
		return "", errors.New("partition: no raft, gossip or NSM port known (/v1/members)")
	}
	slices.Sort(ports)
	var ps []string
	for _, p := range ports {
		ps = append(ps, strconv.Itoa(p))
	}
	portSet := "{ " + strings.Join(ps, ", ") + " }"
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\ntable inet %s {\n", NFTTable, NFTTable, NFTTable)
	if len(v4) > 0 {
		fmt.Fprintf(&b, "\tset peers4 { type ipv4_addr; elements = { %s } }\n", strings.Join(v4, ", "))
	}
	if len(v6) > 0 {
		fmt.Fprintf(&b, "\tset peers6 { type ipv6_addr; elements = { %s } }\n", strings.Join(v6, ", "))
	}
	for _, ch := range []struct{ name, hook, dir string }{{"in", "input", "saddr"}, {"out", "output", "daddr"}} {
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook %s priority -10; policy accept;\n", ch.name, ch.hook)
		for _, fam := range []struct{ ip, set string }{{"ip", "@peers4"}, {"ip6", "@peers6"}} {
			if (fam.ip == "ip" && len(v4) == 0) || (fam.ip == "ip6" && len(v6) == 0) {
				continue
			}
			for _, proto := range []string{"tcp", "udp"} {
				for _, port := range []string{"dport", "sport"} {
					fmt.Fprintf(&b, "\t\t%s %s %s %s %s %s drop\n", fam.ip, ch.dir, fam.set, proto, port, portSet)
				}
			}
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String(), nil
}

// defaultHoldFor is a hang's, cut's or freeze's duration when not given:
// the leader's watchdog timeout + 3 s (long enough that the watchdog
// must fire), or 8 s when its status shows none.
func defaultHoldFor(s admin.Status) time.Duration {
	if w := s.Fence.Watchdog; w != nil && w.TimeoutSeconds > 0 {
		return time.Duration(w.TimeoutSeconds*float64(time.Second)) + holdMargin
	}
	return defaultHold
}

// shellCmd is one command line for this machine's sh, in a process group
// of its own: cancelling ctx sends SIGTERM to the group (a fault script's
// trap undoes the fault), SIGKILL after a grace.
func shellCmd(ctx context.Context, line, stdin string, env []string) *exec.Cmd {
	c := exec.CommandContext(ctx, "sh", "-c", line)
	c.Env = append(os.Environ(), env...)
	if stdin != "" {
		c.Stdin = strings.NewReader(stdin)
	}
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error {
		if err := syscall.Kill(-c.Process.Pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		return nil
	}
	c.WaitDelay = 3 * time.Second
	return c
}

// lineLog collects a command's output lines (bounded) for the report.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s = strings.TrimSpace(s); s != "" && len(l.lines) < 20 {
		l.lines = append(l.lines, s)
	}
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "; ")
}

// runPlan runs a node-level fault: applied receives nil once the fault is
// in place (or the error that kept it from it), then runPlan holds it,
// undoes it and returns what it printed. The undo runs even when ctx is
// cancelled.
func runPlan(ctx context.Context, p *faultPlan, env []string, timeout time.Duration, applied chan<- error) faultResult {
	var out lineLog
	sent := false
	signal := func(err error) {
		if !sent {
			sent = true
			applied <- err
		}
	}
	defer signal(errors.New("fault command ended before the fault was in place"))
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := shellCmd(actx, p.apply, p.script, env)
	var applyErr error
	if p.script == "" { // freeze: in place once the command succeeded
		b, err := c.CombinedOutput()
		for _, l := range strings.Split(string(b), "\n") {
			out.add(l)
		}
		if err != nil {
			signal(fmt.Errorf("%s: %w: %s", p.apply, err, out.String()))
			return faultResult{err: err, definitive: true, note: out.String()}
		}
		signal(nil)
		hold := time.NewTimer(p.hold)
		select {
		case <-ctx.Done():
		case <-hold.C:
		}
		hold.Stop()
	} else {
		stdout, err := c.StdoutPipe()
		if err != nil {
			signal(fmt.Errorf("fault command: %w", err))
			return faultResult{err: err, definitive: true}
		}
		c.Stderr = lineWriter{&out}
		if err := c.Start(); err != nil {
			signal(fmt.Errorf("fault command %q: %w", p.apply, err))
			return faultResult{err: err, definitive: true}
		}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			l := sc.Text()
			out.add(l)
			if strings.HasPrefix(l, appliedMarker) {
				signal(nil)
			}
		}
		applyErr = c.Wait()
		if !sent && applyErr != nil {
			signal(fmt.Errorf("fault command %q: %w: %s", p.apply, applyErr, out.String()))
			return faultResult{err: applyErr, definitive: true, note: out.String()}
		}
	}
	if p.undo != "" {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer ucancel()
		u := shellCmd(uctx, p.undo, p.undoScript, env)
		b, err := u.CombinedOutput()
		for _, l := range strings.Split(string(b), "\n") {
			out.add(l)
		}
		if err != nil {
			out.add(fmt.Sprintf("undo (%s) failed: %v", p.undo, err))
		}
	}
	if applyErr != nil {
		out.add(fmt.Sprintf("fault command ended with %v", applyErr))
	}
	return faultResult{note: out.String()}
}

// lineWriter feeds written lines into a lineLog.
type lineWriter struct{ l *lineLog }

func (w lineWriter) Write(b []byte) (int, error) {
	for _, s := range strings.Split(string(b), "\n") {
		w.l.add(s)
	}
	return len(b), nil
}

var _ io.Writer = lineWriter{}
