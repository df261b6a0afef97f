package nlm

import "time"

// Grace is the lock manager's grace window: after a server incarnation
// starts (a takeover), only lock reclaims are granted until Until, so that
// clients notified through NSM can reclaim the locks they held before
// anyone else takes them. A zero Grace is never active.
type Grace struct {
	Until time.Time
}

// NewGrace opens a grace window of period starting at start.
func NewGrace(start time.Time, period time.Duration) Grace {
	if period <= 0 {
		return Grace{}
	}
	return Grace{Until: start.Add(period)}
}

// Active reports whether now is inside the window.
func (g Grace) Active(now time.Time) bool {
	return !g.Until.IsZero() && now.Before(g.Until)
}

// Remaining is how long the window still lasts at now (0 when over).
func (g Grace) Remaining(now time.Time) time.Duration {
	if !g.Active(now) {
		return 0
	}
	return g.Until.Sub(now)
}
