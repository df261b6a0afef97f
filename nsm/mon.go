package nsm

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// mon is SM_MON (XNFS NSM procedure 2): mon → sm_stat_res. It asks this
// server to monitor mon_name and to call my_id back with priv when that
// host reboots. As rpc.statd: only trusted callers; my_prog must be NLM and
// my_proc its callback (16 or 24); mon_name and my_name must be valid and
// mon_name must resolve. A repeat of the same mon_name + my_id replaces the
// earlier registration (the new cookie wins: the registry keys on MonID).
//
// The reply stat_succ + state is sent only after Registry.Monitor returned,
// i.e. after the registration is committed. Every refusal or error is
// stat_fail with state −1 and changes nothing.
func (s *Service) mon(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	var args Mon
	if err := decodeArgs(c, "SM_MON", &args); err != nil {
		return err
	}
	state, err := s.monitor(ctx, c, &args)
	out := SMStatRes{Res: StatSucc, State: state}
	if err != nil {
		s.refuse("SM_MON", c, err, "mon_name", args.ID.MonName, "my_name", args.ID.My.MyName)
		out = SMStatRes{Res: StatFail, State: -1}
	}
	out.MarshalXDR(res)
	return nil
}

func (s *Service) monitor(ctx context.Context, c *oncrpc.Call, args *Mon) (int32, error) {
	if !s.trusted(c.Remote) {
		return 0, ErrUntrusted
	}
	if err := s.checkMyID(args.ID.My); err != nil {
		return 0, err
	}
	if !ValidName(args.ID.MonName) {
		return 0, fmt.Errorf("mon_name %q: %w", args.ID.MonName, ErrBadName)
	}
	if err := s.checkCap(args.ID.FSM()); err != nil {
		return 0, err
	}
	addrs, err := s.monAddrs(ctx, args.ID.MonName)
	if err != nil {
		return 0, err
	}
	if err := s.checkUnpriv(c, args.ID.MonName); err != nil {
		return 0, err
	}
	s.log.Debug("SM_MON", "mon_name", args.ID.MonName, "my_name", args.ID.My.MyName, "from", c.Remote.String())
	state, err := s.reg.Monitor(ctx, s.registration(c, args, addrs))
	if err != nil {
		return 0, fmt.Errorf("nsm: monitor %q: %w", args.ID.MonName, err)
	}
	return state, nil
}

// monAddrs returns mon_name's addresses. An IP literal is its own address
// (it always resolves, as for rpc.statd), so it skips the resolver and the
// per-call deadline that a lookup needs: at 64 connections that deadline
// (a timer and a child of the server's context) was ~5 % of the CPU spent
// per SM_MON. Any other name goes through Config.Resolve.
func (s *Service) monAddrs(ctx context.Context, name string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(name); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	return s.resolve(ctx, name)
}

// checkCap refuses an SM_MON that would add a registration beyond
// Config.MaxRegistrations. It reads this node's state, so SM_MONs in
// flight on several nodes may overshoot the cap by their number.
func (s *Service) checkCap(id fsm.MonID) error {
	c, ok := s.reg.(Counter)
	if s.cfg.MaxRegistrations <= 0 || !ok {
		return nil
	}
	if n := c.Count(); n >= s.cfg.MaxRegistrations && !c.Has(id) {
		return fmt.Errorf("%d registrations, max_registrations %d: %w", n, s.cfg.MaxRegistrations, ErrTooMany)
	}
	return nil
}

// checkUnpriv refuses an SM_MON from loopback and an unprivileged source
// port that would monitor a new host beyond the bound (monLimiter). A
// privileged caller (lockd, a lock manager running as root), a trusted
// remote caller, and an SM_MON of a host already monitored are not
// counted.
func (s *Service) checkUnpriv(c *oncrpc.Call, monName string) error {
	if s.monLimit == nil || privileged(c.Remote) || !isLoopback(c.Remote) {
		return nil
	}
	if s.reg.(HostChecker).Monitored(monName) {
		return nil
	}
	if !s.monLimit.take(s.cfg.Now()) {
		return fmt.Errorf("mon_name %q from %v: %w (mon_unprivileged_burst %d, one more every %v)",
			monName, c.Remote, ErrUnprivLimit, s.cfg.MonUnprivBurst, s.cfg.MonUnprivEvery)
	}
	return nil
}
