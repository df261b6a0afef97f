package nsm

import (
	"context"

	"github.com/nsmd/nsmd/oncrpc"
)

// stat is SM_STAT (XNFS NSM procedure 1): sm_name → sm_stat_res. It
// returns this server's own state and registers nothing. rpc.statd answers
// stat_fail when mon_name does not resolve; nsmd does not resolve here (a
// read must stay local and cheap) and answers stat_fail only for a name it
// would never monitor (empty, with '/', or starting with '.'). Either way
// the state is ours, as statd returns it.
//
// The state comes from Registry.ReadState: on a follower the leader
// confirms it (the checked fault schedules saw a follower answer the
// previous state in the instant a leadership transfer took effect). When
// it cannot be confirmed the call gets no reply, as when not ready.
func (s *Service) stat(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	var args SMName
	if err := decodeArgs(c, "SM_STAT", &args); err != nil {
		return err
	}
	state, err := s.reg.ReadState(ctx)
	if err != nil {
		return s.notReady(c)
	}
	out := SMStatRes{Res: StatSucc, State: state}
	if !ValidName(args.MonName) {
		out.Res = StatFail
	}
	out.MarshalXDR(res)
	return nil
}
