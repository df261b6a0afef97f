package fsm

import (
	"cmp"
	"errors"
	"net/netip"
	"time"
)

// MyID is the lock manager that asked for monitoring (mon_id.my_id).
type MyID struct {
	MyName string
	Prog   uint32
	Vers   uint32
	Proc   uint32
}

// MonID keys a registration exactly as rpc.statd keys it: mon_name + my_id.
type MonID struct {
	MonName string
	My      MyID
}

// Compare orders MonIDs by MonName, MyName, Prog, Vers, Proc: the order of
// Registrations and of the snapshot. It returns -1, 0 or +1.
func (a MonID) Compare(b MonID) int {
	if c := cmp.Compare(a.MonName, b.MonName); c != 0 {
		return c
	}
	if c := cmp.Compare(a.My.MyName, b.My.MyName); c != 0 {
		return c
	}
	if c := cmp.Compare(a.My.Prog, b.My.Prog); c != 0 {
		return c
	}
	if c := cmp.Compare(a.My.Vers, b.My.Vers); c != 0 {
		return c
	}
	return cmp.Compare(a.My.Proc, b.My.Proc)
}

// Registration is one accepted SM_MON.
type Registration struct {
	ID       MonID
	Priv     [16]byte     // the lock manager's cookie; a repeat SM_MON replaces it
	Node     string       // node that took the SM_MON; it delivers the callback
	Callback netip.Addr   // lock manager address: 127.0.0.1, or a trusted remote caller's IP
	Addrs    []netip.Addr // mon_name's addresses, resolved when the SM_MON was taken (≤ 16)
	Added    time.Time    // stamped by the node that took the SM_MON
}

// Command is one state change. The concrete types below are the only ones.
type Command interface{ isCommand() }

// Register adds or replaces (same MonID) a registration.
//
// With Guarded set (entry kind 14) it replaces an existing registration
// only when the same lock manager asks (Reg's node and callback own it:
// Owner.Owns) or when Reg was taken on the loopback of the node that now
// serves (the node of the last Takeover) and the existing one was made on
// a node's loopback too: that node's lockd holds the clients' locks, and
// the callback must reach it. Otherwise the existing registration stays
// as it is and Result.Refused is set. A guarded Register of a MonID that
// does not exist adds it. Without Guarded (kind 1: the releases before
// it, an operator's import) it always replaces.
type Register struct {
	Reg     Registration
	Guarded bool
}

// Unregister removes the registration with this MonID (SM_UNMON); with a
// non-zero Owner, only if Owner made it (Owner.Owns).
type Unregister struct {
	ID    MonID
	Owner Owner
}

// UnregisterAll removes every registration of this lock manager
// (SM_UNMON_ALL); with a non-zero Owner, only those Owner made.
type UnregisterAll struct {
	My    MyID
	Owner Owner
}

// Owner is the lock manager that sent an SM_UNMON or SM_UNMON_ALL, as the
// node that took it saw it: Node is that node, Callback the caller's
// address as a Registration records it (127.0.0.1 for a caller on the
// node's loopback, else the trusted remote caller's address).
//
// A registration belongs to the lock manager that made it: one made on a
// node's loopback (a loopback Callback) belongs to that node's lockd, one
// made by a trusted remote lock manager belongs to that address, on
// whichever node it was taken. So Owner{Node: n, Callback: 127.0.0.1}
// owns only node n's loopback registrations, and Owner{Callback: r} with
// r not a loopback address owns every registration whose callback is r.
//
// The zero Owner owns every registration: the meaning of SM_UNMON and
// SM_UNMON_ALL in releases before registrations had owners (entry kinds
// 2 and 3), which a proposer falls back to, after checking ownership
// itself, until every member applies kinds 11 and 12 (CommandLevel).
type Owner struct {
	Node     string
	Callback netip.Addr
}

// IsZero reports whether o is the zero Owner (owns every registration).
func (o Owner) IsZero() bool { return o.Node == "" && !o.Callback.IsValid() }

