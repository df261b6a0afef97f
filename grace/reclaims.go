package grace

import (
	"slices"
	"sync"
	"time"
)

// Reasons a grace period ended (GraceEnd.Reason).
const (
	// ReasonNothingToReclaim: no client of that lock manager could hold a
	// lock to reclaim (no monitored host; no NFSv4 client record).
	ReasonNothingToReclaim = "nothing_to_reclaim"
	// ReasonAllReclaimed: every client that could reclaim came back and
	// reclaims were quiet for the settle time.
	ReasonAllReclaimed = "all_reclaimed"
	// ReasonKernel: the kernel ended it itself — its timer ran out, or (for
	// NFSv4) every recorded client sent RECLAIM_COMPLETE.
	ReasonKernel = "kernel"
)

// ReclaimPlan is what a new server incarnation expects to be reclaimed,
// fixed when it starts serving.
type ReclaimPlan struct {
	// NLMHosts are the hosts monitored when the takeover committed: each
	// was sent SM_NOTIFY, and one that held NLM locks reclaims them, which
	// makes this server's lockd monitor it again (SM_MON).
	NLMHosts []string
	// V4Clients are the NFSv4 client records of the recovery epoch: the
	// clients that may reclaim. Each that does re-creates its record in the
	// new epoch (a Cld_Create upcall: an NFSv4.1+ client's RECLAIM_COMPLETE,
	// an NFSv4.0 client's first confirmed reclaim).
	V4Clients []string
	// Settle is how long reclaims must have been quiet after the last
	// expected client came back before grace may end.
	Settle time.Duration
}

// Reclaims applies nsmd's grace rule to one server incarnation (DESIGN.md,
// "When grace ends"): a lock manager's grace may end early when every
// client of it that could hold a lock has come back and no reclaim has been
// seen for Settle — or at once when there is no such client. Until then the
// kernel's own timer (the configured grace) stays in charge. It is safe for
// concurrent use.
type Reclaims struct {
	settle time.Duration

	mu   sync.Mutex
	want map[Manager]map[string]bool // expected clients
	seen map[Manager]map[string]bool // clients that came back (expected or not)
	left map[Manager]int             // expected and not seen yet
	// last is when the last reclaim activity was seen: a client coming
	// back, or any new lock (during grace only reclaims get locks).
	last time.Time
}

// NewReclaims starts tracking plan at now.
func NewReclaims(plan ReclaimPlan, now time.Time) *Reclaims {
	r := &Reclaims{
		settle: plan.Settle,
		want:   map[Manager]map[string]bool{},
		seen:   map[Manager]map[string]bool{NLM: {}, NFSv4: {}},
		left:   map[Manager]int{},
		last:   now,
	}
	r.expect(NLM, plan.NLMHosts)
	r.expect(NFSv4, plan.V4Clients)
	return r
}

// expect sets the expected clients of m; those already seen count as back.
func (r *Reclaims) expect(m Manager, names []string) {
	want := make(map[string]bool, len(names))
	left := 0
	for _, n := range names {
		if want[n] {
			continue
		}
		want[n] = true
		if !r.seen[m][n] {
			left++
		}
	}
	r.want[m], r.left[m] = want, left
}

// Back records that client name of manager m came back at t (an SM_MON for
// that host from this server's lockd; a Cld_Create for that NFSv4 client,
// or an NFSv4.0 client confirmed by nfsd). The first time a client comes
// back is reclaim activity, expected client or not; a repeat is not.
func (r *Reclaims) Back(m Manager, name string, t time.Time) { r.back(m, name, t) }

// back is Back; it says whether name came back now for the first time,
// and whether it was the last expected client of m still out.
func (r *Reclaims) back(m Manager, name string, t time.Time) (first, last bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen[m][name] {
		return false, false
	}
	r.seen[m][name] = true
	r.activity(t)
	if r.want[m][name] {
		r.left[m]--
		return true, r.left[m] == 0
	}
	return true, false
}

// LastActivity is when reclaim activity was last seen (a client back, a
// new lock), or the start.
func (r *Reclaims) LastActivity() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Activity records reclaim activity at t (a new lock appeared while in grace).
func (r *Reclaims) Activity(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.activity(t)
}

func (r *Reclaims) activity(t time.Time) {
	if t.After(r.last) {
		r.last = t
	}
}

// MayEnd reports whether manager m's grace may end at now, and why; when
// it may not yet, wait is how long at least until it might (0: unknown,
// waiting for clients).
func (r *Reclaims) MayEnd(m Manager, now time.Time) (ok bool, reason string, wait time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.want[m]) == 0 {
		return true, ReasonNothingToReclaim, 0
	}
	if r.left[m] > 0 {
		return false, "", 0
	}
	quiet := now.Sub(r.last)
	if quiet >= r.settle {
		return true, ReasonAllReclaimed, 0
	}
	return false, "", r.settle - quiet
}

// Missing lists up to max expected clients of m that have not come back,
// sorted (for status and logs).
func (r *Reclaims) Missing(m Manager, max int) []string {
	r.mu.Lock()
	var out []string
	for n := range r.want[m] {
		if !r.seen[m][n] {
			out = append(out, n)
		}
	}
	r.mu.Unlock()
	slices.Sort(out)
	if max >= 0 && len(out) > max {
		out = out[:max]
	}
	return out
}

// Progress returns how many expected clients of m came back, of how many.
func (r *Reclaims) Progress(m Manager) (back, expected int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.want[m]) - r.left[m], len(r.want[m])
}
