package oncrpc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
)

// RPC message constants (RFC 5531 §9).
const (
	// RPCVersion is the only RPC protocol version (rpcvers) served.
	RPCVersion uint32 = 2

	msgCall  uint32 = 0
	msgReply uint32 = 1

	replyAccepted uint32 = 0 // MSG_ACCEPTED
	replyDenied   uint32 = 1 // MSG_DENIED

	acceptSuccess      uint32 = 0 // SUCCESS
	acceptProgUnavail  uint32 = 1 // PROG_UNAVAIL
	acceptProgMismatch uint32 = 2 // PROG_MISMATCH
	acceptProcUnavail  uint32 = 3 // PROC_UNAVAIL
	acceptGarbageArgs  uint32 = 4 // GARBAGE_ARGS
	acceptSystemErr    uint32 = 5 // SYSTEM_ERR

	rejectRPCMismatch uint32 = 0 // RPC_MISMATCH
	rejectAuthError   uint32 = 1 // AUTH_ERROR
)

// Authentication flavors (RFC 5531 §8.2) and the opaque_auth body limit.
const (
	AuthNone     uint32 = 0 // AUTH_NONE
	AuthSys      uint32 = 1 // AUTH_SYS (AUTH_UNIX)
	MaxAuthBytes        = 400
)

// auth_stat values of an AUTH_ERROR rejection (RFC 5531 §9), carried by
// AuthError.Stat.
const (
	AuthOK           uint32 = 0 // AUTH_OK
	AuthBadCred      uint32 = 1 // AUTH_BADCRED: bad credential
	AuthRejectedCred uint32 = 2 // AUTH_REJECTEDCRED
	AuthBadVerf      uint32 = 3 // AUTH_BADVERF: bad verifier
	AuthRejectedVerf uint32 = 4 // AUTH_REJECTEDVERF
	AuthTooWeak      uint32 = 5 // AUTH_TOOWEAK
	AuthInvalidResp  uint32 = 6 // AUTH_INVALIDRESP
	AuthFailed       uint32 = 7 // AUTH_FAILED
)

// OpaqueAuth is the opaque_auth of RFC 5531 §8.2: a flavor and up to
// MaxAuthBytes of body.
type OpaqueAuth struct {
	Flavor uint32
	Body   []byte
}

// MarshalXDR encodes the opaque_auth.
func (a OpaqueAuth) MarshalXDR(w *Writer) {
	w.Uint32(a.Flavor)
	w.Opaque(a.Body)
}

// UnmarshalXDR decodes an opaque_auth, copying the body.
func (a *OpaqueAuth) UnmarshalXDR(r *Reader) error {
	a.Flavor = r.Uint32()
	a.Body = r.Opaque(MaxAuthBytes)
	return r.Err()
}

// ProgVers names one version of one program.
type ProgVers struct{ Prog, Vers uint32 }

// Call is one decoded call handed to a Handler. It and the slices it refers
// to (Args, Cred.Body, Verf.Body) are valid only until ServeRPC returns.
type Call struct {
	XID        uint32
	Prog       uint32
	Vers       uint32
	Proc       uint32
	Cred, Verf OpaqueAuth
	Sys        *AuthSysParams // non-nil when Cred is a valid AUTH_SYS credential
	Net        string         // "tcp" or "udp"
	Remote     netip.AddrPort // caller address and source port (IPv4-mapped addresses unmapped)
	Local      netip.AddrPort // address the call arrived on (UDP: from IP_PKTINFO)
	Args       *Reader        // positioned at the procedure's arguments
}

// Handler serves the procedures of one program version. It decodes c.Args
// and encodes its results into res. A returned error that wraps one of
// ErrProcUnavail, ErrGarbageArgs, ErrSystemErr becomes that accepted-reply
// status; ErrNoReply sends nothing; any other error becomes SYSTEM_ERR. A
// panic is recovered, logged and answered with SYSTEM_ERR. Results written
// to res are sent only with SUCCESS. Unread argument bytes are not an error;
// a handler that wants to refuse them calls c.Args.Done.
type Handler interface {
	ServeRPC(ctx context.Context, c *Call, res *Writer) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, c *Call, res *Writer) error

