package nsm

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"

	"github.com/nsmd/nsmd/fsm"
)

// mapRegistry is a test double for the cluster: an nsm.Registry over a
// map, one node, no replication. It applies writes at once and records
// every write call so tests can check that refusals write nothing.
type mapRegistry struct {
	mu       sync.Mutex
	state    int32
	regs     map[fsm.MonID]fsm.Registration
	lastSeen map[string]int32
	writes   int
	crashes  int
	events   []fsm.PeerRebooted
	fail     error         // when set, every write returns it
	notReady bool          // when set, Ready reports false
	asked    chan struct{} // when set, a token (if there is room) per Ready call
}

var errRegistryDown = errors.New("test registry: no leader")

func newMapRegistry(state int32) *mapRegistry {
	return &mapRegistry{state: state, regs: map[fsm.MonID]fsm.Registration{}, lastSeen: map[string]int32{}}
}

func (m *mapRegistry) write() error {
	m.writes++
	return m.fail
}

func (m *mapRegistry) Monitor(_ context.Context, reg fsm.Registration) (int32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.write(); err != nil {
		return 0, err
	}
	m.regs[reg.ID] = reg
	return m.state, nil
}

func (m *mapRegistry) Unmonitor(_ context.Context, id fsm.MonID, owner fsm.Owner) (int32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.write(); err != nil {
		return 0, err
	}
	if r, ok := m.regs[id]; ok && owner.Owns(&r) {
		delete(m.regs, id)
	}
	return m.state, nil
}

func (m *mapRegistry) UnmonitorAll(_ context.Context, my fsm.MyID, owner fsm.Owner) (int32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.write(); err != nil {
		return 0, err
	}
	for id, r := range m.regs {
		if id.My == my && owner.Owns(&r) {
			delete(m.regs, id)
		}
	}
	return m.state, nil
}

// Count and Has make mapRegistry an nsm.Counter (MaxRegistrations).
func (m *mapRegistry) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.regs)
}

func (m *mapRegistry) Has(id fsm.MonID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.regs[id]
	return ok
}

func (m *mapRegistry) SimuCrash(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.write(); err != nil {
		return err
	}
	m.crashes++
	m.state += 2
	return nil
}

// matches returns the monitored names an SM_NOTIFY refers to: by mon_name
// or by sender address (fsm.PeerRebooted's rule).
func (m *mapRegistry) matches(monName string, from netip.Addr) []string {
	var names []string
	for _, r := range m.regs {
		if r.ID.MonName == monName || (from.IsValid() && slices.Contains(r.Addrs, from)) {
			if !slices.Contains(names, r.ID.MonName) {
				names = append(names, r.ID.MonName)
			}
		}
	}
	return names
}

func (m *mapRegistry) wouldAccept(monName string, from netip.Addr, state int32) []string {
	var out []string
	for _, n := range m.matches(monName, from) {
		if last, ok := m.lastSeen[n]; !ok || last != state {
			out = append(out, n)
		}
	}
	return out
}

func (m *mapRegistry) PeerRebooted(_ context.Context, ev fsm.PeerRebooted) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.write(); err != nil {
		return err
	}
	for _, n := range m.wouldAccept(ev.MonName, ev.From, ev.State) {
		m.lastSeen[n] = ev.State
	}
	m.events = append(m.events, ev)
	return nil
}

func (m *mapRegistry) ReadState(context.Context) (int32, error) { return m.State(), nil }

func (m *mapRegistry) State() int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}

func (m *mapRegistry) Ready() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.asked != nil {
		select {
		case m.asked <- struct{}{}:
		default:
		}
	}
	return !m.notReady
}

func (m *mapRegistry) setReady(ready bool) {
	m.mu.Lock()
	m.notReady = !ready
	m.mu.Unlock()
}

func (m *mapRegistry) WouldAccept(monName string, from netip.Addr, state int32) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.wouldAccept(monName, from, state)) > 0
}

func (m *mapRegistry) SenderIsHost(monName string, from netip.Addr) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.regs {
		if r.ID.MonName == monName && slices.Contains(r.Addrs, from) {
			return true
		}
	}
	return false
}

func (m *mapRegistry) snapshot() (writes int, regs map[fsm.MonID]fsm.Registration, events []fsm.PeerRebooted) {
	m.mu.Lock()
	defer m.mu.Unlock()
	regs = make(map[fsm.MonID]fsm.Registration, len(m.regs))
	for k, v := range m.regs {
		regs[k] = v
	}
	return m.writes, regs, slices.Clone(m.events)
}

func (m *mapRegistry) setFail(err error) {
	m.mu.Lock()
	m.fail = err
	m.mu.Unlock()
}
