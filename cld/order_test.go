package cld

import "testing"

func isDone(t *task) bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// ready reports whether t could start now.
func ready(t *task) bool {
	for _, d := range t.deps {
		if !isDone(d) {
			return false
		}
	}
	return true
}

func TestOrderSameNameWaitsOtherNamesDoNot(t *testing.T) {
	o := newOrder()
	a1 := o.add("a", false)
	b1 := o.add("b", false)
	a2 := o.add("a", false)
	if !ready(a1) || !ready(b1) {
		t.Fatal("first upcalls on a name wait")
	}
	if ready(a2) {
		t.Fatal("second upcall on a runs before the first finished")
	}
	o.finish(a1)
	if !ready(a2) {
		t.Fatal("second upcall on a still waits after the first finished")
	}
	o.finish(b1)
	o.finish(a2)
	if len(o.pending) != 0 || len(o.byName) != 0 || o.barrier != nil {
		t.Fatalf("state left: %d pending, %d names", len(o.pending), len(o.byName))
	}
}

func TestOrderBarrierWaitsForAllBeforeAndHoldsAllAfter(t *testing.T) {
	o := newOrder()
	a := o.add("a", false)
	b := o.add("b", false)
	g := o.add("", true)
	c := o.add("c", false)
	a2 := o.add("a", false)
	if ready(g) || ready(c) || ready(a2) {
		t.Fatal("barrier or later upcalls ready before earlier ones finished")
	}
	o.finish(a)
	if ready(g) {
		t.Fatal("barrier ready with b pending")
	}
	o.finish(b)
	if !ready(g) || ready(c) || ready(a2) {
		t.Fatal("after a and b: want the barrier alone ready")
	}
	o.finish(g)
	if !ready(c) || !ready(a2) {
		t.Fatal("later upcalls still wait after the barrier finished")
	}
}

func TestOrderUnorderedHasNoDependencies(t *testing.T) {
	o := newOrder()
	o.unordered = true
	o.add("a", false)
	if g := o.add("", true); !ready(g) {
		t.Fatal("unordered barrier waits")
	}
}
