package cld

import (
	"context"
	"sync"
)

// order keeps the kernel's order where it matters while upcalls run
// concurrently: an upcall on a client name waits for the earlier ones on
// the same name, a barrier (GraceStart, GraceDone) waits for every earlier
// upcall, and every later upcall waits for the barrier. Tasks are added in
// arrival order by one goroutine; finish may be called from any.
//
// A task counts as finished only once its store call returned and the
// tasks it waited for finished, even if its answer went out earlier (a
// timeout): so an upcall never overtakes an earlier one that is still
// running in the store.
type order struct {
	mu      sync.Mutex
	pending map[*task]struct{}
	byName  map[string]*task // the last pending task on each name since the last barrier
	barrier *task            // the last barrier, while pending

	unordered bool // tests only: no dependencies (shows the order tests can fail)
}

type task struct {
	name    string
	barrier bool
	deps    []*task
	done    chan struct{}
}

func newOrder() *order {
	return &order{pending: make(map[*task]struct{}), byName: make(map[string]*task)}
}

// add registers the next upcall in arrival order: a barrier, or one on
// the client name.
func (o *order) add(name string, barrier bool) *task {
	t := &task{name: name, barrier: barrier, done: make(chan struct{})}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.unordered {
		if barrier {
			t.deps = make([]*task, 0, len(o.pending))
			for p := range o.pending {
				t.deps = append(t.deps, p)
			}
			clear(o.byName) // later upcalls wait for t, and t for these
			o.barrier = t
		} else {
			if o.barrier != nil {
				t.deps = append(t.deps, o.barrier)
			}
			if p := o.byName[name]; p != nil {
				t.deps = append(t.deps, p)
			}
			o.byName[name] = t
		}
	}
	o.pending[t] = struct{}{}
	return t
}

// finish marks t finished; call it once, after t's store call returned
// and after t.waitAll.
func (o *order) finish(t *task) {
	o.mu.Lock()
	delete(o.pending, t)
	if !t.barrier && o.byName[t.name] == t {
		delete(o.byName, t.name)
	}
	if o.barrier == t {
		o.barrier = nil
	}
	o.mu.Unlock()
	close(t.done)
}

// wait blocks until every task t depends on finished, or ctx is done.
func (t *task) wait(ctx context.Context) error {
	for _, d := range t.deps {
		select {
		case <-d.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// ready reports whether every task t depends on finished.
func (t *task) ready() bool {
	for _, d := range t.deps {
		select {
		case <-d.done:
		default:
			return false
		}
	}
	return true
}

// waitAll blocks until every task t depends on finished. They always do:
// each one's store call returns (Store methods honour their context) and
// dependencies point only to earlier tasks.
func (t *task) waitAll() {
	for _, d := range t.deps {
		<-d.done
	}
}
