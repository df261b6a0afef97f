package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/config"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/service"
)

// Hook events: the leader loop's transitions and faults.
const (
	hookEventLeader   = "leader"
	hookEventFollower = "follower"
	hookEventFault    = "fault"
)

// Hook run results, the result label of nsmd_hook_runs_total.
const (
	hookOK      = "ok"
	hookFailed  = "failed"
	hookTimeout = "timeout"
	hookDropped = "dropped" // the queue was full; the script never ran
)

const (
	hookQueueMax   = 256         // queued events beyond this are dropped (and counted)
	hookTailLines  = 20          // output lines kept for HookFailure.Output
	hookTailBytes  = 4096        // and at most this many bytes of them
	hookMaxLine    = 4096        // a longer line is logged in pieces
	hookWaitDelay  = time.Second // after exit or kill: how long children may hold the output pipes
	hookLogStdout  = "stdout"
	hookLogStderr  = "stderr"
	hookNamePrefix = "on_"
)

// hookEnv is what a hook script is told, as NSMD_* environment variables.
type hookEnv struct {
	NodeID  string
	VIP     string
	SMState int32
	Role    string // leader | follower | candidate | service
	Reason  string
	// Extra is passed after everything else (a service's NSMD_SERVICE_*
	// and NSMD_SERVICE_EPOCH; a later value of a name wins).
	Extra []string
}

type hookJob struct {
	ctx   context.Context // values only (never cancels a queued hook)
	event string
	env   hookEnv
	done  chan error // gets the hook's error (none on success), then is closed; may be nil
}

// finish hands err (nil: the hook succeeded, or there was none to run) to
// job.done, if any, and closes it.
func (j hookJob) finish(err error) {
	if j.done != nil {
		if err != nil {
			j.done <- err
		}
		close(j.done)
	}
}

// errHookNotRun: a queued hook that never ran (the node is shutting down,
// or too many were queued).
var errHookNotRun = errors.New("hook not run")

// doneWith is a finished done channel that yields err.
func doneWith(err error) <-chan error {
	done := make(chan error, 1)
	hookJob{done: done}.finish(err)
	return done
}

// hookRunner runs the on_leader / on_follower / on_fault scripts of one
// node. run only queues: one owner goroutine (start … stop) executes the
// scripts one at a time, in the order the events happened, so a slow
// script never holds up the leader loop and a follower hook never overtakes
// the leader hook before it. Every method is a no-op on a nil *hookRunner.
type hookRunner struct {
	log     *slog.Logger
	nodeID  string
	vip     string
	scripts map[string]string // event → absolute path; "" = none
	timeout time.Duration
	// fixedEnv is passed to every script besides the event's NSMD_*
	// variables: settings the hooks need (notify name, grace, NFSv4
	// tracking). Set before start.
	fixedEnv []string
	// onStart, when set, is told when a script starts (set before start).
	onStart func(event string, state int32, at time.Time)
	// onDone, when set, is told each queued hook's result once it ran
	// (nil: it succeeded; after the on_fault its failure ran), before
	// the hook's channel yields it (set before start).
	onDone func(event string, env hookEnv, err error)

	runs     *prometheus.CounterVec
	duration *prometheus.HistogramVec

	wake chan struct{} // 1-buffered: the queue changed

	mu      sync.Mutex
	queue   []hookJob
	closed  bool // stop was called: no more events
	started bool
	done    chan struct{} // closed when the owner goroutine ends
	cancel  context.CancelFunc
	last    *admin.HookFailure
}

