package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/placement"
)

// Where each service runs, the cluster's side (package placement decides,
// fsm/services.go records). Every node commits what its configuration
// declares (fsm.ServicesDeclared, forwarded when it does not lead); the
// leader, once its takeover committed, decides on the replicated
// declarations and the members' health and commits each move
// (fsm.ServicePlaced) with the service's next epoch. Nothing of this runs
// in a cluster whose nodes declare no service: no entry is written and
// the snapshot format does not change. The kinds are proposed only once
// every member advertises CommandLevel 2 (placementLevel).

// ServicesView is this node's view of where services run.
type ServicesView struct {
	State fsm.ServiceState
	// Holds are the services that should be placed or moved and are not,
	// and why, decided on this node's view (a leader's is the one that
	// acts).
	Holds []placement.Hold
	// Level is false while some member cannot apply the placement
	// entries (a rolling upgrade): nothing is declared or placed yet.
	Level bool
}

// ServiceConfig is what a node declares and how its leader places.
type ServiceConfig struct {
	// Declared is what this node's configuration declares (nil: none).
	Declared []fsm.ServiceDecl
	// Failback: a service goes back to a more preferred server that
	// returned (placement.Policy.Failback).
	Failback bool
	// Settle: a new leader places services that have no owner only once
	// every server of the configuration is alive, or Settle after it
	// began leading, so that a cluster starting one node at a time
	// spreads its services instead of giving them all to the first one.
	Settle time.Duration
}

// withdrawAfter failed starts in a row of one service, a server hands it
// on: it leaves the service out of its declaration for withdrawFor, so
// the leader moves it (placement.ReasonIneligible, released first) to
// another server that declares it, or, with none, takes it away; then it
// declares it again, and the service stays where it runs (no flapping).
const (
	withdrawAfter = 3
	withdrawFor   = 5 * time.Minute
)

// withdraw leaves service out of this node's declaration until until.
func (p *placer) withdraw(service string, until time.Time) {
	p.mu.Lock()
	if p.withdrawn == nil {
		p.withdrawn = map[string]time.Time{}
	}
	p.withdrawn[service] = until
	p.mu.Unlock()
	p.wake()
}

// declared is what this node declares now: its configuration's
// services but those it withdrew (withdraw) until a time still ahead.
func (p *placer) declared() []fsm.ServiceDecl {
	now := p.n.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.withdrawn) == 0 {
		return p.cfg.Declared
	}
	var out []fsm.ServiceDecl
	for _, d := range p.cfg.Declared {
		if until, ok := p.withdrawn[d.ID]; ok && now.Before(until) {
			continue
		}
		delete(p.withdrawn, d.ID)
		out = append(out, d)
	}
	return out
}

// Withdrawn lists the services this node leaves out of its declaration
// now, each with when it declares it again.
func (s Services) Withdrawn() map[string]time.Time {
	p := s.p
	now := p.n.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]time.Time{}
	for id, until := range p.withdrawn {
		if now.Before(until) {
			out[id] = until
		}
	}
	return out
}

// placementLevel is the CommandLevel of kinds 18–21.
const placementLevel = 2

// placer is the node's placement part: one loop (owned by the node)
// that declares and, on the leader, places.
type placer struct {
	n    *Node
	cfg  ServiceConfig
	kick chan struct{}

	mu          sync.Mutex
	leadingFrom time.Time // when this node's current leadership was first seen
	lastErr     string
	releasing   map[string]bool // services whose owner is asked to release them before a move (servicerelease.go)
	// moving are the services of a decided move that waits for its owner's
	// release in a goroutine of its own (moveReleasingFirst); wg owns them.
	moving map[string]bool
	wg     sync.WaitGroup
	// withdrawn are services this node leaves out of its declaration
	// until then: it failed to start them (servicerun.go), so the leader
	// hands them to another server that declares them.
	withdrawn map[string]time.Time
}

func newPlacer(n *Node, cfg ServiceConfig) *placer {
	return &placer{n: n, cfg: cfg, kick: make(chan struct{}, 1)}
}

// wake asks the loop to look again (a placement entry applied, a member
// changed); it never blocks.
func (p *placer) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// loop runs until the node closes.
func (p *placer) loop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	defer p.wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-t.C:
		}
		p.once(ctx)
	}
}

