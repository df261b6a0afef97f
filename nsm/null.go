package nsm

import (
	"context"

	"github.com/nsmd/nsmd/oncrpc"
)

// null is SM_NULL (XNFS NSM procedure 0): void → void, a ping.
func (s *Service) null(_ context.Context, c *oncrpc.Call, _ *oncrpc.Writer) error {
	return decodeArgs(c, "SM_NULL", nil)
}
