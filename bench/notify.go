package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/nsmd/nsmd/agent"
	"github.com/nsmd/nsmd/bench/drill"
	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// nsmd bench notify measures the SM_NOTIFY fan-out after a takeover. The
// parent process creates a network namespace of its own and re-executes
// itself inside it (notify_linux.go); the child stands up the fake
// client hosts and a 3-node in-process cluster there, and hands its report
// back on file descriptor 3 as JSON. The parent prints it.
//
// Addresses: every fake client host is one 127.x.y.z address (x ≥ 1) on
// the namespace's own lo. All of 127.0.0.0/8 is local on lo, so no address
// or route has to be added, each host still has its own address (its own
// port 111), and the traffic never leaves the namespace. The cluster uses
// 127.0.0.1-3 and the VIP 127.0.0.100, as nsmd dev does.

const (
	NotifyChildEnv = "NSMD_BENCH_NOTIFY_CHILD" // JSON NotifyOptions for the child
	notifyVIP      = "127.0.0.100"
	notifyMyName   = "bench-client"
	notifyMaxHosts = 200_000
	FaultKill      = "kill"
	FaultTransfer  = "transfer"
	// A dead host is silent (a port 111 that reads and drops everything:
	// a host that is down) or refused (nothing bound: the kernel answers
	// ICMP port unreachable, as an up host without rpcbind does).
	DeadSilent  = "silent"
	DeadRefused = "refused"
	// How the fake hosts get their sockets (NotifyOptions.Fakes).
	FakesAuto     = "auto"
	FakesPerHost  = "per-host"
	FakesWildcard = "wildcard"
)

type NotifyOptions struct {
	Hosts           int           `json:"hosts"`
	DeadPct         float64       `json:"dead_pct"`
	DeadMode        string        `json:"dead_mode"`
	Fault           string        `json:"fault"`
	SMNotify        bool          `json:"sm_notify"`
	SMNotifyPath    string        `json:"sm_notify_path"`
	SMNotifyTimeout time.Duration `json:"sm_notify_timeout"`
	Timeout         time.Duration `json:"timeout"`
	Conns           int           `json:"conns"`
	LogLevel        string        `json:"log_level"`
	// Fakes is how the fake hosts get their sockets: per-host (a
	// portmapper socket on each host's 127.x.y.z:111 and a statd socket of
	// its own; 111 shared when the open-file limit allows only one per
	// host), wildcard (two sockets per CPU on 0.0.0.0 for all the hosts,
	// replies sent from the address each call was sent to: IP_PKTINFO), or
	// auto (per-host when the open-file limit allows, else wildcard).
	Fakes      string `json:"fakes"`
	CPUProfile string `json:"cpu_profile,omitempty"` // absolute path: the child's CPU profile from the fault to the last live host
	sharedPort bool   // set in the child: the statd shares port 111
	wildcard   bool   // set in the child: the wildcard sockets serve every host
}

// notifySpareFDs is the open-file budget for everything but the fake
// hosts' sockets (the cluster's listeners, raft and client connections).
const notifySpareFDs = 2048

func (o *NotifyOptions) Validate() error {
	var errs []error
	if o.Hosts < 1 || o.Hosts > notifyMaxHosts {
		errs = append(errs, fmt.Errorf("--hosts must be 1..%d, not %d", notifyMaxHosts, o.Hosts))
	}
	if o.DeadPct < 0 || o.DeadPct >= 100 {
		errs = append(errs, fmt.Errorf("--dead-pct must be in [0, 100), not %v", o.DeadPct))
	}
	if o.DeadMode != DeadSilent && o.DeadMode != DeadRefused {
		errs = append(errs, fmt.Errorf("--dead-mode must be %s or %s, not %q", DeadSilent, DeadRefused, o.DeadMode))
	}
	if o.Fault != FaultKill && o.Fault != FaultTransfer {
		errs = append(errs, fmt.Errorf("--fault must be %s or %s, not %q", FaultKill, FaultTransfer, o.Fault))
	}
	if o.Timeout <= 0 || o.SMNotifyTimeout <= 0 {
		errs = append(errs, errors.New("--timeout and --sm-notify-timeout must be positive"))
	}
	switch o.Fakes {
	case FakesAuto, FakesPerHost:
	case FakesWildcard:
		if o.DeadMode == DeadRefused {
			errs = append(errs, fmt.Errorf("--dead-mode %s needs --fakes %s (with the wildcard sockets every address has a listener)", DeadRefused, FakesPerHost))
		}
	default:
		errs = append(errs, fmt.Errorf("--fakes must be %s, %s or %s, not %q", FakesAuto, FakesPerHost, FakesWildcard, o.Fakes))
	}
	if o.Conns < 1 {
		errs = append(errs, fmt.Errorf("--conns must be at least 1, not %d", o.Conns))
	}
	return errors.Join(errs...)
}

// NotifyPhase is one fan-out as the fake hosts saw it.
type NotifyPhase struct {
	Name     string `json:"name"` // nsmd | sm-notify
	Live     int    `json:"live"`
	Notified int    `json:"notified"` // live hosts that got SM_NOTIFY with the new state
	// Latencies are per live host, from the reference instant (nsmd: the
	// takeover; sm-notify: its start) to its first SM_NOTIFY.
	CompleteMS float64 `json:"complete_ms"` // the last live host (the max), or the cap when not all were reached
	FirstMS    float64 `json:"first_ms"`
	P50MS      float64 `json:"p50_ms"`
	P90MS      float64 `json:"p90_ms"`
	P99MS      float64 `json:"p99_ms"`
	MaxMS      float64 `json:"max_ms"`
	TimedOut   bool    `json:"timed_out"`
	// What the live hosts received: every SM_NOTIFY and GETPORT datagram
	// (so duplicates = received - live), and SM_NOTIFYs from an address
	// other than the expected source.
	NotifyRx      int64 `json:"notify_rx"`
	GetportRx     int64 `json:"getport_rx"`
	WrongSource   int64 `json:"wrong_source"`
	WrongMonName  int64 `json:"wrong_mon_name"`
	DeadRx        int64 `json:"dead_rx"`             // datagrams the dead hosts got (silent mode)
	ProgressEvery []int `json:"progress_per_second"` // notified count at each whole second
	// Curve is the cumulative count of notified hosts over time (at most
	// ~400 points), for the plot.
	Curve []NotifyPoint `json:"curve"`
	Note  string        `json:"note,omitempty"`
}