// once declares this node's services if the replicated declaration
// differs, and on a leader commits the moves placement decides.
func (p *placer) once(ctx context.Context) {
	n := p.n
	if !p.levelOK() {
		return
	}
	if err := p.declare(ctx); err != nil {
		p.note("declare", err)
	}
	leading := n.Leading()
	p.mu.Lock()
	switch {
	case !leading:
		p.leadingFrom = time.Time{}
	case p.leadingFrom.IsZero():
		p.leadingFrom = n.cfg.Now()
	}
	since := p.leadingFrom
	p.mu.Unlock()
	if !leading {
		return
	}
	st := n.fsm.Services()
	if len(st.Declarations) == 0 && len(st.Placements) == 0 {
		return
	}
	in := p.input(st)
	in.Policy.Settling = p.settling(in, since)
	d := placement.Decide(in)
	for _, m := range d.Moves {
		if p.movingAway(m) {
			p.moveReleasingFirst(ctx, m)
			continue
		}
		if err := p.commit(ctx, m); err != nil {
			p.note("place "+m.Service, err)
			return // decide again on what is committed now
		}
	}
}

// note logs a failure once per distinct message.
func (p *placer) note(what string, err error) {
	msg := what + ": " + err.Error()
	p.mu.Lock()
	same := p.lastErr == msg
	p.lastErr = msg
	p.mu.Unlock()
	if !same && !errors.Is(err, context.Canceled) {
		p.n.log.Warn("service placement: cannot "+what+" yet; retrying", "err", err)
	}
}

// levelOK: every server of the configuration applies kinds 18–21 — by
// what it advertises, or, for a server that is down, by what it last
// advertised (membership.commandLevel).
func (p *placer) levelOK() bool {
	if p.n.member == nil {
		return p.n.cfg.staticRecords
	}
	return p.n.serversLevel(true) >= placementLevel
}

// gate refuses kinds 18–22 while some member cannot apply them; they are
// never lowered into another kind.
func (p *placer) gate(cmd fsm.Command) error {
	switch cmd.(type) {
	case fsm.ServicesDeclared, fsm.ServicePlaced, fsm.ServiceForgotten, fsm.ServiceReleased, fsm.Scoped:
		if !p.levelOK() {
			return errors.New("cluster: a member cannot apply service placements yet")
		}
	}
	return nil
}

// declare commits this node's declaration when the replicated one
// differs (also an empty one, to clear what an earlier configuration
// declared).
func (p *placer) declare(ctx context.Context) error {
	n := p.n
	want := p.declared()
	st := n.fsm.Services()
	var have []fsm.ServiceDecl
	known := false
	for _, d := range st.Declarations {
		if d.Node == n.cfg.NodeID {
			have, known = d.Services, true
		}
	}
	if sameDecls(have, want) && (known || len(want) == 0) {
		return nil
	}
	_, err := n.apply(ctx, fsm.ServicesDeclared{Node: n.cfg.NodeID, Services: want})
	if err != nil {
		return err
	}
	n.log.Info("declared this node's services", "services", len(want))
	return nil
}

// sameDecls compares declarations regardless of order.
func sameDecls(a, b []fsm.ServiceDecl) bool {
	if len(a) != len(b) {
		return false
	}
	byID := func(x, y fsm.ServiceDecl) int { return strings.Compare(x.ID, y.ID) }
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, byID)
	slices.SortFunc(b, byID)
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Fingerprint != b[i].Fingerprint || !slices.Equal(a[i].Prefer, b[i].Prefer) {
			return false
		}
	}
	return true
}

// input is placement's view of st and of the members now: the servers
// of the raft configuration, healthy when gossip says alive (this node:
// when its data directory takes writes, placeHealthy).
func (p *placer) input(st fsm.ServiceState) placement.Input {
	n := p.n
	in := placement.Input{
		Declared:   map[string]map[string]placement.Decl{},
		Placements: map[string]placement.Placement{},
		EpochFloor: st.EpochFloor,
		Policy:     placement.Policy{Failback: p.cfg.Failback},
	}
	for _, m := range n.Members() {
		if m.Suffrage == "" {
			continue // not a server of the configuration
		}
		healthy := m.State == stateAlive
		switch {
		case m.ID == n.cfg.NodeID:
			healthy = placeHealthy(n.disk.Status())
		case n.cfg.memberHealthy != nil:
			healthy = n.cfg.memberHealthy(m.ID)
		case n.member == nil:
			healthy = true // a static cluster (tests): no gossip to say otherwise
		}
		in.Servers = append(in.Servers, placement.Server{ID: m.ID, Healthy: healthy, Witness: m.Witness || n.IsWitness(m.ID)})
	}
	for _, d := range st.Declarations {
		ds := make(map[string]placement.Decl, len(d.Services))
		for _, s := range d.Services {
			ds[s.ID] = placement.Decl{Fingerprint: s.Fingerprint, Prefer: slices.Clone(s.Prefer)}
		}
		in.Declared[d.Node] = ds
	}
	for _, pl := range st.Placements {
		in.Placements[pl.Service] = placement.Placement{Owner: pl.Node, Epoch: pl.Epoch}
	}
	return in
}

