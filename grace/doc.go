// Package grace is one takeover's grace, end to end: when the kernel's
// lock managers — lockd (NLM) and nfsd (NFSv4) — may stop refusing new
// locks after a failover, and making them stop then.
//
// After a takeover both lock managers are in grace: they grant only
// reclaims, so that every client that held a lock before the fault can
// take it back before anyone else takes it. The kernel ends grace by a
// timer (90 s with the shipped hook). nsmd ends it sooner, as soon as it
// is safe: when every client that could hold a lock has come back and
// reclaims have been quiet for a settle time (DESIGN.md, "When grace
// ends", says why that is safe). The pieces:
//
//   - Reclaims is that rule, on its own: who is expected, who came back,
//     the last reclaim activity, and whether a grace may end now.
//   - KernelGrace reads and ends the kernel's graces through procfs
//     (/proc/fs/lockd/nlm_end_grace, /proc/fs/nfsd/v4_end_grace), including
//     a newer nfsd's asynchronous end and its EBUSY; for a network
//     namespace of its own (a service's), its nfsd filesystem's files,
//     and lockd's file touched from a thread inside it.
//   - NFSdClients is the one reader of nfsd's client list
//     (/proc/fs/nfsd/clients/*/info): an NFSv4.0 client listed as
//     confirmed is back (NFSv4.0 has no RECLAIM_COMPLETE).
//   - Keeper applies the rule to one server incarnation: told the hosts
//     monitored at takeover and the NFSv4 clients nfsd lets reclaim, it
//     hears who comes back, polls the kernel (its grace files, /proc/locks,
//     the client list) and ends each grace.
//   - CarryV40 is the NFSv4.0 carry-over rule (DESIGN.md invariant 8): at
//     nfsd's GraceDone, an NFSv4.0 client that reclaimed is recorded in
//     the new epoch, so that it can reclaim after the next failover too.
//   - Service composes them for a node, one takeover at a time: it starts
//     a Keeper at each takeover, answers nfsd's client-tracking upcalls
//     (cld.Store) through the Cluster it is given, hears the applied
//     commands, marks the takeover's timeline (package timeline) and
//     keeps the hook's status file.
//
// Everything here reads the kernel under an injected procfs root and time
// from an injected clock, so the rules are tested on plain files.
package grace