type NotifyPoint struct {
	MS    float64 `json:"ms"`
	Count int     `json:"n"`
}

// NotifySends is what the new leader's notifier sent (its metrics),
// to live and dead hosts alike.
type NotifySends struct {
	GetportFirst int64 `json:"getport_first"`
	GetportRetry int64 `json:"getport_retry"`
	NotifyFirst  int64 `json:"notify_first"`
	NotifyRetry  int64 `json:"notify_retry"`
}

type NotifyReport struct {
	Hosts      int     `json:"hosts"`
	Live       int     `json:"live"`
	Dead       int     `json:"dead"`
	DeadMode   string  `json:"dead_mode"`
	Fault      string  `json:"fault"`
	Nodes      int     `json:"nodes"`
	Netns      string  `json:"netns"`
	StatdPort  string  `json:"statd_port"` // where each fake statd listens
	Fakes      string  `json:"fakes"`      // per-host | wildcard sockets
	RegisterMS float64 `json:"register_ms"`
	RegisterPS float64 `json:"register_per_s"`
	// RegisterRetried counts SM_MON calls sent again because the first
	// failed (a leader change under the registration load).
	RegisterRetried int     `json:"register_retried,omitempty"`
	OldState        int32   `json:"old_state"`
	NewState        int32   `json:"new_state"`
	NotifyName      string  `json:"notify_name"`
	FaultToTkMS     float64 `json:"fault_to_takeover_ms"` // fault → takeover command stamped by the new leader
	// EarlyNotify counts SM_NOTIFYs the hosts got before the fault (should be 0).
	EarlyNotify int64       `json:"early_notify"`
	NSMD        NotifyPhase `json:"nsmd"`
	// TakeoversAfter counts the takeovers after the measured one until the
	// last live host was notified (each bumps sm_state by 2 and starts the
	// fan-out again): the leader lost its lease under the load.
	TakeoversAfter int `json:"takeovers_after,omitempty"`
	// Memory and UDP are from the fault to the last live host's SM_NOTIFY.
	Memory   NotifyMemory `json:"memory"`
	UDP      UDPCounters  `json:"udp"`
	Sends    NotifySends  `json:"nsmd_sends"`
	SMNotify *NotifyPhase `json:"sm_notify,omitempty"`
	// Ratio is sm-notify's completion over nsmd's (a lower bound when
	// sm-notify did not reach every live host).
	Ratio      float64 `json:"ratio,omitempty"`
	RatioBound bool    `json:"ratio_lower_bound,omitempty"`
	CPUs       int     `json:"cpus"`
	Started    string  `json:"started"`
}

// NotifyChild is the process inside the namespace (NotifyInNetns runs it
// with NotifyChildEnv set): options from the environment, an in-process
// cluster, the report as JSON on fd 3.
func NotifyChild(ctx context.Context, progress io.Writer) error {
	raw := os.Getenv(NotifyChildEnv)
	if raw == "" {
		return fmt.Errorf("internal: %s is not set (run nsmd bench notify without --netns-child)", NotifyChildEnv)
	}
	var o NotifyOptions
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		return fmt.Errorf("internal: %s: %w", NotifyChildEnv, err)
	}
	if err := notifyCheckPrivateNetns(); err != nil {
		return err
	}
	if o.Fakes != FakesWildcard {
		live := len(notifyLive(o.Hosts, o.DeadPct))
		deadSockets := 0
		if o.DeadMode == DeadSilent {
			deadSockets = o.Hosts - live
		}
		two, one := uint64(2*live+deadSockets+notifySpareFDs), uint64(live+deadSockets+notifySpareFDs)
		limit, err := notifyRaiseNofile(two)
		if err != nil {
			return err
		}
		// Two sockets per live host when the open-file limit allows (a
		// portmapper on 111 and the statd on its own port), else one: the
		// statd answers on port 111 too (GETPORT says so); below that, the
		// wildcard sockets (auto).
		o.sharedPort = limit < two
		switch {
		case limit >= one:
		case o.Fakes == FakesAuto && o.DeadMode == DeadSilent:
			o.sharedPort, o.wildcard = false, true
		default:
			hint := "lower --hosts or use --fakes " + FakesWildcard
			if o.DeadMode == DeadRefused {
				hint = "lower --hosts (--dead-mode " + DeadRefused + " needs them)"
			}
			return fmt.Errorf("the open-file limit %d is too low for %d hosts on sockets of their own (%d sockets, plus %d); %s",
				limit, o.Hosts, one-notifySpareFDs, notifySpareFDs, hint)
		}
	} else {
		o.wildcard = true
	}
	out := os.NewFile(3, "report")
	if out == nil {
		return errors.New("internal: no report pipe on fd 3")
	}
	defer out.Close()
	rep, err := runNotify(ctx, o, progress)
	if err != nil {
		return err
	}
	rep.Netns = os.Getenv("NSMD_BENCH_NETNS")
	return json.NewEncoder(out).Encode(rep)
}

// ---- host addresses ------------------------------------------------------------

// notifyAddr is host i's address: 127.x.y.z with x ≥ 1 and z in 1..250.
func notifyAddr(i int) netip.Addr {
	b := i / 250
	return netip.AddrFrom4([4]byte{127, byte(1 + b/256), byte(b % 256), byte(i%250 + 1)})
}

