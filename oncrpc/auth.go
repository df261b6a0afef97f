package oncrpc

import "fmt"

// AUTH_SYS limits (RFC 5531 appendix A).
const (
	MaxMachineName = 255
	MaxAuthSysGIDs = 16
)

// AuthSysParams is the AUTH_SYS credential (RFC 5531 appendix A).
type AuthSysParams struct {
	Stamp       uint32
	MachineName string // ≤ 255
	UID, GID    uint32
	GIDs        []uint32 // ≤ 16
}

// MarshalXDR encodes authsys_parms.
func (p *AuthSysParams) MarshalXDR(w *Writer) {
	w.Uint32(p.Stamp)
	w.String(p.MachineName)
	w.Uint32(p.UID)
	w.Uint32(p.GID)
	w.Uint32(uint32(len(p.GIDs)))
	for _, g := range p.GIDs {
		w.Uint32(g)
	}
}

// UnmarshalXDR decodes authsys_parms, enforcing the name and group limits.
func (p *AuthSysParams) UnmarshalXDR(r *Reader) error {
	p.Stamp = r.Uint32()
	p.MachineName = r.String(MaxMachineName)
	p.UID = r.Uint32()
	p.GID = r.Uint32()
	n := r.Uint32()
	if r.Err() == nil && n > MaxAuthSysGIDs {
		r.Fail(fmt.Errorf("auth_sys: %d gids > max %d: %w", n, MaxAuthSysGIDs, ErrTooLong))
	}
	if r.Err() == nil && int(n)*4 > r.Remaining() {
		r.Fail(fmt.Errorf("auth_sys: %d gids: %w", n, ErrShort))
	}
	if err := r.Err(); err != nil {
		p.GIDs = nil
		return err
	}
	p.GIDs = make([]uint32, n)
	for i := range p.GIDs {
		p.GIDs[i] = r.Uint32()
	}
	return r.Err()
}

// parseAuthSys decodes an AUTH_SYS credential body; the body must hold
// exactly one authsys_parms.
func parseAuthSys(body []byte) (*AuthSysParams, error) {
	r := Reader{b: body}
	p := new(AuthSysParams)
	if err := p.UnmarshalXDR(&r); err != nil {
		return nil, fmt.Errorf("auth_sys credential: %w", err)
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("auth_sys credential: %w", err)
	}
	return p, nil
}

// AuthSysCred builds an AUTH_SYS credential. A machine name longer than 255
// bytes or more than 16 gids are truncated to the limits so the result is
// always valid on the wire.
func AuthSysCred(p AuthSysParams) OpaqueAuth {
	if len(p.MachineName) > MaxMachineName {
		p.MachineName = p.MachineName[:MaxMachineName]
	}
	if len(p.GIDs) > MaxAuthSysGIDs {
		p.GIDs = p.GIDs[:MaxAuthSysGIDs]
	}
	w := NewWriter(make([]byte, 0, 32+len(p.MachineName)+4*len(p.GIDs)))
	p.MarshalXDR(w)
	return OpaqueAuth{Flavor: AuthSys, Body: w.Bytes()}
}
