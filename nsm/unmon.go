package nsm

import (
	"context"
	"fmt"

	"github.com/nsmd/nsmd/oncrpc"
)

// unmon is SM_UNMON (XNFS NSM procedure 3): mon_id → sm_stat. It stops
// monitoring mon_name for exactly this my_id (mon_name + my_name + prog,
// vers, proc, as rpc.statd matches).
//
// sm_stat has no failure field. rpc.statd answers a refused SM_UNMON
// (untrusted caller, bad name) with its current state, and so does nsmd:
// lock managers ignore the value, and a refusal changes nothing. A
// registry error (the removal may not have been committed) is state −1.
func (s *Service) unmon(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	var args MonID
	if err := decodeArgs(c, "SM_UNMON", &args); err != nil {
		return err
	}
	out := SMStat{State: s.reg.State()}
	if err := s.unmonitor(ctx, c, &args, &out); err != nil {
		s.refuse("SM_UNMON", c, err, "mon_name", args.MonName, "my_name", args.My.MyName)
	}
	out.MarshalXDR(res)
	return nil
}

func (s *Service) unmonitor(ctx context.Context, c *oncrpc.Call, args *MonID, out *SMStat) error {
	if !s.trusted(c.Remote) {
		return ErrUntrusted
	}
	if !ValidName(args.MonName) {
		return fmt.Errorf("mon_name %q: %w", args.MonName, ErrBadName)
	}
	if !ValidName(args.My.MyName) {
		return fmt.Errorf("my_name %q: %w", args.My.MyName, ErrBadName)
	}
	s.log.Debug("SM_UNMON", "mon_name", args.MonName, "my_name", args.My.MyName, "from", c.Remote.String())
	if s.keepUnmon("SM_UNMON", c) {
		out.State = s.reg.State()
		return nil
	}
	state, err := s.reg.Unmonitor(ctx, args.FSM(), s.owner(c))
	if err != nil {
		out.State = -1
		return fmt.Errorf("nsm: unmonitor %q: %w", args.MonName, err)
	}
	out.State = state
	return nil
}

// keepUnmon reports whether an unmonitor is answered without removing
// anything: this node does not serve now (Config.UnmonCounts).
func (s *Service) keepUnmon(proc string, c *oncrpc.Call) bool {
	if s.cfg.UnmonCounts == nil || s.cfg.UnmonCounts() {
		return false
	}
	s.log.Debug(proc+" kept: this node does not serve now; its lock manager stops with the NFS server, and the next server must still notify these hosts", "from", c.Remote.String())
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.unmonKept.Inc()
	}
	return true
}
