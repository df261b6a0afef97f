package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// Where each NFS service runs (entry kinds 18–21, CommandLevel 2). Each
// node commits what its configuration declares (ServicesDeclared: every
// service's id and the fingerprint of its whole specification); the
// leader commits who owns each service (ServicePlaced) with an epoch one
// above the service's current one, so a node's right to serve a service
// is exactly "the latest committed placement of it names me" — and a
// placement decided on a view that is no longer current is refused,
// never applied over a newer one. Which server that should be is package
// placement's decision; this file only records it.

// ServiceDecl is one service a node's configuration declares: its id, the
// fingerprint of its specification (equal on two nodes exactly when they
// would serve it the same way; it covers Prefer) and its preferred
// servers, most preferred first — replicated, so every leader places it
// by the same preferences.
type ServiceDecl struct {
	ID          string
	Fingerprint string
	Prefer      []string // node ids, at most MaxPrefer, none empty or twice
}

// ServicesDeclared replaces what Node's configuration declares (committed
// by each node at start and when its configuration changes). An empty
// Services clears Node's declarations (a node that declares no service,
// or one that left the cluster). Encode sorts Services by ID and refuses
// duplicates, so the order given does not matter.
type ServicesDeclared struct {
	Node     string
	Services []ServiceDecl
}

// ServicePlaced records that Service is owned by Node from epoch Epoch
// on; Node "" takes the service away from its owner without giving it to
// another (its declarations now conflict, nobody declares it any more).
// It is applied only if Epoch is the service's current epoch + 1 (1 for
// a service never placed, or EpochFloor+1 after one was forgotten) and
// From is its current owner ("" when unplaced), so a stale or repeated
// placement changes nothing (Result.Refused, Result.Refusal wraps
// ErrStaleEpoch); and only if Node declares the service, and a service
// with no placement record yet is declared by some node (else
// ErrNotDeclared). At is the leader's wall clock, for display only;
// Reason says why (≤ MaxReasonLen).
type ServicePlaced struct {
	Service string
	Node    string
	Epoch   uint64
	Reason  string
	At      time.Time
	From    string
}

// ServiceForgotten drops the placement record of a service that nobody
// declares any more and nobody owns (its latest placement has Node "")
// at Epoch; otherwise it changes nothing (ErrStaleEpoch, ErrServiceInUse).
// The service's epochs are never reused: EpochFloor rises to Epoch, and
// a service placed anew starts above it.
type ServiceForgotten struct {
	Service string
	Epoch   uint64
}

// ServiceReleased records that Node, the last server that held Service
// before its current placement (Placement.Prev), stopped it and will never
// serve it at Epoch or below again (it recorded that on its own disk
// first): the next owner needs no other proof of its stop, and a record
// nobody owns may be forgotten. Applied only while Prev is Node at an
// epoch ≤ Epoch; otherwise it changes nothing (ErrStaleEpoch).
type ServiceReleased struct {
	Service string
	Node    string
	Epoch   uint64
}

func (ServicesDeclared) isCommand() {}
func (ServiceReleased) isCommand()  {}
func (ServicePlaced) isCommand()    {}
func (ServiceForgotten) isCommand() {}

// Placement is a service's latest committed placement: its owner (""
// when unplaced) from epoch Epoch on, who had it before (From), why and
// when (the leader's clock) it moved; and Prev, the last server that held
// the service before Node (at PrevEpoch), whose stop Node must prove
// before it serves — kept across placements to nobody, "" once that
// server recorded its release (ServiceReleased) or when it is Node itself.
type Placement struct {
	Service   string
	Node      string
	Epoch     uint64
	From      string
	Reason    string
	At        time.Time
	Prev      string
	PrevEpoch uint64
}

// Declaration is what one node's configuration declares, by service id.
type Declaration struct {
	Node     string
	Services []ServiceDecl
}

// ServiceState is a copy of the replicated placement state, read at one
// applied index: the placement records by service id, each node's
// declarations by node id, and EpochFloor, the epoch a service without a
// placement record is at (its first placement has EpochFloor+1).
type ServiceState struct {
	Placements   []Placement
	Declarations []Declaration
	EpochFloor   uint64
}

