package nsm

import (
	"context"
	"fmt"

	"github.com/nsmd/nsmd/oncrpc"
)

// unmonAll is SM_UNMON_ALL (XNFS NSM procedure 4): my_id → sm_stat. It
// stops monitoring every host for this my_id (my_name + prog, vers, proc).
// Refusals answer the current state and registry errors −1, as SM_UNMON.
func (s *Service) unmonAll(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	var args MyID
	if err := decodeArgs(c, "SM_UNMON_ALL", &args); err != nil {
		return err
	}
	out := SMStat{State: s.reg.State()}
	if err := s.unmonitorAll(ctx, c, &args, &out); err != nil {
		s.refuse("SM_UNMON_ALL", c, err, "my_name", args.MyName)
	}
	out.MarshalXDR(res)
	return nil
}

func (s *Service) unmonitorAll(ctx context.Context, c *oncrpc.Call, args *MyID, out *SMStat) error {
	if !s.trusted(c.Remote) {
		return ErrUntrusted
	}
	if !ValidName(args.MyName) {
		return fmt.Errorf("my_name %q: %w", args.MyName, ErrBadName)
	}
	s.log.Debug("SM_UNMON_ALL", "my_name", args.MyName, "from", c.Remote.String())
	if s.keepUnmon("SM_UNMON_ALL", c) {
		out.State = s.reg.State()
		return nil
	}
	state, err := s.reg.UnmonitorAll(ctx, args.FSM(), s.owner(c))
	if err != nil {
		out.State = -1
		return fmt.Errorf("nsm: unmonitor all of %q: %w", args.MyName, err)
	}
	out.State = state
	return nil
}
