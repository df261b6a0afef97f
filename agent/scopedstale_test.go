//go:build linux

package agent

import (
	"context"
	"slices"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/nsmd/nsmd/cluster"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/grace"
)

// A service's write that the state refused changed nothing, so it is no
// news to the service's NFSv4 side: an NFSv4 client create sent by a run
// of the service that ended before it was applied (fsm.ErrStaleRun) does
// not count as that client coming back to the service's grace here. The
// control: the same create, sent by the service's current run, does.
func TestARefusedServiceWriteIsNoClientBack(t *testing.T) {
	var a *Agent
	var index uint64
	f := fsm.New(fsm.Options{Observer: func(i uint64, cmd fsm.Command, res fsm.Result) {
		if _, ok := cmd.(fsm.Scoped); ok { // the agent's other subscribers are not built here
			a.applied(cluster.Applied{Index: i, Cmd: cmd, Result: res})
		}
	}})
	apply := func(cmds ...fsm.Command) []fsm.Result {
		t.Helper()
		b, err := fsm.Encode(cmds...)
		if err != nil {
			t.Fatal(err)
		}
		index++
		res, ok := f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: b}).([]fsm.Result)
		if !ok {
			t.Fatalf("apply %T failed", cmds[0])
		}
		return res
	}
	run := func(node string, epoch uint64, c fsm.Command) fsm.Scoped {
		return fsm.Scoped{Service: "a", Node: node, Epoch: epoch, Cmd: c}
	}
	sc := &fsmScopes{t: t, f: f}
	g, err := grace.New(grace.Config{Node: "n1", Proc: t.TempDir()}, serviceGraceCluster{fsmScope{sc, "a"}})
	if err != nil {
		t.Fatal(err)
	}
	a = &Agent{svcNSM: &serviceNSMs{byID: map[string]*serviceNSM{}},
		svcV4: &serviceV4s{byID: map[string]*serviceV4{"a": {grace: g}}}}

	apply(fsm.ServicesDeclared{Node: "n1", Services: []fsm.ServiceDecl{{ID: "a", Fingerprint: "fa"}}},
		fsm.ServicesDeclared{Node: "n2", Services: []fsm.ServiceDecl{{ID: "a", Fingerprint: "fa"}}},
		fsm.ServicePlaced{Service: "a", Node: "n1", Epoch: 1, Reason: "placed"})
	apply(run("n1", 1, fsm.ClientCreate{Name: "v4-a", PrincHash: "p"}))
	// a starts here at epoch 1: its grace expects v4-a.
	g.Takeover(fsm.ServiceSMState(1))
	if _, err := g.Tracking().GraceStart(context.Background()); err != nil {
		t.Fatal(err)
	}
	missing := func() []string { return g.Status().NFSv4.Missing }
	if m := missing(); !slices.Equal(m, []string{"v4-a"}) {
		t.Fatalf("a's grace waits for %q, want v4-a", m)
	}

	// A create of the ended run, applied after a moved on: refused, no news.
	apply(fsm.ServicePlaced{Service: "a", Node: "n2", Epoch: 2, From: "n1", Reason: "moved"})
	if res := apply(run("n1", 1, fsm.ClientCreate{Name: "v4-a", PrincHash: "p"})); !res[0].Refused {
		t.Fatalf("the ended run's create was applied: %+v", res[0])
	}
	if m := missing(); !slices.Equal(m, []string{"v4-a"}) {
		t.Fatalf("a refused create counted as v4-a coming back: still waiting for %q", m)
	}
	// Control: the current run's create counts.
	apply(run("n2", 2, fsm.ClientCreate{Name: "v4-a", PrincHash: "p"}))
	if m := missing(); len(m) != 0 {
		t.Fatalf("control: an applied create did not count: still waiting for %q", m)
	}
}
