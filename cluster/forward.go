package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/nsmd/nsmd/cluster/pki"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/placement"
)

// ForwardProgram is nsmd's private ONC RPC program (in the user-defined
// range 0x20000000–0x3fffffff) over which followers hand writes to the
// leader. It is served on every node's NSM port, next to NSM itself.
var ForwardProgram = oncrpc.ProgVers{Prog: 0x204e534d, Vers: 1}

// Forward procedures.
const (
	fwdProcNull  uint32 = 0
	fwdProcApply uint32 = 1
	// fwdProcVIPHeld: void → bool, or vipHeldArgs → vipHeldRes (a nonce,
	// and the answer with an HMAC over it: vipheld.go), whether this node
	// holds the VIP now (the kernel's view for a netlink VIP), still
	// believes it leads (it could be about to take it), or cannot vouch
	// for it (a term of it ended before it took the VIP: vipUnsure).
	fwdProcVIPHeld uint32 = 2
	// fwdProcState: void → fwdRes{fwdOK, sm_state} from a ready leader
	// (its lease confirmed), fwdNotLeader from anyone else.
	fwdProcState uint32 = 3
	// fwdProcServing: servingArgs → servingRes, whether this node serves
	// the storage, stands down, failed to stop or leads (it could be about
	// to serve): a new leader starts serving only once every other serving
	// voter answers false, or is fenced (serving.go). With a cluster key
	// the answer carries an HMAC over the asker's nonce, the answering
	// node's id and the answer: a forged or replayed "not serving" is not
	// believed.
	fwdProcServing uint32 = 4
)

// Forward result statuses.
const (
	fwdOK        uint32 = 0
	fwdNotLeader uint32 = 1
	fwdFailed    uint32 = 2
	fwdDenied    uint32 = 3
	// fwdRefused: the command was decided and changed nothing by its own
	// rule (a guarded Register that another lock manager's registration
	// refused: fsm.ErrOwnedElsewhere). Only a release that proposes guarded
	// registrations forwards one, so only such a release gets it.
	fwdRefused uint32 = 4
	// fwdRejected: the leader refused a forwarded request by its rule
	// (an operator's move of a service that its own view does not allow:
	// placement's typed refusals; a placement or a service's write the
	// state refused: fsm.Result.Refusal), with why. Only a release that
	// forwards these gets it.
	fwdRejected uint32 = 5
	// fwdStaleRun: a service's write (fsm.Scoped) was committed and
	// refused because the run that sent it was no longer the service's
	// current one (fsm.ErrStaleRun), with why. Only a release that
	// forwards scoped commands gets it.
	fwdStaleRun uint32 = 6
)

const (
	fwdMaxCmd   = 1 << 16
	fwdMaxSkew  = 30 * time.Second // accepted clock difference for keyed requests
	fwdMACLabel = "nsmd-forward-v1"
	// fwdReplayMax bounds the replay cache: MACs accepted in the last
	// 2 × fwdMaxSkew (~4 MiB; ~2,000 forwarded writes a second). Full, it
	// refuses forwarded writes until entries expire.
	fwdReplayMax = 1 << 16
)

// Forwarding errors.
var (
	// ErrNoLeader means no leader was known within the hold time.
	ErrNoLeader = errors.New("cluster: no leader")
	// ErrForwardDenied means the leader refused a forwarded write
	// (authentication failed).
	ErrForwardDenied = errors.New("cluster: forwarded write denied")
	// ErrRejected means the leader refused a forwarded request by its own
	// rule (an operator's move its view does not allow); the error says
	// why. Retrying the same request is refused again.
	ErrRejected = errors.New("cluster: the leader refused the request")
)

// fwdArgs is APPLY's argument: one fsm-encoded command, the sender's
// clock and an HMAC over both with the cluster key (empty without a key).
type fwdArgs struct {
	SentNS int64
	Cmd    []byte
	MAC    []byte
}

