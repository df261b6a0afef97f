package e2e

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
)

// The sequential specification the checked fault schedules hold nsmd to
// (checked_linux_test.go): the registration table of SM_MON / SM_UNMON /
// SM_UNMON_ALL plus sm_state, checked for linearizability with porcupine.
//
// Each client operation is one NSM call: an SM_MON {mon_name, my_name,
// cookie}, an SM_UNMON {mon_name, my_name}, an SM_UNMON_ALL {my_name} or an
// SM_STAT. A call either got an answer that says it took effect (stat_succ
// and an sm_state) or it did not (a timeout, a dropped connection,
// stat_fail, state −1): then it may or may not have taken effect — nsmd
// answers stat_fail when a commit fails, and a failed commit can still be
// applied by the next leader. The final read, made after the faults healed
// and the cluster settled, is the table the leader holds.
//
// Rules (DESIGN.md invariants 1 and 2): an answered state is odd and never
// lower than one answered before (in real time) — sm_state rises only at
// takeovers, which the model lets happen at any moment; an acknowledged
// SM_MON's registration (with its cookie) is there at the end unless a later
// acknowledged or possible SM_UNMON / SM_UNMON_ALL of the same lock
// manager removed it; nothing acknowledged as removed comes back. A
// registration belongs to the lock manager that made it (DESIGN.md): an
// SM_UNMON or SM_UNMON_ALL removes only registrations whose last SM_MON
// came the same way (Via: lockd on the same node, or the same client host
// through the VIP). An SM_MON that would replace another lock manager's
// registration is answered stat_fail unless it comes from the serving
// node's lockd, which the model does not track: a stat_fail is "may or may
// not have taken effect" anyway, and an acknowledged SM_MON replaced. (The
// schedules' workers monitor only under their own lock manager's my_name,
// so they do not meet that refusal: checked_linux_test.go, myNames.)

// monNames are the mon_names the workers use (the client hosts' IPs: every
// one of them can receive SM_NOTIFY).
const monNames = 3

type opKind uint8

const (
	opMon opKind = iota
	opUnmon
	opUnmonAll
	opStat
	opRead
)

func (k opKind) String() string {
	return [...]string{"SM_MON", "SM_UNMON", "SM_UNMON_ALL", "SM_STAT", "read"}[k]
}

// nsmInput is what a client asked.
type nsmInput struct {
	Kind opKind
	My   int    // my_name index: the partition (−1 for SM_STAT)
	Mon  int    // mon_name index (SM_MON, SM_UNMON)
	Priv string // SM_MON's cookie, hex
	Via  string // how it was sent, for the visualization
}

// nsmOutput is what it got back.
type nsmOutput struct {
	Known bool             // answered, and the answer says it took effect
	State int32            // the answered sm_state (Known)
	Table [monNames]string // opRead: the cookie registered per mon_name ("" = none)
	Err   string           // why not Known, for the visualization
}

// nsmState is one my_name's registrations, who made each, and the sm_state.
type nsmState struct {
	Priv  [monNames]string
	Owner [monNames]string // the Via of the SM_MON that made it
	SM    int32
}

// effect applies an operation's change to the table: an SM_UNMON or
// SM_UNMON_ALL removes only what the same lock manager (Via) registered.
func effect(s nsmState, in nsmInput) nsmState {
	switch in.Kind {
	case opMon:
		s.Priv[in.Mon], s.Owner[in.Mon] = in.Priv, in.Via
	case opUnmon:
		if s.Owner[in.Mon] == in.Via {
			s.Priv[in.Mon], s.Owner[in.Mon] = "", ""
		}
	case opUnmonAll:
		for m := range s.Priv {
			if s.Owner[m] == in.Via {
				s.Priv[m], s.Owner[m] = "", ""
			}
		}
	}
	return s
}

func stepNSM(state, input, output any) []any {
	s, in, out := state.(nsmState), input.(nsmInput), output.(nsmOutput)
	if in.Kind == opRead {
		if out.Table == s.Priv {
			return []any{s}
		}
		return nil
	}
	if !out.Known {
		n := effect(s, in)
		if n == s {
			return []any{s}
		}
		return []any{s, n}
	}
	if out.State%2 != 1 || out.State < s.SM {
		return nil
	}
	n := effect(s, in)
	n.SM = out.State
	return []any{n}
}