// notifyDead reports whether host i of a list with deadPct % dead
// hosts is dead: exactly round-down(n·pct/100) of the first n hosts are,
// spread evenly over the list.
// notifyIndex is the host number of address a (notifyAddr's inverse).
func notifyIndex(a netip.Addr) (int, bool) {
	if !a.Is4() {
		return 0, false
	}
	b := a.As4()
	if b[0] != 127 || b[1] == 0 || b[3] == 0 || b[3] > 250 {
		return 0, false
	}
	return ((int(b[1])-1)*256+int(b[2]))*250 + int(b[3]) - 1, true
}

func notifyDead(i int, deadPct float64) bool {
	q := int64(math.Round(deadPct * 100)) // per 10,000
	return (int64(i)+1)*q/10000 > int64(i)*q/10000
}

func notifyLive(hosts int, deadPct float64) []int {
	var live []int
	for i := range hosts {
		if !notifyDead(i, deadPct) {
			live = append(live, i)
		}
	}
	return live
}

// ---- fake client hosts -------------------------------------------------------

// benchHosts is every fake client host. A live host is two UDP sockets on
// its address — a portmapper on port 111 that maps 100024/1/UDP, and a
// statd on another port — each read by one goroutine; a dead host has
// neither. They record, per phase, when each host first got SM_NOTIFY.
type benchHosts struct {
	hosts []benchHost
	conns []*net.UDPConn
	wg    sync.WaitGroup

	// The current phase: which SM_NOTIFYs count and what they must look like.
	minState atomic.Int32 // count an SM_NOTIFY whose state is above this
	source   atomic.Pointer[netip.Addr]
	monName  atomic.Pointer[string]
	all      atomic.Pointer[benchAll] // closed when the phase's wanted count is reached

	notified, notifyRx, getportRx, wrongSource, wrongName, deadRx atomic.Int64
}

// benchAll is a phase's goal: done is closed when want hosts were notified.
type benchAll struct {
	want int64
	done chan struct{}
}

type benchHost struct {
	addr  netip.Addr
	dead  bool
	first atomic.Int64 // UnixNano of this phase's first counted SM_NOTIFY; 0: none
}

func startBenchHosts(n int, deadPct float64, deadMode string, shared, wildcard bool) (*benchHosts, error) {
	h := &benchHosts{hosts: make([]benchHost, n)}
	h.minState.Store(math.MaxInt32) // nothing counts until a phase starts
	for i := range h.hosts {
		hh := &h.hosts[i]
		hh.addr, hh.dead = notifyAddr(i), notifyDead(i, deadPct)
	}
	if wildcard {
		if err := h.startWildcard(runtime.GOMAXPROCS(0)); err != nil {
			h.Close()
			return nil, err
		}
		return h, nil
	}
	for i := range h.hosts {
		hh := &h.hosts[i]
		if hh.dead {
			if deadMode == DeadSilent {
				pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(hh.addr, oncrpc.PmapPort)))
				if err != nil {
					h.Close()
					return nil, fmt.Errorf("dead host's silent port on %s:%d: %w", hh.addr, oncrpc.PmapPort, err)
				}
				h.conns = append(h.conns, pc)
				h.wg.Go(func() { h.drop(pc) })
			}
			continue
		}
		pmap, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(hh.addr, oncrpc.PmapPort)))
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("fake portmapper on %s:%d: %w", hh.addr, oncrpc.PmapPort, err)
		}
		h.conns = append(h.conns, pmap)
		if shared { // the statd answers on port 111 too
			h.wg.Go(func() { h.serve(hh, pmap, true, true, oncrpc.PmapPort) })
			continue
		}
		statd, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(hh.addr, 0)))
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("fake statd on %s: %w", hh.addr, err)
		}
		h.conns = append(h.conns, statd)
		statdPort := uint32(statd.LocalAddr().(*net.UDPAddr).Port)
		h.wg.Go(func() { h.serve(hh, pmap, true, false, statdPort) })
		h.wg.Go(func() { h.serve(hh, statd, false, true, 0) })
	}
	return h, nil
}

// phase starts counting SM_NOTIFYs with a state above minState, expected
// from source with mon_name name, until want hosts have one; every host's
// record is cleared. It returns a channel closed when want is reached.
func (h *benchHosts) phase(minState int32, source netip.Addr, name string, want int) <-chan struct{} {
	h.minState.Store(math.MaxInt32)
	for i := range h.hosts {
		h.hosts[i].first.Store(0)
	}
	for _, c := range []*atomic.Int64{&h.notified, &h.notifyRx, &h.getportRx, &h.wrongSource, &h.wrongName, &h.deadRx} {
		c.Store(0)
	}
	h.source.Store(&source)
	h.monName.Store(&name)
	all := &benchAll{want: int64(want), done: make(chan struct{})}
	h.all.Store(all)
	h.minState.Store(minState)
	return all.done
}

// drop reads and discards everything: a dead host's port 111.
func (h *benchHosts) drop(c *net.UDPConn) {
	buf := make([]byte, benchMaxFakeMessage)
	for {
		if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		h.deadRx.Add(1)
	}
}

func (h *benchHosts) Close() {
	for _, c := range h.conns {
		c.Close()
	}
	h.wg.Wait()
}

// benchMaxFakeMessage is the largest datagram a fake reads.
const benchMaxFakeMessage = 2048

// serve answers calls on one socket: as the portmapper (mapping the statd
// to statdPort), as the statd, or both.
func (h *benchHosts) serve(host *benchHost, c *net.UDPConn, isPmap, isStatd bool, statdPort uint32) {
	buf := make([]byte, benchMaxFakeMessage)
	out := make([]byte, 0, 64)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var ok bool
		if out, ok = h.answer(host, buf[:n], from, out, isPmap, isStatd, statdPort); ok {
			c.WriteToUDPAddrPort(out, from)
		}
	}
}

