package nsm

import (
	"context"
	"fmt"

	"github.com/nsmd/nsmd/oncrpc"
)

// simuCrash is SM_SIMU_CRASH (XNFS NSM procedure 5): void → void. It
// simulates a crash of this server: nsmd treats it as a failover (the
// registry raises the state and notifies every monitored host). As
// rpc.statd, only a trusted caller from a privileged source port (< 1024)
// may ask. The reply is void whatever happened; refusals and errors are
// logged and counted.
func (s *Service) simuCrash(ctx context.Context, c *oncrpc.Call, _ *oncrpc.Writer) error {
	if err := decodeArgs(c, "SM_SIMU_CRASH", nil); err != nil {
		return err
	}
	var err error
	switch {
	case !s.trusted(c.Remote):
		err = ErrUntrusted
	case !privileged(c.Remote):
		err = fmt.Errorf("source port %d: %w", c.Remote.Port(), ErrNotPrivileged)
	default:
		if err = s.reg.SimuCrash(ctx); err != nil {
			err = fmt.Errorf("nsm: simulated crash: %w", err)
		}
	}
	if err != nil {
		s.refuse("SM_SIMU_CRASH", c, err)
		return nil
	}
	s.log.Info("SM_SIMU_CRASH: simulated crash", "caller", c.Remote.String())
	return nil
}
