package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// A service's stop, proven (DESIGN.md, "Saying 'not serving' is a
// promise"): an owner answers the SERVICE question no only once it does
// not serve the service at that epoch or below and has recorded, fsynced
// in its data directory, that it never will again (releaseMarks); it
// never starts an epoch at or below its mark.

// fwdProcService: serviceArgs → servingRes, whether this node serves the
// service at the epoch or below (or may: it has not finished its stop at
// start, a stop failed, it cannot record its promise). With a cluster key
// the answer carries an HMAC over the asker's nonce, the node, the
// service, the epoch and the answer.
const fwdProcService uint32 = 8

// releaseMarks are this node's durable marks per service, kept in
// DataDir/services.json: Released, the highest epoch it promised never to
// serve again; Started, the highest epoch a process of it started (a later
// process never serves that epoch again: what it served was stopped at its
// start, so its clients must hear of a new state — a new epoch).
type releaseMarks struct {
	path string
	mu   sync.Mutex
	m    marksFile
}

type marksFile struct {
	Released map[string]uint64 `json:"released,omitempty"`
	Started  map[string]uint64 `json:"started,omitempty"`
}

func loadReleaseMarks(dir string) (*releaseMarks, error) {
	r := &releaseMarks{path: filepath.Join(dir, "services.json")}
	b, err := os.ReadFile(r.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return r, nil
	case err != nil:
		return nil, fmt.Errorf("cluster: read the services' marks: %w", err)
	}
	if err := json.Unmarshal(b, &r.m); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", r.path, err)
	}
	return r, nil
}

// mark is the epoch at or below which this node never serves service.
func (r *releaseMarks) mark(service string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.Released[service]
}

// started is the highest epoch of service a process of this node started.
func (r *releaseMarks) started(service string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.Started[service]
}

// raise records, durably, that this node never serves service at epoch
// or below again; it returns once the file and its directory are synced.
func (r *releaseMarks) raise(service string, epoch uint64) error {
	return r.set(service, epoch, false)
}

// raiseStarted records, durably, that this node starts service at epoch.
func (r *releaseMarks) raiseStarted(service string, epoch uint64) error {
	return r.set(service, epoch, true)
}

func (r *releaseMarks) set(service string, epoch uint64, started bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur, what := r.m.Released, "release"
	if started {
		cur, what = r.m.Started, "start"
	}
	if cur[service] >= epoch {
		return nil
	}
	next := marksFile{Released: maps.Clone(r.m.Released), Started: maps.Clone(r.m.Started)}
	m := &next.Released
	if started {
		m = &next.Started
	}
	if *m == nil {
		*m = map[string]uint64{}
	}
	(*m)[service] = epoch
	b, err := json.Marshal(next)
	if err != nil {
		return err
	}
	if err := writeSynced(r.path, b); err != nil {
		return fmt.Errorf("cluster: record the %s of %s at epoch %d: %w", what, service, epoch, err)
	}
	r.m = next
	return nil
}

// writeSynced replaces path with b: a synced temporary file renamed over
// it, then the directory synced.
func writeSynced(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// serviceArgs is SERVICE's argument.
type serviceArgs struct {
	Nonce   []byte
	Service string
	Epoch   uint64
}

func (a *serviceArgs) MarshalXDR(w *oncrpc.Writer) {
	w.Opaque(a.Nonce)
	w.String(a.Service)
	w.Uint64(a.Epoch)
}

func (a *serviceArgs) UnmarshalXDR(r *oncrpc.Reader) error {
	a.Nonce = r.Opaque(servingMaxNonceLen)
	a.Service = r.String(fsm.MaxServiceIDLen)
	a.Epoch = r.Uint64()
	return r.Done()
}

// serviceMAC authenticates node's SERVICE answer to the asker's nonce.
func serviceMAC(key []byte, node string, a *serviceArgs, serving bool) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("nsmd-service-v1"))
	m.Write(appendLP(nil, []byte(node)))
	m.Write(appendLP(nil, a.Nonce))
	m.Write(appendLP(nil, []byte(a.Service)))
	var b [9]byte
	binary.BigEndian.PutUint64(b[:8], a.Epoch)
	if serving {
		b[8] = 1
	}
	m.Write(b[:])
	return m.Sum(nil)
}

// serveService answers SERVICE.
func (n *Node) serveService(c *oncrpc.Call, res *oncrpc.Writer) error {
	var args serviceArgs
	if err := args.UnmarshalXDR(c.Args); err != nil || len(args.Nonce) < servingNonceLen || args.Service == "" || args.Epoch == 0 {
		return fmt.Errorf("%w: service: want a nonce of %d…%d bytes, a service and an epoch", oncrpc.ErrGarbageArgs, servingNonceLen, servingMaxNonceLen)
	}
	out := servingRes{Serving: n.runs.serves(args.Service, args.Epoch)}
	if len(n.cfg.ClusterKey) > 0 {
		out.MAC = serviceMAC(n.cfg.ClusterKey, n.cfg.NodeID, &args, out.Serving)
	}
	out.MarshalXDR(res)
	return nil
}

// askService asks peer whether it serves service at epoch or below.
func (n *Node) askService(ctx context.Context, peer, service string, epoch uint64) (bool, error) {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, addr, err := n.dialPeer(dctx, peer, 500*time.Millisecond)
	if err != nil {
		return false, err
	}
	defer c.Close()
	args := serviceArgs{Nonce: make([]byte, servingNonceLen), Service: service, Epoch: epoch}
	if _, err := rand.Read(args.Nonce); err != nil {
		return false, fmt.Errorf("cluster: service nonce: %w", err)
	}
	var res servingRes
	if err := c.Call(dctx, ForwardProgram.Prog, ForwardProgram.Vers, fwdProcService, &args, &res); err != nil {
		return false, err
	}
	if len(n.cfg.ClusterKey) > 0 && !hmac.Equal(res.MAC, serviceMAC(n.cfg.ClusterKey, peer, &args, res.Serving)) {
		return false, fmt.Errorf("%w: %s at %s", errServingUnproven, peer, addr)
	}
	return res.Serving, nil
}

// askServiceUntilClear asks peer every 100 ms until it answers that it
// does not serve service at epoch or below (true), or ctx ends (false).
func (n *Node) askServiceUntilClear(ctx context.Context, peer, service string, epoch uint64) (string, bool) {
	return askUntil(ctx, fmt.Sprintf("answered: not serving %s at epoch %d or below", service, epoch),
		func() (bool, error) { return n.askService(ctx, peer, service, epoch) })
}