// startWildcard serves every host from a few sockets instead of one or two
// per host (the open-file limit caps those at some 10,000 hosts): per CPU,
// one on 0.0.0.0:111 (every portmapper) and one on 0.0.0.0:P (every statd),
// bound with SO_REUSEPORT so the kernel spreads the calls over them. The
// destination address of each call (IP_PKTINFO) tells which host it is
// for; the answer leaves from that address, as a host of its own would
// send it. A dead host's calls are dropped (silent).
func (h *benchHosts) startWildcard(perPort int) error {
	var statdPort uint16
	for range max(perPort, 1) {
		pmap, err := listenPktinfo(oncrpc.PmapPort)
		if err != nil {
			return fmt.Errorf("fake portmappers on 0.0.0.0:%d: %w", oncrpc.PmapPort, err)
		}
		h.conns = append(h.conns, pmap)
		statd, err := listenPktinfo(statdPort)
		if err != nil {
			return fmt.Errorf("fake statds on 0.0.0.0:%d: %w", statdPort, err)
		}
		h.conns = append(h.conns, statd)
		statdPort = uint16(statd.LocalAddr().(*net.UDPAddr).Port)
		h.wg.Go(func() { h.serveWildcard(pmap, true, false, uint32(statdPort)) })
		h.wg.Go(func() { h.serveWildcard(statd, false, true, 0) })
	}
	return nil
}

func (h *benchHosts) serveWildcard(c *net.UDPConn, isPmap, isStatd bool, statdPort uint32) {
	buf, oob := make([]byte, benchMaxFakeMessage), make([]byte, 128)
	out := make([]byte, 0, 64)
	for {
		n, oobn, _, from, err := c.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		dst, ok := pktinfoDst(oob[:oobn])
		if !ok {
			continue
		}
		i, ok := notifyIndex(dst)
		if !ok || i >= len(h.hosts) {
			continue // not one of the hosts
		}
		host := &h.hosts[i]
		if host.dead {
			h.deadRx.Add(1)
			continue
		}
		if out, ok = h.answer(host, buf[:n], from, out, isPmap, isStatd, statdPort); ok {
			c.WriteMsgUDPAddrPort(out, pktinfoSrc(dst), from)
		}
	}
}

// answer is a fake host's answer to one datagram (ok false: none).
func (h *benchHosts) answer(host *benchHost, msg []byte, from netip.AddrPort, out []byte, isPmap, isStatd bool, statdPort uint32) ([]byte, bool) {
	r := oncrpc.NewReader(msg)
	var call oncrpc.CallHeader
	if call.UnmarshalXDR(r) != nil {
		return out, false // not an RPC version 2 call: no answer
	}
	prog, vers, proc := call.Prog, call.Vers, call.Proc
	rep := oncrpc.ReplyHeader{XID: call.XID, Stat: oncrpc.ReplyAccepted, AcceptStat: oncrpc.AcceptSuccess}
	getport, port := false, uint32(0)
	switch {
	case isPmap && prog == oncrpc.PmapProg && vers == oncrpc.PmapVers && proc == oncrpc.PmapProcNull:
	case isPmap && prog == oncrpc.PmapProg && vers == oncrpc.PmapVers && proc == oncrpc.PmapProcGetPort:
		h.getportRx.Add(1)
		getport = true
		mp, mv, prot := r.Uint32(), r.Uint32(), r.Uint32()
		if mp == nsm.Program.Prog && mv == nsm.Program.Vers && prot == oncrpc.IPProtoUDP {
			port = statdPort
		}
	case isStatd && prog == nsm.Program.Prog && vers == nsm.Program.Vers && proc == nsm.ProcNull:
	case isStatd && prog == nsm.Program.Prog && vers == nsm.Program.Vers && proc == nsm.ProcNotify:
		var sc nsm.StatChge
		if sc.UnmarshalXDR(r) != nil {
			return out, false
		}
		h.record(host, from, sc)
	case (isPmap && prog == oncrpc.PmapProg) || (isStatd && prog == nsm.Program.Prog):
		rep.AcceptStat = oncrpc.AcceptProcUnavail
	default:
		rep.AcceptStat = oncrpc.AcceptProgUnavail
	}
	w := oncrpc.NewWriter(out)
	rep.MarshalXDR(w)
	if getport {
		w.Uint32(port)
	}
	return w.Bytes(), true
}

func (h *benchHosts) record(host *benchHost, from netip.AddrPort, sc nsm.StatChge) {
	now := time.Now().UnixNano()
	h.notifyRx.Add(1)
	if src := h.source.Load(); src != nil && from.Addr().Unmap() != *src {
		h.wrongSource.Add(1)
	}
	if name := h.monName.Load(); name != nil && *name != "" && sc.MonName != *name {
		h.wrongName.Add(1)
	}
	if sc.State > h.minState.Load() && host.first.CompareAndSwap(0, now) {
		if all := h.all.Load(); all != nil && h.notified.Add(1) == all.want {
			close(all.done)
		}
	}
}

// wait reports progress once a second until every live host was notified
// (all closed), exited is closed, or the deadline; it returns whether all
// were notified.
func (h *benchHosts) wait(ctx context.Context, label string, live int, start time.Time, deadline time.Time, all, exited <-chan struct{}, progress io.Writer, perSecond *[]int) bool {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-all:
			fmt.Fprintf(progress, "bench notify: %-9s all %d/%d notified within %v\n", label, h.notified.Load(), live, time.Since(start).Round(time.Millisecond))
			return true
		case <-exited:
			select {
			case <-all:
				return true
			default:
				return false
			}
		case now := <-tick.C:
			n := int(h.notified.Load())
			*perSecond = append(*perSecond, n)
			fmt.Fprintf(progress, "bench notify: %-9s +%3.0fs  notified %d/%d\n", label, now.Sub(start).Seconds(), n, live)
			if now.After(deadline) {
				return false
			}
		}
	}
}

