package fence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Exit codes of a fence agent, as the fence-agents library sets them.
const (
	// AgentOK is success: for action=off, the target is off.
	AgentOK = 0
	// AgentStatusOff is action=status's answer "the target is off"; 0 is
	// "on", anything else a failure.
	AgentStatusOff = 2
)

// outputTail is how much of an agent's output (the end of it) an error
// carries.
const outputTail = 2048

// waitDelay bounds the wait for an agent's output after it exited, when
// something that left its process group still holds the output open.
const waitDelay = 2 * time.Second

// ErrUnknownNode is returned for a node that AgentConfig.NodeArgs does not
// name: without its arguments the agent might act on another machine.
var ErrUnknownNode = errors.New("no fence agent arguments for this node")

// AgentConfig configures an [Agent].
type AgentConfig struct {
	// Path is the agent executable (absolute), e.g. /usr/sbin/fence_ipmilan.
	Path string
	// Args are the key=value arguments common to every invocation
	// (ip=…, username=…, password=…). They are never logged, since they may
	// hold passwords: logs name the keys only, and the values of keys that
	// look secret (see [SecretKey]) are masked in the agent output an error
	// carries. "action" and "option" are the Agent's own, and "nodename" is
	// per node: Args may not hold them.
	Args map[string]string
	// NodeArgs are the arguments for each node ID, added to Args (and
	// overriding them), e.g. {"s1": {"plug": "s1"}} for fence_virsh or
	// {"s1": {"ip": "10.0.0.11"}} for fence_ipmilan. Every invocation for a
	// node also gets nodename=ID (the fence-agents convention, which fabric
	// agents such as fence_scsi use) unless NodeArgs sets nodename itself.
	// A node NodeArgs does not name is refused ([ErrUnknownNode]) rather
	// than fenced with Args alone, which may point at another machine (or
	// at this one); an agent that needs nothing but nodename gets an empty
	// entry: {"s1": {}}.
	NodeArgs map[string]map[string]string
	// Timeout bounds one invocation (0: 60s); a hung agent is killed, with
	// its process group, at Timeout.
	Timeout time.Duration
	// Backoff is Fence's first delay between tries (0: 1s), doubling up to
	// MaxBackoff (0: 30s).
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Logger receives one line per invocation (action, node, argument keys,
	// exit code, duration); nil discards them.
	Logger *slog.Logger
}

// Agent runs a ClusterLabs fence agent: the arguments go to its standard
// input as key=value lines (never on its command line, which other users
// can read), and exit code 0 is success. Its methods are safe for
// concurrent use; each invocation is a process of its own, in a process
// group of its own, and leaves no process or goroutine behind when it
// returns.
type Agent struct {
	cfg       AgentConfig
	log       *slog.Logger
	secrets   []string // values of secret-looking keys, longest first
	secretMax int      // the longest one's length
}

// NewAgent checks cfg: Path must be absolute and name an executable
// regular file, and the arguments must be expressible as key=value lines.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	if !filepath.IsAbs(cfg.Path) {
		return nil, fmt.Errorf("fence agent %q: the path must be absolute", cfg.Path)
	}
	st, err := os.Stat(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("fence agent: %w (install the fence agent, e.g. Debian's fence-agents package)", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("fence agent %s is not a regular file (%s)", cfg.Path, st.Mode().Type())
	}
	if err := checkExecutable(cfg.Path); err != nil {
		return nil, fmt.Errorf("fence agent %s is not executable by this process: %w", cfg.Path, err)
	}
	if err := checkArgs(cfg.Args, "args"); err != nil {
		return nil, fmt.Errorf("fence agent %s: %w", cfg.Path, err)
	}
	if _, ok := cfg.Args["nodename"]; ok {
		return nil, fmt.Errorf("fence agent %s: args: nodename is per node: set it in the node's arguments (the default is the node ID)", cfg.Path)
	}
	for node, args := range cfg.NodeArgs {
		if node == "" {
			return nil, fmt.Errorf("fence agent %s: node arguments for an empty node ID", cfg.Path)
		}
		if err := checkArgs(args, "node "+node); err != nil {
			return nil, fmt.Errorf("fence agent %s: %w", cfg.Path, err)
		}
	}
	switch {
	case cfg.Timeout < 0, cfg.Backoff < 0, cfg.MaxBackoff < 0:
		return nil, fmt.Errorf("fence agent %s: negative timeout or backoff", cfg.Path)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 60 * time.Second
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = time.Second
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = max(30*time.Second, cfg.Backoff)
	}
	if cfg.MaxBackoff < cfg.Backoff {
		return nil, fmt.Errorf("fence agent %s: max backoff %v is shorter than the first backoff %v", cfg.Path, cfg.MaxBackoff, cfg.Backoff)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger.With("agent", cfg.Path)}
	collect := func(args map[string]string) {
		for k, v := range args {
			if v != "" && SecretKey(k) {
				a.secrets = append(a.secrets, v)
			}
		}
	}
	collect(cfg.Args)
	for _, args := range cfg.NodeArgs {
		collect(args)
	}
	slices.SortFunc(a.secrets, func(x, y string) int { return len(y) - len(x) })
	a.secrets = slices.Compact(a.secrets)
	if len(a.secrets) > 0 {
		a.secretMax = len(a.secrets[0])
	}
	return a, nil
}

