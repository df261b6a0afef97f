package nsm

import "errors"

// Reasons an NSM request is refused. Refusals are answered on the wire as
// rpc.statd answers them (stat_fail, state −1 for SM_MON); these errors
// are what the service logs and what tests check with errors.Is.
var (
	// ErrUntrusted: the caller's address may not use this procedure
	// (SM_MON, SM_UNMON, SM_UNMON_ALL and SM_SIMU_CRASH are for the local
	// lock manager and configured trusted callers only).
	ErrUntrusted = errors.New("nsm: caller not trusted")
	// ErrNotPrivileged: SM_SIMU_CRASH came from a source port ≥ 1024.
	ErrNotPrivileged = errors.New("nsm: caller source port not privileged")
	// ErrBadCallback: my_id does not name a lock manager callback
	// (my_prog must be 100021 and my_proc 16 or 24 unless
	// Config.AllowAnyCallback).
	ErrBadCallback = errors.New("nsm: callback is not the lock manager's")
	// ErrBadName: a mon_name or my_name is empty, contains '/' or starts
	// with '.'.
	ErrBadName = errors.New("nsm: invalid host name")
	// ErrTooMany: the registrations cap (Config.MaxRegistrations) is
	// reached and the SM_MON would add one.
	ErrTooMany = errors.New("nsm: registrations cap reached")
	// ErrUnprivLimit: an SM_MON from an unprivileged source port would
	// monitor a new host beyond the bound of unprivileged local callers
	// (Config.MonUnprivBurst).
	ErrUnprivLimit = errors.New("nsm: new hosts from unprivileged local callers are over their bound")
	// ErrUnresolved: mon_name does not resolve to any address.
	ErrUnresolved = errors.New("nsm: host name does not resolve")
	// ErrBadEnum: an XDR enum carried an undeclared value.
	ErrBadEnum = errors.New("nsm: undeclared enum value")
	// ErrNotReady: this node does not know the current incarnation's
	// sm_state yet (starting, replaying, or the leader's takeover is not
	// applied here); the call is dropped without a reply.
	ErrNotReady = errors.New("nsm: current sm_state not known yet")
	// ErrNoAddress: the notifier found no address to send to.
	ErrNoAddress = errors.New("nsm: no usable address")
)
