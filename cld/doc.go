// Package cld serves the Linux NFS server's client-tracking upcall: the
// rpc_pipefs pipe <pipefs>/nfsd/cld that nfs-utils' nfsdcld serves, so
// that nsmd can replace nfsdcld and keep NFSv4 client records in the
// cluster.
//
// # Protocol
//
// nfsd writes fixed-size messages (struct cld_msg, 1034 bytes, or
// struct cld_msg_v2, 1067 bytes, packed, in host byte order) and waits,
// per message, for a downcall of the same size carrying the same xid and a
// status. It starts with version 1 messages and asks GetVersion; the
// answer (we say 2) switches it to version 2 messages. Then GraceStart:
// the daemon answers one -EINPROGRESS downcall per client that may
// reclaim, then a final status. A nonzero final status makes nfsd drop
// the pipe and start over with its oldest ops on a new pipe (no
// GetVersion, no GraceStart: Check decides each reclaim, GraceDone
// carries the boot time), or with other tracking. Create, Remove,
// GraceDone (and Check, with the oldest ops) follow as clients come and
// go. Many upcalls may be in flight at once,
// one per nfsd thread, matched by xid. Decode and Encode are the codec;
// the Status constants the errnos the kernel expects.
//
// # Serving
//
//	srv, err := cld.NewServer(store, cld.Config{Logger: log, Registerer: reg})
//	...
//	go srv.Run(ctx) // returns once ctx is done and every upcall read is answered
//
// Run makes sure rpc_pipefs is mounted, watches <pipefs>/nfsd with
// inotify and opens nfsd/cld as soon as nfsd creates it (nfsd waits only
// about a second for a daemon to open it before it falls back to other
// tracking), serves it, and when nfsd stops (the pipe is destroyed)
// closes it and waits for the next one. A daemon restarted while nfsd
// runs opens the existing file.
//
// Upcalls are handled concurrently, up to Config.MaxInflight, so that a
// Store can commit a burst of Creates together; the order the kernel
// relies on is kept: upcalls on the same client name reach the Store one
// at a time in arrival order, and GraceStart and GraceDone are barriers.
// GetVersion is answered at once, malformed upcalls at once with an error
// downcall, neither reaching the Store. Every upcall read is answered
// within Config.OpTimeout; an answer is 0 only when the Store committed.
//
// Pipe works on any descriptor with message semantics: the rpc_pipefs
// file, or a SOCK_SEQPACKET socketpair end, which is how package cldtest
// fakes the kernel in tests. The real kernel is exercised by the e2e
// QEMU tier.
package cld