// SecretKey reports whether an argument's key looks like it holds a
// secret (password, passwd, secret, token, community, key, credential,
// kg): its value is masked in the agent output that errors carry. Logs
// never carry any value.
func SecretKey(key string) bool {
	k := strings.ToLower(key)
	for _, s := range []string{"pass", "secret", "token", "community", "key", "credential", "kg"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

// checkArgs refuses what cannot go on a key=value line or is the Agent's
// own.
func checkArgs(args map[string]string, where string) error {
	for k, v := range args {
		if k == "" || strings.TrimLeft(k, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" {
			return fmt.Errorf("%s: key %q: keys are letters, digits, _ and -", where, k)
		}
		if k == "action" || k == "option" {
			return fmt.Errorf("%s: key %q: the action is the Agent's own", where, k)
		}
		if strings.ContainsAny(v, "\n\r\x00") {
			return fmt.Errorf("%s: the value of %q has a line break or NUL, which a key=value line cannot carry", where, k)
		}
		if strings.TrimRight(v, " \t") != v {
			return fmt.Errorf("%s: the value of %q ends in white space, which the agent strips", where, k)
		}
	}
	return nil
}

// AgentError is a failed invocation of a fence agent.
type AgentError struct {
	Agent    string // the executable
	Action   string // off, status, monitor
	Node     string // empty for monitor
	ExitCode int    // -1: it did not exit by itself (killed, not started)
	TimedOut bool   // killed at AgentConfig.Timeout
	// Output is the end of its standard output and error (at most 2 KiB),
	// with the values of secret-looking arguments masked.
	Output string
	// Err is the cause when it did not exit by itself: the start error,
	// or the context's error when it was stopped.
	Err error
}

func (e *AgentError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fence agent %s action=%s", filepath.Base(e.Agent), e.Action)
	if e.Node != "" {
		fmt.Fprintf(&b, " node=%s", e.Node)
	}
	switch {
	case e.TimedOut:
		b.WriteString(": timed out (killed with its process group)")
	case e.Err != nil:
		fmt.Fprintf(&b, ": %v", e.Err)
	default:
		fmt.Fprintf(&b, ": exit %d", e.ExitCode)
	}
	if out := strings.TrimSpace(e.Output); out != "" {
		fmt.Fprintf(&b, ": output: %s", out)
	}
	return b.String()
}

func (e *AgentError) Unwrap() error { return e.Err }

// Off runs action=off once against node; nil only on exit 0, which the
// fence-agents library gives only once it saw the target off. The error
// is an [*AgentError] with the exit code and the tail of the output.
func (a *Agent) Off(ctx context.Context, node string) error {
	if err := a.knownNode(node); err != nil {
		return err
	}
	res, err := a.run(ctx, "off", node)
	if err != nil {
		return err
	}
	if res.ExitCode != AgentOK {
		return res
	}
	return nil
}

// Status runs action=status against node: off is true on exit 2 and false
// on exit 0; any other exit is an error. Exit 2 is "off" only by the
// fence-agents convention, so decide that a node is fenced on Off's
// success, not on Status.
func (a *Agent) Status(ctx context.Context, node string) (off bool, err error) {
	if err := a.knownNode(node); err != nil {
		return false, err
	}
	res, err := a.run(ctx, "status", node)
	if err != nil {
		return false, err
	}
	switch res.ExitCode {
	case AgentOK:
		return false, nil
	case AgentStatusOff:
		return true, nil
	}
	return false, res
}

// Monitor runs action=monitor with Args alone (is the fence device
// reachable?), for a start-up check and an alert. nil only on exit 0.
func (a *Agent) Monitor(ctx context.Context) error {
	res, err := a.run(ctx, "monitor", "")
	if err != nil {
		return err
	}
	if res.ExitCode != AgentOK {
		return res
	}
	return nil
}

// Fence retries Off with backoff (Backoff, doubling up to MaxBackoff)
// until it succeeds or ctx ends. It never reports success on a failure or
// a hang: a hung agent is killed at Timeout, and counts as a failed try.
// onAttempt (may be nil) is told of each failed try, the last one
// included, before the wait that follows it. The error, when ctx ends,
// wraps ctx's error and the last try's.
func (a *Agent) Fence(ctx context.Context, node string, onAttempt func(try int, err error)) error {
	if err := a.knownNode(node); err != nil {
		return err
	}
	delay := a.cfg.Backoff
	for try := 1; ; try++ {
		err := a.Off(ctx, node)
		if err == nil {
			a.log.Info("node fenced", "node", node, "tries", try)
			return nil
		}
		if onAttempt != nil {
			onAttempt(try, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("fence node %s: gave up after try %d: %w (last try: %w)", node, try, ctx.Err(), err)
		}
		a.log.Warn("fencing failed; retrying", "node", node, "try", try, "retry_in", delay, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("fence node %s: gave up after try %d: %w (last try: %w)", node, try, ctx.Err(), err)
		case <-t.C:
		}
		delay = min(2*delay, a.cfg.MaxBackoff)
	}
}

func (a *Agent) knownNode(node string) error {
	if _, ok := a.cfg.NodeArgs[node]; !ok || node == "" {
		return fmt.Errorf("fence agent %s: node %q: %w (add it to the agent's node arguments, even empty, to fence it with the common ones and nodename=%s)", a.cfg.Path, node, ErrUnknownNode, node)
	}
	return nil
}

// input is the agent's standard input for action against node ("" for
// none), and the keys it holds (for the log).
func (a *Agent) input(action, node string) ([]byte, []string) {
	args := maps.Clone(a.cfg.Args)
	if args == nil {
		args = map[string]string{}
	}
	if node != "" {
		args["nodename"] = node
		maps.Copy(args, a.cfg.NodeArgs[node])
	}
	keys := slices.Sorted(maps.Keys(args))
	var b bytes.Buffer
	fmt.Fprintf(&b, "action=%s\n", action)
	for _, k := range keys {
		v := args[k]
		// The agent strips one pair of enclosing double quotes: keep a
		// quoted value's own.
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = `"` + v + `"`
		}
		fmt.Fprintf(&b, "%s=%s\n", k, v)
	}
	return b.Bytes(), append([]string{"action"}, keys...)
}

// run runs the agent once. It returns an *AgentError as the error when the
// agent did not exit by itself (it could not start, it timed out, ctx
// ended), and otherwise an *AgentError as the result, holding the exit
// code and output, for the caller to judge.
func (a *Agent) run(ctx context.Context, action, node string) (*AgentError, error) {
	in, keys := a.input(action, node)
	res := &AgentError{Agent: a.cfg.Path, Action: action, Node: node, ExitCode: -1}
	log := a.log.With("action", action)
	if node != "" {
		log = log.With("node", node)
	}

	if err := ctx.Err(); err != nil {
		res.Err = err
		return nil, res
	}
	runCtx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	// Keep a secret's length more than the tail, so that one cut at the
	// start is still masked whole.
	out := &tailBuffer{max: outputTail + a.secretMax}
	cmd := exec.Command(a.cfg.Path)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = waitDelay
	start := time.Now()
	if err := cmd.Start(); err != nil {
		res.Err = err
		log.Warn("fence agent did not start", "keys", keys, "err", err)
		return nil, res
	}
	pid := cmd.Process.Pid

	// Learn that it exited without reaping it: while the leader is a
	// zombie its pid, and so its process group's ID, cannot be reused, so
	// killing the group cannot hit a stranger.
	exited := make(chan error, 1)
	go func() { exited <- waitExited(pid) }()
	var stopped error
	select {
	case err := <-exited:
		if err != nil {
			log.Error("fence agent: waiting for it failed", "pid", pid, "err", err)
		}
	case <-runCtx.Done():
		killGroup(pid)
		<-exited
		stopped = runCtx.Err()
		if ctx.Err() != nil {
			stopped = ctx.Err()
		}
	}
	// Whatever it left behind in its group goes with it.
	killGroup(pid)
	werr := cmd.Wait()
	took := time.Since(start)
	res.Output = a.mask(out.String(), out.cut)

	if stopped != nil {
		res.TimedOut = ctx.Err() == nil
		if res.TimedOut {
			res.Err = fmt.Errorf("timed out after %v: %w", a.cfg.Timeout, stopped)
		} else {
			res.Err = stopped
		}
		log.Warn("fence agent stopped", "keys", keys, "timed_out", res.TimedOut, "took", took)
		return nil, res
	}
	if cmd.ProcessState == nil {
		res.Err = werr
		log.Error("fence agent: its exit status is unknown", "keys", keys, "err", werr)
		return nil, res
	}
	res.ExitCode = cmd.ProcessState.ExitCode()
	if errors.Is(werr, exec.ErrWaitDelay) {
		log.Warn("fence agent exited but something it started kept its output open", "exit", res.ExitCode)
	}
	if res.ExitCode < 0 {
		// Killed by a signal that was not ours.
		res.Err = fmt.Errorf("%s", cmd.ProcessState.String())
		log.Warn("fence agent killed", "keys", keys, "state", cmd.ProcessState.String(), "took", took)
		return nil, res
	}
	level := slog.LevelInfo
	if action != "off" && res.ExitCode == AgentOK {
		level = slog.LevelDebug // a routine status or monitor
	}
	log.Log(context.Background(), level, "fence agent ran", "keys", keys, "exit", res.ExitCode, "took", took)
	return res, nil
}

// mask replaces the values of secret-looking arguments in s, the output
// kept, and cuts it to its last outputTail bytes; cut says that s is
// already the end of a longer output.
func (a *Agent) mask(s string, cut bool) string {
	for _, v := range a.secrets {
		s = strings.ReplaceAll(s, v, "***")
	}
	if len(s) > outputTail {
		s = s[len(s)-outputTail:]
		cut = true
	}
	if cut {
		return "…" + s
	}
	return s
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
	cut bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) > t.max {
		p = p[len(p)-t.max:]
		t.cut = true
	}
	if over := len(t.b) + len(p) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
		t.cut = true
	}
	t.b = append(t.b, p...)
	return n, nil
}

// String is the bytes kept.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
