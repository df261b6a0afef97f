package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/admin"
)

func servicesCmd() *cobra.Command {
	var c adminClient
	cmd := &cobra.Command{
		Use:   "services",
		Short: "List the cluster's NFS services: where each runs, its epoch and state",
		Long: `services lists the NFS services of the services: list of the configuration,
as the node at --admin sees them: the address, the node it is placed on
(owner), the epoch of its placement, its state (placed, unplaced, conflict;
serving and moving are the states of a service its owner serves by itself,
which this release does not do yet) and, when the servers' specs of a
service differ, how. Without
services: in the configuration the list is empty. --json adds each
member's fingerprint of the spec and the last move.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var list []admin.ServiceStatus
			if printed, err := c.show(cmd, "/v1/services", &list); printed || err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(list) == 0 {
				_, err := fmt.Fprintln(out, "no services configured (one service on the vip: nsmd status)")
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SERVICE\tADDRESS\tOWNER\tEPOCH\tSTATE\tCONFLICT")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", s.ID, dash(s.Address), s.OwnerOrDash(), s.Epoch, dash(s.State), dash(s.Conflict))
			}
			return tw.Flush()
		},
	}
	c.flags(cmd)
	return cmd
}

func moveCmd() *cobra.Command {
	var c adminClient
	var to string
	cmd := &cobra.Command{
		Use:   "move SERVICE --to NODE",
		Short: "Move one NFS service to another server (a planned move)",
		Long: `move asks the cluster (the leader, at --admin) to move SERVICE to NODE: the
planned move of that one service, committed with the service's next epoch;
the other services stay where they are. (This release places services and
does not serve a service by itself yet: no address moves, no hook runs.)
The move is refused for a node that may not serve it (a witness, an unknown
node) and while the servers' specs of the service differ.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				return fmt.Errorf("--to NODE is required: the node to move %s to", args[0])
			}
			res, err := c.MoveService(cmd.Context(), args[0], to)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "service %s moved to %s\n", res.Service, res.To)
			return nil
		},
	}
	c.flags(cmd)
	cmd.Flags().StringVar(&to, "to", "", "node id to move the service to (required)")
	return cmd
}
