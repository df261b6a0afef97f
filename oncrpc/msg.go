package oncrpc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
)

// RPC message constants (RFC 5531 §9).
const (
	// RPCVersion is the only RPC protocol version (rpcvers) served, and the
	// one CallHeader writes.
	RPCVersion uint32 = 2

	msgCall  uint32 = 0 // msg_type CALL
	msgReply uint32 = 1 // msg_type REPLY
)

// reply_stat values (RFC 5531 §9), carried by ReplyHeader.Stat.
const (
	ReplyAccepted uint32 = 0 // MSG_ACCEPTED
	ReplyDenied   uint32 = 1 // MSG_DENIED
)

// accept_stat values of an accepted reply (RFC 5531 §9), carried by
// ReplyHeader.AcceptStat.
const (
	AcceptSuccess      uint32 = 0 // SUCCESS: the results follow
	AcceptProgUnavail  uint32 = 1 // PROG_UNAVAIL
	AcceptProgMismatch uint32 = 2 // PROG_MISMATCH: mismatch_info (low, high) follows
	AcceptProcUnavail  uint32 = 3 // PROC_UNAVAIL
	AcceptGarbageArgs  uint32 = 4 // GARBAGE_ARGS
	AcceptSystemErr    uint32 = 5 // SYSTEM_ERR
)

