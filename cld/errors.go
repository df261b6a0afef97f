package cld

import (
	"errors"
	"fmt"
)

// Errors of the codec, the pipe and the server. Check them with errors.Is:
// the errors returned carry the details (which field, which path) and wrap
// one of these.
var (
	// ErrBadUpcall: a message from the kernel does not decode (too short,
	// a length that is not the size of its version, an unknown version,
	// command or field length). It is answered with an error downcall and
	// never reaches the Store.
	ErrBadUpcall = errors.New("cld: malformed upcall")
	// ErrUnknownCommand: the upcall's cm_cmd is not one this package knows.
	// It wraps ErrBadUpcall and is answered -EOPNOTSUPP, as nfsdcld does.
	ErrUnknownCommand = fmt.Errorf("%w: unknown command", ErrBadUpcall)
	// ErrBadMsg: Encode was given a message it cannot represent (unknown
	// version or command, a name or principal hash too long, a field the
	// command or version does not carry).
	ErrBadMsg = errors.New("cld: message cannot be encoded")
	// ErrPipeGone: the kernel destroyed the pipe (nfsd stopped) or, on a
	// socketpair, the other end closed. The file must be closed and opened
	// again once the kernel creates it anew.
	ErrPipeGone = errors.New("cld: pipe gone")
	// ErrClosed: the Pipe was closed by its owner.
	ErrClosed = errors.New("cld: pipe closed")
	// ErrNotPipe: the file at the pipe's path is not a FIFO, so it is not
	// an rpc_pipefs pipe.
	ErrNotPipe = errors.New("cld: not an rpc_pipefs pipe")
	// ErrNotServing is for Store implementations: wrap it when this node
	// may not answer for the cluster (not the leader, not ready, no
	// quorum). The server answers such upcalls with an error status
	// (-EREMOTEIO, or -EACCES for Check), never 0, and counts them under
	// result="not_serving".
	ErrNotServing = errors.New("cld: this node does not serve client tracking now")
	// ErrNoPipefs: rpc_pipefs is not mounted at Config.PipefsDir (and
	// could not be mounted).
	ErrNoPipefs = errors.New("cld: rpc_pipefs not mounted")
	// ErrRunning: Run was called while another Run of the same Server was
	// still running.
	ErrRunning = errors.New("cld: server already running")
	// ErrConfig: a Config value is out of range.
	ErrConfig = errors.New("cld: invalid config")
)