// nsmModel is the porcupine model, partitioned by my_name (SM_UNMON_ALL
// acts on one my_name; SM_STAT has a partition of its own). A partition
// sees only part of the sm_state history, so stateRegressions checks the
// whole history for a falling state too.
func nsmModel(monLabels, myLabels []string) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[int][]porcupine.Operation{}
			for _, op := range h {
				my := op.Input.(nsmInput).My
				by[my] = append(by[my], op)
			}
			keys := make([]int, 0, len(by))
			for k := range by {
				keys = append(keys, k)
			}
			sort.Ints(keys)
			var out [][]porcupine.Operation
			for _, k := range keys {
				out = append(out, by[k])
			}
			return out
		},
		Init: func() []any { return []any{nsmState{}} },
		Step: stepNSM,
		Hash: func(state any) uint64 {
			s := state.(nsmState)
			h := fnv.New64a()
			fmt.Fprintf(h, "%d|%s|%s", s.SM, strings.Join(s.Priv[:], "|"), strings.Join(s.Owner[:], "|"))
			return h.Sum64()
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(nsmInput), output.(nsmOutput)
			name := func(l []string, i int) string {
				if i >= 0 && i < len(l) {
					return l[i]
				}
				return fmt.Sprint(i)
			}
			var call string
			switch in.Kind {
			case opMon:
				call = fmt.Sprintf("SM_MON{%s, %s, %.8s}", name(monLabels, in.Mon), name(myLabels, in.My), in.Priv)
			case opUnmon:
				call = fmt.Sprintf("SM_UNMON{%s, %s}", name(monLabels, in.Mon), name(myLabels, in.My))
			case opUnmonAll:
				call = fmt.Sprintf("SM_UNMON_ALL{%s}", name(myLabels, in.My))
			case opStat:
				call = "SM_STAT"
			case opRead:
				return fmt.Sprintf("final read %s → %v", name(myLabels, in.My), describeTable(out.Table, monLabels))
			}
			if in.Via != "" {
				call += " via " + in.Via
			}
			if !out.Known {
				return call + " → unknown (" + out.Err + ")"
			}
			return fmt.Sprintf("%s → state %d", call, out.State)
		},
		DescribeState: func(state any) string {
			s := state.(nsmState)
			return fmt.Sprintf("sm_state %d, %v", s.SM, describeTable(s.Priv, monLabels))
		},
	}
	return nm.ToModel()
}