// Current returns service's placement as a proposer builds on it: its
// record, or, without one, Node "" at EpochFloor.
func (s ServiceState) Current(service string) Placement {
	i, ok := slices.BinarySearchFunc(s.Placements, service, func(p Placement, id string) int { return strings.Compare(p.Service, id) })
	if ok {
		return s.Placements[i]
	}
	return Placement{Service: service, Epoch: s.EpochFloor}
}

// Limits of the service commands (besides MaxNameLen for node ids and
// MaxReasonLen for reasons).
const (
	MaxServices       = 256 // services one node declares
	MaxServiceIDLen   = 64  // ServiceDecl.ID, ServicePlaced.Service (1…)
	MaxFingerprintLen = 64  // ServiceDecl.Fingerprint (1…)
	MaxPrefer         = 64  // ServiceDecl.Prefer
)

var (
	// ErrStaleEpoch means a ServicePlaced or ServiceForgotten was decided
	// on a placement that is no longer the service's latest (another
	// placement was committed first, or it is a repeat): it changed
	// nothing. Decide again on the current state.
	ErrStaleEpoch = errors.New("fsm: placement is not based on the service's latest")
	// ErrNotDeclared means a ServicePlaced named a node that does not
	// declare the service, or placed a service nobody declares.
	ErrNotDeclared = errors.New("fsm: the service is not declared there")
	// ErrServiceInUse means a ServiceForgotten named a service that still
	// has an owner, that a node still declares, or whose last server has
	// not recorded its release.
	ErrServiceInUse = errors.New("fsm: the service is still placed or declared")
)

// Entry kinds of this file (codec.go has the format).
const (
	kindServicesDeclared = 18
	kindServicePlaced    = 19
	kindServiceForgotten = 20
	kindServiceReleased  = 21
)

// applyServices applies kinds 18–21; the maps are replaced, never changed
// in place, so a view taken before keeps its own. mu is held exclusively.
func (s *state) applyServices(c Command) Result {
	res := Result{State: s.sm}
	var err error
	switch c := c.(type) {
	case ServicesDeclared:
		if len(c.Services) == 0 {
			if _, ok := s.declared[c.Node]; ok {
				s.declared = without(s.declared, c.Node)
			}
			break
		}
		s.declared = with(s.declared, c.Node, cloneDecls(c.Services)) // the Observer gets c too
	case ServicePlaced:
		err = s.place(c)
	case ServiceForgotten:
		err = s.forget(c)
	case ServiceReleased:
		err = s.release(c)
	}
	if err != nil {
		res.Refused, res.Refusal = true, err
	}
	return res
}

func (s *state) place(c ServicePlaced) error {
	cur, recorded := s.placed[c.Service]
	if !recorded {
		cur = Placement{Service: c.Service, Epoch: s.epochFloor}
	}
	if cur.Epoch == math.MaxUint64 || c.Epoch != cur.Epoch+1 || c.From != cur.Node {
		return fmt.Errorf("%w: service %q is on %q at epoch %d; the placement says %q at %d → epoch %d",
			ErrStaleEpoch, c.Service, cur.Node, cur.Epoch, c.From, c.Epoch-1, c.Epoch)
	}
	if c.Node != "" && !s.declares(c.Node, c.Service) {
		return fmt.Errorf("%w: node %q does not declare service %q", ErrNotDeclared, c.Node, c.Service)
	}
	if !recorded && !s.declaredAnywhere(c.Service) {
		return fmt.Errorf("%w: no node declares service %q", ErrNotDeclared, c.Service)
	}
	p := Placement{Service: c.Service, Node: c.Node, Epoch: c.Epoch, From: c.From, Reason: c.Reason, At: c.At, Prev: cur.Prev, PrevEpoch: cur.PrevEpoch}
	if cur.Node != "" {
		p.Prev, p.PrevEpoch = cur.Node, cur.Epoch
	}
	if p.Prev == p.Node {
		p.Prev, p.PrevEpoch = "", 0 // its own stops are its own (never an epoch twice)
	}
	s.placed = with(s.placed, c.Service, p)
	return nil
}

func (s *state) release(c ServiceReleased) error {
	cur, ok := s.placed[c.Service]
	if !ok || cur.Prev == "" || cur.Prev != c.Node || cur.PrevEpoch > c.Epoch {
		return fmt.Errorf("%w: service %q is not waiting for %q's release at epoch %d", ErrStaleEpoch, c.Service, c.Node, c.Epoch)
	}
	cur.Prev, cur.PrevEpoch = "", 0
	s.placed = with(s.placed, c.Service, cur)
	return nil
}