// ServeRPC calls f.
func (f HandlerFunc) ServeRPC(ctx context.Context, c *Call, res *Writer) error { return f(ctx, c, res) }

// Programs maps each served program version to its handler. A call to a
// known program but unknown version gets PROG_MISMATCH with the lowest and
// highest registered versions.
type Programs map[ProgVers]Handler

// Reply errors: returned by handlers (server side) and by Client.Call when
// the server answered with that status (client side), checked with errors.Is.
var (
	// ErrProgUnavail is PROG_UNAVAIL: the program is not served.
	ErrProgUnavail = errors.New("rpc: program unavailable")
	// ErrProgMismatch is PROG_MISMATCH; on the client side it comes as a
	// *MismatchError with the supported versions.
	ErrProgMismatch = errors.New("rpc: program version mismatch")
	// ErrProcUnavail is PROC_UNAVAIL: the procedure is not served.
	ErrProcUnavail = errors.New("rpc: procedure unavailable")
	// ErrGarbageArgs is GARBAGE_ARGS: the arguments could not be decoded.
	ErrGarbageArgs = errors.New("rpc: garbage arguments")
	// ErrSystemErr is SYSTEM_ERR: the server failed (e.g. a handler error).
	ErrSystemErr = errors.New("rpc: system error")
	// ErrRPCMismatch is the RPC_MISMATCH rejection (rpcvers not 2); on the
	// client side it comes as a *MismatchError.
	ErrRPCMismatch = errors.New("rpc: rpc version mismatch")
	// ErrAuth is the AUTH_ERROR rejection; on the client side it comes as an
	// *AuthError with the auth_stat.
	ErrAuth = errors.New("rpc: authentication error")
	// ErrNoReply, returned by a handler, makes the server send no reply.
	ErrNoReply = errors.New("rpc: no reply")
	// ErrTimeout means a client call got no reply in time.
	ErrTimeout = errors.New("rpc: call timed out")
	// ErrRecordTooBig means a TCP record exceeded the size limit; the
	// connection is closed.
	ErrRecordTooBig = errors.New("rpc: record exceeds size limit")
	// ErrClosed is returned by a shut-down Server's Serve methods and by a
	// closed Client.
	ErrClosed = errors.New("rpc: closed")
	// ErrBadReply means a reply message could not be decoded.
	ErrBadReply = errors.New("rpc: malformed reply")
)

// MismatchError carries the supported range of a PROG_MISMATCH or RPC_MISMATCH.
type MismatchError struct {
	Err       error // ErrProgMismatch or ErrRPCMismatch
	Low, High uint32
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%v (supported: %d..%d)", e.Err, e.Low, e.High)
}

// Unwrap returns e.Err.
func (e *MismatchError) Unwrap() error { return e.Err }

// AuthError carries the auth_stat of an AUTH_ERROR rejection.
type AuthError struct{ Stat uint32 }

var authStatNames = [...]string{"AUTH_OK", "AUTH_BADCRED", "AUTH_REJECTEDCRED", "AUTH_BADVERF",
	"AUTH_REJECTEDVERF", "AUTH_TOOWEAK", "AUTH_INVALIDRESP", "AUTH_FAILED"}

func (e *AuthError) Error() string {
	if int(e.Stat) < len(authStatNames) {
		return fmt.Sprintf("%v: %s", ErrAuth, authStatNames[e.Stat])
	}
	return fmt.Sprintf("%v: auth_stat %d", ErrAuth, e.Stat)
}

// Unwrap returns ErrAuth.
func (e *AuthError) Unwrap() error { return ErrAuth }

// callHeader is the call message up to the arguments (RFC 5531 §9:
// rpc_msg with mtype CALL and call_body).
type callHeader struct {
	XID, RPCVers     uint32
	Prog, Vers, Proc uint32
	Cred, Verf       OpaqueAuth
}