func describeTable(t [monNames]string, monLabels []string) string {
	var parts []string
	for i, p := range t {
		if p == "" {
			continue
		}
		l := fmt.Sprint(i)
		if i < len(monLabels) {
			l = monLabels[i]
		}
		parts = append(parts, fmt.Sprintf("%s:%.8s", l, p))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// stateRegressions finds answered states that are even, or lower than a
// state answered before the call was made (real time, whole history).
func stateRegressions(h []porcupine.Operation) []string {
	type ans struct {
		call, ret int64
		state     int32
		desc      string
	}
	var as []ans
	for _, op := range h {
		in, out := op.Input.(nsmInput), op.Output.(nsmOutput)
		if in.Kind == opRead || !out.Known {
			continue
		}
		as = append(as, ans{op.Call, op.Return, out.State, fmt.Sprintf("%s via %s → %d", in.Kind, in.Via, out.State)})
	}
	var bad []string
	byRet := slices.Clone(as)
	slices.SortFunc(byRet, func(a, b ans) int { return int(a.ret - b.ret) })
	byCall := slices.Clone(as)
	slices.SortFunc(byCall, func(a, b ans) int { return int(a.call - b.call) })
	var hi ans
	j := 0
	for _, b := range byCall {
		for j < len(byRet) && byRet[j].ret < b.call {
			if byRet[j].state > hi.state {
				hi = byRet[j]
			}
			j++
		}
		switch {
		case b.state%2 != 1:
			bad = append(bad, fmt.Sprintf("even state answered: %s", b.desc))
		case b.state < hi.state:
			bad = append(bad, fmt.Sprintf("state went back: %s, after %s had returned", b.desc, hi.desc))
		}
	}
	return bad
}

// The model itself must catch what it is there to catch.
func TestNSMModelAcceptsAndRejects(t *testing.T) {
	op := func(c int, call, ret int64, in nsmInput, out nsmOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret}
	}
	mon := func(mon int, priv string) nsmInput { return nsmInput{Kind: opMon, Mon: mon, Priv: priv} }
	unmon := func(mon int) nsmInput { return nsmInput{Kind: opUnmon, Mon: mon} }
	ok := func(s int32) nsmOutput { return nsmOutput{Known: true, State: s} }
	unknown := nsmOutput{Err: "timeout"}
	read := func(t [monNames]string) (nsmInput, nsmOutput) {
		return nsmInput{Kind: opRead}, nsmOutput{Table: t}
	}
	m := nsmModel([]string{"a", "b", "c"}, []string{"x"})
	cases := []struct {
		name string
		h    []porcupine.Operation
		want bool
	}{
		{"mon then read", []porcupine.Operation{
			op(0, 0, 10, mon(0, "p1"), ok(3)),
			func() porcupine.Operation { i, o := read([monNames]string{"p1"}); return op(1, 20, 30, i, o) }(),
		}, true},
		{"acknowledged mon lost", []porcupine.Operation{
			op(0, 0, 10, mon(0, "p1"), ok(3)),
			func() porcupine.Operation { i, o := read([monNames]string{}); return op(1, 20, 30, i, o) }(),
		}, false},
		{"acknowledged unmon resurrected", []porcupine.Operation{
			op(0, 0, 10, mon(1, "p1"), ok(3)),
			op(0, 11, 20, unmon(1), ok(3)),
			func() porcupine.Operation { i, o := read([monNames]string{"", "p1"}); return op(1, 30, 40, i, o) }(),
		}, false},
		{"old cookie after a newer acknowledged mon", []porcupine.Operation{
			op(0, 0, 10, mon(2, "old"), ok(3)),
			op(0, 11, 20, mon(2, "new"), ok(3)),
			func() porcupine.Operation { i, o := read([monNames]string{"", "", "old"}); return op(1, 30, 40, i, o) }(),
		}, false},
		{"concurrent mon and unmon: either order", []porcupine.Operation{
			op(0, 0, 10, mon(0, "p1"), ok(3)),
			op(1, 5, 15, unmon(0), ok(3)),
			func() porcupine.Operation { i, o := read([monNames]string{"p1"}); return op(2, 20, 30, i, o) }(),
		}, true},
		{"unanswered mon may have happened", []porcupine.Operation{
			op(0, 0, 10, mon(0, "p1"), unknown),
			func() porcupine.Operation { i, o := read([monNames]string{"p1"}); return op(1, 20, 30, i, o) }(),
		}, true},
		{"unanswered mon may not have happened", []porcupine.Operation{
			op(0, 0, 10, mon(0, "p1"), unknown),
			func() porcupine.Operation { i, o := read([monNames]string{}); return op(1, 20, 30, i, o) }(),
		}, true},
		{"state went back", []porcupine.Operation{
			op(0, 0, 10, nsmInput{Kind: opStat, My: 0}, ok(5)),
			op(1, 20, 30, mon(0, "p1"), ok(3)),
		}, false},
		{"even state", []porcupine.Operation{
			op(0, 0, 10, mon(0, "p1"), ok(4)),
		}, false},
		{"unmon by another lock manager keeps it", []porcupine.Operation{
			op(0, 0, 10, nsmInput{Kind: opMon, Mon: 0, Priv: "p1", Via: "lockd on n1"}, ok(3)),
			op(1, 11, 20, nsmInput{Kind: opUnmon, Mon: 0, Via: "lockd on n2"}, ok(3)),
			op(1, 21, 25, nsmInput{Kind: opUnmonAll, Via: "lockd on n2"}, ok(3)),
			func() porcupine.Operation { i, o := read([monNames]string{"p1"}); return op(2, 30, 40, i, o) }(),
		}, true},
		{"unmon by another lock manager removed it", []porcupine.Operation{
			op(0, 0, 10, nsmInput{Kind: opMon, Mon: 0, Priv: "p1", Via: "lockd on n1"}, ok(3)),
			op(1, 11, 20, nsmInput{Kind: opUnmonAll, Via: "lockd on n2"}, ok(3)),
			func() porcupine.Operation { i, o := read([monNames]string{}); return op(2, 30, 40, i, o) }(),
		}, false},
		{"the owner's unmon removes it", []porcupine.Operation{
			op(0, 0, 10, nsmInput{Kind: opMon, Mon: 0, Priv: "p1", Via: "lockd on n1"}, ok(3)),
			op(1, 11, 20, nsmInput{Kind: opUnmon, Mon: 0, Via: "lockd on n1"}, ok(3)),
			func() porcupine.Operation { i, o := read([monNames]string{}); return op(2, 30, 40, i, o) }(),
		}, true},
		{"state rises at a takeover", []porcupine.Operation{
			op(0, 0, 10, mon(0, "p1"), ok(3)),
			op(1, 20, 30, unmon(0), ok(5)),
			func() porcupine.Operation { i, o := read([monNames]string{}); return op(2, 40, 50, i, o) }(),
		}, true},
	}
	for _, tc := range cases {
		if got := porcupine.CheckOperations(m, tc.h); got != tc.want {
			t.Errorf("%s: linearizable=%v, want %v", tc.name, got, tc.want)
		}
	}
	// The whole-history sweep sees a fall across partitions.
	h := []porcupine.Operation{
		op(0, 0, 10, nsmInput{Kind: opStat, My: -1, Via: "vip"}, ok(7)),
		op(1, 20, 30, nsmInput{Kind: opMon, My: 2, Via: "n3 lockd"}, ok(5)),
		op(2, 5, 25, nsmInput{Kind: opMon, My: 1, Via: "vip"}, ok(5)), // concurrent: fine
	}
	if bad := stateRegressions(h); len(bad) != 1 || !strings.Contains(bad[0], "n3 lockd") {
		t.Errorf("stateRegressions = %q, want the one fall via n3", bad)
	}
}