// reject_stat values of a denied reply (RFC 5531 §9): the first word after
// a ReplyHeader whose Stat is ReplyDenied.
const (
	RejectRPCMismatch uint32 = 0 // RPC_MISMATCH: mismatch_info (low, high) follows
	RejectAuthError   uint32 = 1 // AUTH_ERROR: an auth_stat follows
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

// CallHeader is a call message up to the procedure's arguments (RFC 5531
// §9: an rpc_msg with mtype CALL and its call_body without the arguments).
// rpcvers is not a field: MarshalXDR always writes RPCVersion (2) and
// UnmarshalXDR accepts nothing else. The zero Cred and Verf are AUTH_NONE
// with an empty body (RFC 5531 §10.1); AuthSysCred builds an AUTH_SYS
// credential (RFC 5531 appendix A).
//
// A client that runs its own socket writes a CallHeader and then the
// arguments into one Writer; a stand-in server decodes one with
// UnmarshalXDR and finds the arguments next in the Reader.
type CallHeader struct {
	XID              uint32
	Prog, Vers, Proc uint32
	Cred, Verf       OpaqueAuth // each body at most MaxAuthBytes
}

// MarshalXDR encodes the header: xid, CALL, rpcvers 2, prog, vers, proc,
// cred, verf. The arguments follow.
func (h CallHeader) MarshalXDR(w *Writer) {
	w.Uint32(h.XID)
	w.Uint32(msgCall)
	w.Uint32(RPCVersion)
	w.Uint32(h.Prog)
	w.Uint32(h.Vers)
	w.Uint32(h.Proc)
	h.Cred.MarshalXDR(w)
	h.Verf.MarshalXDR(w)
}

// callDecodeError says how far CallHeader.UnmarshalXDR got, and so which
// reply fits.
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

// UnmarshalXDR decodes a call header from r, leaving r at the arguments.
// The message type must be CALL and rpcvers 2 (an error wrapping
// ErrRPCMismatch otherwise, RFC 5531 §9); a credential or verifier body
// longer than MaxAuthBytes, truncated or with non-zero padding is an error.
// The fields decoded before a failure are kept (XID first), so a server can
// still address its rejection. On error r's sticky error is set too.
//
// The credential and verifier bodies alias r's buffer (Reader.OpaqueRef):
// copy them to keep them past that buffer's reuse. An AUTH_SYS body is
// checked only as an opaque; decode it with AuthSysParams.UnmarshalXDR.
func (h *CallHeader) UnmarshalXDR(r *Reader) error {
	if err := h.unmarshal(r); err != nil {
		r.Fail(err)
		return err
	}
	return nil
}

// unmarshal is UnmarshalXDR without setting r's error; errors are
// *callDecodeError.
func (h *CallHeader) unmarshal(r *Reader) error {
	h.XID = r.Uint32()
	mtype := r.Uint32()
	rpcvers := r.Uint32()
	if err := r.Err(); err != nil {
		return &callDecodeError{stageDrop, fmt.Errorf("rpc: call header: %w", err)}
	}
	if mtype != msgCall {
		return &callDecodeError{stageDrop, fmt.Errorf("rpc: message type %d is not CALL", mtype)}
	}
	if rpcvers != RPCVersion {
		return &callDecodeError{stageRPCVers, fmt.Errorf("rpc: rpcvers %d: %w", rpcvers, ErrRPCMismatch)}
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

// ReplyHeader is a reply message up to what depends on its status (RFC
// 5531 §9: an rpc_msg with mtype REPLY and the start of its reply_body).
// For an accepted reply it holds the verifier and the accept_stat, and the
// results (SUCCESS) or the mismatch_info (PROG_MISMATCH) follow it; for a
// denied reply it ends at reply_stat and the rejected_reply (a reject_stat,
// RejectRPCMismatch or RejectAuthError, and its data) follows.
//
// The zero value with an XID is the reply this package's server sends for
// SUCCESS: MSG_ACCEPTED, an AUTH_NONE verifier (RFC 5531 §10.1), SUCCESS.
type ReplyHeader struct {
	XID  uint32
	Stat uint32 // reply_stat: ReplyAccepted or ReplyDenied
	// Of an accepted reply only:
	Verf       OpaqueAuth // the server's verifier, body at most MaxAuthBytes
	AcceptStat uint32     // accept_stat: AcceptSuccess, AcceptProgUnavail, ...
}

// MarshalXDR encodes the header: xid, REPLY, reply_stat and, when Stat is
// ReplyAccepted, the verifier and accept_stat. The caller writes what
// follows (results, mismatch_info or rejected_reply).
func (h ReplyHeader) MarshalXDR(w *Writer) {
	w.Uint32(h.XID)
	w.Uint32(msgReply)
	w.Uint32(h.Stat)
	if h.Stat == ReplyAccepted {
		h.Verf.MarshalXDR(w)
		w.Uint32(h.AcceptStat)
	}
}

// UnmarshalXDR decodes a reply header from r, leaving r at what follows it
// (see ReplyHeader). The message type must be REPLY. When Stat is
// ReplyAccepted the verifier (at most MaxAuthBytes, zero padding) and the
// accept_stat are read, whatever its value; any other reply_stat is left for
// the caller to read a rejected_reply or to refuse, and Verf and AcceptStat
// are zeroed. Errors wrap ErrBadReply; on error r's sticky error is set too.
// XID is kept whenever it was read, so a reply can be matched to its call
// even when the rest is malformed.
//
// The verifier body aliases r's buffer (Reader.OpaqueRef).
func (h *ReplyHeader) UnmarshalXDR(r *Reader) error {
	h.XID = r.Uint32()
	mtype := r.Uint32()
	h.Stat = r.Uint32()
	h.Verf, h.AcceptStat = OpaqueAuth{}, 0
	if err := r.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadReply, err)
	}
	if mtype != msgReply {
		err := fmt.Errorf("%w: message type %d is not REPLY", ErrBadReply, mtype)
		r.Fail(err)
		return err
	}
	if h.Stat != ReplyAccepted {
		return nil
	}
	h.Verf.Flavor = r.Uint32()
	h.Verf.Body = r.OpaqueRef(MaxAuthBytes)
	h.AcceptStat = r.Uint32()
	if err := r.Err(); err != nil {
		return fmt.Errorf("%w: accepted reply: %w", ErrBadReply, err)
	}
	return nil
}

// Reply encoders (RFC 5531 §9, reply_body). Every accepted reply carries an
// AUTH_NONE verifier.

// successHeaderLen is the size of an accepted SUCCESS reply header:
// xid, REPLY, MSG_ACCEPTED, verf flavor, verf length, SUCCESS.
const successHeaderLen = 24

func putAccepted(w *Writer, xid, stat uint32) {
	ReplyHeader{XID: xid, Stat: ReplyAccepted, AcceptStat: stat}.MarshalXDR(w)
}

// putAcceptedError encodes an accepted reply with a non-SUCCESS status.
func putAcceptedError(w *Writer, xid, stat, low, high uint32) {
	putAccepted(w, xid, stat)
	if stat == AcceptProgMismatch {
		w.Uint32(low)
		w.Uint32(high)
	}
}

// putRPCMismatch encodes MSG_DENIED RPC_MISMATCH with the supported range.
func putRPCMismatch(w *Writer, xid uint32) {
	ReplyHeader{XID: xid, Stat: ReplyDenied}.MarshalXDR(w)
	w.Uint32(RejectRPCMismatch)
	w.Uint32(RPCVersion) // low
	w.Uint32(RPCVersion) // high
}

// putAuthError encodes MSG_DENIED AUTH_ERROR with an auth_stat.
func putAuthError(w *Writer, xid, stat uint32) {
	ReplyHeader{XID: xid, Stat: ReplyDenied}.MarshalXDR(w)
	w.Uint32(RejectAuthError)
	w.Uint32(stat)
}

// acceptStat maps a handler error to an accept_stat.
func acceptStat(err error) uint32 {
	switch {
	case err == nil:
		return AcceptSuccess
	case errors.Is(err, ErrProcUnavail):
		return AcceptProcUnavail
	case errors.Is(err, ErrGarbageArgs):
		return AcceptGarbageArgs
	default:
		return AcceptSystemErr
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
	var h ReplyHeader
	if err := h.UnmarshalXDR(r); err != nil {
		return h.XID, err
	}
	xid = h.XID
	switch h.Stat {
	case ReplyAccepted:
		switch h.AcceptStat {
		case AcceptSuccess:
			return xid, nil
		case AcceptProgUnavail:
			return xid, ErrProgUnavail
		case AcceptProgMismatch:
			low, high := r.Uint32(), r.Uint32()
			if err := r.Err(); err != nil {
				return xid, fmt.Errorf("%w: PROG_MISMATCH: %w", ErrBadReply, err)
			}
			return xid, &MismatchError{Err: ErrProgMismatch, Low: low, High: high}
		case AcceptProcUnavail:
			return xid, ErrProcUnavail
		case AcceptGarbageArgs:
			return xid, ErrGarbageArgs
		case AcceptSystemErr:
			return xid, ErrSystemErr
		default:
			return xid, fmt.Errorf("%w: accept_stat %d", ErrBadReply, h.AcceptStat)
		}
	case ReplyDenied:
		rs := r.Uint32()
		switch rs {
		case RejectRPCMismatch:
			low, high := r.Uint32(), r.Uint32()
			if err := r.Err(); err != nil {
				return xid, fmt.Errorf("%w: RPC_MISMATCH: %w", ErrBadReply, err)
			}
			return xid, &MismatchError{Err: ErrRPCMismatch, Low: low, High: high}
		case RejectAuthError:
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
		return xid, fmt.Errorf("%w: reply_stat %d", ErrBadReply, h.Stat)
	}
}
