// Package ctxtime waits for a duration or a context, whichever ends first.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits d and reports true, or false as soon as ctx ends first.
// d ≤ 0 returns at once, true unless ctx has ended.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