func (a *fwdArgs) MarshalXDR(w *oncrpc.Writer) {
	w.Int64(a.SentNS)
	w.Opaque(a.Cmd)
	w.Opaque(a.MAC)
}

func (a *fwdArgs) UnmarshalXDR(r *oncrpc.Reader) error {
	a.SentNS = r.Int64()
	a.Cmd = r.Opaque(fwdMaxCmd)
	a.MAC = r.Opaque(sha256.Size)
	return r.Done()
}

// fwdRes is APPLY's result.
type fwdRes struct {
	Status uint32
	State  int32
	Err    string
}

func (r *fwdRes) MarshalXDR(w *oncrpc.Writer) {
	w.Uint32(r.Status)
	w.Int32(r.State)
	e := r.Err
	if len(e) > fwdMaxErr { // the reader refuses a longer one
		e = e[:fwdMaxErr]
	}
	w.String(e)
}

// fwdMaxErr is the longest fwdRes.Err read.
const fwdMaxErr = 256

func (r *fwdRes) UnmarshalXDR(rd *oncrpc.Reader) error {
	r.Status = rd.Uint32()
	r.State = rd.Int32()
	r.Err = rd.String(fwdMaxErr)
	return rd.Err()
}

func fwdMAC(key []byte, sent int64, cmd []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(fwdMACLabel))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(sent))
	m.Write(b[:])
	m.Write(cmd)
	return m.Sum(nil)
}

// ServeRPC serves ForwardProgram: the leader applies a follower's write.
func (n *Node) ServeRPC(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	switch c.Proc {
	case fwdProcNull:
		return nil
	case fwdProcApply:
		if c.Net == "udp" {
			// A datagram's source address is not proof of anything, and a
			// follower forwards over TCP only.
			n.metrics.forwarded.WithLabelValues("denied").Inc()
			out := fwdRes{Status: fwdDenied, Err: "forwarded writes are taken over TCP only"}
			out.MarshalXDR(res)
			return nil
		}
	case fwdProcVIPHeld:
		return n.serveVIPHeld(c, res) // vipheld.go
	case fwdProcState:
		n.serveState(res) // readstate.go
		return nil
	case fwdProcServing:
		return n.serveServing(c, res) // serving.go
	case fwdProcConns:
		return n.serveConns(c, res) // conns.go
	case fwdProcSeen:
		return n.serveSeen(c, res) // seen.go
	case fwdProcLease:
		return n.serveLease(c, res) // servicelease.go
	case fwdProcService:
		return n.serveService(c, res) // servicestop.go
	case fwdProcRelease:
		return n.serveRelease(ctx, c, res) // servicerelease.go
	case fwdProcSvcConns:
		return n.serveSvcConns(c, res) // svcconns.go
	default:
		return oncrpc.ErrProcUnavail
	}
	var args fwdArgs
	if err := args.UnmarshalXDR(c.Args); err != nil {
		return fmt.Errorf("%w: forward: %v", oncrpc.ErrGarbageArgs, err)
	}
	out := n.serveForward(ctx, c.Remote.Addr().Unmap(), &args)
	out.MarshalXDR(res)
	return nil
}

// denialLog lets through at most one log line about denied forwarded
// writes per sender address a minute (the forwarding program is on the
// NSM port: anyone may call it), with the number held back. Its zero
// value is ready.
type denialLog struct {
	once sync.Once
	l    *pki.LogLimiter
}

func (d *denialLog) warn(log *slog.Logger, from netip.Addr, err error) {
	d.once.Do(func() { d.l = pki.NewLogLimiter(time.Now, time.Minute) })
	if ok, held := d.l.Allow(from.String()); ok {
		log.Warn("forwarded write denied", "from", from, "err", err, "suppressed_since_last", held)
	}
}

