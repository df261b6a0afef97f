package placement

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// Decl is what one node's configuration declares of one service: the
// fingerprint of its specification (which covers Prefer) and its
// preferred servers, most preferred first (fsm.ServiceDecl).
type Decl struct {
	Fingerprint string
	Prefer      []string
}

// Server is a member of the cluster. Healthy is the caller's verdict
// (alive, not draining, disk not slow, …); a witness never owns a
// service. Ids are unique.
type Server struct {
	ID      string
	Healthy bool
	Witness bool
}

// Placement is a service's latest committed placement: its owner (""
// when unplaced) and its epoch.
type Placement struct {
	Owner string
	Epoch uint64
}

// Policy tunes the decision (doc.go says why each exists).
type Policy struct {
	// Failback moves a service whose owner is healthy to an eligible
	// server earlier in its Prefer list (one that came back).
	Failback bool
	// Settling holds services without an owner (the settle period after
	// the cluster starts); services whose owner is lost still move.
	Settling bool
	// MaxMoves bounds the moves of one decision; 0: no bound.
	MaxMoves int
}

// Input is everything a decision depends on.
type Input struct {
	Servers []Server
	// Declared maps a node to the services its configuration declares
	// (service id → declaration): the replicated declarations, so every
	// leader decides on the same. Only members' (Servers') declarations
	// count. A service's preferences are those of its agreed declaration.
	Declared map[string]map[string]Decl
	// Placements maps a service to its latest placement; a service not
	// in it is unplaced at EpochFloor (fsm.ServiceState.EpochFloor).
	Placements map[string]Placement
	EpochFloor uint64
	Policy     Policy
}

// Move is one placement to commit: Service goes from From ("" if it had
// no owner) to To ("" takes it away) at Epoch, its current epoch + 1
// (fsm.ServicePlaced{Service, Node: To, Epoch, Reason, From}).
type Move struct {
	Service string
	From    string
	To      string
	Epoch   uint64
	Reason  string
}

// The reasons of moves.
const (
	ReasonPlaced     = "placed"             // it had no owner
	ReasonOwnerLost  = "owner_lost"         // its owner is unhealthy or no longer a member
	ReasonIneligible = "owner_cannot_serve" // its owner is a witness, or no longer declares it with the agreed fingerprint
	ReasonUndeclared = "undeclared"         // no member declares it any more
	ReasonFailback   = "failback"           // a more preferred server is eligible (Policy.Failback)
	ReasonOperator   = "operator"           // PlanMove
	ReasonRestarted  = "restarted"          // its owner serves it anew: a new epoch on the same server
)

// Hold is a service that should move or be placed but is not, and why
// (for the status): a conflict of declarations, no eligible server, the
// settle period, the move bound.
type Hold struct {
	Service  string
	Owner    string
	Conflict bool // the members' declarations of it differ
	Reason   string
}

// Decision is what Decide returns: the moves to commit, in order, and
// the services held.
type Decision struct {
	Moves []Move
	Holds []Hold
}

var (
	// ErrUnknownService: no member declares the service and it has no placement.
	ErrUnknownService = errors.New("placement: unknown service")
	// ErrUnknownServer: the target is not a member of the cluster.
	ErrUnknownServer = errors.New("placement: not a member of the cluster")
	// ErrWitness: the target is a witness, which never serves.
	ErrWitness = errors.New("placement: a witness never owns a service")
	// ErrNotDeclared: the target's configuration does not declare the
	// service (with the agreed fingerprint).
	ErrNotDeclared = errors.New("placement: the server does not declare the service")
	// ErrConflict: the members' declarations of the service differ.
	ErrConflict = errors.New("placement: the servers' declarations of the service differ")
	// ErrUnhealthy: the target is not healthy.
	ErrUnhealthy = errors.New("placement: the server is not healthy")
	// ErrAlreadyThere: the target owns the service already.
	ErrAlreadyThere = errors.New("placement: the service runs there already")
)

