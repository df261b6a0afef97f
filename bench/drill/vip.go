package drill

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// The VIP as a drill sees it: its NSM address, NULL and SM_STAT over UDP.

// findVIP settles the VIP's NSM address and checks that it answers.
func (d *runner) findVIP(ctx context.Context, leader Node) error {
	if d.o.VIP == "" {
		var s admin.Status
		if err := d.call(ctx, "GET", leader.Admin, "/v1/status", 3*time.Second, &s); err != nil {
			return err
		}
		if s.VIP == "" {
			return errors.New("drill: the cluster has no VIP (vip_mode none?); pass --vip HOST:PORT")
		}
		host := s.VIP
		if p, err := netip.ParsePrefix(s.VIP); err == nil {
			host = p.Addr().String()
		}
		_, port, err := net.SplitHostPort(s.NSMAddr)
		if err != nil {
			return fmt.Errorf("drill: leader's nsm_addr %q: %w", s.NSMAddr, err)
		}
		d.o.VIP = net.JoinHostPort(host, port)
	}
	d.vip = d.o.VIP
	// A new holder may need a moment (a drill right after a failover):
	// retry up to the timeout before giving up.
	deadline := time.Now().Add(d.o.Timeout)
	for {
		_, err := vipStat(ctx, d.vip)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("drill: the VIP %s does not answer SM_STAT before the drill (use --vip): %w", d.vip, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(healthPoll):
		}
	}
}

func vipDial(ctx context.Context, addr string) (*oncrpc.Client, error) {
	return oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: "udp", Addr: addr, Timeout: rpcTimeout, Retransmit: rpcRetransmit})
}

// vipNull calls NSM NULL on addr over UDP.
func vipNull(ctx context.Context, addr string) error {
	c, err := vipDial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcNull, oncrpc.Void{}, nil)
}

// vipStat calls SM_STAT on addr over UDP and returns the state.
func vipStat(ctx context.Context, addr string) (int32, error) {
	c, err := vipDial(ctx, addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var res nsm.SMStatRes
	if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: "nsmd-drill"}, &res); err != nil {
		return 0, err
	}
	if res.Res != nsm.StatSucc {
		return 0, fmt.Errorf("SM_STAT: %s", res.Res)
	}
	return res.State, nil
}