// appendCall encodes a call header; the arguments follow.
func (h *callHeader) marshal(w *Writer) {
	w.Uint32(h.XID)
	w.Uint32(msgCall)
	w.Uint32(h.RPCVers)
	w.Uint32(h.Prog)
	w.Uint32(h.Vers)
	w.Uint32(h.Proc)
	h.Cred.MarshalXDR(w)
	h.Verf.MarshalXDR(w)
}

// callDecodeError says how far decodeCall got, and so which reply fits.
type callDecodeError struct {
	stage int // stageDrop, stageRPCVers, stageCred, stageVerf
	err   error
}

const (
	stageDrop    = iota // header unreadable or not a call: no reply possible
	stageRPCVers        // rpcvers != 2: RPC_MISMATCH
	stageCred           // bad credential: AUTH_BADCRED
	stageVerf           // bad verifier: AUTH_BADVERF
)

func (e *callDecodeError) Error() string { return e.err.Error() }
func (e *callDecodeError) Unwrap() error { return e.err }

// decodeCall decodes a call header from r, leaving r at the arguments. The
// credential and verifier bodies alias r's buffer. Errors are
// *callDecodeError.
func decodeCall(r *Reader, h *callHeader) error {
	h.XID = r.Uint32()
	mtype := r.Uint32()
	h.RPCVers = r.Uint32()
	if err := r.Err(); err != nil {
		return &callDecodeError{stageDrop, fmt.Errorf("rpc: call header: %w", err)}
	}
	if mtype != msgCall {
		return &callDecodeError{stageDrop, fmt.Errorf("rpc: message type %d is not CALL", mtype)}
	}
	if h.RPCVers != RPCVersion {
		return &callDecodeError{stageRPCVers, fmt.Errorf("rpc: rpcvers %d: %w", h.RPCVers, ErrRPCMismatch)}
	}
	h.Prog, h.Vers, h.Proc = r.Uint32(), r.Uint32(), r.Uint32()
	if err := r.Err(); err != nil {
		return &callDecodeError{stageDrop, fmt.Errorf("rpc: call header: %w", err)}
	}
	h.Cred.Flavor = r.Uint32()
	h.Cred.Body = r.OpaqueRef(MaxAuthBytes)
	if err := r.Err(); err != nil {
		return &callDecodeError{stageCred, fmt.Errorf("rpc: credential: %w", err)}
	}
	h.Verf.Flavor = r.Uint32()
	h.Verf.Body = r.OpaqueRef(MaxAuthBytes)
	if err := r.Err(); err != nil {
		return &callDecodeError{stageVerf, fmt.Errorf("rpc: verifier: %w", err)}
	}
	return nil
}

// Reply encoders (RFC 5531 §9, reply_body). Every accepted reply carries an
// AUTH_NONE verifier.

// successHeaderLen is the size of an accepted SUCCESS reply header:
// xid, REPLY, MSG_ACCEPTED, verf flavor, verf length, SUCCESS.
const successHeaderLen = 24

func putAccepted(w *Writer, xid, stat uint32) {
	w.Uint32(xid)
	w.Uint32(msgReply)
	w.Uint32(replyAccepted)
	w.Uint32(AuthNone) // verf flavor
	w.Uint32(0)        // verf body length
	w.Uint32(stat)
}

// putAcceptedError encodes an accepted reply with a non-SUCCESS status.
func putAcceptedError(w *Writer, xid, stat, low, high uint32) {
	putAccepted(w, xid, stat)
	if stat == acceptProgMismatch {
		w.Uint32(low)
		w.Uint32(high)
	}
}

// putRPCMismatch encodes MSG_DENIED RPC_MISMATCH with the supported range.
func putRPCMismatch(w *Writer, xid uint32) {
	w.Uint32(xid)
	w.Uint32(msgReply)
	w.Uint32(replyDenied)
	w.Uint32(rejectRPCMismatch)
	w.Uint32(RPCVersion) // low
	w.Uint32(RPCVersion) // high
}