// Owns reports whether o made r (see Owner).
func (o Owner) Owns(r *Registration) bool {
	if o.IsZero() {
		return true
	}
	return o.owns(r.Node, ipOf(r.Callback))
}

// owns is Owns on a registration's node and callback address (zones are
// not compared: registrations do not keep them).
func (o Owner) owns(node string, cb ip) bool {
	if o.IsZero() {
		return true
	}
	if cb != ipOf(o.Callback) {
		return false
	}
	return !o.Callback.IsLoopback() || node == o.Node
}

// Takeover marks a new server incarnation (leader change, restart,
// SM_SIMU_CRASH, import): sm_state becomes the smallest odd number that is
// greater than the current one and ≥ MinState; the grace window is set.
//
// At the end of the int32 range (that number would exceed math.MaxInt32)
// a Takeover with Wrap set wraps sm_state to the smallest odd number that
// differs from the current state and from MinState−1 (the state a server
// whose clients are imported had): peers compare states for inequality
// only, so every monitored host still sees a new state. Without Wrap (the
// releases before it, entry kind 4) sm_state stays at math.MaxInt32, which
// every peer then ignores as a repeat. A Takeover with Wrap is entry kind
// 13, proposed only once every member applies it (CommandLevel 1); the
// applied state keeps the Takeover without Wrap (LastTakeover).
type Takeover struct {
	Node       string
	MinState   int32
	GraceUntil time.Time
	Reason     string
	At         time.Time
	Wrap       bool
}

// MaxImportedState is the largest sm_state of another NSM server that an
// import accepts (POST /v1/import, nsmd import-statd): 2^30, leaving half
// a billion takeovers before sm_state reaches the end of its range. A
// real rpc.statd adds 2 per reboot from 1; a state above this is a
// mistake or an attack, and is refused.
const MaxImportedState = 1 << 30

// PeerRebooted is an accepted SM_NOTIFY from a monitored host. It matches
// every registration whose MonName equals MonName or one of whose Addrs
// equals From; it is accepted only if State differs from the last state
// seen from that host; then the last-seen state is recorded.
type PeerRebooted struct {
	MonName string
	From    netip.Addr // sender address (may be invalid/zero)
	State   int32
	At      time.Time
}

// The NFSv4 client-tracking commands below keep nfsdcld's database (the
// kernel's nfsdcld upcalls, one command each) with nfsdcld's semantics.
// The records of the current epoch are the clients that may reclaim
// after the next restart; during a grace period (recovery epoch ≠ 0) the
// records of the previous epoch say who may reclaim now.

// ClientCreate records a client in the current epoch (Create upcall): it
// inserts Name, or replaces the principal hash of an existing record.
type ClientCreate struct {
	Name      string // opaque client id, 1…MaxClientNameLen bytes
	PrincHash string // 0…MaxPrincHashLen bytes; empty: no principal
}

// ClientRemove deletes Name's record from the current epoch (Remove
// upcall; the recovery epoch keeps its record). Result.Removed is 1 if
// there was one, else 0.
type ClientRemove struct{ Name string }

// ClientCheck asks whether Name may reclaim (Check upcall, sent by old
// kernels only). Outside a grace period it first starts one, as a
// GraceStart would (an old kernel sends no GraceStart). Then, if the
// recovery epoch holds Name, Name's record is copied into the current
// epoch (principal hash included) and Result.Accepted is true; otherwise
// Accepted is false and nothing else changes.
type ClientCheck struct{ Name string }

// GraceStart starts a grace period (GraceStart upcall, at nfsd start).
// Outside grace: the recovery epoch becomes the current one, the current
// epoch advances by one, the current records become the recovery records
// and the current epoch starts empty. Already in grace (nfsd restarted,
// or another node took over, during the grace period): the epochs and
// the recovery records stay, the current records are discarded;
// Result.Removed is the number discarded (0 outside grace).
type GraceStart struct{}