// result summarises the phase from ref (the reference instant).
func (h *benchHosts) result(name string, ref time.Time, live int, timedOut bool, capAt time.Duration) NotifyPhase {
	p := NotifyPhase{Name: name, Live: live, TimedOut: timedOut,
		NotifyRx: h.notifyRx.Load(), GetportRx: h.getportRx.Load(),
		WrongSource: h.wrongSource.Load(), WrongMonName: h.wrongName.Load(), DeadRx: h.deadRx.Load()}
	var ms []float64
	for i := range h.hosts {
		if at := h.hosts[i].first.Load(); at != 0 && !h.hosts[i].dead {
			ms = append(ms, float64(time.Unix(0, at).Sub(ref))/float64(time.Millisecond))
		}
	}
	slices.Sort(ms)
	p.Notified = len(ms)
	if len(ms) > 0 {
		p.FirstMS, p.MaxMS = ms[0], ms[len(ms)-1]
		p.P50MS, p.P90MS, p.P99MS = drill.Percentile(ms, 0.5), drill.Percentile(ms, 0.9), drill.Percentile(ms, 0.99)
		p.CompleteMS = p.MaxMS
		step := max(1, len(ms)/400)
		for i := 0; i < len(ms); i += step {
			p.Curve = append(p.Curve, NotifyPoint{MS: ms[i], Count: i + 1})
		}
		if last := len(ms) - 1; last%step != 0 {
			p.Curve = append(p.Curve, NotifyPoint{MS: ms[last], Count: last + 1})
		}
	}
	if p.Notified < live {
		p.CompleteMS = float64(capAt) / float64(time.Millisecond)
	}
	return p
}

// ---- the run inside the namespace ----------------------------------------------