// putAuthError encodes MSG_DENIED AUTH_ERROR with an auth_stat.
func putAuthError(w *Writer, xid, stat uint32) {
	w.Uint32(xid)
	w.Uint32(msgReply)
	w.Uint32(replyDenied)
	w.Uint32(rejectAuthError)
	w.Uint32(stat)
}

// acceptStat maps a handler error to an accept_stat.
func acceptStat(err error) uint32 {
	switch {
	case err == nil:
		return acceptSuccess
	case errors.Is(err, ErrProcUnavail):
		return acceptProcUnavail
	case errors.Is(err, ErrGarbageArgs):
		return acceptGarbageArgs
	default:
		return acceptSystemErr
	}
}

// decodeReplyXID reads just the XID of a reply message.
func decodeReplyXID(b []byte) (uint32, bool) {
	if len(b) < 8 {
		return 0, false
	}
	r := Reader{b: b}
	xid := r.Uint32()
	return xid, r.Uint32() == msgReply
}

// decodeReply decodes a reply header from r, leaving r at the results when
// the status is SUCCESS. A non-SUCCESS status comes back as the matching
// sentinel error, *MismatchError or *AuthError; an undecodable header as an
// error wrapping ErrBadReply.
func decodeReply(r *Reader) (xid uint32, err error) {
	xid = r.Uint32()
	mtype := r.Uint32()
	stat := r.Uint32()
	if err := r.Err(); err != nil {
		return xid, fmt.Errorf("%w: %w", ErrBadReply, err)
	}
	if mtype != msgReply {
		return xid, fmt.Errorf("%w: message type %d is not REPLY", ErrBadReply, mtype)
	}
	switch stat {
	case replyAccepted:
		var verf OpaqueAuth
		verf.Flavor = r.Uint32()
		verf.Body = r.OpaqueRef(MaxAuthBytes)
		as := r.Uint32()
		if err := r.Err(); err != nil {
			return xid, fmt.Errorf("%w: accepted reply: %w", ErrBadReply, err)
		}
		switch as {
		case acceptSuccess:
			return xid, nil
		case acceptProgUnavail:
			return xid, ErrProgUnavail
		case acceptProgMismatch:
			low, high := r.Uint32(), r.Uint32()
			if err := r.Err(); err != nil {
				return xid, fmt.Errorf("%w: PROG_MISMATCH: %w", ErrBadReply, err)
			}
			return xid, &MismatchError{Err: ErrProgMismatch, Low: low, High: high}
		case acceptProcUnavail:
			return xid, ErrProcUnavail
		case acceptGarbageArgs:
			return xid, ErrGarbageArgs
		case acceptSystemErr:
			return xid, ErrSystemErr
		default:
			return xid, fmt.Errorf("%w: accept_stat %d", ErrBadReply, as)
		}
	case replyDenied:
		rs := r.Uint32()
		switch rs {
		case rejectRPCMismatch:
			low, high := r.Uint32(), r.Uint32()
			if err := r.Err(); err != nil {
				return xid, fmt.Errorf("%w: RPC_MISMATCH: %w", ErrBadReply, err)
			}
			return xid, &MismatchError{Err: ErrRPCMismatch, Low: low, High: high}
		case rejectAuthError:
			as := r.Uint32()
			if err := r.Err(); err != nil {
				return xid, fmt.Errorf("%w: AUTH_ERROR: %w", ErrBadReply, err)
			}
			return xid, &AuthError{Stat: as}
		default:
			if err := r.Err(); err != nil {
				return xid, fmt.Errorf("%w: denied reply: %w", ErrBadReply, err)
			}
			return xid, fmt.Errorf("%w: reject_stat %d", ErrBadReply, rs)
		}
	default:
		return xid, fmt.Errorf("%w: reply_stat %d", ErrBadReply, stat)
	}
}
