// Package oncrpc implements ONC RPC version 2 (RFC 5531) with XDR (RFC 4506):
// primitives, TCP record marking, call and reply messages, AUTH_NONE and
// AUTH_SYS, a server for explicitly registered programs over TCP and UDP, a
// client, and the portmapper version 2 (RFC 1833) client and server.
//
// It knows nothing of any particular program. A program is a Handler handed
// to NewServer in a Programs map:
//
//	srv := oncrpc.NewServer(oncrpc.Programs{nsm.Program: svc}, oncrpc.ServerConfig{Logger: log})
//	go srv.ServeTCP(tcpListener)
//	go srv.ServeUDP(udpConn)
//	...
//	srv.Shutdown(ctx)
//
// # Wire types
//
// Wire types implement Marshaler and Unmarshaler over the XDR Writer and
// Reader. The Reader is sticky: the first error (ErrShort, ErrTooLong,
// ErrPadding, ErrBadBool, or one set with Fail) is kept and every later read
// returns a zero value, so a decoder reads all its fields and checks Err
// once. Every variable-length item is checked against the caller's maximum
// before anything is allocated, and padding must be zero.
//
// # Server
//
// The server reads TCP records (RFC 5531 §11) with multi-fragment reassembly
// and a size cap, and handles the calls of one connection concurrently (up to
// ServerConfig.MaxInFlight; per UDP socket MaxInFlightUDP), so clients can
// pipeline. Over UDP the reply
// leaves from the address the request was sent to, which lets a socket bound
// to the wildcard address answer a floating address (VIP) from that address.
// Handlers report accept statuses by returning errors that wrap
// ErrProcUnavail, ErrGarbageArgs or ErrSystemErr; ErrNoReply suppresses the
// reply; a panic is recovered and answered with SYSTEM_ERR.
//
// TCP connections are capped per remote IP (MaxConnsPerHost, excess closed
// at once) and in total (MaxConns). At the total cap a new connection
// closes the one idle the longest (no call in flight) and is served; it is
// refused only if every connection has a call in flight. OnConn and Conns
// expose the admissions for metrics; refusals and evictions are logged at
// most once per remote IP per minute.
//
// A Call, its Args reader and the byte slices of its credentials refer to
// the server's receive buffer, which is reused once ServeRPC returns: a
// handler that keeps anything from them must copy it.
//
// # Client
//
// Dial returns a Client for "tcp" (pipelined calls matched by XID on one
// connection, redialled after the connection breaks) or "udp" (retransmits
// with doubling backoff until the call's timeout). ClientConfig.LocalAddr
// picks the source address and ClientConfig.Privileged a source port in
// 512..1023.
//
// # Messages on your own socket
//
// Code that runs its own socket instead of a Client or Server — one UDP
// socket fanning calls out to many hosts, or a minimal stand-in server in a
// test or bench — builds and reads messages with the header types (RFC 5531
// §9). A call is a CallHeader followed by the arguments; a stand-in server
// decodes it with CallHeader.UnmarshalXDR and answers with a ReplyHeader
// followed by the results. A client decodes a ReplyHeader and reads the
// results from the same Reader when Stat is ReplyAccepted and AcceptStat is
// AcceptSuccess:
//
//	w := oncrpc.NewWriter(buf)
//	oncrpc.CallHeader{XID: xid, Prog: prog, Vers: vers, Proc: proc}.MarshalXDR(w)
//	args.MarshalXDR(w)
//	...
//	r := oncrpc.NewReader(datagram)
//	var h oncrpc.ReplyHeader
//	if err := h.UnmarshalXDR(r); err == nil && h.Stat == oncrpc.ReplyAccepted && h.AcceptStat == oncrpc.AcceptSuccess {
//		err = res.UnmarshalXDR(r)
//	}
//
// # Portmapper
//
// PmapClient speaks PMAP version 2 to rpcbind or to Portmapper, a small
// embedded PMAP version 2 server.
package oncrpc
