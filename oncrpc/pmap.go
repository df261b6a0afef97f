package oncrpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// Portmapper version 2 (RFC 1833 §3).
const (
	PmapProg   uint32 = 100000
	PmapVers   uint32 = 2
	PmapPort          = 111
	IPProtoTCP uint32 = 6
	IPProtoUDP uint32 = 17
)

// PMAP v2 procedures (RFC 1833 §3.2).
const (
	PmapProcNull    uint32 = 0
	PmapProcSet     uint32 = 1
	PmapProcUnset   uint32 = 2
	PmapProcGetPort uint32 = 3
	PmapProcDump    uint32 = 4
	PmapProcCallIt  uint32 = 5
)

// maxDumpEntries bounds a decoded DUMP list.
const maxDumpEntries = 1 << 16

// Mapping is PMAP v2 "mapping".
type Mapping struct{ Prog, Vers, Prot, Port uint32 }

// MarshalXDR encodes the mapping.
func (m Mapping) MarshalXDR(w *Writer) {
	w.Uint32(m.Prog)
	w.Uint32(m.Vers)
	w.Uint32(m.Prot)
	w.Uint32(m.Port)
}

// UnmarshalXDR decodes a mapping.
func (m *Mapping) UnmarshalXDR(r *Reader) error {
	m.Prog, m.Vers, m.Prot, m.Port = r.Uint32(), r.Uint32(), r.Uint32(), r.Uint32()
	return r.Err()
}

// pmapList is the DUMP result: an XDR optional-data list of mappings.
type pmapList []Mapping

func (l pmapList) MarshalXDR(w *Writer) {
	for _, m := range l {
		w.Bool(true)
		m.MarshalXDR(w)
	}
	w.Bool(false)
}

func (l *pmapList) UnmarshalXDR(r *Reader) error {
	*l = (*l)[:0]
	for r.Bool() {
		if len(*l) == maxDumpEntries {
			r.Fail(fmt.Errorf("pmap: more than %d mappings: %w", maxDumpEntries, ErrTooLong))
			break
		}
		var m Mapping
		if m.UnmarshalXDR(r) != nil {
			break
		}
		*l = append(*l, m)
	}
	return r.Err()
}

type xdrUint32 uint32

func (v xdrUint32) MarshalXDR(w *Writer)          { w.Uint32(uint32(v)) }
func (v *xdrUint32) UnmarshalXDR(r *Reader) error { *v = xdrUint32(r.Uint32()); return r.Err() }

type xdrBool bool

func (v xdrBool) MarshalXDR(w *Writer)          { w.Bool(bool(v)) }
func (v *xdrBool) UnmarshalXDR(r *Reader) error { *v = xdrBool(r.Bool()); return r.Err() }

// PmapClient talks PMAP v2 to one portmapper (rpcbind or ours). Each
// operation dials, calls and closes, so a PmapClient holds no resources.
type PmapClient struct {
	cfg ClientConfig
}

// NewPmapClient uses UDP to host:111 unless cfg says otherwise (host may
// carry a port, "127.0.0.1:1111"; cfg.Addr is ignored). SET and UNSET are
// sent from a privileged port as rpcbind expects, falling back to an
// ordinary port when binding one is not permitted.
func NewPmapClient(host string, cfg ClientConfig) *PmapClient {
	if cfg.Net == "" {
		cfg.Net = "udp"
	}
	if _, _, err := net.SplitHostPort(host); err == nil {
		cfg.Addr = host
	} else {
		cfg.Addr = net.JoinHostPort(strings.Trim(host, "[]"), fmt.Sprint(PmapPort))
	}
	return &PmapClient{cfg: cfg}
}

func (p *PmapClient) call(ctx context.Context, cfg ClientConfig, proc uint32, args Marshaler, res Unmarshaler) error {
	c, err := Dial(ctx, cfg)
	if err != nil && cfg.Privileged && (errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)) {
		cfg.Privileged = false
		c, err = Dial(ctx, cfg)
	}
	if err != nil {
		return fmt.Errorf("portmapper: %w", err)
	}
	defer c.Close()
	if err := c.Call(ctx, PmapProg, PmapVers, proc, args, res); err != nil {
		return fmt.Errorf("portmapper: %w", err)
	}
	return nil
}

// Null calls PMAPPROC_NULL (a ping).
func (p *PmapClient) Null(ctx context.Context) error {
	return p.call(ctx, p.cfg, PmapProcNull, nil, nil)
}

// GetPort asks for the port of prog/vers over prot (IPProtoTCP or
// IPProtoUDP). Port 0, "not registered", is an error wrapping ErrProgUnavail.
func (p *PmapClient) GetPort(ctx context.Context, prog, vers, prot uint32) (uint16, error) {
	var port xdrUint32
	if err := p.call(ctx, p.cfg, PmapProcGetPort, Mapping{Prog: prog, Vers: vers, Prot: prot}, &port); err != nil {
		return 0, err
	}
	if port == 0 {
		return 0, fmt.Errorf("portmapper at %s: program %d version %d protocol %d not registered: %w",
			p.cfg.Addr, prog, vers, prot, ErrProgUnavail)
	}
	if port > 0xffff {
		return 0, fmt.Errorf("portmapper at %s: port %d out of range: %w", p.cfg.Addr, port, ErrBadReply)
	}
	return uint16(port), nil
}

