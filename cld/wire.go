package cld

import (
	"encoding/binary"
	"fmt"
)

// Sizes of the kernel's packed structures (include/uapi/linux/nfsd/cld.h).
const (
	// HeaderSize: cm_vers u8, cm_cmd u8, cm_status s16, cm_xid u32.
	HeaderSize = 8
	// MaxNameLen: NFS4_OPAQUE_LIMIT, the size of cn_id.
	MaxNameLen = 1024
	// MaxPrincHashLen: SHA256_DIGEST_SIZE, the size of cp_data.
	MaxPrincHashLen = 32
	// nameSize: struct cld_name = cn_len u16 + cn_id[1024].
	nameSize = 2 + MaxNameLen
	// princHashSize: struct cld_princhash = cp_len u8 + cp_data[32].
	princHashSize = 1 + MaxPrincHashLen
	// MsgSizeV1: struct cld_msg, the header and a union of cm_gracetime
	// (s64), cld_name and cm_version (u8): 8 + 1026.
	MsgSizeV1 = HeaderSize + nameSize
	// MsgSizeV2: struct cld_msg_v2, the header and a union of cld_name,
	// cm_version and cld_clntinfo (cld_name + cld_princhash): 8 + 1059.
	MsgSizeV2 = HeaderSize + nameSize + princHashSize
	// UpcallVersion is the highest message version this package speaks,
	// the answer to GetVersion.
	UpcallVersion = 2
)

// byteOrder: the structures are in the host's byte order (little-endian
// on amd64 and arm64).
var byteOrder = binary.NativeEndian

// Command is cm_cmd, enum cld_command.
type Command uint8

// The commands of enum cld_command, in the kernel's order.
const (
	// Create: record a client (v2: with the hash of its principal; an
	// empty hash for AUTH_SYS).
	Create Command = iota
	// Remove: forget a client.
	Remove
	// Check: may this client reclaim? Sent only by kernels using the
	// oldest ops (no GraceStart); answered 0 or -EACCES.
	Check
	// GraceDone: the grace period ended; v1 messages of the oldest ops
	// carry the boot time in cm_gracetime.
	GraceDone
	// GraceStart: a grace period starts; answered with one -EINPROGRESS
	// downcall per client that may reclaim, then a final status.
	GraceStart
	// GetVersion: which message version does the daemon speak? Answered
	// in cm_u.cm_version; the kernel switches to it for what follows.
	GetVersion
)

var commandNames = [...]string{"Create", "Remove", "Check", "GraceDone", "GraceStart", "GetVersion"}
var commandLabels = [...]string{"create", "remove", "check", "grace_done", "grace_start", "get_version"}

// Valid reports whether c is one of the known commands.
func (c Command) Valid() bool { return int(c) < len(commandNames) }

func (c Command) String() string {
	if c.Valid() {
		return commandNames[c]
	}
	return fmt.Sprintf("Command(%d)", uint8(c))
}

// label is c as a bounded metric label value.
func (c Command) label() string {
	if c.Valid() {
		return commandLabels[c]
	}
	return "unknown"
}

// Statuses: cm_status is 0 or a negative Linux errno (the values of the
// generic errno table, as on x86 and arm; cld_linux_test.go checks them
// against the build's own).
const (
	StatusOK           int16 = 0
	StatusAccessDenied int16 = -13  // -EACCES: Check: the client may not reclaim
	StatusInvalid      int16 = -22  // -EINVAL: a malformed upcall
	StatusNotSupported int16 = -95  // -EOPNOTSUPP: an unknown command
	StatusInProgress   int16 = -115 // -EINPROGRESS: one GraceStart record, more follow
	StatusRemoteIO     int16 = -121 // -EREMOTEIO: the store failed or does not serve
)

// Msg is one message of either version, upcall or downcall. Which fields
// are meaningful depends on Cmd and Version:
//
//	Create       Name; v2: PrincHash (empty for AUTH_SYS clients)
//	Remove       Name
//	Check        Name
//	GraceDone    v1: GraceTime (only the oldest kernel ops set it)
//	GraceStart   nothing; a record downcall (Status StatusInProgress): Name, v2: PrincHash
//	GetVersion   UpcallVersion (0 in the upcall, the version in the reply)
//
// The other fields are zero in what Decode returns, and Encode refuses
// them when set.
type Msg struct {
	Version       uint8
	Cmd           Command
	Status        int16
	XID           uint32
	Name          []byte
	PrincHash     []byte
	GraceTime     int64
	UpcallVersion uint8
}

// MsgSize is the size of a message of version v (1 or 2); ok is false for
// any other version.
func MsgSize(v uint8) (size int, ok bool) {
	switch v {
	case 1:
		return MsgSizeV1, true
	case 2:
		return MsgSizeV2, true
	}
	return 0, false
}

// hasName: the message carries a cld_name.
func (m *Msg) hasName() bool {
	switch m.Cmd {
	case Create, Remove, Check:
		return true
	case GraceStart:
		return m.Status == StatusInProgress
	}
	return false
}

// hasPrincHash: the message carries a cld_princhash after its name.
func (m *Msg) hasPrincHash() bool {
	return m.Version >= 2 && m.hasName() && (m.Cmd == Create || m.Cmd == GraceStart)
}

