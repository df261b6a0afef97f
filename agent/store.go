package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/timeline"
)

// Status is this node's view: GET /v1/status.
func (a *Agent) Status() admin.Status {
	r := a.node.RaftStatus()
	f := a.node.View()
	s := admin.Status{
		NodeID:        a.cfg.NodeID,
		ClusterID:     a.cfg.ClusterID,
		Version:       Build(),
		Role:          r.Role,
		RaftState:     r.Role,
		Witness:       a.cfg.Witness,
		LeaderID:      r.Leader,
		Term:          r.Term,
		SMState:       f.State(),
		Registrations: f.Count(),
		VIP:           a.cfg.VIP,
		VIPHeld:       a.VIPHeld(),
		NSMAddr:       a.NSMAddr().String(),
		AppliedIndex:  r.AppliedIndex,
		TLS:           a.sec.tls != nil,
		Ready:         a.node.Ready(),
		Disk:          diskJSON(a.node.Disk()),
		Insecure:      a.sec.exposures,
	}
	if g := f.GraceUntil(); !g.IsZero() {
		g = g.UTC()
		s.GraceUntil = &g
	}
	s.Notify.Pending, s.Notify.Done, s.Notify.Failed = a.notifier.Progress()
	s.Notify.State, s.Notify.Targets = a.notifier.Current()
	s.LastHookFailure = a.hooks.lastFailure()
	s.NFSv4 = a.v4.status()
	s.Grace = graceJSON(a.v4.grace.Status(), a.v4.seen.lastSeen)
	s.Fence = a.fenceStatus()
	s.Process = &admin.Process{PID: os.Getpid(), Started: a.started.UTC(), BootID: a.bootID, InProcess: a.crashFn != nil}
	if tl := a.node.LastTimeline(); !tl.At(timeline.Elected).IsZero() {
		t := admin.TimelineOf(tl)
		s.Takeover = &t
	}
	if a.cfg.Witness {
		s.Role = "witness"
		s.WitnessHandoffs = a.node.Handoffs()
	}
	return s
}

// readyNow is /readyz's answer without waiting: a leader is known, this
// node knows the current incarnation's sm_state and has applied
// everything committed.
func (a *Agent) readyNow() bool {
	r := a.node.RaftStatus()
	return r.Leader != "" && a.node.Ready() && r.AppliedIndex >= r.CommitIndex
}

// adminStore is the agent as the admin API sees it (admin.Store).
type adminStore struct{ a *Agent }

var _ admin.Store = adminStore{}

func (s adminStore) Status() admin.Status { return s.a.Status() }

func (s adminStore) Members() []admin.Member {
	ms := s.a.node.Members()
	if ms == nil {
		return nil // JSON null, as always
	}
	out := make([]admin.Member, len(ms))
	for i, m := range ms {
		out[i] = memberJSON(m)
	}
	return out
}

func (s adminStore) Registrations(after fsm.MonID, limit int, monName string) []fsm.Registration {
	return s.a.node.View().Registrations(after, limit, monName)
}

// ServiceRegistrations are one service's own registrations (its scope).
func (s adminStore) ServiceRegistrations(service string, after fsm.MonID, limit int, monName string) ([]fsm.Registration, error) {
	if !slices.ContainsFunc(s.a.node.Services().View().State.Placements, func(p fsm.Placement) bool { return p.Service == service }) {
		return nil, fmt.Errorf("%w %q: the cluster has no placement record of it", admin.ErrUnknownService, service)
	}
	return s.a.node.Services().Registry(service).Registrations(after, limit, monName), nil
}

func (s adminStore) NFSv4Clients() admin.V4ClientPage { return s.a.v4.clients() }

func (s adminStore) LastTakeover() fsm.Takeover { return s.a.node.View().LastTakeover() }

func (s adminStore) Import(ctx context.Context, regs []fsm.Registration, state int32) (int32, error) {
	return s.a.node.Registry().Import(ctx, regs, state)
}

func (s adminStore) Crash() { s.a.crash() }

// Services is where the cluster's services run (agent/services.go).
func (s adminStore) Services() ([]admin.ServiceStatus, error) { return s.a.services(), nil }

// MoveService is an operator's move of one service (agent/services.go).
func (s adminStore) MoveService(ctx context.Context, service, to string) error {
	return s.a.moveService(ctx, service, to)
}

// ConfirmOff records an operator's confirmation that node is off (POST
// /v1/fence/confirm): the cluster refuses this node, the leader and a
// node that answers that it serves.
func (s adminStore) ConfirmOff(ctx context.Context, node, by string) error {
	err := s.a.node.ConfirmOff(ctx, node, by)
	if errors.Is(err, cluster.ErrConfirmRefused) {
		return admin.BadRequest(err)
	}
	return err
}

// TransferLeadership hands leadership over and waits (bounded) until this
// node has heard of the new leader: the transfer returns once the target
// started its election.
func (s adminStore) TransferLeadership(to string) (string, error) {
	if r := s.a.node.RaftStatus(); r.Role != "leader" {
		return "", fmt.Errorf("%w (leader: %q)", admin.ErrNotLeader, r.Leader)
	}
	if err := s.a.node.TransferLeadership(to); err != nil {
		if errors.Is(err, cluster.ErrWitnessTarget) || errors.Is(err, cluster.ErrUnknownTarget) {
			return "", admin.BadRequest(err)
		}
		return "", err
	}
	deadline := time.NewTimer(3 * time.Second)
	defer deadline.Stop()
	poll := time.NewTicker(10 * time.Millisecond) // raft may drop a leader observation
	defer poll.Stop()
	for {
		changed := s.a.node.ReadyChanged() // before the look: a change after it closes this
		if leader := s.a.node.Leader(); leader != "" && leader != s.a.cfg.NodeID {
			return leader, nil
		}
		select {
		case <-changed:
		case <-poll.C:
		case <-deadline.C:
			return s.a.node.Leader(), nil
		}
	}
}

// Ready waits until a leader is known and this node has applied everything
// committed at the time of the call and knows the current sm_state.
func (s adminStore) Ready(ctx context.Context) error {
	r := s.a.node.RaftStatus()
	if r.Leader == "" {
		return errors.New("no leader known")
	}
	if err := s.a.node.WaitApplied(ctx, r.CommitIndex); err != nil {
		if errors.Is(err, cluster.ErrNotReadyYet) {
			return errors.New("current sm_state not known yet (this term's takeover not applied here); NSM calls get no answer")
		}
		return fmt.Errorf("applied %d < commit %d", s.a.node.View().AppliedIndex(), r.CommitIndex)
	}
	return nil
}

// readBootID is the kernel's boot id, "" where it has none.
func readBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
