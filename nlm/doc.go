// Package nlm is the lock-manager side of NSM: the wire types a lock
// manager (Linux lockd, NFS-Ganesha, or nsmd's own NLM later) exchanges with
// the status monitor, and the grace window during which only lock reclaims
// are granted.
//
// Today it holds:
//
//   - Status, the argument of the lock manager's private "SM_NOTIFY"
//     callback procedure (ProcSMNotify) that the status monitor calls when a
//     monitored peer reboots (X/Open XNFS, "NSM callback"; sm_inter.x
//     "status");
//   - Notify, the nlm_notify argument of NLM_FREE_ALL (ProcFreeAll);
//   - Grace, the grace window opened at every takeover.
//
// Later it will hold an NLM v4 lock manager that honours Grace (non-reclaim
// LOCKs get NLM4_DENIED_GRACE_PERIOD while it is active) and accepts
// reclaims from clients notified with the new sm_state.
package nlm