func (s *state) forget(c ServiceForgotten) error {
	cur, ok := s.placed[c.Service]
	if !ok || cur.Epoch != c.Epoch {
		return fmt.Errorf("%w: service %q has no placement at epoch %d", ErrStaleEpoch, c.Service, c.Epoch)
	}
	if cur.Node != "" {
		return fmt.Errorf("%w: service %q is placed on %q", ErrServiceInUse, c.Service, cur.Node)
	}
	if cur.Prev != "" {
		return fmt.Errorf("%w: service %q: %q has not recorded its release", ErrServiceInUse, c.Service, cur.Prev)
	}
	if s.declaredAnywhere(c.Service) {
		return fmt.Errorf("%w: service %q is still declared", ErrServiceInUse, c.Service)
	}
	s.placed = without(s.placed, c.Service)
	s.epochFloor = max(s.epochFloor, cur.Epoch)
	s.dropScope(c.Service) // its lock managers and clients are gone with it
	return nil
}

// cloneDecls copies ds, preferences included.
func cloneDecls(ds []ServiceDecl) []ServiceDecl {
	out := slices.Clone(ds)
	for i := range out {
		out[i].Prefer = slices.Clone(out[i].Prefer)
	}
	return out
}

// declares reports whether node's declarations list service.
func (s *state) declares(node, service string) bool {
	_, ok := slices.BinarySearchFunc(s.declared[node], service, cmpDeclID)
	return ok
}

func (s *state) declaredAnywhere(service string) bool {
	for _, ds := range s.declared {
		if _, ok := slices.BinarySearchFunc(ds, service, cmpDeclID); ok {
			return true
		}
	}
	return false
}

func cmpDeclID(d ServiceDecl, id string) int { return strings.Compare(d.ID, id) }

// hasServices reports whether the state holds any placement state (then
// a snapshot is version 5).
func (s *state) hasServices() bool {
	return len(s.declared) > 0 || len(s.placed) > 0 || s.epochFloor > 0
}

// Services returns a copy of the placement state (ServiceState).
func (f *FSM) Services() ServiceState {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := ServiceState{EpochFloor: f.st.epochFloor}
	for _, id := range slices.Sorted(maps.Keys(f.st.placed)) {
		out.Placements = append(out.Placements, f.st.placed[id])
	}
	for _, node := range slices.Sorted(maps.Keys(f.st.declared)) {
		out.Declarations = append(out.Declarations, Declaration{Node: node, Services: cloneDecls(f.st.declared[node])})
	}
	return out
}

// PlacementOf returns service's latest placement and true, or, for a
// service without a placement record, Node "" at EpochFloor and false.
func (f *FSM) PlacementOf(service string) (Placement, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if p, ok := f.st.placed[service]; ok {
		return p, true
	}
	return Placement{Service: service, Epoch: f.st.epochFloor}, false
}

// servicesCommand encodes kinds 18–21 (ok false for other commands).
func (e *encoder) servicesCommand(c Command) (ok bool, err error) {
	switch c := c.(type) {
	case ServicesDeclared:
		e.b = append(e.b, kindServicesDeclared)
		ds := slices.Clone(c.Services)
		slices.SortFunc(ds, func(a, b ServiceDecl) int { return strings.Compare(a.ID, b.ID) })
		return true, e.declaration(c.Node, ds)
	case ServicePlaced:
		e.b = append(e.b, kindServicePlaced)
		return true, e.placement(&Placement{Service: c.Service, Node: c.Node, Epoch: c.Epoch, From: c.From, Reason: c.Reason, At: c.At})
	case ServiceForgotten:
		e.b = append(e.b, kindServiceForgotten)
		if err := e.serviceID(c.Service); err != nil {
			return true, err
		}
		return true, e.epoch(c.Epoch)
	case ServiceReleased:
		e.b = append(e.b, kindServiceReleased)
		if err := e.serviceID(c.Service); err != nil {
			return true, err
		}
		if c.Node == "" {
			return true, fmt.Errorf("service %q released by no node", c.Service)
		}
		if err := e.nodeName(c.Node); err != nil {
			return true, err
		}
		return true, e.epoch(c.Epoch)
	}
	return false, nil
}

