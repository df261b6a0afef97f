// Package timeline is a takeover's timeline: the named steps a new leader
// goes through, from the last word of the leader before it to the end of
// the kernel's grace periods, in their usual order, and when this node
// reached each one (on its own clock).
//
// The step table below is the one definition of the steps: their names
// (the keys of GET /v1/status's "takeover"), their labels (the status
// page, the drill's report) and their order. Adding a step is one constant
// and its row here, plus the Mark where it happens; every reader renders
// the table.
package timeline

import "time"

// Step is one step of a takeover.
type Step int

// The steps, in their usual order. (Their times may come in another: the
// clients' first reclaims can precede the end of the SM_NOTIFY fan-out.)
const (
	// PrevLeaderContact: this node, as a follower, last heard from the
	// leader before it (after a crash: within a heartbeat before it).
	// Elected − PrevLeaderContact is failure detection and election.
	PrevLeaderContact Step = iota
	// Elected: raft made this node leader.
	Elected
	// Committed: its Takeover command was applied.
	Committed
	// Fenced: every other node that may still have served was proven not
	// to (it answered so, a fence agent reported it off, an operator
	// confirmed it, or its watchdog's bound passed); absent when there was
	// nothing to wait for. GET /v1/status's "fence" says by what.
	Fenced
	// VIP: the floating address was taken (or there is none to take).
	VIP
	// HookStarted: the on_leader script started (it may have waited
	// behind an on_follower still running); absent without a script.
	HookStarted
	// NFSdGraceStart: nfsd, started by the hook, sent its GraceStart
	// upcall and nsmd answered it (the NFSv4 clients that may reclaim
	// were handed to the kernel).
	NFSdGraceStart
	// OnLeaderDone: the on_leader hook returned; SM_NOTIFY goes out.
	OnLeaderDone
	// NotifyStarted: the SM_NOTIFY fan-out started (again after an
	// SM_SIMU_CRASH); NotifyDone: every host it started with answered or
	// was given up.
	NotifyStarted
	NotifyDone
	// NLMFirstBack: the first SM_MON committed after the takeover (this
	// node's lockd monitors a client at its first lock — a reclaim during
	// grace); NLMAllBack: every host monitored at the takeover did so.
	NLMFirstBack
	NLMAllBack
	// NFSv4FirstBack: the first NFSv4 client back (a cld Create committed,
	// or an NFSv4.0 client of the recovery epoch confirmed by nfsd);
	// NFSv4AllBack: every client of the recovery epoch.
	NFSv4FirstBack
	NFSv4AllBack
	// NLMGraceEnd, NFSv4GraceEnd: lockd's and nfsd's grace seen over (by
	// the grace keeper, which ended it or saw the kernel end it).
	NLMGraceEnd
	NFSv4GraceEnd

	numSteps // keep last
)

// Def is a step's row in the table.
type Def struct {
	// Name is the step's key in the admin API's JSON.
	Name string
	// Label is how people read it.
	Label string
	// Always: the admin API's JSON has the key even when the step was not
	// reached (as the zero time), as it always had.
	Always bool
}

// table is the step table, in the order of the constants.
var table = [numSteps]Def{
	PrevLeaderContact: {Name: "prev_leader_contact", Label: "previous leader (or witness) last heard"},
	Elected:           {Name: "elected", Label: "elected", Always: true},
	Committed:         {Name: "committed", Label: "takeover committed", Always: true},
	Fenced:            {Name: "fenced", Label: "every other server proven stopped"},
	VIP:               {Name: "vip", Label: "VIP taken", Always: true},
	HookStarted:       {Name: "hook_started", Label: "on_leader hook started"},
	NFSdGraceStart:    {Name: "nfsd_grace_start", Label: "nfsd GraceStart answered"},
	OnLeaderDone:      {Name: "on_leader_done", Label: "on_leader hook done", Always: true},
	NotifyStarted:     {Name: "notify_started", Label: "SM_NOTIFY fan-out started"},
	NotifyDone:        {Name: "notify_done", Label: "SM_NOTIFY fan-out complete"},
	NLMFirstBack:      {Name: "nlm_first_back", Label: "first SM_MON (NLM reclaim)"},
	NLMAllBack:        {Name: "nlm_all_back", Label: "every NLM client back"},
	NFSv4FirstBack:    {Name: "nfsv4_first_back", Label: "first NFSv4 client back"},
	NFSv4AllBack:      {Name: "nfsv4_all_back", Label: "every NFSv4 client back"},
	NLMGraceEnd:       {Name: "nlm_grace_end", Label: "lockd grace over"},
	NFSv4GraceEnd:     {Name: "nfsv4_grace_end", Label: "nfsd grace over"},
}

// Steps lists every step in the table's order.
func Steps() []Step {
	out := make([]Step, numSteps)
	for i := range out {
		out[i] = Step(i)
	}
	return out
}

// Defs lists every step's row, in the table's order.
func Defs() []Def { return append([]Def(nil), table[:]...) }

// Def is s's row in the table (the zero Def for a step out of range).
func (s Step) Def() Def {
	if s < 0 || s >= numSteps {
		return Def{}
	}
	return table[s]
}

// Name is s's key in the admin API's JSON.
func (s Step) Name() string { return s.Def().Name }

// Label is how people read s.
func (s Step) Label() string { return s.Def().Label }

// String is s's name.
func (s Step) String() string { return s.Name() }

// ByName finds the step of that name.
func ByName(name string) (Step, bool) {
	for i, d := range table {
		if d.Name == name {
			return Step(i), true
		}
	}
	return 0, false
}

// Timeline is when this node's last takeover reached each step (zero: not
// yet, or not on this node), all on this node's clock. State is the
// takeover's sm_state: a mark for another takeover is not this one's. A
// Timeline is a value: copies do not share their marks.
type Timeline struct {
	State int32
	at    [numSteps]time.Time
}

// Mark records that step s was reached at t (the zero time clears it).
func (tl *Timeline) Mark(s Step, t time.Time) {
	if s >= 0 && s < numSteps {
		tl.at[s] = t
	}
}

// MarkFirst records t for s unless s was already reached.
func (tl *Timeline) MarkFirst(s Step, t time.Time) {
	if tl.At(s).IsZero() {
		tl.Mark(s, t)
	}
}

// At is when step s was reached (zero: not reached).
func (tl Timeline) At(s Step) time.Time {
	if s < 0 || s >= numSteps {
		return time.Time{}
	}
	return tl.at[s]
}

// Mark is one reached step.
type Mark struct {
	Step Step
	At   time.Time
}

// Reached lists the steps reached, in the table's order.
func (tl Timeline) Reached() []Mark {
	var out []Mark
	for i, t := range tl.at {
		if !t.IsZero() {
			out = append(out, Mark{Step: Step(i), At: t})
		}
	}
	return out
}
