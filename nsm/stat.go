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
func (s *Service) stat(_ context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	var args SMName
	if err := decodeArgs(c, "SM_STAT", &args); err != nil {
		return err
	}
	out := SMStatRes{Res: StatSucc, State: s.reg.State()}
	if !ValidName(args.MonName) {
		out.Res = StatFail
	}
	out.MarshalXDR(res)
	return nil
}