func (n *Node) serveForward(ctx context.Context, from netip.Addr, a *fwdArgs) fwdRes {
	if err := n.authForward(from, a); err != nil {
		n.metrics.forwarded.WithLabelValues("denied").Inc()
		n.fwdLog.warn(n.log, from, err)
		return fwdRes{Status: fwdDenied, Err: err.Error()}
	}
	cmds, err := fsm.Decode(a.Cmd)
	if err != nil || len(cmds) != 1 {
		return fwdRes{Status: fwdFailed, Err: fmt.Sprintf("%s: %v", fwdUndecodable, err)}
	}
	if pc, ok, perr := n.forwardablePlacement(from, cmds[0]); ok {
		if placement.IsRefusal(perr) {
			return fwdRes{Status: fwdRejected, Err: perr.Error()}
		}
		cmds[0], err = pc, perr
	} else {
		cmds[0], err = n.forwardable(cmds[0])
	}
	if err != nil {
		n.metrics.forwarded.WithLabelValues("denied").Inc()
		n.fwdLog.warn(n.log, from, err)
		return fwdRes{Status: fwdDenied, Err: err.Error()}
	}
	if !n.Leading() { // not leader, or elected but its takeover not committed yet
		return fwdRes{Status: fwdNotLeader}
	}
	var r fsm.Result
	if t, ok := cmds[0].(fsm.Takeover); ok {
		cmds[0] = n.lowerTakeover(t)
	}
	if pc, ok := cmds[0].(fsm.ServicePlaced); ok {
		n.placer.releaseFirst(ctx, pc) // an operator's move (servicerelease.go)
	}
	if isOwned(cmds[0]) && !n.ownerCommandsOK() {
		// The sender saw every member apply owner commands, this leader
		// does not (yet): commit it in the form every member applies.
		r, err = n.applyLowered(ctx, cmds[0])
	} else {
		r, err = n.applyLocal(ctx, cmds[0])
	}
	switch {
	case errors.Is(err, ErrNotLeader):
		return fwdRes{Status: fwdNotLeader}
	case err != nil:
		return fwdRes{Status: fwdFailed, Err: err.Error()}
	}
	n.metrics.forwarded.WithLabelValues("served").Inc()
	if r.Refused && errors.Is(r.Refusal, fsm.ErrStaleRun) {
		return fwdRes{Status: fwdStaleRun, State: r.State, Err: r.Refusal.Error()}
	}
	if r.Refused && r.Refusal != nil {
		// A placement or a service's write refused by its rule: the
		// reason goes back (fwdRefused says "owned elsewhere").
		return fwdRes{Status: fwdRejected, State: r.State, Err: r.Refusal.Error()}
	}
	if r.Refused {
		return fwdRes{Status: fwdRefused, State: r.State}
	}
	return fwdRes{Status: fwdOK, State: r.State}
}

// forwardable returns the command to commit for a forwarded cmd, or why
// a follower may not forward it. A follower forwards the NSM writes it
// takes — Register (SM_MON), Unregister and UnregisterAll (SM_UNMON,
// SM_UNMON_ALL), PeerRebooted (an accepted SM_NOTIFY) — and asks for two
// takeovers, SM_SIMU_CRASH and an import; of a Takeover the leader keeps
// only the reason and a MinState within the import range, and makes the
// rest (node, grace window, times) its own. The NFSv4 tracking commands
// and every other takeover only a leader proposes, never a forward.
func (n *Node) forwardable(cmd fsm.Command) (fsm.Command, error) {
	switch c := cmd.(type) {
	case fsm.Register, fsm.Unregister, fsm.UnregisterAll, fsm.PeerRebooted:
		return cmd, nil
	case fsm.Scoped:
		// A service's owner is any member: it forwards its service's NSM
		// writes and its NFSv4 tracking commands (serviceregistry.go).
		return cmd, nil
	case fsm.ServingEnd, fsm.FenceConfirm:
		// A node that stopped clears its serving record; an operator's
		// confirmation taken on another member (promise.go).
		return cmd, nil
	case fsm.Takeover:
		if c.Reason != reasonSimuCrash && c.Reason != reasonImport {
			return nil, fmt.Errorf("a forwarded takeover must be an SM_SIMU_CRASH or an import, not %q", c.Reason)
		}
		if c.MinState < 0 || c.MinState > fsm.MaxImportedState+1 {
			return nil, fmt.Errorf("a forwarded takeover's MinState %d is outside 0…%d", c.MinState, fsm.MaxImportedState+1)
		}
		t := n.takeover(c.Reason)
		t.MinState = c.MinState
		return t, nil
	}
	return nil, fmt.Errorf("a follower does not forward %T", cmd)
}

