package cluster

import "testing"

// The leader loop may spend seconds stepping down while raft keeps
// reporting changes: observeLeadership must never wait for it, and the
// loop must get the latest value, not the oldest.
func TestOfferLatestNeverBlocksAndKeepsTheLatest(t *testing.T) {
	ch := make(chan bool, 1)
	offerLatest(ch, true)
	offerLatest(ch, false) // a plain send would block here: nobody reads yet
	offerLatest(ch, true)
	offerLatest(ch, false)
	if v := <-ch; v {
		t.Fatalf("reader got %v, want the latest (false)", v)
	}
	select {
	case v := <-ch:
		t.Fatalf("a stale value %v is still queued", v)
	default:
	}
}
