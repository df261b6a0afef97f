package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"
)

// sdNotifier speaks systemd's service notification protocol (sd_notify(3)):
// each message is one datagram of NAME=value lines sent to the unix socket
// named by $NOTIFY_SOCKET (a leading '@' is the abstract namespace, which
// Go's unix addresses handle themselves).
type sdNotifier struct {
	conn *net.UnixConn
}

// newSDNotifier connects to $NOTIFY_SOCKET; nil, nil when it is unset (not
// started by systemd with Type=notify).
func newSDNotifier(getenv func(string) string) (*sdNotifier, error) {
	path := getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil, nil
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("systemd notify socket %s: %w", path, err)
	}
	return &sdNotifier{conn: conn}, nil
}

func (n *sdNotifier) notify(state string) error {
	if _, err := n.conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify %q: %w", state, err)
	}
	return nil
}

// watchdogInterval is the watchdog timeout systemd asks this process to
// keep fed ($WATCHDOG_USEC, for $WATCHDOG_PID if set), or 0.
func watchdogInterval(getenv func(string) string, pid int) time.Duration {
	usec, err := strconv.ParseUint(getenv("WATCHDOG_USEC"), 10, 63)
	if err != nil || usec == 0 {
		return 0
	}
	if p := getenv("WATCHDOG_PID"); p != "" && p != strconv.Itoa(pid) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond
}

// SystemdNotify tells systemd about one agent: READY=1 once the node is
// ready as /readyz defines it, WATCHDOG=1 every half watchdog interval
// while the node's state machine answers, STOPPING=1 at shutdown.
type SystemdNotify struct {
	n      *sdNotifier
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// readyPoll is how often readiness is checked until the node is ready.
const readyPoll = 50 * time.Millisecond

// StartSystemdNotify starts the notifier goroutine of a, the agent of
// process pid, told about systemd by getenv (os.Getenv); it does nothing
// (and Stop is a no-op) outside a systemd notify service.
func StartSystemdNotify(a *Agent, getenv func(string) string, pid int, log *slog.Logger) (*SystemdNotify, error) {
	n, err := newSDNotifier(getenv)
	if err != nil || n == nil {
		return &SystemdNotify{}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &SystemdNotify{n: n, cancel: cancel}
	wd := watchdogInterval(getenv, pid)
	s.wg.Go(func() { s.run(ctx, a, wd, log) })
	return s, nil
}

func (s *SystemdNotify) run(ctx context.Context, a *Agent, wd time.Duration, log *slog.Logger) {
	send := func(state string) {
		if err := s.n.notify(state); err != nil {
			log.Warn("systemd notification failed", "err", err)
		}
	}
	var feed <-chan time.Time
	if wd > 0 {
		t := time.NewTicker(wd / 2)
		defer t.Stop()
		feed = t.C
		send("WATCHDOG=1")
	}
	poll := time.NewTicker(readyPoll)
	defer poll.Stop()
	send("STATUS=waiting for a leader and the current sm_state")
	for {
		select {
		case <-ctx.Done():
			return
		case <-feed:
			// Reading the FSM takes its lock: a node wedged there stops
			// feeding the watchdog and systemd restarts it.
			a.node.View().State()
			send("WATCHDOG=1")
		case <-poll.C:
			if !a.readyNow() {
				continue
			}
			leader := a.node.Leader()
			send(fmt.Sprintf("READY=1\nSTATUS=ready: sm_state %d, leader %s", a.node.View().State(), leader))
			log.Info("told systemd the node is ready")
			poll.Stop()
		}
	}
}

// Stopping tells systemd the service is stopping; the watchdog stays fed
// while the agent shuts down (a leadership transfer, the on_follower hook).
func (s *SystemdNotify) Stopping() {
	if s.n != nil {
		s.n.notify("STOPPING=1")
	}
}

// Stop ends the goroutine and closes the socket.
func (s *SystemdNotify) Stop() {
	if s.n == nil {
		return
	}
	s.cancel()
	s.wg.Wait()
	s.n.conn.Close()
}