// authForward: with a cluster key the request must carry a valid HMAC, a
// timestamp within fwdMaxSkew, and a MAC not seen before (replayCache);
// without one it must come from a raft member's IP (over TCP).
func (n *Node) authForward(from netip.Addr, a *fwdArgs) error {
	if len(n.cfg.ClusterKey) > 0 {
		if !hmac.Equal(a.MAC, fwdMAC(n.cfg.ClusterKey, a.SentNS, a.Cmd)) {
			return errors.New("bad MAC (cluster key mismatch?)")
		}
		now := n.cfg.Now()
		if d := now.Sub(time.Unix(0, a.SentNS)); d > fwdMaxSkew || d < -fwdMaxSkew {
			return fmt.Errorf("timestamp off by %v (at most %v: keep the members' clocks in sync)", d, fwdMaxSkew)
		}
		return n.replay.add(a.MAC, now)
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	for _, s := range f.Configuration().Servers {
		host, _, err := net.SplitHostPort(string(s.Address))
		if err != nil {
			continue
		}
		if ip, err := netip.ParseAddr(host); err == nil && ip.Unmap() == from {
			return nil
		}
	}
	return fmt.Errorf("%s is not a raft member's address", from)
}

// replayCache remembers the MACs of the forwarded writes accepted within
// the last 2 × fwdMaxSkew: a request with a valid MAC and timestamp is
// accepted once. (A timestamp up to fwdMaxSkew in the future stays valid
// until fwdMaxSkew after it, hence twice the skew.) The zero value is
// ready.
type replayCache struct {
	mu    sync.Mutex
	seen  map[[sha256.Size]byte]struct{}
	order []replayEntry // by time accepted; order[head:] are live
	head  int
}

type replayEntry struct {
	mac [sha256.Size]byte
	at  time.Time
}

// Replay refusals.
var (
	errReplayed   = errors.New("replayed (this forwarded write was accepted before)")
	errReplayFull = errors.New("too many forwarded writes within the replay window; retry")
)

// add records mac as accepted at now, or refuses a MAC already recorded.
func (c *replayCache) add(mac []byte, now time.Time) error {
	var k [sha256.Size]byte
	if copy(k[:], mac) != sha256.Size {
		return errors.New("short MAC")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = make(map[[sha256.Size]byte]struct{})
	}
	keep := now.Add(-2 * fwdMaxSkew)
	for c.head < len(c.order) && c.order[c.head].at.Before(keep) {
		delete(c.seen, c.order[c.head].mac)
		c.head++
	}
	if c.head > len(c.order)/2 {
		c.order = append(c.order[:0], c.order[c.head:]...)
		c.head = 0
	}
	if _, ok := c.seen[k]; ok {
		return errReplayed
	}
	if len(c.seen) >= fwdReplayMax {
		return errReplayFull
	}
	c.seen[k] = struct{}{}
	c.order = append(c.order, replayEntry{mac: k, at: now})
	return nil
}

// forwarder keeps one pipelining TCP client to the current leader.
type forwarder struct {
	mu     sync.Mutex
	addr   string
	client *oncrpc.Client
}

func (f *forwarder) get(ctx context.Context, addr string, local netip.Addr) (*oncrpc.Client, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.client != nil && f.addr == addr {
		return f.client, nil
	}
	if f.client != nil {
		f.client.Close()
		f.client = nil
	}
	c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "tcp", Addr: addr, Timeout: 5 * time.Second, LocalAddr: local})
	if err != nil {
		return nil, err
	}
	f.addr, f.client = addr, c
	return c, nil
}