// newHookRunner builds the runner for cfg's hooks and registers its metrics
// on reg (nil: unregistered). Nothing runs before start.
func newHookRunner(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) *hookRunner {
	h := &hookRunner{
		log:    log.With("component", "hooks"),
		nodeID: cfg.NodeID,
		vip:    cfg.VIP,
		scripts: map[string]string{
			hookEventLeader:   cfg.OnLeader,
			hookEventFollower: cfg.OnFollower,
			hookEventFault:    cfg.OnFault,
		},
		timeout: cfg.HookTimeout,
		fixedEnv: []string{
			"NSMD_NOTIFY_NAME=" + cfg.EffectiveNotifyName(),
			fmt.Sprintf("NSMD_GRACE_SECONDS=%d", int64(cfg.GracePeriod/time.Second)),
		},
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nsmd_hook_runs_total",
			Help: "Hook script runs, by hook (on_leader, on_follower, on_fault) and result (ok, failed, timeout, dropped).",
		}, []string{"hook", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nsmd_hook_duration_seconds",
			Help:    "Time a hook script ran, by hook.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"hook"}),
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	if h.timeout <= 0 {
		h.timeout = config.Default().HookTimeout
	}
	if reg != nil {
		reg.MustRegister(h.runs, h.duration)
	}
	return h
}

func hookName(event string) string { return hookNamePrefix + event }

// forService is a runner of its own for one service's hooks (serviceroom.go):
// the node's scripts, timeout, fixed environment and metrics (the same
// series: nsmd_hook_runs_total{hook,result}), its own queue, owner
// goroutine and last failure, so that one service's slow hook never
// delays another's. NSMD_VIP is the service's address. Call it after
// the node's fixedEnv is complete; start and stop it like the node's.
func (h *hookRunner) forService(spec service.Spec) *hookRunner {
	if h == nil {
		return nil
	}
	return &hookRunner{
		log:      h.log.With("service", spec.ID),
		nodeID:   h.nodeID,
		vip:      spec.Address.String(),
		scripts:  h.scripts,
		timeout:  h.timeout,
		fixedEnv: slices.Clone(h.fixedEnv),
		runs:     h.runs,
		duration: h.duration,
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
}

// start launches the owner goroutine. Cancelling ctx kills a running script
// and drops whatever is queued; stop is the orderly end.
func (h *hookRunner) start(ctx context.Context) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started || h.closed {
		return
	}
	h.started = true
	ctx, h.cancel = context.WithCancel(ctx)
	go func() {
		defer close(h.done)
		defer func() { // stopped: what is still queued never runs
			h.mu.Lock()
			for _, j := range h.queue {
				j.finish(errHookNotRun)
			}
			h.queue = nil
			h.mu.Unlock()
		}()
		for {
			job, ok := h.next(ctx)
			if !ok {
				return
			}
			err := h.exec(ctx, job)
			if h.onDone != nil {
				h.onDone(job.event, job.env, err)
			}
			job.finish(err)
		}
	}()
}

// stop refuses new events, runs those already queued (each still bounded
// by hook_timeout; the on_follower hook of a shutdown is usually one of
// them) and waits for the owner goroutine.
func (h *hookRunner) stop() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.closed = true
	started := h.started
	h.mu.Unlock()
	h.signal()
	if !started {
		return
	}
	<-h.done
	h.cancel()
}

func (h *hookRunner) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// next waits for the next queued event; false once stopped and drained, or
// when ctx ends.
func (h *hookRunner) next(ctx context.Context) (hookJob, bool) {
	for {
		h.mu.Lock()
		if len(h.queue) > 0 {
			job := h.queue[0]
			h.queue[0] = hookJob{}
			h.queue = h.queue[1:]
			h.mu.Unlock()
			return job, true
		}
		closed := h.closed
		h.mu.Unlock()
		if closed {
			return hookJob{}, false
		}
		select {
		case <-ctx.Done():
			return hookJob{}, false
		case <-h.wake:
		}
	}
}

