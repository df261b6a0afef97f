package nsm

import (
	"context"
	"fmt"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// notify is SM_NOTIFY (XNFS NSM procedure 6): stat_chge → void. A peer
// says it rebooted. Like rpc.statd, anyone may send it (it is not
// authenticated), and it is accepted only if mon_name or the sender's
// address matches a monitored host and the state differs from the last one
// seen from that host; then the registry commits it and the owners of the
// matching registrations call their lock managers back.
//
// Before it is committed, an acceptable notification must pass the
// limiter (Config.NotifyBurst, NotifyEvery): a token per sender address
// and per mon_name — one budget for notifications sent from the named
// host's own addresses, another for the rest —, and not the same one
// already being committed; held back, it gets no reply (the peer
// retransmits). With Config.NotifyStrictSender, one not sent from an
// address of the host it names is ignored; with Config.NotifyOn, one not
// sent to an address it accepts (a cluster's VIP) is ignored before
// anything else.
//
// The reply is void, also when the notification is ignored. One deliberate
// difference from rpc.statd: when an acceptable notification cannot be
// committed (no leader during an election, shutdown), no reply is sent, so
// that the peer's sm-notify retransmits it instead of it being lost.
func (s *Service) notify(ctx context.Context, c *oncrpc.Call, _ *oncrpc.Writer) error {
	var args StatChge
	if err := decodeArgs(c, "SM_NOTIFY", &args); err != nil {
		return err
	}
	from := callerAddr(c.Remote)
	if on := s.cfg.NotifyOn; on != nil && !on(c.Local.Addr().Unmap()) {
		s.m.notifyReceivedInc("not_vip")
		s.log.Debug("SM_NOTIFY ignored: not sent to the address this cluster takes notifications on (its VIP)",
			"mon_name", args.MonName, "from", from, "to", c.Local.Addr(), "state", args.State)
		return nil
	}
	if !s.reg.WouldAccept(args.MonName, from, args.State) {
		s.m.notifyReceivedInc("ignored")
		s.log.Debug("SM_NOTIFY ignored: unmonitored host or repeated state",
			"mon_name", args.MonName, "from", from, "state", args.State)
		return nil
	}
	fromHost := false
	if sc, ok := s.reg.(SenderChecker); ok {
		fromHost = sc.SenderIsHost(args.MonName, from)
	}
	if s.cfg.NotifyStrictSender && !fromHost {
		s.m.notifyReceivedInc("wrong_sender")
		s.log.Debug("SM_NOTIFY ignored: not sent from an address of the host it names (notify_strict_sender)",
			"mon_name", args.MonName, "from", from, "state", args.State)
		return nil
	}
	if s.limit != nil {
		k := notifyKey{monName: args.MonName, from: from, state: args.State, fromHost: fromHost}
		switch s.limit.begin(k, s.cfg.Now()) {
		case notifyLimited:
			s.m.notifyReceivedInc("rate_limited")
			s.log.Debug("SM_NOTIFY held back: too many from this sender or for this name; no reply, the peer retransmits",
				"mon_name", args.MonName, "from", from, "state", args.State)
			return fmt.Errorf("nsm: SM_NOTIFY from %s rate-limited: %w", from, oncrpc.ErrNoReply)
		case notifyInFlight:
			s.m.notifyReceivedInc("in_flight")
			return fmt.Errorf("nsm: SM_NOTIFY from %s already being committed: %w", from, oncrpc.ErrNoReply)
		}
		defer s.limit.end(k)
	}
	err := s.reg.PeerRebooted(ctx, fsm.PeerRebooted{MonName: args.MonName, From: from, State: args.State, At: s.cfg.Now()})
	if err != nil {
		s.m.notifyReceivedInc("error")
		s.log.Error("SM_NOTIFY not committed; withholding the reply so the peer retransmits",
			"mon_name", args.MonName, "from", from, "state", args.State, "err", err)
		return fmt.Errorf("nsm: SM_NOTIFY from %s not committed: %w: %w", from, oncrpc.ErrNoReply, err)
	}
	s.m.notifyReceivedInc("accepted")
	s.log.Info("SM_NOTIFY accepted: monitored host rebooted", "mon_name", args.MonName, "from", from, "state", args.State)
	return nil
}