// declaration = node count:uvarint(0…MaxServices) decl{count}, ids
// strictly ascending; decl = str(id) str(fingerprint) n:uvarint(0…MaxPrefer)
// node{n}; the body of kind 18 and (count ≥ 1) an entry of the
// snapshot's declared section.
func (e *encoder) declaration(node string, ds []ServiceDecl) error {
	if err := e.nodeName(node); err != nil {
		return err
	}
	if len(ds) > MaxServices {
		return fmt.Errorf("%d services (max %d)", len(ds), MaxServices)
	}
	e.b = binary.AppendUvarint(e.b, uint64(len(ds)))
	for i, d := range ds {
		if i > 0 && d.ID == ds[i-1].ID {
			return fmt.Errorf("service %q declared twice", d.ID)
		}
		if err := e.serviceID(d.ID); err != nil {
			return err
		}
		if d.Fingerprint == "" {
			return fmt.Errorf("service %q: empty fingerprint", d.ID)
		}
		if err := e.str(d.Fingerprint, MaxFingerprintLen, "fingerprint"); err != nil {
			return err
		}
		if len(d.Prefer) > MaxPrefer {
			return fmt.Errorf("service %q: %d preferred servers (max %d)", d.ID, len(d.Prefer), MaxPrefer)
		}
		e.b = binary.AppendUvarint(e.b, uint64(len(d.Prefer)))
		for j, n := range d.Prefer {
			if slices.Contains(d.Prefer[:j], n) {
				return fmt.Errorf("service %q: %q preferred twice", d.ID, n)
			}
			if err := e.nodeName(n); err != nil {
				return fmt.Errorf("service %q: preferred server: %w", d.ID, err)
			}
		}
	}
	return nil
}

// placement = str(service) str(node) epoch str(reason) time(at) str(from)
// (node and from may be empty); the body of kind 19 and an entry of the
// snapshot's placed section.
func (e *encoder) placement(p *Placement) error {
	if err := e.serviceID(p.Service); err != nil {
		return err
	}
	if err := e.str(p.Node, MaxNameLen, "node"); err != nil {
		return err
	}
	if err := e.epoch(p.Epoch); err != nil {
		return err
	}
	if err := e.str(p.Reason, MaxReasonLen, "reason"); err != nil {
		return err
	}
	if err := e.time(p.At, "at"); err != nil {
		return err
	}
	return e.str(p.From, MaxNameLen, "from")
}

// prev = str(prev) prevEpoch:uvarint (0 exactly when prev is empty),
// after each placement of the snapshot's placed section.
func (e *encoder) prev(p *Placement) error {
	if (p.Prev == "") != (p.PrevEpoch == 0) {
		return fmt.Errorf("previous holder %q at epoch %d", p.Prev, p.PrevEpoch)
	}
	if err := e.str(p.Prev, MaxNameLen, "prev"); err != nil {
		return err
	}
	e.b = binary.AppendUvarint(e.b, p.PrevEpoch)
	return nil
}

func (d *decoder) prev() (string, uint64) {
	prev := d.str(MaxNameLen, "prev")
	n := d.uvarint()
	if d.err == nil && (prev == "") != (n == 0) {
		d.fail("previous holder %q at epoch %d", prev, n)
	}
	return prev, n
}

func (e *encoder) serviceID(s string) error {
	if s == "" {
		return fmt.Errorf("empty service id")
	}
	return e.str(s, MaxServiceIDLen, "service id")
}

// epoch = uvarint, never 0 (the first placement of a service is epoch 1).
func (e *encoder) epoch(n uint64) error {
	if n == 0 {
		return fmt.Errorf("placement epoch 0 (the first is 1)")
	}
	e.b = binary.AppendUvarint(e.b, n)
	return nil
}

// servicesCommand decodes kinds 18–21 (ok false for another kind).
func (d *decoder) servicesCommand(k byte) (Command, bool) {
	switch k {
	case kindServicesDeclared:
		node, ds := d.declaration(0)
		return ServicesDeclared{Node: node, Services: ds}, true
	case kindServicePlaced:
		p := d.placement()
		return ServicePlaced{Service: p.Service, Node: p.Node, Epoch: p.Epoch, Reason: p.Reason, At: p.At, From: p.From}, true
	case kindServiceForgotten:
		return ServiceForgotten{Service: d.serviceID(), Epoch: d.epoch()}, true
	case kindServiceReleased:
		return ServiceReleased{Service: d.serviceID(), Node: d.nodeName(), Epoch: d.epoch()}, true
	}
	return nil, false
}

