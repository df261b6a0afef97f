package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/tickle"
)

// The clients' connections of each service, shared by the server that
// serves it with the other serving nodes, so that the service's next
// server tickles them (agent/servicetickle.go). As CONNS (conns.go) shares
// the VIP's, but from each service's own server: with services:, raft
// leadership serves nothing, and a service's connections are on the
// server that serves it. Every server samples the services it serves and
// hands the samples to Hints.SetServiceConns; every other serving node
// asks each server that serves a service (the placements say which) for
// them (Hints.ServerServiceConns, the forward program's SVCCONNS) and
// keeps the last sample of each service. Not in the FSM, for CONNS's
// reasons: a hint that changes every second, whose loss costs only what
// having none costs.

// fwdProcSvcConns: hintArgs → svcConnsRes, the last sample of each service
// this node serves now (fwdOK; none when it serves none), at most Max
// connections each. Authenticated like CONNS (the cluster key's HMAC over
// the asker's time and Max, or a raft member's address), over TCP only.
// A release without it answers PROC_UNAVAIL.
const fwdProcSvcConns uint32 = 10

// tagSvcConns is SVCCONNS's MAC tag (hintArgs.macInput).
const tagSvcConns = "svcconns"

// ErrServiceConnsUnsupported means a server does not answer SVCCONNS (a
// release before it): ask it again only after a while or once it
// restarted.
var ErrServiceConnsUnsupported = errors.New("cluster: the server does not share its services' connections (an older release)")

// serviceConns is a node's side of SVCCONNS: the last samples of the
// services it serves, and its clients to the other servers. The zero
// value is ready.
type serviceConns struct {
	samples atomic.Pointer[map[string]VIPConns]
	peers   peerClients
}

// SetServiceConns records this node's latest samples of the services it
// serves, by service id. SVCCONNS answers with those of them this node
// serves when asked.
func (h Hints) SetServiceConns(m map[string]VIPConns) {
	m = maps.Clone(m)
	h.n.svcConns.samples.Store(&m)
}

// svcConnsEntry is one service's sample in an SVCCONNS answer.
type svcConnsEntry struct {
	Service string
	Total   uint32
	AgeMS   uint32 // how old the sample is, so the asker dates it on its own clock
	Conns   []tickle.Conn
}

// svcConnsRes is SVCCONNS's result: the services by id, each at most once.
type svcConnsRes struct {
	Status   uint32
	Err      string
	Services []svcConnsEntry
	max      int // decoding: the most connections of one service accepted
}

func (r *svcConnsRes) status() (uint32, string) { return r.Status, r.Err }

func (r *svcConnsRes) MarshalXDR(w *oncrpc.Writer) {
	w.Uint32(r.Status)
	w.String(r.Err)
	w.Uint32(uint32(len(r.Services)))
	for _, e := range r.Services {
		w.String(e.Service)
		w.Uint32(e.Total)
		w.Uint32(e.AgeMS)
		writeConns(w, e.Conns)
	}
}

// UnmarshalXDR refuses an answer over the bounds: more than
// fsm.MaxServices services, more than max connections of one, more than
// MaxVIPConns in all, or services not in strictly increasing order (so
// each at most once).
func (r *svcConnsRes) UnmarshalXDR(rd *oncrpc.Reader) error {
	r.Status = rd.Uint32()
	r.Err = rd.String(256)
	count := rd.Uint32()
	if rd.Err() != nil {
		return rd.Err()
	}
	if count > fsm.MaxServices {
		return fmt.Errorf("%d services, more than %d", count, fsm.MaxServices)
	}
	r.Services = make([]svcConnsEntry, 0, min(int(count), rd.Remaining()/16))
	total := 0
	for range count {
		var e svcConnsEntry
		e.Service = rd.String(fsm.MaxServiceIDLen)
		e.Total = rd.Uint32()
		e.AgeMS = rd.Uint32()
		if err := rd.Err(); err != nil {
			return err
		}
		if e.Service == "" || (len(r.Services) > 0 && e.Service <= r.Services[len(r.Services)-1].Service) {
			return fmt.Errorf("service %q out of order", e.Service)
		}
		var err error
		if e.Conns, err = readConns(rd, min(r.max, MaxVIPConns-total)); err != nil {
			return fmt.Errorf("service %s: %w", e.Service, err)
		}
		total += len(e.Conns)
		r.Services = append(r.Services, e)
	}
	return rd.Err()
}

// serveSvcConns answers SVCCONNS.
func (n *Node) serveSvcConns(c *oncrpc.Call, res *oncrpc.Writer) error {
	if c.Net == "udp" {
		out := svcConnsRes{Status: fwdDenied, Err: "taken over TCP only"}
		out.MarshalXDR(res)
		return nil
	}
	args, err := n.authHint(c, tagSvcConns, "the services' connections (SVCCONNS)")
	var denied errHintDenied
	if errors.As(err, &denied) {
		out := svcConnsRes{Status: fwdDenied, Err: denied.Error()}
		out.MarshalXDR(res)
		return nil
	}
	if err != nil {
		return err
	}
	out := svcConnsRes{Status: fwdOK, Services: n.servedSamples(int(args.Max))}
	out.MarshalXDR(res)
	return nil
}