func runNotify(ctx context.Context, o NotifyOptions, progress io.Writer) (*NotifyReport, error) {
	rep := &NotifyReport{Hosts: o.Hosts, DeadMode: o.DeadMode, Fault: o.Fault, Nodes: 3, CPUs: notifyCPUs(), Started: time.Now().UTC().Format(time.RFC3339)}
	live := len(notifyLive(o.Hosts, o.DeadPct))
	rep.Live, rep.Dead = live, o.Hosts-live
	vip := netip.MustParseAddr(notifyVIP)

	tSetup := time.Now()
	hosts, err := startBenchHosts(o.Hosts, o.DeadPct, o.DeadMode, o.sharedPort, o.wildcard)
	if err != nil {
		return nil, err
	}
	defer hosts.Close()
	rep.StatdPort = "own port"
	rep.Fakes = FakesPerHost
	switch {
	case o.sharedPort:
		rep.StatdPort = "111 (shared with the portmapper: open-file limit)"
	case o.wildcard:
		rep.Fakes = FakesWildcard
		rep.StatdPort = fmt.Sprintf("a shared port (wildcard sockets, %d per port)", runtime.GOMAXPROCS(0))
	}
	fmt.Fprintf(progress, "bench notify: %d fake hosts (%d live, %d dead; statd on %s) up in %v\n", o.Hosts, live, rep.Dead, rep.StatdPort, time.Since(tSetup).Round(time.Millisecond))

	dir, err := os.MkdirTemp("", "nsmd-bench-notify-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	spec := agent.DevOptions{Nodes: rep.Nodes, DataDir: dir, VIP: notifyVIP, NSMPort: 6620, RaftPort: 7300, GossipPort: 7946, LogLevel: o.LogLevel}
	if o.LogLevel == "off" {
		spec.LogLevel = ""
	}
	d, err := startCluster(spec, progress)
	if err != nil {
		return nil, fmt.Errorf("start the cluster: %w", err)
	}
	closed := false
	closeCluster := func() {
		if !closed {
			closed = true
			// Crash every node first: a graceful close hands leadership
			// over, and the next leader would start another fan-out.
			for _, a := range d.Agents() {
				a.Kill()
			}
			d.Close()
		}
	}
	defer closeCluster()
	cfg := d.Agent(0).Config()
	rep.NotifyName = cfg.EffectiveNotifyName()
	leader, err := benchWaitLeader(ctx, d, 30*time.Second)
	if err != nil {
		return nil, err
	}
	rep.OldState = leader.Node().View().State()
	vipAddr := net.JoinHostPort(notifyVIP, strconv.Itoa(spec.NSMPort))

	// Register every host through the VIP, as the server's lockd would.
	tReg := time.Now()
	retried, err := benchRegister(ctx, d, vipAddr, o.Hosts, o.Conns)
	if err != nil {
		return nil, err
	}
	rep.RegisterRetried = retried
	if err := benchWaitCond(ctx, 60*time.Second, "every node to apply the registrations", func() bool {
		for _, a := range d.Agents() {
			if a.Node().View().Count() != o.Hosts {
				return false
			}
		}
		return true
	}); err != nil {
		return nil, err
	}
	regTook := time.Since(tReg)
	rep.RegisterMS = float64(regTook) / float64(time.Millisecond)
	rep.RegisterPS = float64(o.Hosts) / regTook.Seconds()
	fmt.Fprintf(progress, "bench notify: %d SM_MON committed on all nodes in %v (%.0f/s, %d sent again)\n", o.Hosts, regTook.Round(time.Millisecond), rep.RegisterPS, retried)
	if retried > 0 {
		// The leadership moved under the load: the leader to fail is the
		// one holding the VIP now, and its state is the old one.
		if leader, err = benchWaitLeader(ctx, d, 30*time.Second); err != nil {
			return nil, err
		}
		rep.OldState = leader.Node().View().State()
	}
	rep.EarlyNotify = hosts.notifyRx.Load()
	allNotified := hosts.phase(rep.OldState, vip, rep.NotifyName, live)

	if o.CPUProfile != "" {
		stop, err := benchStartCPUProfile(o.CPUProfile)
		if err != nil {
			return nil, err
		}
		defer stop()
	}

	udp0 := readUDPCounters()
	mem := startMemSampler(runtime.GC)
	// The fault.
	t0 := time.Now()
	switch o.Fault {
	case FaultKill:
		leader.Kill()
	case FaultTransfer:
		if err := leader.Node().TransferLeadership(""); err != nil {
			return nil, fmt.Errorf("leadership transfer: %w", err)
		}
	}
	var nl *agent.Agent
	if err := benchWaitCond(ctx, 30*time.Second, "a new leader's takeover", func() bool {
		for _, a := range d.Agents() {
			if a != leader && a.Node().Leading() && a.Node().View().State() > rep.OldState {
				nl = a
				return true
			}
		}
		return false
	}); err != nil {
		return nil, err
	}
	tk := nl.Node().View().LastTakeover().At
	rep.NewState = nl.Node().View().State()
	rep.FaultToTkMS = float64(tk.Sub(t0)) / float64(time.Millisecond)
	fmt.Fprintf(progress, "bench notify: %s took over %v after the %s (sm_state %d → %d); notifying\n",
		nl.Config().NodeID, tk.Sub(t0).Round(time.Millisecond), o.Fault, rep.OldState, rep.NewState)

	var perSecond []int
	all := hosts.wait(ctx, "nsmd", live, tk, tk.Add(o.Timeout), allNotified, nil, progress, &perSecond)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	for _, a := range d.Agents() {
		if a != leader {
			if st := a.Node().View().State(); st > rep.NewState {
				rep.TakeoversAfter = max(rep.TakeoversAfter, int(st-rep.NewState)/2)
			}
		}
	}
	rep.Memory = mem.stop()
	rep.UDP = readUDPCounters().sub(udp0)
	rep.NSMD = hosts.result("nsmd", tk, live, !all, o.Timeout)
	rep.NSMD.ProgressEvery = perSecond
	if o.CPUProfile != "" {
		pprof.StopCPUProfile()
	}
	rep.Sends = notifySendsOf(nl)
	closeCluster() // stops the notifier (still retrying the dead hosts)

	if o.SMNotify {
		p, err := benchRunSMNotify(ctx, o, hosts, live, rep.NewState, progress)
		if err != nil {
			return nil, err
		}
		rep.SMNotify = p
		// A ratio only when sm-notify reached every live host, or was
		// still at it when the cap stopped it (then a lower bound).
		if rep.NSMD.CompleteMS > 0 && (p.Notified == live || p.TimedOut) {
			rep.Ratio = p.CompleteMS / rep.NSMD.CompleteMS
			rep.RatioBound = p.Notified < live
		}
	}
	return rep, nil
}

func benchStartCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func notifyCPUs() int {
	n, _ := strconv.Atoi(strings.TrimSpace(func() string {
		b, err := exec.Command("nproc").Output()
		if err != nil {
			return "0"
		}
		return string(b)
	}()))
	return n
}

// benchWaitCond polls cond every millisecond.
func benchWaitCond(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// benchWaitLeader waits for a leader that holds the VIP and whose own
// takeover fan-out has begun: a fan-out takes its targets when it starts
// (after the VIP and the on_leader hook), so hosts registered before that
// would be notified of the old state, before the fault (a flake of the
// netns test until this wait).
func benchWaitLeader(ctx context.Context, d *agent.Dev, timeout time.Duration) (*agent.Agent, error) {
	var lead *agent.Agent
	err := benchWaitCond(ctx, timeout, "a leader holding the VIP, its takeover's notifier started", func() bool {
		for _, a := range d.Agents() {
			if st, _ := a.NotifyRun(); a.Node().Leading() && a.VIPHeld() && st == a.Node().View().State() {
				lead = a
				return true
			}
		}
		return false
	})
	return lead, err
}

// benchRegister sends SM_MON{mon_name: host i's address} for every host to
// addr over conns TCP connections from 127.0.0.1, 64 calls in flight on each.
// A call that fails (the leader lost its lease under the load and the VIP
// moved: the whole cluster shares two cores with the fake hosts) is sent
// again in the next round, after a leader holds the VIP again; it returns
// how many calls were sent again, and an error after 20 rounds.
func benchRegister(ctx context.Context, d *agent.Dev, addr string, hosts, conns int) (retried int, err error) {
	todo := make([]int32, hosts)
	for i := range todo {
		todo[i] = int32(i)
	}
	for round := 0; ; round++ {
		failed, firstErr := benchRegisterRound(ctx, addr, todo, conns)
		if len(failed) == 0 {
			return retried, nil
		}
		if round == 19 || ctx.Err() != nil {
			return retried, fmt.Errorf("%d SM_MON calls failed after %d rounds, e.g. %w", len(failed), round+1, firstErr)
		}
		retried += len(failed)
		if _, err := benchWaitLeader(ctx, d, 30*time.Second); err != nil {
			return retried, fmt.Errorf("after %d failed SM_MON calls (%w): %w", len(failed), firstErr, err)
		}
		todo = failed
	}
}

// benchRegisterRound sends SM_MON for each host in todo; it returns those
// that failed, and the first error.
func benchRegisterRound(ctx context.Context, addr string, todo []int32, conns int) (failed []int32, firstErr error) {
	var next atomic.Int64
	var mu sync.Mutex
	fail := func(i int32, err error) {
		mu.Lock()
		defer mu.Unlock()
		failed = append(failed, i)
		if firstErr == nil {
			firstErr = err
		}
	}
	var wg sync.WaitGroup
	for range conns {
		c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "tcp", Addr: addr, Timeout: 30 * time.Second,
			LocalAddr: netip.AddrFrom4([4]byte{127, 0, 0, 1})})
		if err != nil {
			fail(-1, fmt.Errorf("connect to the VIP %s: %w", addr, err))
			continue // the others may still work; all of todo is retried if none does
		}
		defer c.Close()
		for range 64 {
			wg.Go(func() {
				for {
					k := int(next.Add(1)) - 1
					if k >= len(todo) {
						return
					}
					i := todo[k]
					mon := nsm.Mon{ID: nsm.MonID{MonName: notifyAddr(int(i)).String(),
						My: nsm.MyID{MyName: notifyMyName, Prog: 100021, Vers: 3, Proc: 16}}}
					var res nsm.SMStatRes
					if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res); err != nil {
						fail(i, fmt.Errorf("SM_MON %s: %w", mon.ID.MonName, err))
						continue
					}
					if res.Res != nsm.StatSucc {
						fail(i, fmt.Errorf("SM_MON %s: answered %v", mon.ID.MonName, res.Res))
					}
				}
			})
		}
	}
	wg.Wait()
	// A connection that could not be made leaves no host behind unless
	// none could: then every host is still to do.
	failed = slices.DeleteFunc(failed, func(i int32) bool { return i < 0 })
	if int(next.Load()) == 0 && len(todo) > 0 {
		failed = append(failed[:0], todo...)
	}
	return failed, firstErr
}

