// Package nlm holds the lock manager's wire types that the status monitor
// exchanges with a lock manager (Linux lockd, NFS-Ganesha):
//
//   - Status, the argument of the lock manager's private "SM_NOTIFY"
//     callback procedure (ProcSMNotify) that the status monitor calls when a
//     monitored peer reboots (X/Open XNFS, "NSM callback"; sm_inter.x
//     "status"); Notify, the nlm_notify argument of NLM_FREE_ALL.
//
// The kernel lock managers' grace periods are package grace's.
package nlm
