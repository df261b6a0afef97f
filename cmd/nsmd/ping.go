package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

func pingCmd() *cobra.Command {
	var addr, network, name string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "ping",
		Short: "Call NSM NULL and SM_STAT on an address (a node or the VIP) and print sm_state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c, err := oncrpc.Dial(ctx, oncrpc.ClientConfig{Net: network, Addr: addr, Timeout: timeout})
			if err != nil {
				return fmt.Errorf("dial %s %s: %w", network, addr, err)
			}
			defer c.Close()
			start := time.Now()
			if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcNull, oncrpc.Void{}, nil); err != nil {
				return fmt.Errorf("NULL: %w", err)
			}
			var res nsm.SMStatRes
			if err := c.Call(ctx, nsm.Program.Prog, nsm.Program.Vers, nsm.ProcStat, &nsm.SMName{MonName: name}, &res); err != nil {
				return fmt.Errorf("SM_STAT: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s: %s sm_state=%d (%v)\n", network, addr, res.Res, res.State, time.Since(start).Round(time.Microsecond))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "127.0.0.100:6620", "NSM address (host:port)")
	f.StringVar(&network, "net", "udp", "udp | tcp")
	f.StringVar(&name, "mon-name", "localhost", "mon_name sent in SM_STAT")
	f.DurationVar(&timeout, "timeout", 3*time.Second, "call timeout")
	return cmd
}