// run queues the hook of event (leader, follower or fault) and returns at
// once. An event without a configured script is ignored. ctx only carries
// values to the log records: a queued hook is not cancelled with it (a
// term that ended still gets its on_leader run before its on_follower).
//
// The returned channel is closed once the hook ran (successfully or not,
// and after the on_fault a failure triggers), or at once when it will
// never run (no script, dropped, shutting down).
func (h *hookRunner) run(ctx context.Context, event string, env hookEnv) <-chan error {
	if h == nil || h.scripts[event] == "" {
		return doneWith(nil)
	}
	done := make(chan error, 1)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.log.Warn("hook not run: node is shutting down", "hook", hookName(event), "event", event)
		return doneWith(fmt.Errorf("%s: %w: node is shutting down", hookName(event), errHookNotRun))
	}
	if len(h.queue) >= hookQueueMax {
		h.mu.Unlock()
		h.runs.WithLabelValues(hookName(event), hookDropped).Inc()
		h.log.Error("hook dropped: too many hooks queued", "hook", hookName(event), "event", event, "queued", hookQueueMax)
		return doneWith(fmt.Errorf("%s: %w: %d hooks queued", hookName(event), errHookNotRun, hookQueueMax))
	}
	h.queue = append(h.queue, hookJob{ctx: context.WithoutCancel(ctx), event: event, env: env, done: done})
	h.mu.Unlock()
	h.signal()
	return done
}

// env fills a hookEnv with this node's identity.
func (h *hookRunner) env(role string, state int32, reason string) hookEnv {
	return hookEnv{NodeID: h.nodeID, VIP: h.vip, SMState: state, Role: role, Reason: reason}
}

// leader queues on_leader after a takeover committed (cluster OnLeader);
// the channel yields its error and is closed when it has run.
func (h *hookRunner) leader(ctx context.Context, t fsm.Takeover, state int32) <-chan error {
	if h == nil {
		return doneWith(nil)
	}
	return h.run(ctx, hookEventLeader, h.env("leader", state, t.Reason))
}

// follower queues on_follower when leadership ended (cluster OnFollower)
// or at start (cluster.StopStart); the channel yields its error and is closed
// when it has run.
func (h *hookRunner) follower(state int32, reason string) <-chan error {
	if h == nil {
		return doneWith(nil)
	}
	return h.run(context.Background(), hookEventFollower, h.env("follower", state, reason))
}

// fault queues on_fault for a fault the node cannot fix (cluster OnFault).
func (h *hookRunner) fault(role string, state int32, reason string, err error) {
	if h == nil {
		return
	}
	if err != nil {
		reason = reason + ": " + err.Error()
	}
	h.run(context.Background(), hookEventFault, h.env(role, state, reason))
}

// lastFailure is the last hook run that failed or timed out, or nil.
func (h *hookRunner) lastFailure() *admin.HookFailure {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		return nil
	}
	f := *h.last
	return &f
}

// exec runs one hook to the end; a failed on_leader/on_follower is
// followed at once by on_fault (a failed on_fault is only recorded).
func (h *hookRunner) exec(ctx context.Context, job hookJob) error {
	name := hookName(job.event)
	tail, err := h.execScript(ctx, job)
	if err == nil {
		return nil
	}
	h.mu.Lock()
	h.last = &admin.HookFailure{Hook: name, Event: job.event, Reason: job.env.Reason, At: time.Now().UTC(), Err: err.Error(), Output: tail}
	h.mu.Unlock()
	if job.event == hookEventFault || h.scripts[hookEventFault] == "" || ctx.Err() != nil {
		return err
	}
	fault := job
	fault.event = hookEventFault
	fault.env.Reason = fmt.Sprintf("hook %s failed: %v", name, err)
	h.exec(ctx, fault) // runs on_fault once: its own failure stops here
	return err
}