// drop forgets a client that failed, so the next call dials again.
func (f *forwarder) drop(c *oncrpc.Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.client == c {
		f.client.Close()
		f.client = nil
	}
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.client != nil {
		f.client.Close()
		f.client = nil
	}
}

// errRetry marks a forwarding failure worth retrying (leader changing).
var errRetry = errors.New("retry")

// errRefusedKind: the leader could not decode the forwarded command — a
// release that predates its kind (every release answers with this text).
var errRefusedKind = errors.New("the leader does not know this command")

// fwdUndecodable begins a leader's answer to a forward it cannot decode.
const fwdUndecodable = "want one command"

// forward sends cmd to the leader at addr and returns its sm_state.
func (n *Node) forward(ctx context.Context, addr string, cmd fsm.Command) (int32, error) {
	data, err := fsm.Encode(cmd)
	if err != nil {
		return 0, fmt.Errorf("cluster: encode forwarded command: %w", err)
	}
	args := fwdArgs{SentNS: n.cfg.Now().UnixNano(), Cmd: data}
	if len(n.cfg.ClusterKey) > 0 {
		args.MAC = fwdMAC(n.cfg.ClusterKey, args.SentNS, data)
	}
	local, _ := netip.ParseAddrPort(n.cfg.RaftBind)
	c, err := n.fwd.get(ctx, addr, local.Addr())
	if err != nil {
		return 0, fmt.Errorf("%w: dial leader %s: %w", errRetry, addr, err)
	}
	var res fwdRes
	if err := c.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcApply, &args, &res); err != nil {
		n.fwd.drop(c)
		return 0, fmt.Errorf("%w: forward to %s: %w", errRetry, addr, err)
	}
	switch res.Status {
	case fwdOK:
		n.metrics.forwarded.WithLabelValues("ok").Inc()
		return res.State, nil
	case fwdNotLeader:
		return 0, fmt.Errorf("%w: %s is no longer the leader", errRetry, addr)
	case fwdDenied:
		n.metrics.forwarded.WithLabelValues("denied").Inc()
		return 0, fmt.Errorf("%w: %s", ErrForwardDenied, res.Err)
	case fwdRefused:
		n.metrics.forwarded.WithLabelValues("ok").Inc()
		return res.State, fmt.Errorf("cluster: leader %s: %w", addr, fsm.ErrOwnedElsewhere)
	case fwdRejected:
		return 0, fmt.Errorf("%w: leader %s: %s", ErrRejected, addr, res.Err)
	case fwdStaleRun:
		n.metrics.forwarded.WithLabelValues("ok").Inc()
		return res.State, fmt.Errorf("%w: leader %s: %s", fsm.ErrStaleRun, addr, res.Err)
	case fwdFailed:
		if strings.HasPrefix(res.Err, fwdUndecodable) {
			return 0, fmt.Errorf("%w: leader %s: %s", errRefusedKind, addr, res.Err)
		}
	}
	return 0, fmt.Errorf("%w: leader %s: %s", errRetry, addr, res.Err)
}

// leaderNSMAddr finds the current leader and its NSM address.
func (n *Node) leaderNSMAddr() (id, addr string) {
	laddr, lid := n.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	id = string(lid)
	if n.member != nil {
		if a, ok := n.member.nsmAddr(id); ok {
			return id, a
		}
	}
	if a := n.cfg.PeerNSMAddrs[id]; a != "" {
		return id, a
	}
	// Not known yet: a restarted node that gossip has not reached (a seed
	// with nothing to join) knows the leader only from raft. Nodes of one
	// cluster normally share the NSM port: try ours at the leader's host.
	host, _, err := net.SplitHostPort(string(laddr))
	_, port, perr := net.SplitHostPort(n.cfg.NSMAddr)
	if err == nil && perr == nil && port != "0" {
		return id, net.JoinHostPort(host, port)
	}
	return id, ""
}