// GraceDone ends the grace period (GraceDone upcall): the recovery
// records are dropped and the recovery epoch becomes 0, so a client that
// did not reclaim (or was not created again) during the grace period is
// forgotten. Outside grace it first starts one, as a GraceStart would
// (an old kernel that sent no GraceStart), so then every record is
// dropped and the current epoch advances.
type GraceDone struct{}

func (Register) isCommand()      {}
func (Unregister) isCommand()    {}
func (UnregisterAll) isCommand() {}
func (Takeover) isCommand()      {}
func (PeerRebooted) isCommand()  {}
func (ClientCreate) isCommand()  {}
func (ClientRemove) isCommand()  {}
func (ClientCheck) isCommand()   {}
func (GraceStart) isCommand()    {}
func (GraceDone) isCommand()     {}

// Result is what Apply did with one command.
type Result struct {
	State int32 // sm_state after the command
	// Removed: Unregister/UnregisterAll: registrations removed;
	// ClientRemove: 1 if the current epoch held the name, else 0;
	// GraceStart: current-epoch records discarded (restart during grace).
	Removed int
	// Accepted: PeerRebooted: the state was new and some registration
	// matched; ClientCheck: the recovery epoch holds the name (the client
	// may reclaim).
	Accepted bool
	Matched  []Registration // PeerRebooted: registrations to call back (when Accepted)
	// Refused: a guarded Register left an existing registration that
	// another lock manager made as it was (Register.Guarded); a
	// ServicePlaced or ServiceForgotten changed nothing (Refusal says why);
	// a Scoped command changed nothing (Refusal says why, or, for its
	// guarded Register, is nil as above).
	Refused bool
	// Refusal: why a ServicePlaced or ServiceForgotten was refused (wraps
	// ErrStaleEpoch, ErrNotDeclared or ErrServiceInUse), or a Scoped
	// command (wraps ErrNotPlaced or ErrStaleRun).
	Refusal error
}

// Target is one distinct monitored host to notify after a takeover.
type Target struct {
	MonName string
	Addrs   []netip.Addr
}

// V4Client is one NFSv4 client-tracking record (a row of nfsdcld's
// database): the client's opaque id and the hash of its principal.
type V4Client struct {
	Name      string // opaque client id bytes, 1…MaxClientNameLen
	PrincHash string // principal hash bytes, 0…MaxPrincHashLen (empty: none)
}

// Limits of the command and snapshot encodings. Encode refuses, and Decode
// and Restore reject, anything beyond them.
const (
	MaxNameLen   = 1024  // MonName, MyName, Node (SM_MAXSTRLEN)
	MaxReasonLen = 256   // Takeover.Reason
	MaxAddrs     = 16    // Registration.Addrs
	MaxBatch     = 65536 // commands in one log entry

	MaxClientNameLen = 1024 // V4Client.Name (NFS4_OPAQUE_LIMIT); never empty
	MaxPrincHashLen  = 32   // V4Client.PrincHash (a SHA-256 digest)
)

var (
	// ErrBadCommand means a log entry or a command could not be decoded or
	// encoded: unknown kind, a length beyond its limit, an empty NFSv4
	// client name, truncated input, trailing bytes, an unrepresentable
	// time. Apply returns it (wrapped) for a malformed entry and changes
	// no state.
	ErrBadCommand = errors.New("fsm: malformed command")
	// ErrVersion means a log entry or snapshot was written by a format
	// version this build does not know.
	ErrVersion = errors.New("fsm: unsupported command or snapshot version")
	// ErrCorruptSnapshot means Restore rejected a snapshot stream: bad magic,
	// truncation, a checksum or count mismatch, unsorted or inconsistent
	// content. The FSM is left unchanged.
	ErrCorruptSnapshot = errors.New("fsm: corrupt snapshot")
	// ErrOwnedElsewhere means a guarded Register was refused: the
	// registration it would replace belongs to another lock manager
	// (Register.Guarded). Package fsm never returns it; the layers above
	// wrap it when they report a Result with Refused set.
	ErrOwnedElsewhere = errors.New("fsm: the registration belongs to another lock manager")
)
