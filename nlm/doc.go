// Package nlm is the lock-manager side of NSM: the wire types a lock
// manager (Linux lockd, NFS-Ganesha) exchanges with the status monitor,
// and control of the kernel lock managers' grace periods.
//
//   - Status, the argument of the lock manager's private "SM_NOTIFY"
//     callback procedure (ProcSMNotify) that the status monitor calls when a
//     monitored peer reboots (X/Open XNFS, "NSM callback"; sm_inter.x
//     "status"); Notify, the nlm_notify argument of NLM_FREE_ALL.
//   - KernelGrace reads and ends lockd's and nfsd's grace through procfs
//     (/proc/fs/lockd/nlm_end_grace, /proc/fs/nfsd/v4_end_grace).
//   - Reclaims is nsmd's rule for ending a grace early: every client that
//     could hold a lock came back, and reclaims were quiet for a settle
//     time (or there was no such client). DESIGN.md, "When grace ends",
//     says why that is safe.
//   - Keeper applies the rule for one server incarnation: it is told the
//     hosts monitored at takeover and the NFSv4 clients nfsd may let
//     reclaim, hears who comes back, polls the kernel (its grace files,
//     /proc/locks, nfsd's client list: NFSdClients) and ends each grace.
package nlm
