package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
	"github.com/nsmd/nsmd/placement"
)

// A planned move releases first (DESIGN.md, "A planned move waits only
// for that service's stop"): before it commits an operator's move, the
// leader asks the owner to stop the service (RELEASE); the owner stops it,
// records its mark and answers, all while its lease still holds, so its
// watchdog never starves for it. An owner that cannot be asked, or does
// not answer in time, is moved as a failed one.

// fwdProcRelease: releaseArgs → servingRes, whether this node still serves
// the service at the epoch or below after it was asked to stop it (false:
// released, its mark recorded). Only the leader asks: with a cluster key
// the request carries the key's HMAC (APPLY's), without one it must come
// from the leader's raft address; the answer carries an HMAC like
// SERVICE's, under its own label.
const fwdProcRelease uint32 = 9

// releaseArgs is RELEASE's argument: SERVICE's, with the asker's clock
// and the request's MAC.
type releaseArgs struct {
	SentNS int64
	serviceArgs
	MAC []byte
}

func (a *releaseArgs) MarshalXDR(w *oncrpc.Writer) {
	w.Int64(a.SentNS)
	a.serviceArgs.MarshalXDR(w)
	w.Opaque(a.MAC)
}

func (a *releaseArgs) UnmarshalXDR(r *oncrpc.Reader) error {
	a.SentNS = r.Int64()
	a.Nonce = r.Opaque(servingMaxNonceLen)
	a.Service = r.String(fsm.MaxServiceIDLen)
	a.Epoch = r.Uint64()
	a.MAC = r.Opaque(sha256.Size)
	return r.Done()
}

func (a *releaseArgs) macInput() []byte {
	b := []byte("\x00release\x00")
	b = appendLP(b, a.Nonce)
	b = appendLP(b, []byte(a.Service))
	return binary.BigEndian.AppendUint64(b, a.Epoch)
}

// releaseAnswerKey is the label of RELEASE's answer MAC: a SERVICE answer
// cannot stand in for it, nor the other way round.
func releaseAnswerKey(key []byte) []byte { return append([]byte("release\x00"), key...) }

// serveRelease answers RELEASE.
func (n *Node) serveRelease(ctx context.Context, c *oncrpc.Call, res *oncrpc.Writer) error {
	var args releaseArgs
	if err := args.UnmarshalXDR(c.Args); err != nil || len(args.Nonce) < servingNonceLen || args.Service == "" || args.Epoch == 0 {
		return fmt.Errorf("%w: release: want a nonce of %d…%d bytes, a service and an epoch", oncrpc.ErrGarbageArgs, servingNonceLen, servingMaxNonceLen)
	}
	from := c.Remote.Addr().Unmap()
	if err := n.authForward(from, &fwdArgs{SentNS: args.SentNS, Cmd: args.macInput(), MAC: args.MAC}); err != nil {
		n.fwdLog.warn(n.log, from, fmt.Errorf("a release request: %w", err))
		return fmt.Errorf("%w: release: %v", oncrpc.ErrAuth, err)
	}
	if _, lid := n.raft.LeaderWithID(); len(n.cfg.ClusterKey) == 0 && !n.isRaftAddrOf(string(lid), from) {
		return fmt.Errorf("%w: release: only the leader asks", oncrpc.ErrAuth)
	}
	out := servingRes{Serving: n.runs.release(ctx, args.Service, args.Epoch)}
	if len(n.cfg.ClusterKey) > 0 {
		out.MAC = serviceMAC(releaseAnswerKey(n.cfg.ClusterKey), n.cfg.NodeID, &args.serviceArgs, out.Serving)
	}
	out.MarshalXDR(res)
	return nil
}

// release stops service's run at epoch or below (a planned move) and
// waits for it, at most the hook timeout + 2 s; it answers as SERVICE
// does (serves), false once released.
func (r *serviceRuns) release(ctx context.Context, service string, epoch uint64) bool {
	r.mu.Lock()
	run, ok := r.runs[service]
	if ok && run.epoch <= epoch {
		r.stopLocked(run, "released for a planned move")
	}
	r.mu.Unlock()
	if ok && run.epoch <= epoch {
		t := time.NewTimer(r.n.cfg.HookTimeout + 2*time.Second)
		defer t.Stop()
		select {
		case <-run.done:
		case <-t.C:
			return true
		case <-ctx.Done():
			return true
		}
	}
	return r.serves(service, epoch)
}