// placeHealthy is whether the leader, judging itself, may keep and take
// services: only while its data directory takes writes. A slow one moves
// leadership (successor.go), not services: what they serve is on their
// own storage, their state goes through the leader, and a move costs
// their clients a grace — and, judged unhealthy, the leader would take
// its own services away at once, without their stop, with its lease on
// them revoked (a stop slower than the lease then resets the node).
func placeHealthy(ds DiskStatus) bool { return ds.Writable }

// settling: a leader that began leading less than Settle ago places no
// service that has no owner yet while some server of the configuration
// is not alive or has not declared its services yet (a cluster starting
// one node at a time would otherwise give every service to the first).
func (p *placer) settling(in placement.Input, since time.Time) bool {
	if p.n.cfg.Now().Sub(since) >= p.cfg.Settle {
		return false
	}
	for _, s := range in.Servers {
		if _, declared := in.Declared[s.ID]; !s.Witness && (!s.Healthy || !declared) {
			return true
		}
	}
	return false
}

// commit commits one move as the leader.
func (p *placer) commit(ctx context.Context, m placement.Move) error {
	n := p.n
	res, err := n.applyLocal(ctx, fsm.ServicePlaced{Service: m.Service, Node: m.To, Epoch: m.Epoch, Reason: m.Reason, At: n.cfg.Now().UTC(), From: m.From})
	if err != nil {
		return err
	}
	if res.Refused {
		return fmt.Errorf("the placement of %s at epoch %d was refused: %v", m.Service, m.Epoch, res.Refusal)
	}
	n.log.Info("service placed", "service", m.Service, "from", m.From, "to", m.To, "epoch", m.Epoch, "reason", m.Reason)
	return nil
}

// plan is the operator's move of service to node `to`, decided on the
// leader's current view (a follower's request is forwarded as a
// ServicePlaced with Reason operator and decided again here: the
// leader never commits a follower's epoch).
func (p *placer) plan(service, to string) (fsm.ServicePlaced, error) {
	m, err := placement.PlanMove(p.input(p.n.fsm.Services()), service, to)
	if err != nil {
		return fsm.ServicePlaced{}, err
	}
	return fsm.ServicePlaced{Service: m.Service, Node: m.To, Epoch: m.Epoch, Reason: m.Reason, At: p.n.cfg.Now().UTC(), From: m.From}, nil
}

// Services is the node's placement part as its callers see it: where
// services run, and an operator's move.
type Services struct{ p *placer }

// Services returns the node's placement part.
func (n *Node) Services() Services { return Services{n.placer} }

// View is where services run as this node sees them.
func (s Services) View() ServicesView {
	n := s.p.n
	st := n.fsm.Services()
	v := ServicesView{State: st, Level: s.p.levelOK()}
	if len(st.Declarations) > 0 || len(st.Placements) > 0 {
		v.Holds = placement.Decide(s.p.input(st)).Holds
	}
	return v
}

// Move moves service to node `to` (an operator's planned move): decided
// and committed by the leader, forwarded to it from a follower. Errors
// wrap placement's (ErrUnknownService, ErrConflict, …).
func (s Services) Move(ctx context.Context, service, to string) error {
	n := s.p.n
	if !s.p.levelOK() {
		return errors.New("cluster: a member cannot apply service placements yet (a rolling upgrade is under way)")
	}
	if n.raft.State() == raft.Leader {
		c, err := s.p.plan(service, to)
		if err != nil {
			return err
		}
		s.p.releaseFirst(ctx, c)
		return s.p.commitPlaced(ctx, c)
	}
	// Checked on this node's view first (its refusal is placement's typed
	// error), then planned again by the leader on its own view
	// (forwardablePlacement): the epoch and From sent are this node's,
	// never committed as they are.
	c, err := s.p.plan(service, to)
	if err != nil {
		return err
	}
	_, err = n.apply(ctx, c)
	return err
}

