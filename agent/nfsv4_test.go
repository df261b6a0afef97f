package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/agent/agenttest"
	"github.com/nsmd/nsmd/cld"
	"github.com/nsmd/nsmd/cld/cldtest"
	"github.com/nsmd/nsmd/config"
)

// A 3-node cluster (real raft over TCP) whose nodes each face a fake
// kernel (cld/cldtest: nfsd's side of the tracking pipe on a socketpair;
// the real kernel runs in the e2e QEMU tier). The leader's nfsd records
// two clients; a follower's nfsd is refused; the leader dies; the new
// leader's nfsd gets both clients back at GraceStart, one reclaims, and
// GraceDone forgets the other — on every node.
func TestNFSv4ClientRecordsSurviveAFailover(t *testing.T) {
	kernels := map[string]*cldtest.Kernel{}
	for _, id := range []string{"node1", "node2", "node3"} {
		k, err := cldtest.New(filepath.Join(t.TempDir(), "pipefs"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		kernels[id] = k
	}
	o := agenttest.DevOptions(t, "127.0.0.100", 3)
	o.Tune = func(c *config.Config) {
		c.NFSv4Tracking = config.TrackingOn
		c.RPCPipefs = kernels[c.NodeID].Dir()
	}
	d := agenttest.StartDev(t, o, agent.Options{TuneTracking: func(id string, c *cld.Config) {
		c.OpenPipe, c.IsPipefs, c.MountPipefs = kernels[id].OpenPipe, kernels[id].IsPipefs, false
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	leader := agenttest.Leader(t, d, nil, 20*time.Second)
	k := kernels[leader.Config().NodeID]
	if recs, err := k.Start(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("leader's nfsd start: %v records, %v (want none)", recs, err)
	}
	if k.Version() != 2 {
		t.Fatalf("upcall version %d, want 2", k.Version())
	}
	// Nothing to reclaim: the kernel skips its grace and says so at once.
	if err := k.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}
	a, b := []byte("Linux NFSv4.2 client-a"), []byte("Linux NFSv4.0 client-b/10.0.0.100")
	for _, name := range [][]byte{a, b} {
		if err := k.Create(ctx, name, nil); err != nil {
			t.Fatalf("Create %q: %v", name, err)
		}
	}
	for _, ag := range d.Agents() {
		agenttest.WaitApplied(t, ag, leader.Node().View().AppliedIndex())
		if c, _, _ := ag.Node().View().V4Counts(); c != 2 {
			t.Fatalf("%s holds %d client records, want 2", ag.Config().NodeID, c)
		}
	}

	// A follower's nfsd (started by hand, or a leftover) gets no answer
	// from a table that is not its to change.
	var follower *agent.Agent
	for _, ag := range d.Agents() {
		if ag != leader {
			follower = ag
			break
		}
	}
	fk := kernels[follower.Config().NodeID]
	if _, err := fk.Start(ctx); err == nil {
		t.Fatal("a follower's nfsd got its GraceStart answered")
	}
	var se *cldtest.StatusError
	if err := fk.Create(ctx, []byte("intruder"), nil); !errors.As(err, &se) || se.Status != cld.StatusRemoteIO {
		// The fake fell back to the oldest ops after the refused
		// GraceStart, as the kernel does; their Create is refused too.
		if !errors.Is(err, cldtest.ErrNFSDStopped) {
			t.Fatalf("follower Create: %v, want status %d", err, cld.StatusRemoteIO)
		}
	}
	fk.Stop()
	if _, has := leader.Node().View().HasV4Client("intruder"); has {
		t.Fatal("a follower's Create reached the table")
	}

	// The leader dies with its nfsd.
	k.Stop()
	leader.Kill()
	next := agenttest.Leader(t, d, leader, 20*time.Second)
	nk := kernels[next.Config().NodeID]
	recs, err := nk.Start(ctx)
	if err != nil {
		t.Fatalf("new leader's nfsd start: %v", err)
	}
	var names []string
	for _, r := range recs {
		names = append(names, string(r.Name))
	}
	slices.Sort(names)
	if want := []string{string(b), string(a)}; !slices.Equal(names, want) {
		t.Fatalf("new leader's GraceStart sent %q, want %q", names, want)
	}
	if err := nk.Create(ctx, a, nil); err != nil { // a reclaims (RECLAIM_COMPLETE)
		t.Fatal(err)
	}
	if err := nk.GraceDone(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ag := range d.Agents() {
		if ag == leader {
			continue
		}
		agenttest.WaitApplied(t, ag, next.Node().View().AppliedIndex())
		cur := ag.Node().View().V4Clients(false)
		if len(cur) != 1 || cur[0].Name != string(a) {
			t.Fatalf("%s after GraceDone: %v, want only %q", ag.Config().NodeID, cur, a)
		}
		if _, rec := ag.Node().View().Epochs(); rec != 0 {
			t.Fatalf("%s still in grace after GraceDone", ag.Config().NodeID)
		}
	}
	st := next.Status()
	if !st.NFSv4.Tracking || st.NFSv4.Clients != 1 || st.NFSv4.GraceStartSMState != st.SMState {
		t.Fatalf("status nfsv4: %+v (sm_state %d)", st.NFSv4, st.SMState)
	}
	page := next.NFSv4Clients()
	if len(page.Clients) != 1 || page.Clients[0].Name != string(a) || page.Clients[0].Epoch != "current" || page.RecoveryEpoch != 0 {
		t.Fatalf("GET /v1/nfsv4/clients: %+v", page)
	}
	body, err := os.ReadFile(next.TrackingStatusFile())
	if err != nil || !slices.Contains(strings.Split(string(body), "\n"), fmt.Sprintf("grace_start_sm_state=%d", st.SMState)) {
		t.Fatalf("hook status file: %q %v", body, err)
	}
}
