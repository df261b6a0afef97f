package admin

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nlm"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/timeline"
)

// Status is the body of GET /v1/status (DESIGN.md, outside contract).
type Status struct {
	NodeID string `json:"node_id"`
	// ClusterID is the cluster this node belongs to (gossip members with
	// another one are refused); Version is this node's build.
	ClusterID string    `json:"cluster_id"`
	Version   BuildInfo `json:"version"`
	Role      string    `json:"role"`
	// RaftState is raft's own view (leader, follower, candidate): a
	// witness that briefly leads has role "witness" and raft_state "leader".
	RaftState string `json:"raft_state"`
	Witness   bool   `json:"witness,omitempty"`
	// WitnessHandoffs counts the times this witness won an election and
	// passed leadership to a serving node.
	WitnessHandoffs uint64         `json:"witness_handoffs,omitempty"`
	LeaderID        string         `json:"leader_id"`
	Term            uint64         `json:"term"`
	SMState         int32          `json:"sm_state"`
	Registrations   int            `json:"registrations"`
	VIP             string         `json:"vip"`
	VIPHeld         bool           `json:"vip_held"`
	NSMAddr         string         `json:"nsm_addr"`
	GraceUntil      *time.Time     `json:"grace_until"`
	AppliedIndex    uint64         `json:"applied_index"`
	Notify          NotifyProgress `json:"notify"`
	// Takeover is this node's last takeover, step by step (absent on a
	// node that never took over). on_leader_done − vip is the hook's time.
	Takeover *Timeline `json:"takeover,omitempty"`
	// TLS says raft and the admin API use mutual TLS; Insecure lists what
	// runs unprotected beyond loopback because insecure is set.
	TLS bool `json:"tls"`
	// Disk: whether the data directory takes writes (a node that cannot
	// write stays out of elections).
	Disk Disk `json:"disk"`
	// Ready: this node knows the current incarnation's sm_state and
	// answers NSM (cluster.Node.Ready).
	Ready    bool     `json:"ready"`
	Insecure []string `json:"insecure,omitempty"`
	// LastHookFailure is the most recent failed hook script, if any.
	LastHookFailure *HookFailure `json:"last_hook_failure,omitempty"`
	// NFSv4 is the NFSv4 client-tracking table and pipe.
	NFSv4 NFSv4Status `json:"nfsv4"`
	// Grace is the kernel grace periods of this node's last takeover:
	// how many clients could reclaim, how many came back, when and why
	// each grace ended (absent on a node that never took over).
	Grace *Grace `json:"grace,omitempty"`
	// Fence is how this node is fenced and what it waited for before it
	// last served.
	Fence Fence `json:"fence"`
	// Process is the nsmd process behind this node and its machine's
	// boot: a drill tells a reset node (another boot) from a restarted
	// process (another start) from one that kept running.
	Process *Process `json:"process,omitempty"`
}

// Process is GET /v1/status's "process".
type Process struct {
	PID int `json:"pid"`
	// Started is when this node's agent started (a node nsmd dev
	// restarts after a crash drill starts again in the same process).
	Started time.Time `json:"started"`
	// BootID is the kernel's boot id (/proc/sys/kernel/random/boot_id):
	// it changes at every boot; empty where the kernel has none.
	BootID string `json:"boot_id,omitempty"`
	// InProcess: one of nsmd dev's nodes, which share one process: a
	// signal or a firewall rule would hit them all.
	InProcess bool `json:"in_process,omitempty"`
}