// planRestart is a new epoch of service on node, its owner, which serves it
// anew (placement.ReasonRestarted: it released or restarted the epoch it
// had), decided on this node's view.
func (p *placer) planRestart(service, node string) (fsm.ServicePlaced, error) {
	p.mu.Lock()
	releasing := p.releasing[service]
	p.mu.Unlock()
	if releasing {
		return fsm.ServicePlaced{}, fmt.Errorf("cluster: service %q is being moved by an operator", service)
	}
	cur, ok := p.n.fsm.PlacementOf(service)
	if !ok || cur.Node == "" || cur.Node != node {
		return fsm.ServicePlaced{}, fmt.Errorf("cluster: service %q is not placed on %q (it is on %q at epoch %d)", service, node, cur.Node, cur.Epoch)
	}
	return fsm.ServicePlaced{Service: service, Node: node, Epoch: cur.Epoch + 1, From: node, Reason: placement.ReasonRestarted, At: p.n.cfg.Now().UTC()}, nil
}

// restart asks for a new epoch of service on this node, its owner at
// epoch: committed on the leader, forwarded to it from a follower (and
// planned again there).
func (p *placer) restart(ctx context.Context, service string, epoch uint64) error {
	n := p.n
	c, err := p.planRestart(service, n.cfg.NodeID)
	if err != nil {
		return err
	}
	if c.Epoch != epoch+1 {
		return nil // placed anew meanwhile
	}
	if n.raft.State() == raft.Leader {
		return p.commitPlaced(ctx, c)
	}
	_, err = n.apply(ctx, c)
	return err
}

func (p *placer) commitPlaced(ctx context.Context, c fsm.ServicePlaced) error {
	return p.commit(ctx, placement.Move{Service: c.Service, From: c.From, To: c.Node, Epoch: c.Epoch, Reason: c.Reason})
}

// forwardablePlacement is forwardable's part for kinds 18–19: a
// follower's declaration of its own services (the sender's address must
// be that node's raft address), and an operator's move, planned again on
// this leader's view.
func (n *Node) forwardablePlacement(from netip.Addr, cmd fsm.Command) (fsm.Command, bool, error) {
	switch c := cmd.(type) {
	case fsm.ServicesDeclared:
		// Without a cluster key a forward is a member's by its address, so
		// it may declare only for the node at that address; with one, the
		// key is what makes a member (docs/security.md).
		if len(n.cfg.ClusterKey) == 0 && !n.isRaftAddrOf(c.Node, from) {
			return nil, true, fmt.Errorf("a declaration of %q's services must come from %q", c.Node, c.Node)
		}
		return c, true, nil
	case fsm.ServingBegin, fsm.ServiceReleased:
		// A node that serves services records that it serves, and what it
		// released (servicerun.go): only its own.
		node := ""
		if b, ok := c.(fsm.ServingBegin); ok {
			node = b.Node
		} else {
			node = c.(fsm.ServiceReleased).Node
		}
		if len(n.cfg.ClusterKey) == 0 && !n.isRaftAddrOf(node, from) {
			return nil, true, fmt.Errorf("a %T of %q must come from %q", c, node, node)
		}
		return c, true, nil
	case fsm.ServicePlaced:
		if c.Reason == placement.ReasonRestarted {
			// Its owner serves it anew: only the owner asks, for itself.
			if len(n.cfg.ClusterKey) == 0 && !n.isRaftAddrOf(c.Node, from) {
				return nil, true, fmt.Errorf("a new epoch of %q on %q must come from %q", c.Service, c.Node, c.Node)
			}
			pc, err := n.placer.planRestart(c.Service, c.Node)
			return pc, true, err
		}
		if c.Reason != placement.ReasonOperator {
			return nil, true, fmt.Errorf("a forwarded placement must be an operator's move or a restart, not %q", c.Reason)
		}
		pc, err := n.placer.plan(c.Service, c.Node)
		return pc, true, err
	}
	return nil, false, nil
}

// isRaftAddrOf: from is the IP of node's raft address in the
// configuration.
func (n *Node) isRaftAddrOf(node string, from netip.Addr) bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) != node {
			continue
		}
		ap, err := netip.ParseAddrPort(string(s.Address))
		return err == nil && ap.Addr().Unmap() == from.Unmap()
	}
	return false
}
