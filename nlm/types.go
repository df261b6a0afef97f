package nlm

import (
	"fmt"

	"github.com/nsmd/nsmd/oncrpc"
)

// Program is the NLM program number (X/Open XNFS, "NLM protocol").
const Program uint32 = 100021

// NLM versions.
const (
	Vers1 uint32 = 1
	Vers3 uint32 = 3 // NLM v3 (NFSv2/v3, 32-bit offsets); Linux lockd registers with statd as v3
	Vers4 uint32 = 4 // NLM v4 (NFSv3, 64-bit offsets)
)

// Procedures the status monitor side cares about.
const (
	// ProcSMNotify is the lock manager's private callback procedure that
	// the status monitor calls with Status when a monitored host reboots.
	// Linux lockd names it NLMPROC_NSM_NOTIFY and passes it as my_proc in
	// SM_MON.
	ProcSMNotify uint32 = 16
	// ProcSMNotifyAlt is the other my_proc value rpc.statd accepts in SM_MON.
	ProcSMNotifyAlt uint32 = 24
	// ProcFreeAll is NLM_FREE_ALL / NLM4_FREE_ALL (arg Notify, void result):
	// release every lock held by a client that rebooted.
	ProcFreeAll uint32 = 23
)

// Lengths from the NLM and NSM protocol specifications.
const (
	// MaxStrLen is LM_MAXSTRLEN (nlm_prot.x), the cap on nlm_notify.name.
	MaxStrLen = 1024
	// SMMaxStrLen is SM_MAXSTRLEN (sm_inter.x), the cap on status.mon_name.
	SMMaxStrLen = 1024
	// PrivLen is the size of the opaque cookie the lock manager hands NSM
	// in SM_MON and gets back in Status.
	PrivLen = 16
)

// Stat is nlm4_stats (X/Open XNFS NLM v4 "nlm4_stats"; the first values are
// shared with v1-3 nlm_stats).
type Stat uint32

// NLM v4 status codes.
const (
	Granted           Stat = 0
	Denied            Stat = 1
	DeniedNoLocks     Stat = 2
	Blocked           Stat = 3
	DeniedGracePeriod Stat = 4 // NLM4_DENIED_GRACE_PERIOD: only reclaims during grace
	Deadlock          Stat = 5
	ReadOnlyFS        Stat = 6
	StaleFH           Stat = 7
	FileTooBig        Stat = 8
	Failed            Stat = 9
)

var statNames = [...]string{"granted", "denied", "denied_nolocks", "blocked", "denied_grace_period",
	"deadlck", "rofs", "stale_fh", "fbig", "failed"}

func (s Stat) String() string {
	if int(s) < len(statNames) {
		return statNames[s]
	}
	return fmt.Sprintf("nlm4_stat(%d)", uint32(s))
}

// Status is the argument of the NSM callback (sm_inter.x):
//
//	struct status {
//		string mon_name<SM_MAXSTRLEN>;
//		int    state;
//		opaque priv[16];
//	};
//
// MonName is the monitored host's name as the lock manager gave it in
// SM_MON; State is that host's new NSM state; Priv is the lock manager's
// cookie from SM_MON.
type Status struct {
	MonName string
	State   int32
	Priv    [PrivLen]byte
}

// MarshalXDR encodes s (sm_inter.x "status").
func (s *Status) MarshalXDR(w *oncrpc.Writer) {
	w.String(s.MonName)
	w.Int32(s.State)
	w.FixedOpaque(s.Priv[:])
}

// UnmarshalXDR decodes s, enforcing mon_name<SM_MAXSTRLEN>.
func (s *Status) UnmarshalXDR(r *oncrpc.Reader) error {
	s.MonName = r.String(SMMaxStrLen)
	s.State = r.Int32()
	r.FixedOpaque(s.Priv[:])
	if err := r.Err(); err != nil {
		return fmt.Errorf("nlm: status: %w", err)
	}
	return nil
}

// Notify is nlm_notify, the argument of NLM_FREE_ALL (nlm_prot.x):
//
//	struct nlm_notify {
//		string name<LM_MAXSTRLEN>;
//		long   state;
//	};
type Notify struct {
	Name  string
	State int32
}

// MarshalXDR encodes n (nlm_prot.x "nlm_notify").
func (n *Notify) MarshalXDR(w *oncrpc.Writer) {
	w.String(n.Name)
	w.Int32(n.State)
}

// UnmarshalXDR decodes n, enforcing name<LM_MAXSTRLEN>.
func (n *Notify) UnmarshalXDR(r *oncrpc.Reader) error {
	n.Name = r.String(MaxStrLen)
	n.State = r.Int32()
	if err := r.Err(); err != nil {
		return fmt.Errorf("nlm: nlm_notify: %w", err)
	}
	return nil
}
