package nsm

import (
	"fmt"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// Wire types of the NSM protocol, mirroring sm_inter.x (X/Open XNFS
// "Network Status Monitor Protocol", chapter 11, and nfs-utils
// rpc.statd). Every variable-length field is capped at its maximum when
// decoded; encoders trust the caller to respect the same caps.

// Procedure numbers of NSM version 1.
const (
	ProcNull      uint32 = 0
	ProcStat      uint32 = 1
	ProcMon       uint32 = 2
	ProcUnmon     uint32 = 3
	ProcUnmonAll  uint32 = 4
	ProcSimuCrash uint32 = 5
	ProcNotify    uint32 = 6
)

const (
	// MaxStrLen is SM_MAXSTRLEN: the cap on every string of the protocol.
	MaxStrLen = 1024
	// PrivLen is the size of the lock manager's opaque cookie (mon.priv).
	PrivLen = 16
)

// Res is res (sm_inter.x "enum res { stat_succ = 0, stat_fail = 1 }").
type Res uint32

const (
	StatSucc Res = 0 // stat_succ
	StatFail Res = 1 // stat_fail
)

func (r Res) String() string {
	switch r {
	case StatSucc:
		return "stat_succ"
	case StatFail:
		return "stat_fail"
	}
	return fmt.Sprintf("res(%d)", uint32(r))
}

func wrap(what string, err error) error {
	if err != nil {
		return fmt.Errorf("nsm: %s: %w", what, err)
	}
	return nil
}

// SMName is sm_name: struct sm_name { string mon_name<SM_MAXSTRLEN>; }.
// SM_STAT's argument.
type SMName struct {
	MonName string
}

// MarshalXDR encodes n (sm_inter.x "sm_name").
func (n *SMName) MarshalXDR(w *oncrpc.Writer) { w.String(n.MonName) }

// UnmarshalXDR decodes n (sm_inter.x "sm_name").
func (n *SMName) UnmarshalXDR(r *oncrpc.Reader) error {
	n.MonName = r.String(MaxStrLen)
	return wrap("sm_name", r.Err())
}

// MyID is my_id, the lock manager to call back (sm_inter.x):
//
//	struct my_id {
//		string my_name<SM_MAXSTRLEN>;
//		int    my_prog;
//		int    my_vers;
//		int    my_proc;
//	};
type MyID struct {
	MyName string
	Prog   uint32
	Vers   uint32
	Proc   uint32
}

// MarshalXDR encodes m (sm_inter.x "my_id").
func (m *MyID) MarshalXDR(w *oncrpc.Writer) {
	w.String(m.MyName)
	w.Uint32(m.Prog)
	w.Uint32(m.Vers)
	w.Uint32(m.Proc)
}

// UnmarshalXDR decodes m (sm_inter.x "my_id").
func (m *MyID) UnmarshalXDR(r *oncrpc.Reader) error {
	m.MyName = r.String(MaxStrLen)
	m.Prog = r.Uint32()
	m.Vers = r.Uint32()
	m.Proc = r.Uint32()
	return wrap("my_id", r.Err())
}

// FSM converts m to the state machine's key type.
func (m MyID) FSM() fsm.MyID {
	return fsm.MyID{MyName: m.MyName, Prog: m.Prog, Vers: m.Vers, Proc: m.Proc}
}

// MonID is mon_id (sm_inter.x):
//
//	struct mon_id {
//		string mon_name<SM_MAXSTRLEN>;
//		struct my_id my_id;
//	};
type MonID struct {
	MonName string
	My      MyID
}

// MarshalXDR encodes m (sm_inter.x "mon_id").
func (m *MonID) MarshalXDR(w *oncrpc.Writer) {
	w.String(m.MonName)
	m.My.MarshalXDR(w)
}

// UnmarshalXDR decodes m (sm_inter.x "mon_id").
func (m *MonID) UnmarshalXDR(r *oncrpc.Reader) error {
	m.MonName = r.String(MaxStrLen)
	if err := m.My.UnmarshalXDR(r); err != nil {
		return wrap("mon_id", err)
	}
	return wrap("mon_id", r.Err())
}

// FSM converts m to the state machine's key type.
func (m MonID) FSM() fsm.MonID { return fsm.MonID{MonName: m.MonName, My: m.My.FSM()} }

// Mon is mon, SM_MON's argument (sm_inter.x):
//
//	struct mon {
//		struct mon_id mon_id;
//		opaque priv[16];
//	};
type Mon struct {
	ID   MonID
	Priv [PrivLen]byte
}

// MarshalXDR encodes m (sm_inter.x "mon").
func (m *Mon) MarshalXDR(w *oncrpc.Writer) {
	m.ID.MarshalXDR(w)
	w.FixedOpaque(m.Priv[:])
}

// UnmarshalXDR decodes m (sm_inter.x "mon").
func (m *Mon) UnmarshalXDR(r *oncrpc.Reader) error {
	if err := m.ID.UnmarshalXDR(r); err != nil {
		return wrap("mon", err)
	}
	r.FixedOpaque(m.Priv[:])
	return wrap("mon", r.Err())
}

// SMStatRes is sm_stat_res, the result of SM_STAT and SM_MON (sm_inter.x):
//
//	struct sm_stat_res {
//		res res_stat;
//		int state;
//	};
type SMStatRes struct {
	Res   Res
	State int32
}

// MarshalXDR encodes s (sm_inter.x "sm_stat_res").
func (s *SMStatRes) MarshalXDR(w *oncrpc.Writer) {
	w.Uint32(uint32(s.Res))
	w.Int32(s.State)
}

// UnmarshalXDR decodes s (sm_inter.x "sm_stat_res"); res must be
// stat_succ or stat_fail (an XDR enum takes only its declared values).
func (s *SMStatRes) UnmarshalXDR(r *oncrpc.Reader) error {
	res := r.Uint32()
	s.State = r.Int32()
	if r.Err() == nil && res > uint32(StatFail) {
		r.Fail(fmt.Errorf("res %d is not stat_succ or stat_fail: %w", res, ErrBadEnum))
	}
	s.Res = Res(res)
	return wrap("sm_stat_res", r.Err())
}

// SMStat is sm_stat, the result of SM_UNMON and SM_UNMON_ALL (sm_inter.x):
//
//	struct sm_stat { int state; };
type SMStat struct {
	State int32
}

// MarshalXDR encodes s (sm_inter.x "sm_stat").
func (s *SMStat) MarshalXDR(w *oncrpc.Writer) { w.Int32(s.State) }

// UnmarshalXDR decodes s (sm_inter.x "sm_stat").
func (s *SMStat) UnmarshalXDR(r *oncrpc.Reader) error {
	s.State = r.Int32()
	return wrap("sm_stat", r.Err())
}

// StatChge is stat_chge, SM_NOTIFY's argument (sm_inter.x):
//
//	struct stat_chge {
//		string mon_name<SM_MAXSTRLEN>;
//		int    state;
//	};
//
// MonName is the name of the host whose state changed (the sender).
type StatChge struct {
	MonName string
	State   int32
}

// MarshalXDR encodes s (sm_inter.x "stat_chge").
func (s *StatChge) MarshalXDR(w *oncrpc.Writer) {
	w.String(s.MonName)
	w.Int32(s.State)
}

// UnmarshalXDR decodes s (sm_inter.x "stat_chge").
func (s *StatChge) UnmarshalXDR(r *oncrpc.Reader) error {
	s.MonName = r.String(MaxStrLen)
	s.State = r.Int32()
	return wrap("stat_chge", r.Err())
}