// Set registers m; false means the portmapper refused (already registered,
// or the caller not allowed).
func (p *PmapClient) Set(ctx context.Context, m Mapping) (bool, error) {
	return p.change(ctx, PmapProcSet, m)
}

// Unset removes every mapping of m.Prog/m.Vers (m.Prot and m.Port are
// ignored, RFC 1833); false means nothing was removed or the caller is not
// allowed.
func (p *PmapClient) Unset(ctx context.Context, m Mapping) (bool, error) {
	return p.change(ctx, PmapProcUnset, m)
}

func (p *PmapClient) change(ctx context.Context, proc uint32, m Mapping) (bool, error) {
	cfg := p.cfg
	cfg.Privileged = true
	var ok xdrBool
	if err := p.call(ctx, cfg, proc, m, &ok); err != nil {
		return false, err
	}
	return bool(ok), nil
}

// Dump lists every mapping.
func (p *PmapClient) Dump(ctx context.Context) ([]Mapping, error) {
	var l pmapList
	if err := p.call(ctx, p.cfg, PmapProcDump, nil, &l); err != nil {
		return nil, err
	}
	return []Mapping(l), nil
}

// Portmapper is a small embedded PMAP v2 server (NULL, SET, UNSET,
// GETPORT, DUMP over TCP; CALLIT, and DUMP over UDP, are PROC_UNAVAIL: no
// reply is larger than its call over UDP, so the portmapper amplifies
// nothing for a spoofed source). SET and UNSET are taken only from
// loopback and a privileged source port (below 1024: root, such as the
// kernel's lockd, which registers over loopback TCP from one); others get
// false, so a local user cannot redirect a program's mapping (lockd's
// callback included). Serve it with
// NewServer(Programs{{PmapProg, PmapVers}: pm}, ...). It is safe for
// concurrent use.
type Portmapper struct {
	mu sync.RWMutex
	m  map[pmapKey]uint32
}

type pmapKey struct{ prog, vers, prot uint32 }

// NewPortmapper returns an empty Portmapper.
func NewPortmapper() *Portmapper { return &Portmapper{m: make(map[pmapKey]uint32)} }

// Register adds a mapping directly (for the process's own programs),
// replacing any mapping of the same program, version and protocol.
func (p *Portmapper) Register(m Mapping) {
	p.mu.Lock()
	p.m[pmapKey{m.Prog, m.Vers, m.Prot}] = m.Port
	p.mu.Unlock()
}

// Unregister removes every mapping of prog/vers and reports whether there
// was one.
func (p *Portmapper) Unregister(prog, vers uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	found := false
	for k := range p.m {
		if k.prog == prog && k.vers == vers {
			delete(p.m, k)
			found = true
		}
	}
	return found
}

// Mappings returns every mapping, sorted by program, version, protocol.
func (p *Portmapper) Mappings() []Mapping {
	p.mu.RLock()
	out := make([]Mapping, 0, len(p.m))
	for k, port := range p.m {
		out = append(out, Mapping{k.prog, k.vers, k.prot, port})
	}
	p.mu.RUnlock()
	slices.SortFunc(out, func(a, b Mapping) int {
		return cmp.Or(cmp.Compare(a.Prog, b.Prog), cmp.Compare(a.Vers, b.Vers), cmp.Compare(a.Prot, b.Prot))
	})
	return out
}

// ServeRPC implements Handler for PMAP v2.
func (p *Portmapper) ServeRPC(ctx context.Context, c *Call, res *Writer) error {
	switch c.Proc {
	case PmapProcNull:
		return nil
	case PmapProcSet, PmapProcUnset, PmapProcGetPort:
		var m Mapping
		if err := m.UnmarshalXDR(c.Args); err != nil {
			return fmt.Errorf("pmap mapping: %w: %w", err, ErrGarbageArgs)
		}
		switch c.Proc {
		case PmapProcSet:
			res.Bool(mayChange(c.Remote) && p.set(m))
		case PmapProcUnset:
			res.Bool(mayChange(c.Remote) && p.Unregister(m.Prog, m.Vers))
		default:
			p.mu.RLock()
			port := p.m[pmapKey{m.Prog, m.Vers, m.Prot}]
			p.mu.RUnlock()
			res.Uint32(port)
		}
		return nil
	case PmapProcDump:
		if c.Net == "udp" {
			// The list is several times the call: over UDP, whose source
			// address nobody checks, a DUMP would turn this host into a
			// reflector. PROC_UNAVAIL (24 bytes) is smaller than any call;
			// rpcinfo -p and every portmapper client that lists mappings
			// do it over TCP.
			return fmt.Errorf("pmap DUMP over UDP: %w", ErrProcUnavail)
		}
		pmapList(p.Mappings()).MarshalXDR(res)
		return nil
	default:
		return ErrProcUnavail
	}
}

// mayChange reports whether a caller may SET or UNSET: on this host and
// from a port only root binds.
func mayChange(remote netip.AddrPort) bool {
	return remote.Addr().Unmap().IsLoopback() && remote.Port() > 0 && remote.Port() < 1024
}

// set registers m unless prog/vers/prot is already mapped (RFC 1833:
// "the procedure refuses to establish a mapping if one already exists").
func (p *Portmapper) set(m Mapping) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := pmapKey{m.Prog, m.Vers, m.Prot}
	if _, ok := p.m[k]; ok {
		return false
	}
	p.m[k] = m.Port
	return true
}