// execScript runs the script of job.event in its own process group, killed
// (the whole group) after hook_timeout; it logs the output line by line and
// returns the output's last lines and the error (nil on exit status 0).
func (h *hookRunner) execScript(ctx context.Context, job hookJob) (string, error) {
	name := hookName(job.event)
	script := h.scripts[job.event]
	log := h.log.With("hook", name, "event", job.event)
	tctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()

	cmd := exec.CommandContext(tctx, script)
	cmd.Env = append(os.Environ(),
		"NSMD_EVENT="+job.event,
		"NSMD_NODE_ID="+job.env.NodeID,
		"NSMD_VIP="+job.env.VIP,
		fmt.Sprintf("NSMD_SM_STATE=%d", job.env.SMState),
		"NSMD_ROLE="+job.env.Role,
		"NSMD_REASON="+job.env.Reason,
	)
	cmd.Env = append(cmd.Env, h.fixedEnv...)
	cmd.Env = append(cmd.Env, job.env.Extra...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The script and everything it started: the group has its pid.
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		return nil
	}
	cmd.WaitDelay = hookWaitDelay
	out := &hookOutput{ctx: job.ctx, log: log}
	stdout, stderr := out.writer(hookLogStdout), out.writer(hookLogStderr)
	cmd.Stdout, cmd.Stderr = stdout, stderr

	log.InfoContext(job.ctx, "running hook", "script", script, "sm_state", job.env.SMState, "reason", job.env.Reason)
	start := time.Now()
	if h.onStart != nil {
		h.onStart(job.event, job.env.SMState, start)
	}
	err := cmd.Run()
	took := time.Since(start)
	stdout.flush()
	stderr.flush()
	h.duration.WithLabelValues(name).Observe(took.Seconds())

	result := hookOK
	switch {
	case err == nil:
	case errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success():
		// The script succeeded but left a child holding its output open.
		log.WarnContext(job.ctx, "hook exited 0 but a child kept its output open; no longer read", "script", script)
		err = nil
	case tctx.Err() == context.DeadlineExceeded && ctx.Err() == nil:
		result = hookTimeout
		err = fmt.Errorf("%s timed out after %v (process group killed)", script, h.timeout)
	case ctx.Err() != nil:
		result = hookFailed
		err = fmt.Errorf("%s killed: hook runner stopped: %w", script, err)
	default:
		result = hookFailed
		err = fmt.Errorf("%s: %w", script, err)
	}
	h.runs.WithLabelValues(name, result).Inc()
	if err != nil {
		log.ErrorContext(job.ctx, "hook failed", "result", result, "err", err, "took", took)
		return out.tailText(), err
	}
	log.InfoContext(job.ctx, "hook done", "exit", cmd.ProcessState.ExitCode(), "took", took)
	return "", nil
}

// hookOutput logs a script's stdout and stderr line by line and keeps the
// last lines of both for HookFailure.
type hookOutput struct {
	ctx context.Context
	log *slog.Logger

	mu   sync.Mutex
	tail []string
}

func (o *hookOutput) writer(stream string) *hookLineWriter {
	return &hookLineWriter{out: o, stream: stream}
}

func (o *hookOutput) line(stream string, b []byte) {
	s := strings.TrimRight(string(b), "\r")
	o.log.InfoContext(o.ctx, "hook output", "stream", stream, "line", s)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tail = append(o.tail, s)
	if len(o.tail) > hookTailLines {
		o.tail = o.tail[len(o.tail)-hookTailLines:]
	}
}

func (o *hookOutput) tailText() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := strings.Join(o.tail, "\n")
	if len(s) > hookTailBytes {
		s = s[len(s)-hookTailBytes:]
	}
	return s
}

// hookLineWriter splits one stream into lines. exec copies each stream
// from one goroutine, so buf needs no lock.
type hookLineWriter struct {
	out    *hookOutput
	stream string
	buf    []byte
}

func (w *hookLineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.out.line(w.stream, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	for len(w.buf) >= hookMaxLine {
		w.out.line(w.stream, w.buf[:hookMaxLine])
		w.buf = w.buf[hookMaxLine:]
	}
	if len(w.buf) == 0 {
		w.buf = nil
	}
	return len(p), nil
}

// flush logs an unterminated last line.
func (w *hookLineWriter) flush() {
	if len(w.buf) > 0 {
		w.out.line(w.stream, w.buf)
		w.buf = nil
	}
}