// Decode decodes one message. On error (wrapping ErrBadUpcall, or
// ErrUnknownCommand for an unknown cm_cmd) it still returns the header
// fields it could read, so the caller can answer with an error downcall.
// Name and PrincHash are copies: b may be reused.
func Decode(b []byte) (Msg, error) {
	var m Msg
	if len(b) < HeaderSize {
		return m, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrBadUpcall, len(b), HeaderSize)
	}
	m.Version = b[0]
	m.Cmd = Command(b[1])
	m.Status = int16(byteOrder.Uint16(b[2:4]))
	m.XID = byteOrder.Uint32(b[4:8])
	size, ok := MsgSize(m.Version)
	if !ok {
		return m, fmt.Errorf("%w: unknown version %d (xid %d)", ErrBadUpcall, m.Version, m.XID)
	}
	if len(b) != size {
		return m, fmt.Errorf("%w: %d bytes, a version %d message has %d (xid %d)", ErrBadUpcall, len(b), m.Version, size, m.XID)
	}
	if !m.Cmd.Valid() {
		return m, fmt.Errorf("%w %d (xid %d)", ErrUnknownCommand, uint8(m.Cmd), m.XID)
	}
	u := b[HeaderSize:] // cm_u
	switch {
	case m.hasName():
		n := int(byteOrder.Uint16(u[0:2]))
		if n == 0 || n > MaxNameLen {
			return m, fmt.Errorf("%w: %v name length %d, want 1..%d (xid %d)", ErrBadUpcall, m.Cmd, n, MaxNameLen, m.XID)
		}
		name := append([]byte(nil), u[2:2+n]...)
		if m.hasPrincHash() {
			p := u[nameSize:]
			pn := int(p[0])
			if pn > MaxPrincHashLen {
				return m, fmt.Errorf("%w: %v principal hash length %d, want ≤ %d (xid %d)", ErrBadUpcall, m.Cmd, pn, MaxPrincHashLen, m.XID)
			}
			if pn > 0 {
				m.PrincHash = append([]byte(nil), p[1:1+pn]...)
			}
		}
		m.Name = name
	case m.Cmd == GraceDone && m.Version == 1:
		m.GraceTime = int64(byteOrder.Uint64(u[0:8]))
	case m.Cmd == GetVersion:
		m.UpcallVersion = u[0]
	}
	return m, nil
}

// Encode builds the fixed-size message of m.Version (MsgSizeV1 or
// MsgSizeV2 bytes). It refuses, wrapping ErrBadMsg, what Decode would
// refuse and fields the command does not carry (see Msg).
func Encode(m Msg) ([]byte, error) {
	size, ok := MsgSize(m.Version)
	if !ok {
		return nil, fmt.Errorf("%w: unknown version %d", ErrBadMsg, m.Version)
	}
	if !m.Cmd.Valid() {
		return nil, fmt.Errorf("%w: unknown command %d", ErrBadMsg, uint8(m.Cmd))
	}
	switch {
	case m.hasName() && (len(m.Name) == 0 || len(m.Name) > MaxNameLen):
		return nil, fmt.Errorf("%w: %v name of %d bytes, want 1..%d", ErrBadMsg, m.Cmd, len(m.Name), MaxNameLen)
	case !m.hasName() && len(m.Name) > 0:
		return nil, fmt.Errorf("%w: %v (status %d) carries no name", ErrBadMsg, m.Cmd, m.Status)
	case !m.hasPrincHash() && len(m.PrincHash) > 0:
		return nil, fmt.Errorf("%w: a version %d %v carries no principal hash", ErrBadMsg, m.Version, m.Cmd)
	case len(m.PrincHash) > MaxPrincHashLen:
		return nil, fmt.Errorf("%w: principal hash of %d bytes, want ≤ %d", ErrBadMsg, len(m.PrincHash), MaxPrincHashLen)
	case m.GraceTime != 0 && (m.Cmd != GraceDone || m.Version != 1):
		return nil, fmt.Errorf("%w: only a version 1 GraceDone carries a grace time", ErrBadMsg)
	case m.UpcallVersion != 0 && m.Cmd != GetVersion:
		return nil, fmt.Errorf("%w: only GetVersion carries a version", ErrBadMsg)
	}
	b := make([]byte, size)
	b[0] = m.Version
	b[1] = byte(m.Cmd)
	byteOrder.PutUint16(b[2:4], uint16(m.Status))
	byteOrder.PutUint32(b[4:8], m.XID)
	u := b[HeaderSize:]
	switch {
	case m.hasName():
		byteOrder.PutUint16(u[0:2], uint16(len(m.Name)))
		copy(u[2:], m.Name)
		if m.hasPrincHash() {
			p := u[nameSize:]
			p[0] = byte(len(m.PrincHash))
			copy(p[1:], m.PrincHash)
		}
	case m.Cmd == GraceDone && m.Version == 1:
		byteOrder.PutUint64(u[0:8], uint64(m.GraceTime))
	case m.Cmd == GetVersion:
		u[0] = m.UpcallVersion
	}
	return b, nil
}