// releasesFirst reports whether a move for reason takes a service from
// an owner that is alive: an operator's move, a failback, an owner that
// no longer declares the service, a service nobody declares. A move from
// a lost owner (placement.ReasonLost) asks nobody.
func releasesFirst(reason string) bool {
	switch reason {
	case placement.ReasonOperator, placement.ReasonFailback, placement.ReasonIneligible, placement.ReasonUndeclared:
		return true
	}
	return false
}

// movingAway reports whether m is a decided move that releases first
// (releasesFirst) from another node than this leader's own loop can ask
// without waiting: every such move does, in moveReleasingFirst.
func (p *placer) movingAway(m placement.Move) bool {
	return releasesFirst(m.Reason) && m.From != "" && m.From != m.To && m.Epoch >= 2
}

// moveReleasingFirst commits a decided move m in a goroutine of its own,
// after its owner released the service (releaseFirst), so the placer's
// loop never waits for an owner's stop; the loop skips the service until
// then. The move is committed as decided: if another placement of the
// service was committed meanwhile, it is refused, and the loop decides
// again.
func (p *placer) moveReleasingFirst(ctx context.Context, m placement.Move) {
	p.mu.Lock()
	if p.moving[m.Service] {
		p.mu.Unlock()
		return
	}
	if p.moving == nil {
		p.moving = map[string]bool{}
	}
	p.moving[m.Service] = true
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() {
			p.mu.Lock()
			delete(p.moving, m.Service)
			p.mu.Unlock()
			p.wake()
		}()
		c := fsm.ServicePlaced{Service: m.Service, Node: m.To, Epoch: m.Epoch, Reason: m.Reason, From: m.From}
		p.releaseFirst(ctx, c)
		if err := p.commit(ctx, m); err != nil {
			p.note("place "+m.Service, err)
		}
	}()
}

// releaseFirst asks c's current owner to release the service before a
// move c that takes it from a live owner is committed (releasesFirst):
// true when it answered that it released it. The leader's restart of
// that service waits meanwhile (planRestart).
func (p *placer) releaseFirst(ctx context.Context, c fsm.ServicePlaced) bool {
	n := p.n
	if !releasesFirst(c.Reason) || c.From == "" || c.From == c.Node || c.Epoch < 2 {
		return false
	}
	p.mu.Lock()
	if p.releasing == nil {
		p.releasing = map[string]bool{}
	}
	p.releasing[c.Service] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.releasing, c.Service)
		p.mu.Unlock()
	}()
	wait := n.peerStandDownWait(n.peerPromise(c.From)) + 2*time.Second
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if c.From == n.cfg.NodeID {
		return !n.runs.release(cctx, c.Service, c.Epoch-1)
	}
	serving, err := n.askRelease(cctx, c.From, c.Service, c.Epoch-1)
	if err != nil {
		n.log.Warn("the owner did not release the service for a planned move: moving it as from a failed server", "service", c.Service, "owner", c.From, "err", err)
		return false
	}
	return !serving
}

// askRelease asks peer to release service at epoch (RELEASE).
func (n *Node) askRelease(ctx context.Context, peer, service string, epoch uint64) (bool, error) {
	c, addr, err := n.dialPeer(ctx, peer, time.Until(deadlineOr(ctx, time.Minute)))
	if err != nil {
		return false, err
	}
	defer c.Close()
	args := releaseArgs{SentNS: n.cfg.Now().UnixNano(), serviceArgs: serviceArgs{Nonce: make([]byte, servingNonceLen), Service: service, Epoch: epoch}}
	if _, err := rand.Read(args.Nonce); err != nil {
		return false, fmt.Errorf("cluster: release nonce: %w", err)
	}
	if len(n.cfg.ClusterKey) > 0 {
		args.MAC = fwdMAC(n.cfg.ClusterKey, args.SentNS, args.macInput())
	}
	var res servingRes
	if err := c.Call(ctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcRelease, &args, &res); err != nil {
		return false, err
	}
	if len(n.cfg.ClusterKey) > 0 && !hmac.Equal(res.MAC, serviceMAC(releaseAnswerKey(n.cfg.ClusterKey), peer, &args.serviceArgs, res.Serving)) {
		return false, fmt.Errorf("%w: %s at %s", errServingUnproven, peer, addr)
	}
	return res.Serving, nil
}

// deadlineOr is ctx's deadline, or d from now without one.
func deadlineOr(ctx context.Context, d time.Duration) time.Time {
	if t, ok := ctx.Deadline(); ok {
		return t
	}
	return time.Now().Add(d)
}