// notifySendsOf reads the notifier's send counters from n's metrics.
func notifySendsOf(a *agent.Agent) NotifySends {
	var s NotifySends
	mfs, err := a.Registry().Gather()
	if err != nil {
		return s
	}
	for _, mf := range mfs {
		if mf.GetName() != "nsmd_notify_sends_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			v := int64(counterValue(m))
			switch labels["call"] + "/" + labels["kind"] {
			case "getport/first":
				s.GetportFirst = v
			case "getport/retry":
				s.GetportRetry = v
			case "notify/first":
				s.NotifyFirst = v
			case "notify/retry":
				s.NotifyRetry = v
			}
		}
	}
	return s
}

func counterValue(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return 0
}

// benchRunSMNotify runs the real sm-notify on the same hosts: an rpc.statd
// state directory with one record per host, then `sm-notify -d -f -P DIR
// -v VIP`, timed from its start until every live host has its SM_NOTIFY.
func benchRunSMNotify(ctx context.Context, o NotifyOptions, hosts *benchHosts, live int, state int32, progress io.Writer) (*NotifyPhase, error) {
	dir, err := os.MkdirTemp("", "nsmd-bench-sm-notify-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sd := nsm.StatdDir{State: state}
	for i := range o.Hosts {
		sd.Records = append(sd.Records, nsm.StatdRecord{
			Callback: netip.AddrFrom4([4]byte{127, 0, 0, 1}),
			My:       fsm.MyID{MyName: notifyMyName, Prog: 100021, Vers: 3, Proc: 16},
			MonName:  notifyAddr(i).String(),
		})
	}
	if err := nsm.WriteStatdDir(dir, sd); err != nil {
		return nil, err
	}
	if err := notifyHosts(dir); err != nil {
		return nil, err
	}
	allNotified := hosts.phase(math.MinInt32, netip.MustParseAddr(notifyVIP), notifyVIP, live)
	var tail benchTail
	cmd := exec.Command(o.SMNotifyPath, "-d", "-f", "-P", dir, "-v", notifyVIP)
	cmd.Stdout, cmd.Stderr = &tail, &tail
	cmd.SysProcAttr = notifyChildAttr() // dies with us
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start sm-notify: %w", err)
	}
	exited := make(chan struct{})
	var waitErr error // written before exited closes
	go func() { waitErr = cmd.Wait(); close(exited) }()
	fmt.Fprintf(progress, "bench notify: sm-notify (pid %d) started on the same %d hosts\n", cmd.Process.Pid, o.Hosts)
	var perSecond []int
	all := hosts.wait(ctx, "sm-notify", live, start, start.Add(o.SMNotifyTimeout), allNotified, exited, progress, &perSecond)
	p := hosts.result("sm-notify", start, live, false, o.SMNotifyTimeout)
	p.ProgressEvery = perSecond
	select {
	case <-exited:
		p.Note = fmt.Sprintf("sm-notify exited after %v: %v", time.Since(start).Round(time.Millisecond), benchExitText(waitErr))
	default:
		cmd.Process.Kill() // our own child, by pid
		<-exited
		if all {
			p.Note = "sm-notify stopped once every live host had its SM_NOTIFY"
			if live < o.Hosts {
				p.Note += " (it keeps retrying the dead ones)"
			}
		} else {
			p.TimedOut = true
			p.Note = fmt.Sprintf("sm-notify stopped after the %v cap", o.SMNotifyTimeout)
		}
	}
	if !all {
		if t := tail.String(); t != "" {
			p.Note += "; its last output: " + t
		}
	}
	return &p, ctx.Err()
}

func benchExitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// benchTail keeps the last 2 KiB written to it.
type benchTail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *benchTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2048 {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-2048:]...)
	}
	return len(p), nil
}