// IsRefusal reports whether err is one of PlanMove's refusals above.
func IsRefusal(err error) bool {
	for _, e := range []error{ErrUnknownService, ErrUnknownServer, ErrWitness, ErrNotDeclared, ErrConflict, ErrUnhealthy, ErrAlreadyThere} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// view is an Input indexed for one decision.
type view struct {
	in      Input
	servers map[string]Server
	ids     []string // of servers, sorted
	prefer  map[string][]string
	agreed  map[string]string // service → agreed fingerprint (no conflict, ≥ 1 declarer)
	differ  map[string]string // service → description of its conflict
	load    map[string]int    // server → services it owns (moves of this decision included)
}

// anyRank lets best consider every eligible server.
const anyRank = math.MaxInt

func newView(in Input) *view {
	v := &view{in: in, servers: map[string]Server{}, prefer: map[string][]string{},
		agreed: map[string]string{}, differ: map[string]string{}, load: map[string]int{}}
	for _, s := range in.Servers {
		if _, dup := v.servers[s.ID]; !dup {
			v.servers[s.ID] = s
		}
	}
	v.ids = slices.Sorted(maps.Keys(v.servers))
	byFP := map[string]map[string][]string{} // service → fingerprint → nodes
	for _, node := range slices.Sorted(maps.Keys(in.Declared)) {
		if _, member := v.servers[node]; !member {
			continue
		}
		for id, d := range in.Declared[node] {
			if byFP[id] == nil {
				byFP[id] = map[string][]string{}
				v.prefer[id] = d.Prefer // the first member's, by id
			}
			byFP[id][d.Fingerprint] = append(byFP[id][d.Fingerprint], node)
		}
	}
	for id, fps := range byFP {
		if len(fps) == 1 {
			for fp := range fps {
				v.agreed[id] = fp
			}
			continue
		}
		var parts []string
		for _, fp := range slices.Sorted(maps.Keys(fps)) {
			parts = append(parts, fmt.Sprintf("%s on %s", fp, strings.Join(fps[fp], ", ")))
		}
		v.differ[id] = strings.Join(parts, "; ")
	}
	for _, p := range in.Placements {
		if p.Owner != "" {
			v.load[p.Owner]++
		}
	}
	return v
}

// current is service's latest placement.
func (v *view) current(id string) Placement {
	if p, ok := v.in.Placements[id]; ok {
		return p
	}
	return Placement{Epoch: v.in.EpochFloor}
}

// serves reports whether node may own service apart from its health: a
// member, not a witness, declaring it with the agreed fingerprint.
func (v *view) serves(node, service string) bool {
	s, ok := v.servers[node]
	if !ok || s.Witness {
		return false
	}
	fp, ok := v.agreed[service]
	d, declared := v.in.Declared[node][service]
	return ok && declared && d.Fingerprint == fp
}

func (v *view) eligible(node, service string) bool {
	return v.serves(node, service) && v.servers[node].Healthy
}

// rank is node's position in service's Prefer list (len when absent).
func (v *view) rank(service, node string) int {
	p := v.prefer[service]
	if i := slices.Index(p, node); i >= 0 {
		return i
	}
	return len(p)
}

// best is the eligible server for service that comes first by
// preference, then fewest services, then id; "" when none is eligible.
// Only servers ranked below maxRank are considered.
func (v *view) best(service string, maxRank int) string {
	bestID := ""
	for _, id := range v.ids {
		if !v.eligible(id, service) || v.rank(service, id) >= maxRank {
			continue
		}
		if bestID == "" || cmp.Or(cmp.Compare(v.rank(service, id), v.rank(service, bestID)), cmp.Compare(v.load[id], v.load[bestID])) < 0 {
			bestID = id
		}
	}
	return bestID
}

// services lists every service the decision covers — those members
// declare, those with a placement — those with preferences first, then
// by id.
func (v *view) services() []string {
	set := map[string]bool{}
	for id := range v.agreed {
		set[id] = true
	}
	for id := range v.differ {
		set[id] = true
	}
	for id := range v.in.Placements {
		set[id] = true
	}
	ids := slices.Collect(maps.Keys(set))
	slices.SortFunc(ids, func(a, b string) int {
		return cmp.Or(cmp.Compare(boolInt(len(v.prefer[a]) == 0), boolInt(len(v.prefer[b]) == 0)), cmp.Compare(a, b))
	})
	return ids
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Decide returns the moves that bring every service to where the rules
// (doc.go) put it, and the services held.
func Decide(in Input) Decision {
	v := newView(in)
	var d Decision
	for _, id := range v.services() {
		m, h, ok := v.decide(id)
		if h != nil {
			d.Holds = append(d.Holds, *h)
		}
		if !ok {
			continue
		}
		if m.From != "" {
			v.load[m.From]--
		}
		if m.To != "" {
			v.load[m.To]++
		}
		d.Moves = append(d.Moves, m)
	}
	if n := in.Policy.MaxMoves; n > 0 && len(d.Moves) > n {
		slices.SortStableFunc(d.Moves, func(a, b Move) int { return cmp.Compare(priority(a.Reason), priority(b.Reason)) })
		for _, m := range d.Moves[n:] {
			d.Holds = append(d.Holds, Hold{Service: m.Service, Owner: m.From,
				Reason: fmt.Sprintf("waiting for the next decision (at most %d moves at once): %s to %q", n, m.Reason, m.To)})
		}
		d.Moves = d.Moves[:n]
	}
	slices.SortFunc(d.Holds, func(a, b Hold) int { return cmp.Compare(a.Service, b.Service) })
	return d
}

func priority(reason string) int {
	switch reason {
	case ReasonPlaced:
		return 1
	case ReasonFailback:
		return 2
	}
	return 0 // restoring a service: owner lost or unable, nobody declares it
}

// decide is one service's rule; ok says whether m is a move.
func (v *view) decide(id string) (m Move, h *Hold, ok bool) {
	cur := v.current(id)
	move := func(to, reason string) (Move, *Hold, bool) {
		return Move{Service: id, From: cur.Owner, To: to, Epoch: cur.Epoch + 1, Reason: reason}, nil, true
	}
	hold := func(conflict bool, format string, args ...any) (Move, *Hold, bool) {
		return Move{}, &Hold{Service: id, Owner: cur.Owner, Conflict: conflict, Reason: fmt.Sprintf(format, args...)}, false
	}
	if c, ok := v.differ[id]; ok {
		if cur.Owner != "" {
			return hold(true, "the servers' declarations differ (%s): it stays on %s and is not moved until they agree", c, cur.Owner)
		}
		return hold(true, "the servers' declarations differ (%s): it is not placed until they agree", c)
	}
	if _, declared := v.agreed[id]; !declared {
		if cur.Owner != "" {
			return move("", ReasonUndeclared)
		}
		return hold(false, "no server declares it")
	}
	owner, member := v.servers[cur.Owner]
	switch {
	case cur.Owner == "":
		if v.in.Policy.Settling {
			return hold(false, "settling: waiting for the servers to join before placing it")
		}
		if to := v.best(id, anyRank); to != "" {
			return move(to, ReasonPlaced)
		}
		return hold(false, "no healthy server declares it")
	case v.eligible(cur.Owner, id):
		if v.in.Policy.Failback {
			if to := v.best(id, v.rank(id, cur.Owner)); to != "" {
				return move(to, ReasonFailback)
			}
		}
		return Move{}, nil, false
	case member && !v.serves(cur.Owner, id): // a witness, or it dropped the service
		if to := v.best(id, anyRank); to != "" {
			return move(to, ReasonIneligible)
		}
		return move("", ReasonIneligible)
	default: // unhealthy, or no longer a member
		if to := v.best(id, anyRank); to != "" {
			return move(to, ReasonOwnerLost)
		}
		why := "is not a member"
		if member && !owner.Healthy {
			why = "is not healthy"
		}
		return hold(false, "its owner %s %s and no other healthy server declares it", cur.Owner, why)
	}
}

// PlanMove is an operator's move of service to server to: one move
// (ReasonOperator), or an error wrapping ErrUnknownService,
// ErrConflict, ErrUnknownServer, ErrWitness, ErrNotDeclared,
// ErrUnhealthy or ErrAlreadyThere.
func PlanMove(in Input, service, to string) (Move, error) {
	v := newView(in)
	_, placed := in.Placements[service]
	if _, declared := v.agreed[service]; !declared && !placed && v.differ[service] == "" {
		return Move{}, fmt.Errorf("%w %q: no server declares it", ErrUnknownService, service)
	}
	if c, ok := v.differ[service]; ok {
		return Move{}, fmt.Errorf("%w: service %q: %s", ErrConflict, service, c)
	}
	s, ok := v.servers[to]
	switch {
	case !ok:
		return Move{}, fmt.Errorf("%w: %q", ErrUnknownServer, to)
	case s.Witness:
		return Move{}, fmt.Errorf("%w: %q", ErrWitness, to)
	case !v.serves(to, service):
		return Move{}, fmt.Errorf("%w: %q does not declare service %q with the fingerprint the others agree on", ErrNotDeclared, to, service)
	case !s.Healthy:
		return Move{}, fmt.Errorf("%w: %q", ErrUnhealthy, to)
	}
	cur := v.current(service)
	if cur.Owner == to {
		return Move{}, fmt.Errorf("%w: service %q runs on %q (epoch %d)", ErrAlreadyThere, service, to, cur.Epoch)
	}
	return Move{Service: service, From: cur.Owner, To: to, Epoch: cur.Epoch + 1, Reason: ReasonOperator}, nil
}