// Fence is a node's fencing: GET /v1/status's "fence".
type Fence struct {
	// Mode: watchdog, agent or watchdog+agent; off on a serving node that
	// runs without any fence (the operator said so); none on a node that
	// never serves (a witness, or no on_leader hook).
	Mode string `json:"mode"`
	// Serving: from before the on_leader hook until on_follower succeeded.
	Serving  bool           `json:"serving"`
	Watchdog *FenceWatchdog `json:"watchdog,omitempty"`
	// Agent is the fence agent this node runs against another node that
	// may still serve.
	Agent string `json:"agent,omitempty"`
	// StopFailed: the last stop failed; the watchdog resets this node.
	StopFailed bool `json:"stop_failed,omitempty"`
	// Waiting: this node leads and waits for the others to be proven
	// stopped before it serves.
	Waiting  bool       `json:"waiting,omitempty"`
	LastWait *FenceWait `json:"last_wait,omitempty"`
	// Promises: what each serving node promises (admin/fence.go).
	Promises *FencePromises `json:"promises,omitempty"`
	// Hypervisor: what says this serving node runs under a hypervisor
	// (the CPU's hypervisor flag, the DMI vendor); empty when nothing does.
	Hypervisor string `json:"hypervisor,omitempty"`
	// PauseUncovered: it runs under a hypervisor fenced by its watchdog
	// alone. A pause of the VM pauses the watchdog too: nothing resets the
	// node while it is paused, and it may resume serving beside its
	// successor. A fence agent or ext4 multi-mount protection covers it.
	PauseUncovered bool `json:"pause_uncovered,omitempty"`
}

// FenceWatchdog is a serving node's watchdog.
type FenceWatchdog struct {
	Device         string  `json:"device"`
	TimeoutSeconds float64 `json:"timeout_seconds"`
	Armed          bool    `json:"armed"`
	// Starving: armed but not fed, for lack of proof that this node may
	// serve (no quorum within the lease, a stop failed, a hook overran).
	Starving bool       `json:"starving,omitempty"`
	LastFeed *time.Time `json:"last_feed,omitempty"`
	// Deadline: when the watchdog resets the node unless fed or disarmed.
	Deadline *time.Time `json:"deadline,omitempty"`
}

// FenceWait is what a new leader waited for before it served: one entry
// per other serving node.
type FenceWait struct {
	At      time.Time    `json:"at"`
	Seconds float64      `json:"seconds"`
	Nodes   []FencedNode `json:"nodes"`
	Aborted string       `json:"aborted,omitempty"`
}

// FencedNode says how another serving node was proven not to serve: by
// "clean" (it said so after its stop), "agent" (the fence agent reported
// it off) or "watchdog" (its watchdog must have reset it by then), after
// Seconds of the wait.
type FencedNode struct {
	Node    string  `json:"node"`
	By      string  `json:"by"`
	Seconds float64 `json:"seconds"`
	Detail  string  `json:"detail,omitempty"`
}

// NotifyProgress is the SM_NOTIFY fan-out progress of the current leader term.
type NotifyProgress struct {
	Pending int   `json:"pending"`
	Done    int   `json:"done"`
	Failed  int   `json:"failed"`
	Targets int   `json:"targets"` // hosts the fan-out started with
	State   int32 `json:"state"`   // sm_state it sends
}

// Timeline is a node's last takeover, step by step, on that node's clock:
// each step reached (package timeline's table: elected, its Takeover
// committed, the VIP taken, the on_leader hook, the SM_NOTIFY fan-out,
// the clients coming back, the kernel graces' end), in the table's order.
// Differences between its times are durations on one clock; compare them
// with another machine's clock only through a shared event (the drill
// anchors them on the VIP answering with the new state).
//
// On the wire it is one object: "sm_state" and one key per step, its name,
// with the time it was reached; a step not reached is left out, except
// elected, committed, vip and on_leader_done, which are always there (the
// zero time when not reached). A reader keeps the steps it does not know
// (a newer node's), labelled with their name.
type Timeline struct {
	State int32
	Steps []TimelineStep
}

// TimelineStep is one step reached.
type TimelineStep struct {
	Name  string
	Label string // the step table's label (the name for a step not in it)
	At    time.Time
}