func (t *benchTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// ---- output ------------------------------------------------------------------------

func PrintNotify(w io.Writer, r *NotifyReport) {
	fmt.Fprintf(w, "nsmd bench notify: %d hosts (%d live, %d dead: %s), fault %s, %d nodes in one process, %d CPUs, netns %s\n",
		r.Hosts, r.Live, r.Dead, r.DeadMode, r.Fault, r.Nodes, r.CPUs, r.Netns)
	fmt.Fprintf(w, "  each fake host (%s sockets): portmapper on its 127.x.y.z:111, statd on %s\n", r.Fakes, r.StatdPort)
	fmt.Fprintf(w, "  registration: %d SM_MON committed in %s (%.0f/s)\n", r.Hosts, drill.FormatMS(r.RegisterMS), r.RegisterPS)
	fmt.Fprintf(w, "  %s → takeover: %s (sm_state %d → %d, notify name %s)\n", r.Fault, drill.FormatMS(r.FaultToTkMS), r.OldState, r.NewState, r.NotifyName)
	fmt.Fprintf(w, "\n  %-10s %13s %10s %9s %9s %9s %9s %9s %11s %11s\n", "", "notified", "all done", "first", "p50", "p90", "p99", "max", "NOTIFY rx", "GETPORT rx")
	row := func(label string, p *NotifyPhase) {
		done := drill.FormatMS(p.CompleteMS)
		if p.Notified < p.Live {
			done = ">" + done
		}
		fmt.Fprintf(w, "  %-10s %13s %10s %9s %9s %9s %9s %9s %11d %11d\n", label, fmt.Sprintf("%d/%d", p.Notified, p.Live),
			done, drill.FormatMS(p.FirstMS), drill.FormatMS(p.P50MS), drill.FormatMS(p.P90MS), drill.FormatMS(p.P99MS), drill.FormatMS(p.MaxMS), p.NotifyRx, p.GetportRx)
	}
	row("nsmd", &r.NSMD)
	if r.SMNotify != nil {
		row("sm-notify", r.SMNotify)
	}
	fmt.Fprintf(w, "\n  nsmd: times from the takeover; sm-notify: from its start. \"all done\" = the last live host.\n")
	s := r.Sends
	fmt.Fprintf(w, "  nsmd notifier sent (live + dead hosts): GETPORT %d first + %d retransmitted, SM_NOTIFY %d first + %d retransmitted\n",
		s.GetportFirst, s.GetportRetry, s.NotifyFirst, s.NotifyRetry)
	fmt.Fprintf(w, "  live hosts received duplicates: SM_NOTIFY %d, GETPORT %d; wrong source %d, wrong mon_name %d; SM_NOTIFY before the fault %d\n",
		max(0, r.NSMD.NotifyRx-int64(r.NSMD.Notified)), max(0, r.NSMD.GetportRx-int64(r.NSMD.Notified)), r.NSMD.WrongSource, r.NSMD.WrongMonName, r.EarlyNotify)
	if r.TakeoversAfter > 0 {
		fmt.Fprintf(w, "  WARNING: %d more takeover(s) during the fan-out (a leader lost its lease under the load; each starts the fan-out again)\n", r.TakeoversAfter)
	}
	m := r.Memory
	fmt.Fprintf(w, "  memory (whole process: 3 nodes, fake hosts, bench): before the fault heap %.0f MiB, RSS %.0f MiB; fan-out: heap peak %.0f MiB (+%.0f), %.0f MiB allocated, RSS peak %.0f MiB, goroutines %d → max %d\n",
		m.HeapBeforeMiB, m.RSSBeforeMiB, m.HeapPeakMiB, m.FanoutHeapMiB, m.AllocMiB, m.RSSPeakMiB, m.Goroutines, m.GoroutinesMax)
	u := r.UDP
	fmt.Fprintf(w, "  UDP in the namespace during the fan-out: %d datagrams in, %d out, %d receive-buffer drops, %d to no socket\n",
		u.InDatagrams, u.OutDatagrams, u.RcvbufErrors, u.NoPorts)
	if r.Dead > 0 && r.DeadMode == DeadSilent {
		fmt.Fprintf(w, "  dead hosts received %d datagrams until the last live host was notified\n", r.NSMD.DeadRx)
	}
	if r.SMNotify != nil {
		if r.SMNotify.Note != "" {
			fmt.Fprintf(w, "  %s\n", r.SMNotify.Note)
		}
		bound := ""
		if r.RatioBound {
			bound = "at least "
		}
		if r.Ratio > 0 {
			fmt.Fprintf(w, "  sm-notify / nsmd (last live host): %s%.1f×\n", bound, r.Ratio)
		}
	}
}

// NotifySVG draws the cumulative number of notified live hosts over
// time (log time axis), one line per phase.
func NotifySVG(r *NotifyReport) string {
	const W, H, left, right, top, bottom = 760, 380, 70, 20, 40, 50
	phases := []*NotifyPhase{&r.NSMD}
	colors := []string{"#1f77b4", "#d62728"}
	if r.SMNotify != nil {
		phases = append(phases, r.SMNotify)
	}
	lo, hi := 1.0, 10.0
	for _, p := range phases {
		for _, c := range p.Curve {
			hi = max(hi, c.MS)
		}
		if p.CompleteMS > hi {
			hi = p.CompleteMS
		}
	}
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	x := func(ms float64) float64 {
		ms = max(ms, lo)
		return left + pw*math.Log10(ms/lo)/math.Log10(hi/lo)
	}
	y := func(n int) float64 { return top + ph*(1-float64(n)/float64(max(r.Live, 1))) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">SM_NOTIFY fan-out: %d hosts (%d live, %d dead), fault %s</text>`+"\n", left, r.Hosts, r.Live, r.Dead, r.Fault)
	for d := lo; d <= hi; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(d), top, x(d), H-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(d), H-bottom+16, drill.FormatMS(d))
	}
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 1} {
		n := int(f * float64(r.Live))
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", left, y(n), W-right, y(n))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%d</text>`+"\n", left-6, y(n)+4, n)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">time (log scale): nsmd from the takeover, sm-notify from its start</text>`+"\n", left+int(pw/2), H-12)
	fmt.Fprintf(&b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">live hosts notified</text>`+"\n", top+int(ph/2), top+int(ph/2))
	for i, p := range phases {
		var pts []string
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(lo), y(0)))
		for _, c := range p.Curve {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(c.MS), y(c.Count)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colors[i], strings.Join(pts, " "))
		label := fmt.Sprintf("%s: %d/%d, last %s", p.Name, p.Notified, p.Live, drill.FormatMS(p.MaxMS))
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", left+10, top+16+16*i, colors[i], label)
	}
	b.WriteString("</svg>\n")
	return b.String()
}