// servedSamples are the last samples of the services this node serves
// now (its run of each in phase serving: one that stops has nothing left
// worth sharing, and the asker keeps what it had), by id, at most max
// connections each and MaxVIPConns in all (fairShares).
func (n *Node) servedSamples(max int) []svcConnsEntry {
	p := n.svcConns.samples.Load()
	if p == nil || len(*p) == 0 {
		return nil
	}
	var ids []string
	for _, r := range n.Services().Runs() {
		if _, ok := (*p)[r.Service]; ok && r.Phase == runServing.String() {
			ids = append(ids, r.Service)
		}
	}
	slices.Sort(ids) // Runs is sorted; kept sorted whatever it does
	ids = ids[:min(len(ids), fsm.MaxServices)]
	sizes := make([]int, len(ids))
	for i, id := range ids {
		sizes[i] = min(len((*p)[id].Conns), max, MaxVIPConns)
	}
	shares := fairShares(sizes, MaxVIPConns)
	out := make([]svcConnsEntry, len(ids))
	for i, id := range ids {
		v := (*p)[id]
		out[i] = svcConnsEntry{Service: id, Total: uint32(v.Total), AgeMS: uint32(min(time.Since(v.At).Milliseconds(), 1<<31)), Conns: v.Conns[:shares[i]]}
	}
	return out
}

// fairShares splits limit between wants: each gets what it wants when
// the sum fits, else the smallest get theirs first and the rest an equal
// share of what is left (so no service's sample crowds out another's).
func fairShares(wants []int, limit int) []int {
	order := make([]int, len(wants))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return wants[a] - wants[b] })
	out := make([]int, len(wants))
	left := limit
	for j, i := range order {
		out[i] = min(wants[i], left/(len(order)-j))
		left -= out[i]
	}
	return out
}

// ServerServiceConns asks server for its latest samples of the
// connections of the services it serves, at most max of each, by service
// id. A server that does not answer SVCCONNS is
// ErrServiceConnsUnsupported.
func (h Hints) ServerServiceConns(ctx context.Context, server string, max int) (map[string]VIPConns, error) {
	n := h.n
	if server == n.cfg.NodeID {
		return nil, errors.New("cluster: a node does not ask itself for its services' connections")
	}
	addr := n.peerNSMAddr(server)
	if addr == "" {
		return nil, fmt.Errorf("cluster: no NSM address known for %s", server)
	}
	max = min(max, MaxVIPConns)
	args := hintArgs{SentNS: n.cfg.Now().UnixNano(), Max: uint32(max)}
	if len(n.cfg.ClusterKey) > 0 {
		args.MAC = fwdMAC(n.cfg.ClusterKey, args.SentNS, args.macInput(tagSvcConns))
	}
	local, _ := netip.ParseAddrPort(n.cfg.RaftBind) // without a key, the answerer checks the raft address
	c, err := n.svcConns.peers.get(ctx, addr, local.Addr())
	if err != nil {
		return nil, fmt.Errorf("cluster: ask %s for its services' connections: %w", server, err)
	}
	res := svcConnsRes{max: max}
	if err := c.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcSvcConns, &args, &res); err != nil {
		if errors.Is(err, oncrpc.ErrProcUnavail) {
			return nil, fmt.Errorf("%s: %w", server, ErrServiceConnsUnsupported)
		}
		n.svcConns.peers.drop(addr, c)
		return nil, fmt.Errorf("cluster: ask %s for its services' connections: %w", server, err)
	}
	switch res.Status {
	case fwdOK:
	case fwdDenied:
		return nil, fmt.Errorf("cluster: %s refused to share its services' connections: %s", server, res.Err)
	default:
		return nil, fmt.Errorf("cluster: %s: status %d: %s", server, res.Status, res.Err)
	}
	now := time.Now()
	out := make(map[string]VIPConns, len(res.Services))
	for _, e := range res.Services {
		out[e.Service] = VIPConns{Conns: e.Conns, Total: int(e.Total), At: now.Add(-time.Duration(e.AgeMS) * time.Millisecond)}
	}
	return out, nil
}

// maxPeerClients bounds the clients kept to other servers (one each).
const maxPeerClients = 64

// peerClients keeps one TCP client per other server asked (by NSM
// address). The zero value is ready; close ends them all and any later
// get fails.
type peerClients struct {
	mu     sync.Mutex
	closed bool
	byAddr map[string]*oncrpc.Client
}

func (p *peerClients) get(ctx context.Context, addr string, local netip.Addr) (*oncrpc.Client, error) {
	p.mu.Lock()
	if c := p.byAddr[addr]; c != nil || p.closed {
		p.mu.Unlock()
		if c == nil {
			return nil, errors.New("node closed")
		}
		return c, nil
	}
	p.mu.Unlock()
	c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "tcp", Addr: addr, Timeout: 5 * time.Second, LocalAddr: local})
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return nil, errors.New("node closed")
	}
	if had := p.byAddr[addr]; had != nil { // dialled meanwhile
		c.Close()
		return had, nil
	}
	if p.byAddr == nil {
		p.byAddr = map[string]*oncrpc.Client{}
	}
	if len(p.byAddr) >= maxPeerClients {
		for a, old := range p.byAddr { // one of them: addresses come and go
			old.Close()
			delete(p.byAddr, a)
			break
		}
	}
	p.byAddr[addr] = c
	return c, nil
}

// drop forgets a client that failed, so the next call dials again.
func (p *peerClients) drop(addr string, c *oncrpc.Client) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byAddr[addr] == c {
		c.Close()
		delete(p.byAddr, addr)
	}
}

func (p *peerClients) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for a, c := range p.byAddr {
		c.Close()
		delete(p.byAddr, a)
	}
}