// declaration reads a declaration of at least minCount services.
func (d *decoder) declaration(minCount int) (string, []ServiceDecl) {
	node := d.nodeName()
	n := d.uvarint()
	if d.err == nil && (n < uint64(minCount) || n > MaxServices || n > uint64(len(d.b)/5)) {
		d.fail("%d services (want %d…%d, fitting %d bytes)", n, minCount, MaxServices, len(d.b))
	}
	if d.err != nil {
		return "", nil
	}
	var ds []ServiceDecl
	for i := uint64(0); i < n && d.err == nil; i++ {
		x := ServiceDecl{ID: d.serviceID()}
		fp := d.strBytes(MaxFingerprintLen, "fingerprint")
		if d.err == nil && len(fp) == 0 {
			d.fail("service %q: empty fingerprint", x.ID)
		}
		x.Fingerprint = string(fp)
		if d.err == nil && i > 0 && x.ID <= ds[i-1].ID {
			d.fail("services out of order at %q", x.ID)
		}
		np := d.uvarint()
		if d.err == nil && np > MaxPrefer {
			d.fail("service %q: %d preferred servers (max %d)", x.ID, np, MaxPrefer)
		}
		for j := uint64(0); j < np && d.err == nil; j++ {
			node := d.nodeName()
			if d.err == nil && slices.Contains(x.Prefer, node) {
				d.fail("service %q: %q preferred twice", x.ID, node)
			}
			x.Prefer = append(x.Prefer, node)
		}
		ds = append(ds, x)
	}
	if d.err != nil {
		return "", nil
	}
	return node, ds
}

func (d *decoder) placement() Placement {
	p := Placement{Service: d.serviceID(), Node: d.str(MaxNameLen, "node"), Epoch: d.epoch()}
	p.Reason = d.str(MaxReasonLen, "reason")
	p.At = d.time()
	p.From = d.str(MaxNameLen, "from")
	if d.err != nil {
		return Placement{}
	}
	return p
}

func (d *decoder) serviceID() string {
	b := d.strBytes(MaxServiceIDLen, "service id")
	if d.err == nil && len(b) == 0 {
		d.fail("empty service id")
	}
	return string(b)
}

func (d *decoder) epoch() uint64 {
	n := d.uvarint()
	if d.err == nil && n == 0 {
		d.fail("placement epoch 0")
	}
	return n
}

// servicesSections writes the snapshot's sections 8 (declarations, by
// node) and 9 (placements, by service) (version 5 only).
func (w *snapWriter) servicesSections(st *state) error {
	w.begin(tagDeclared)
	for _, node := range slices.Sorted(maps.Keys(st.declared)) {
		if err := w.frame.declaration(node, st.declared[node]); err != nil {
			return fmt.Errorf("declarations of %q: %w", node, err)
		}
		w.maybeFlush(tagDeclared)
	}
	w.flush()
	w.begin(tagPlaced)
	for _, id := range slices.Sorted(maps.Keys(st.placed)) {
		p := st.placed[id]
		if err := w.frame.placement(&p); err != nil {
			return fmt.Errorf("placement of %q: %w", id, err)
		}
		if err := w.frame.prev(&p); err != nil {
			return fmt.Errorf("placement of %q: %w", id, err)
		}
		w.maybeFlush(tagPlaced)
	}
	w.flush()
	return w.err
}

// servicesReader reads sections 8 and 9, checking the order across frames.
type servicesReader struct {
	prev [2]string
	n    [2]int
}

func (v *servicesReader) read(d *decoder, tag int, st *state) {
	i := tag - tagDeclared
	for len(d.b) > 0 && d.err == nil {
		var key string
		if tag == tagDeclared {
			node, ds := d.declaration(1)
			if d.err != nil {
				return
			}
			key = node
			if st.declared == nil {
				st.declared = map[string][]ServiceDecl{}
			}
			st.declared[node] = ds
		} else {
			p := d.placement()
			p.Prev, p.PrevEpoch = d.prev()
			if d.err != nil {
				return
			}
			key = p.Service
			if st.placed == nil {
				st.placed = map[string]Placement{}
			}
			st.placed[key] = p
		}
		if v.n[i] > 0 && key <= v.prev[i] {
			d.fail("section %d out of order at %q", tag, key)
			return
		}
		v.prev[i] = key
		v.n[i]++
	}
}
