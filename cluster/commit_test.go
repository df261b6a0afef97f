package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/internal/testutil"
)

// gatedTransport holds back replication of log entries (not heartbeats)
// while its gate is shut, so an entry stays in flight as long as a test
// needs. Pipelining is refused so every AppendEntries comes through here.
type gatedTransport struct {
	*raft.InmemTransport
	shut *atomic.Bool
	open <-chan struct{}
}

func (g *gatedTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

func (g *gatedTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if len(args.Entries) > 0 && g.shut.Load() {
		<-g.open
	}
	return g.InmemTransport.AppendEntries(id, target, args, resp)
}

// TestWritesDuringACommitShareTheNextEntry: with one entry in flight
// (the default), writes that arrive while it commits are not handed to
// raft one by one; they wait and then go out together as one entry.
func TestWritesDuringACommitShareTheNextEntry(t *testing.T) {
	var shut atomic.Bool
	open := make(chan struct{})
	var opened sync.Once
	release := func() { shut.Store(false); opened.Do(func() { close(open) }) }
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.Transport = &gatedTransport{InmemTransport: cfg.Transport.(*raft.InmemTransport), shut: &shut, open: open}
	})
	c.waitTakeover(10 * time.Second)
	_, ld := c.leader(5 * time.Second)
	n := ld.n
	before := n.raft.LastIndex()
	shut.Store(true)
	t.Cleanup(release) // registered after the cluster's: runs first

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	write := func(i int) {
		defer wg.Done()
		if _, err := n.Registry().Monitor(context.Background(), testReg(fmt.Sprintf("127.0.1.%d", i), ld.id, byte(i))); err != nil {
			errs <- err
		}
	}
	wg.Add(1)
	go write(0) // stored on the leader, not replicated: stays in flight
	testutil.WaitFor(t, 5*time.Second, "first entry on the leader", func() bool { return n.raft.LastIndex() == before+1 })
	for i := 1; i <= 3; i++ {
		wg.Add(1)
		go write(i)
	}
	// One write is held by the commit loop waiting for the slot, two queue.
	testutil.WaitFor(t, 5*time.Second, "three writes waiting", func() bool { return len(n.writes) == 2 })
	if got := n.raft.LastIndex(); got != before+1 {
		t.Fatalf("raft got %d entries while one was in flight, want 1", got-before)
	}
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := n.raft.LastIndex() - before; got != 2 {
		t.Errorf("4 writes took %d entries, want 2 (one, then the three that waited)", got)
	}
	if got := n.fsm.Len(); got != 4 {
		t.Errorf("registrations %d, want 4", got)
	}
	c.converge(5 * time.Second)
}

// awaitReturning, on its own: the next entry waits for the writers the
// previous one answered (those that arrive after it completed), not for
// the ones that queued during it, and never for a lone writer.
func TestNextEntryWaitsForTheWritersJustAnswered(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := &Node{writes: make(chan *write, 16), ctx: ctx}
	n.lastCommitNanos.Store(int64(time.Hour)) // the wait is capped at 1 ms
	w := func(seq uint64) *write { return &write{seq: seq, done: make(chan struct{})} }

	// A lone writer (previous entry of 1) goes out at once, even with
	// nothing else coming.
	n.lastBatch.Store(1)
	n.lastDoneSeq.Store(10)
	if got := n.awaitReturning([]*write{w(11)}); len(got) != 1 {
		t.Fatalf("lone writer: %d writes", len(got))
	}

	// The previous entry carried 3 writers; 2 writes queued during it
	// (seq ≤ 10) are here. The 3 answered writers come back (seq > 10):
	// the entry takes all 5 and stops waiting as soon as they are in,
	// leaving later writes for the next entry.
	n.lastBatch.Store(3)
	for _, s := range []uint64{11, 12, 13, 14} {
		n.writes <- w(s)
	}
	got := n.awaitReturning([]*write{w(9), w(10)})
	if len(got) != 5 {
		t.Fatalf("got %d writes, want the 2 queued + 3 returning", len(got))
	}
	if len(n.writes) != 1 {
		t.Fatalf("%d writes left queued, want 1 for the next entry", len(n.writes))
	}
	<-n.writes

	// Writers that do not come back: the wait ends (after at most 1 ms)
	// with what is there.
	if got := n.awaitReturning([]*write{w(9)}); len(got) != 1 {
		t.Fatalf("got %d writes, want the 1 queued", len(got))
	}
}