// At is when the step of that name was reached (zero: not reached).
func (t *Timeline) At(name string) time.Time {
	for _, s := range t.Steps {
		if s.Name == name {
			return s.At
		}
	}
	return time.Time{}
}

// MarshalJSON writes the wire form: the steps as keys.
func (t Timeline) MarshalJSON() ([]byte, error) {
	at := make(map[string]time.Time, len(t.Steps))
	for _, s := range t.Steps {
		at[s.Name] = s.At
	}
	var b bytes.Buffer
	b.WriteByte('{')
	put := func(key string, v any) error {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		val, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("takeover step %s: %w", key, err)
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(val)
		return nil
	}
	// The steps that are always there, sm_state, then the others reached,
	// in the table's order; then any the table does not know.
	defs := timeline.Defs()
	for _, always := range []bool{true, false} {
		if !always {
			if err := put("sm_state", t.State); err != nil {
				return nil, err
			}
		}
		for _, d := range defs {
			v := at[d.Name]
			if d.Always != always || (!always && v.IsZero()) {
				continue
			}
			if err := put(d.Name, v); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range t.Steps {
		if _, known := timeline.ByName(s.Name); known || s.Name == "sm_state" || s.At.IsZero() {
			continue
		}
		if err := put(s.Name, s.At); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads the wire form: every key but sm_state whose value
// is a time is a step; the zero time is a step not reached.
func (t *Timeline) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("takeover timeline: %w", err)
	}
	*t = Timeline{}
	for name, v := range m {
		if name == "sm_state" {
			if err := json.Unmarshal(v, &t.State); err != nil {
				return fmt.Errorf("takeover timeline: sm_state: %w", err)
			}
			continue
		}
		var at time.Time
		if json.Unmarshal(v, &at) != nil || at.IsZero() {
			continue // not a step (a newer node's other field), or not reached
		}
		label := name
		if s, ok := timeline.ByName(name); ok {
			label = s.Label()
		}
		t.Steps = append(t.Steps, TimelineStep{Name: name, Label: label, At: at})
	}
	t.sort()
	return nil
}

// sort orders the steps as the table does; steps it does not know go
// last, by time.
func (t *Timeline) sort() {
	rank := func(name string) int {
		if s, ok := timeline.ByName(name); ok {
			return int(s)
		}
		return len(timeline.Defs())
	}
	slices.SortStableFunc(t.Steps, func(a, b TimelineStep) int {
		if c := cmp.Compare(rank(a.Name), rank(b.Name)); c != 0 {
			return c
		}
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// TimelineOf is tl in the admin API's form: its steps reached, in the
// table's order, with their labels.
func TimelineOf(tl timeline.Timeline) Timeline {
	t := Timeline{State: tl.State}
	for _, m := range tl.Reached() {
		t.Steps = append(t.Steps, TimelineStep{Name: m.Step.Name(), Label: m.Step.Label(), At: m.At})
	}
	return t
}

// TimelineSummary is the one-line form of a node's last takeover
// (Status.Takeover) that nsmd status prints: each step reached, in the
// table's order, in ms from the election.
func TimelineSummary(t *Timeline) string {
	if t == nil {
		return "this node has not taken over since it started"
	}
	t0 := t.At(timeline.Elected.Name())
	parts := make([]string, 0, len(t.Steps))
	for _, s := range t.Steps {
		if t0.IsZero() {
			parts = append(parts, s.Label)
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %+dms", s.Label, s.At.Sub(t0).Milliseconds()))
	}
	return fmt.Sprintf("sm_state %d: %s", t.State, strings.Join(parts, ", "))
}

// Grace is the kernel grace periods of a node's last takeover: GET
// /v1/status's "grace".
type Grace struct {
	// SMState is the sm_state of that takeover.
	SMState int32     `json:"sm_state,omitempty"`
	Started time.Time `json:"started"`
	// Settle is how long reclaims must be quiet before nsmd ends a grace
	// (a Go duration, e.g. "3s").
	Settle string       `json:"settle"`
	NLM    GraceManager `json:"nlm"`
	NFSv4  GraceManager `json:"nfsv4"`
	Error  string       `json:"error,omitempty"`
	// LastActivity is when reclaim activity was last seen (a client
	// back, a new lock in /proc/locks): nsmd ends a grace Settle after it.
	LastActivity time.Time `json:"last_activity,omitzero"`
}

// GraceManagers names the kernel's lock managers as Grace does, in its
// order: lockd's (nlm) and nfsd's (nfsv4).
func GraceManagers() []string { return []string{"nlm", "nfsv4"} }

// Manager is the grace of the lock manager of that name (GraceManagers).
func (g *Grace) Manager(name string) GraceManager {
	if name == "nlm" {
		return g.NLM
	}
	return g.NFSv4
}

// GraceManager is one lock manager's grace.
type GraceManager struct {
	// Expected is how many clients could reclaim; Back how many came back;
	// Missing names some that have not (at most 8).
	Expected int      `json:"expected"`
	Back     int      `json:"back"`
	Missing  []string `json:"missing,omitempty"`
	// LastSeen says, for those of Missing that are NFSv4 clients a server
	// of this cluster saw, when each last renewed its lease (by the last
	// sample the nodes shared): a client gone for hours is a courtesy
	// client that will not come back, and the grace timer ends this grace.
	LastSeen map[string]time.Time `json:"last_seen,omitempty"`
	// MissingHidden is how many names of Missing were withheld from this
	// reader: client names are shown only to an operator (Status.ForReader).
	MissingHidden int       `json:"missing_hidden,omitempty"`
	Ended         *GraceEnd `json:"ended,omitempty"`
	// Seconds is how long after the takeover it ended (0 while in grace).
	Seconds float64 `json:"seconds,omitempty"`
	// Absent: this lock manager does not run here (no lockd, or no nfsd).
	Absent bool `json:"absent,omitempty"`
}

// GraceEnd is when and why a grace ended: all_reclaimed or
// nothing_to_reclaim (nsmd ended it), kernel (its timer, or every NFSv4.1+
// client sent RECLAIM_COMPLETE).
type GraceEnd struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// Pipe is the NFSv4 client-tracking pipe: GET /v1/status's nfsv4.pipe.
type Pipe struct {
	Path  string    `json:"pipe"`            // the pipe's path
	State string    `json:"state"`           // waiting, open, no_pipefs, error …
	Err   string    `json:"error,omitempty"` // why, when State says trouble
	Since time.Time `json:"since"`           // when State (or Err) last changed
	// Version is the message version the kernel uses on this pipe (0
	// before its first upcall).
	Version               uint8     `json:"version"`
	LastGraceStart        time.Time `json:"last_grace_start,omitzero"`
	LastGraceStartRecords int       `json:"last_grace_start_records"`
	// Upcalls counts the upcalls answered, by command ("create",
	// "remove", "check", "grace_done", "grace_start", "get_version").
	Upcalls map[string]uint64 `json:"upcalls"`
	Failed  uint64            `json:"failed"`  // answered with an error status
	Refused uint64            `json:"refused"` // malformed, refused
}

// Disk is the health of a node's data directory.
type Disk struct {
	Writable bool      `json:"writable"`
	Since    time.Time `json:"since"`
	Error    string    `json:"error,omitempty"`
	Failures uint64    `json:"write_failures"`
	// Slow: the median write over the last 2 s is above disk_slow_threshold;
	// the node hands leadership away and stays out of elections.
	Slow      bool          `json:"slow"`
	SlowSince time.Time     `json:"slow_since,omitzero"`
	WriteP50  time.Duration `json:"write_p50_ns"`
}

// HookFailure is the last hook run that did not succeed.
type HookFailure struct {
	Hook   string    `json:"hook"` // on_leader | on_follower | on_fault
	Event  string    `json:"event"`
	Reason string    `json:"reason,omitempty"` // NSMD_REASON of that run
	At     time.Time `json:"at"`
	Err    string    `json:"error"`
	Output string    `json:"output,omitempty"` // the last lines of stdout+stderr
}

// NFSv4Status is the NFSv4 part of GET /v1/status: the node's own
// tracking, and the clients the cluster last saw its servers know.
type NFSv4Status struct {
	NFSv4Tracking
	// ClientsSeen is how many NFSv4 clients this node knows when a server
	// of the cluster last saw (nsmd_nfsv4_clients_seen).
	ClientsSeen int `json:"clients_seen"`
}

// NFSv4Tracking is nsmd's service of nfsd's NFSv4 client-tracking
// upcall, as a status shows it: the node's (NFSv4Status) or one
// service's on the server that serves it (ServiceNFSv4).
type NFSv4Tracking struct {
	// Tracking: nsmd serves the kernel's NFSv4 client-tracking upcall.
	Tracking    bool   `json:"tracking"`
	TrackingWhy string `json:"tracking_off_why,omitempty"`
	Pipe        *Pipe  `json:"pipe,omitempty"`
	// The replicated table: epochs and records (clients that may reclaim
	// after the next failover or move; during grace, those that may
	// reclaim now and how many did).
	CurrentEpoch  uint64 `json:"current_epoch"`
	RecoveryEpoch uint64 `json:"recovery_epoch"`
	Clients       int    `json:"clients"`
	Reclaimable   int    `json:"reclaimable"`
	Reclaimed     int    `json:"reclaimed"`
	// GraceStartSMState is the sm_state (the node's, or the service's)
	// whose nfsd's GraceStart this node answered last; the start hook
	// waits for it.
	GraceStartSMState int32      `json:"grace_start_sm_state,omitempty"`
	GraceStartAt      *time.Time `json:"grace_start_at,omitempty"`
}

// Member is one row of GET /v1/members: a node as gossip and raft see it.
type Member struct {
	ID         string `json:"id"`
	GossipAddr string `json:"gossip_addr"`
	RaftAddr   string `json:"raft_addr"`
	NSMAddr    string `json:"nsm_addr"`
	Version    string `json:"version"`
	State      string `json:"state"`    // alive | suspect | dead | left | unknown (in raft only)
	Suffrage   string `json:"suffrage"` // Voter | Nonvoter | Staging | "" (not in raft)
	Leader     bool   `json:"leader"`
	Witness    bool   `json:"witness,omitempty"`
	// Role is leader, follower or witness (what the member is for; a
	// witness that briefly leads is still a witness, with Leader set).
	Role string `json:"role"`
}

// RegistrationJSON is one row of GET /v1/registrations.
type RegistrationJSON struct {
	MonName  string    `json:"mon_name"`
	MyName   string    `json:"my_name"`
	MyProg   uint32    `json:"my_prog"`
	MyVers   uint32    `json:"my_vers"`
	MyProc   uint32    `json:"my_proc"`
	Priv     string    `json:"priv"`
	Node     string    `json:"node"`
	Callback string    `json:"callback"`
	Addrs    []string  `json:"addrs,omitempty"`
	Added    time.Time `json:"added"`
}

// RegistrationPage is the body of GET /v1/registrations.
type RegistrationPage struct {
	Registrations []RegistrationJSON `json:"registrations"`
	// Next, when set, is the `after` value for the next page.
	Next string `json:"next,omitempty"`
}

// registrationRow is g as a row of GET /v1/registrations.
func registrationRow(g fsm.Registration) RegistrationJSON {
	rj := RegistrationJSON{
		MonName: g.ID.MonName, MyName: g.ID.My.MyName, MyProg: g.ID.My.Prog, MyVers: g.ID.My.Vers, MyProc: g.ID.My.Proc,
		Priv: hex.EncodeToString(g.Priv[:]), Node: g.Node, Callback: g.Callback.String(), Added: g.Added.UTC(),
	}
	for _, ad := range g.Addrs {
		rj.Addrs = append(rj.Addrs, ad.String())
	}
	return rj
}

// Registration validates a row as SM_MON would (names, a 16-byte priv in
// hex, a callback address) and makes it the registration of node owner,
// added at now.
func (rj RegistrationJSON) Registration(owner string, now time.Time) (fsm.Registration, error) {
	if !nsm.ValidName(rj.MonName) || !nsm.ValidName(rj.MyName) {
		return fsm.Registration{}, fmt.Errorf("invalid mon_name %q or my_name %q", rj.MonName, rj.MyName)
	}
	// rpc.statd's rule for SM_MON, which the NSM service applies too: the
	// callback goes to the lock manager's program and callback procedure.
	if rj.MyProg != nlm.Program || (rj.MyProc != nlm.ProcSMNotify && rj.MyProc != nlm.ProcSMNotifyAlt) {
		return fsm.Registration{}, fmt.Errorf("my_prog %d my_proc %d: want %d and %d or %d (the lock manager's callback)",
			rj.MyProg, rj.MyProc, nlm.Program, nlm.ProcSMNotify, nlm.ProcSMNotifyAlt)
	}
	reg := fsm.Registration{
		ID:    fsm.MonID{MonName: rj.MonName, My: fsm.MyID{MyName: rj.MyName, Prog: rj.MyProg, Vers: rj.MyVers, Proc: rj.MyProc}},
		Node:  owner,
		Added: now,
	}
	priv, err := hex.DecodeString(rj.Priv)
	if err != nil || len(priv) != nsm.PrivLen {
		return reg, fmt.Errorf("priv %q is not %d hex bytes", rj.Priv, nsm.PrivLen)
	}
	copy(reg.Priv[:], priv)
	if reg.Callback, err = netip.ParseAddr(rj.Callback); err != nil {
		return reg, fmt.Errorf("callback %q: %w", rj.Callback, err)
	}
	if ip, err := netip.ParseAddr(rj.MonName); err == nil {
		reg.Addrs = []netip.Addr{ip}
	}
	return reg, nil
}

// ImportRequest is the body of POST /v1/import.
type ImportRequest struct {
	// State is the sm_state the previous server had; ours goes above it.
	State int32 `json:"state"`
	// Node owns the registrations (delivers their callbacks); default:
	// the node that receives the request.
	Node          string             `json:"node,omitempty"`
	Registrations []RegistrationJSON `json:"registrations"`
}

// ImportResult is the answer of POST /v1/import.
type ImportResult struct {
	Imported int   `json:"imported"`
	SMState  int32 `json:"sm_state"`
}

// V4ClientJSON is one row of GET /v1/nfsv4/clients: a client-tracking
// record. Name is the client's id as the kernel gave it (Go-quoted when it
// is not printable UTF-8), PrincHash the hex of its principal's hash.
type V4ClientJSON struct {
	Epoch     string `json:"epoch"` // current | recovery
	Name      string `json:"name"`
	PrincHash string `json:"princ_hash,omitempty"`
}

// V4ClientPage is the body of GET /v1/nfsv4/clients.
type V4ClientPage struct {
	CurrentEpoch  uint64         `json:"current_epoch"`
	RecoveryEpoch uint64         `json:"recovery_epoch"`
	Clients       []V4ClientJSON `json:"clients"`
}

// V4ClientRow is record c of epoch ("current" or "recovery") as a row of
// GET /v1/nfsv4/clients.
func V4ClientRow(epoch string, c fsm.V4Client) V4ClientJSON {
	name := c.Name
	if !utf8.ValidString(name) || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		name = strconv.Quote(name)
	}
	return V4ClientJSON{Epoch: epoch, Name: name, PrincHash: hex.EncodeToString([]byte(c.PrincHash))}
}

// Overview is the body of GET /v1/overview: what the status page shows,
// in one read of this node.
type Overview struct {
	Status  Status   `json:"status"`
	Members []Member `json:"members"`
	// LastTakeover is the cluster's last committed takeover, from the
	// replicated state (every node knows it, whoever took over).
	LastTakeover  *TakeoverJSON `json:"last_takeover,omitempty"`
	Registrations OverviewRegs  `json:"registrations"`
	Now           time.Time     `json:"now"` // this node's clock, for the grace countdown
	// Services are the cluster's NFS services (absent without services:).
	Services []ServiceStatus `json:"services,omitempty"`
}

// TakeoverJSON is a committed takeover.
type TakeoverJSON struct {
	Node       string    `json:"node"`
	Reason     string    `json:"reason,omitempty"`
	At         time.Time `json:"at"`
	GraceUntil time.Time `json:"grace_until"`
}

// OverviewRegs lists the first registrations in key order, without the
// lock managers' cookies. Rows is empty and Hidden says why when the
// reader may not see registrations (the rules of GET /v1/registrations).
type OverviewRegs struct {
	Total  int           `json:"total"`
	Rows   []OverviewReg `json:"rows"`
	More   int           `json:"more"` // registrations not listed
	Hidden string        `json:"hidden,omitempty"`
}

// OverviewReg is one listed registration: never priv.
type OverviewReg struct {
	MonName string    `json:"mon_name"`
	MyName  string    `json:"my_name"`
	Node    string    `json:"node"`
	Added   time.Time `json:"added"`
}

// TransferResult is the answer of POST /v1/leadership/transfer. (The
// fields are in the order the answer has always had: by name.)
type TransferResult struct {
	LeaderID string `json:"leader_id"`
	Result   string `json:"result"` // "transferred"
}

// CrashResult is the answer of POST /v1/drill/crash, sent before the node
// dies.
type CrashResult struct {
	NodeID string `json:"node_id"`
	Result string `json:"result"` // "crashing"
}

// ErrorBody is the body of every answer that is not 2xx.
type ErrorBody struct {
	Error string `json:"error"`
}

// Summary is the one-line form of s that nsmd status prints.
func (s NFSv4Tracking) Summary() string {
	var b strings.Builder
	if s.Tracking {
		state := "?"
		if s.Pipe != nil {
			state = s.Pipe.State
			if s.Pipe.Err != "" {
				state += ": " + s.Pipe.Err
			}
		}
		fmt.Fprintf(&b, "tracking served (pipe %s)", state)
	} else {
		fmt.Fprintf(&b, "tracking not served (%s)", s.TrackingWhy)
	}
	fmt.Fprintf(&b, ", epoch %d, %d client records", s.CurrentEpoch, s.Clients)
	if s.RecoveryEpoch != 0 {
		fmt.Fprintf(&b, ", in grace: %d of %d clients reclaimed", s.Reclaimed, s.Reclaimable)
	}
	return b.String()
}

// GraceSummary is the one-line form of a node's last kernel grace
// periods (Status.Grace) that nsmd status prints.
func GraceSummary(g *Grace) string {
	if g == nil {
		return "this node has not served since it started"
	}
	one := func(name string, m GraceManager) string {
		back := fmt.Sprintf("%d of %d clients back", m.Back, m.Expected)
		switch {
		case m.Absent:
			return name + " not running"
		case m.Ended != nil:
			return fmt.Sprintf("%s ended after %.1fs (%s, %s)", name, m.Seconds, m.Ended.Reason, back)
		case m.MissingHidden > 0:
			return fmt.Sprintf("%s open (%s; waiting for %d, names shown only to an operator)", name, back, m.MissingHidden)
		case len(m.Missing) > 0:
			var who []string
			for _, c := range m.Missing {
				if t, ok := m.LastSeen[c]; ok {
					c += " (last seen " + t.UTC().Format("2006-01-02 15:04:05 MST") + ")"
				}
				who = append(who, c)
			}
			return fmt.Sprintf("%s open (%s; waiting for %s)", name, back, strings.Join(who, ", "))
		}
		return fmt.Sprintf("%s open (%s)", name, back)
	}
	out := fmt.Sprintf("sm_state %d: %s; %s", g.SMState, one("lockd", g.NLM), one("nfsd", g.NFSv4))
	if g.Error != "" {
		out += "; " + g.Error
	}
	return out
}

// BuildInfo is what a binary says about itself: `nsmd version`,
// /v1/status (version) and nsmd_build_info.
type BuildInfo struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
}

// shortRevision is the first 12 hex digits of the revision.
func (b BuildInfo) shortRevision() string {
	if len(b.Revision) > 12 {
		return b.Revision[:12]
	}
	return b.Revision
}

// String is the one-line form: `nsmd VERSION (revision REV, modified) GO`.
func (b BuildInfo) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "nsmd %s", b.Version)
	if b.Revision != "" {
		fmt.Fprintf(&s, " (revision %s", b.Revision)
		if b.Modified {
			s.WriteString(", modified")
		}
		s.WriteString(")")
	}
	fmt.Fprintf(&s, " %s", b.GoVersion)
	return s.String()
}

// Gossip is the compact version each node advertises to the others: the
// version, plus the short revision when the version does not already name
// it, plus "+modified". Two builds differ here when they differ in code.
func (b BuildInfo) Gossip() string {
	v := b.Version
	if r := b.shortRevision(); r != "" && !strings.Contains(v, r[:min(7, len(r))]) {
		v += "+" + r
	}
	if b.Modified && !strings.Contains(v, "dirty") {
		v += "+modified"
	}
	return v
}

// Summary is the fence line of nsmd status: the mode, the watchdog's
// state, and what the last wait before serving was.
func (f Fence) Summary() string {
	var b strings.Builder
	switch f.Mode {
	case "":
		return "unknown (an older nsmd)"
	case "none":
		b.WriteString("none (this node serves no storage)")
	case "off":
		b.WriteString("OFF: this node serves storage without any fence")
	default:
		b.WriteString(f.Mode)
	}
	if w := f.Watchdog; w != nil {
		fmt.Fprintf(&b, "; watchdog %s %gs", w.Device, w.TimeoutSeconds)
		switch {
		case w.Armed && w.Starving:
			b.WriteString(" armed, NOT FED (no proof this node may serve)")
		case w.Armed:
			b.WriteString(" armed")
			if w.LastFeed != nil {
				fmt.Fprintf(&b, ", fed %s", w.LastFeed.Format(time.RFC3339Nano))
			}
		default:
			b.WriteString(" disarmed")
		}
		if w.Deadline != nil {
			fmt.Fprintf(&b, ", resets the machine at %s unless fed", w.Deadline.Format(time.RFC3339Nano))
		}
	}
	if f.Serving {
		b.WriteString("; serving")
	}
	if f.StopFailed {
		b.WriteString("; STOP FAILED: the watchdog resets this node")
	}
	if f.Waiting {
		b.WriteString("; waiting for the other servers to be proven stopped")
	}
	if w := f.LastWait; w != nil {
		fmt.Fprintf(&b, "; last wait before serving %.1fs", w.Seconds)
		for _, n := range w.Nodes {
			fmt.Fprintf(&b, ", %s %s after %.1fs", n.Node, n.By, n.Seconds)
		}
		if w.Aborted != "" {
			fmt.Fprintf(&b, " (%s)", w.Aborted)
		}
	}
	if f.PauseUncovered {
		fmt.Fprintf(&b, "; a VM (%s) fenced by its watchdog alone: a PAUSE of it is NOT COVERED (add a fence agent, or ext4 multi-mount protection)", f.Hypervisor)
	}
	return b.String()
}
