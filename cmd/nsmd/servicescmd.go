package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

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
(owner), the epoch of its placement, its state and, when the servers' specs
of a service differ, how. The state is serving on the owner while it serves
the service, placed elsewhere (and on the owner until it serves), unplaced
(no server may take it now) or conflict. Without services: in the
configuration the list is empty.

Below the table, what the node at --admin does with each service it runs,
started or stopped: the phase of its run (proving: the previous server is
not proven stopped yet; starting; serving; stopping), the epoch, the lease
left, how the previous server was proven stopped, whether it holds the
service's address and its last hook; then, for each service it serves in a
namespace of its own, that service's NFSv4 client tracking (its pipe, its
records, how many reclaimed) and its grace (each lock manager's clients back
of those expected, and how and when it ended). Ask each server to see all of
them.
--json adds each member's fingerprint of the spec, the last move and the
same details (run, local).`,
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
			if err := tw.Flush(); err != nil {
				return err
			}
			return printServicesHere(out, list)
		},
	}
	c.flags(cmd)
	return cmd
}

// printServicesHere prints, for the services the answering node runs or
// ran, what it does with them (nothing when there are none).
func printServicesHere(out io.Writer, list []admin.ServiceStatus) error {
	node := ""
	for _, s := range list {
		if s.Run != nil {
			node = s.Run.Node
		} else if s.Local != nil {
			node = s.Local.Node
		}
	}
	if node == "" {
		return nil
	}
	fmt.Fprintf(out, "\non this node (%s):\n", node)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tRUN\tEPOCH\tLEASE\tPREVIOUS SERVER\tADDRESS\tLAST HOOK")
	for _, s := range list {
		if s.Run == nil && s.Local == nil {
			continue
		}
		run, epoch, lease, prev := "-", "-", "-", "-"
		if r := s.Run; r != nil {
			run, epoch, lease = r.Phase, fmt.Sprint(r.Epoch), fmt.Sprintf("%.1fs", r.LeaseSeconds)
			if p := r.Proof; p != nil {
				prev = fmt.Sprintf("%s stopped (%s, %.1fs)", p.Node, p.By, p.Seconds)
			}
		}
		addr, hook := "-", "-"
		if l := s.Local; l != nil {
			addr = "not held"
			if l.AddressHeld {
				addr = "held"
			}
			if h := l.LastHook; h != nil {
				res := "ok"
				if h.Err != "" {
					res = "FAILED: " + h.Err
				}
				hook = fmt.Sprintf("%s %s (epoch %d) %s at %s", h.Hook, h.Reason, h.Epoch, res, h.At.UTC().Format(time.RFC3339))
			}
			if run == "-" {
				run = l.Phase // no run: stopped, or failed (a start or stop did not complete)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, run, epoch, lease, prev, addr, hook)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printServicesGrace(out, list)
}

// printServicesGrace prints, below the table of what the answering node
// does with its services, each served service's own NFSv4 tracking and
// grace (service namespaces): one line each.
func printServicesGrace(out io.Writer, list []admin.ServiceStatus) error {
	for _, s := range list {
		l := s.Local
		if l == nil {
			continue
		}
		if l.NFSv4 != nil {
			if _, err := fmt.Fprintf(out, "%s nfsv4: %s\n", s.ID, l.NFSv4.Summary()); err != nil {
				return err
			}
		}
		if l.Grace != nil {
			if _, err := fmt.Fprintf(out, "%s grace: %s\n", s.ID, admin.GraceSummary(l.Grace)); err != nil {
				return err
			}
		}
	}
	return nil
}

func moveCmd() *cobra.Command {
	var c adminClient
	var to string
	cmd := &cobra.Command{
		Use:   "move SERVICE --to NODE",
		Short: "Move one NFS service to another server (a planned move)",
		Long: `move asks the cluster (the leader, at --admin) to move SERVICE to NODE: the
planned move of that one service, committed with the service's next epoch;
the other services stay where they are. The service's server stops it
(on_follower, then its address goes), and the new server starts it
(its address, on_leader, SM_NOTIFY to the service's clients with its new
state) once that stop succeeded. The move is refused for a node that may not serve it (a witness, an unknown
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
