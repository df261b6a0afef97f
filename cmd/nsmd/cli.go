package main

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/admin"
)

// adminClient is the --admin, --json, --tls-* and --token-file flags of a
// command that calls a node's admin API.
type adminClient struct {
	admin.Client
	json bool
}

func (c *adminClient) flags(cmd *cobra.Command) {
	def := os.Getenv("NSMD_ADMIN")
	if def == "" {
		def = "127.0.0.1:8024"
	}
	cmd.Flags().StringVar(&c.Addr, "admin", def, "admin API address of a node (host:port) [env NSMD_ADMIN]")
	cmd.Flags().BoolVar(&c.json, "json", false, "print JSON instead of a table")
	authFlags(cmd.Flags(), &c.Auth)
}

// show GETs path into out; with --json it prints the answer as it came and
// reports printed=true, so the caller skips its table.
func (c *adminClient) show(cmd *cobra.Command, path string, out any) (printed bool, err error) {
	body, err := c.Get(cmd.Context(), path, out)
	if err != nil || !c.json {
		return false, err
	}
	_, err = cmd.OutOrStdout().Write(body)
	return true, err
}

func statusCmd() *cobra.Command {
	var c adminClient
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a node's view: role, leader, term, sm_state, VIP, grace, notify progress",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var s admin.Status
			if printed, err := c.show(cmd, "/v1/status", &s); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			grace := "closed"
			if s.GraceUntil != nil {
				if d := time.Until(*s.GraceUntil); d > 0 {
					grace = fmt.Sprintf("open, %s left (until %s)", d.Round(time.Second), s.GraceUntil.Format(time.RFC3339))
				}
			}
			vip := s.VIP
			if vip == "" {
				vip = "-"
			} else if s.VIPHeld {
				vip += " (held here)"
			}
			fmt.Fprintf(tw, "cluster_id\t%s\nversion\t%s\n", s.ClusterID, s.Version.Gossip())
			fmt.Fprintf(tw, "node\t%s\nrole\t%s\nleader\t%s\nterm\t%d\nsm_state\t%d\nregistrations\t%d\nnsm_addr\t%s\nvip\t%s\ngrace\t%s\napplied_index\t%d\nnotify\tpending %d, done %d, failed %d\n",
				s.NodeID, s.Role, s.LeaderID, s.Term, s.SMState, s.Registrations, s.NSMAddr, vip, grace, s.AppliedIndex,
				s.Notify.Pending, s.Notify.Done, s.Notify.Failed)
			fmt.Fprintf(tw, "nfsv4\t%s\nkernel grace\t%s\nfence\t%s\n", s.NFSv4.Summary(), admin.GraceSummary(s.Grace), s.Fence.Summary())
			if s.Fence.Promises != nil {
				fmt.Fprintf(tw, "fence promises\t%s\n", s.Fence.Promises.Summary())
			}
			fmt.Fprintf(tw, "takeover\t%s\n", admin.TimelineSummary(s.Takeover))
			var svcs []admin.ServiceStatus
			if _, err := c.Get(cmd.Context(), "/v1/services", &svcs); err == nil && len(svcs) > 0 {
				fmt.Fprintf(tw, "services\t%s\n", admin.ServicesSummary(svcs))
			}
			return tw.Flush()
		},
	}
	c.flags(cmd)
	return cmd
}

func membersCmd() *cobra.Command {
	var c adminClient
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List the cluster's raft members",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ms []admin.Member
			if printed, err := c.show(cmd, "/v1/members", &ms); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tROLE\tSTATE\tSUFFRAGE\tLEADER\tRAFT\tNSM\tGOSSIP\tVERSION")
			for _, m := range ms {
				leader := ""
				if m.Leader {
					leader = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, dash(m.Role), m.State, dash(m.Suffrage), leader, dash(m.RaftAddr), dash(m.NSMAddr), dash(m.GossipAddr), dash(m.Version))
			}
			return tw.Flush()
		},
	}
	c.flags(cmd)
	return cmd
}

func clientsCmd() *cobra.Command {
	var c adminClient
	cmd := &cobra.Command{
		Use:   "clients",
		Short: "List the NFSv4 client-tracking records (clients that may reclaim after a failover)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var page admin.V4ClientPage
			if printed, err := c.show(cmd, "/v1/nfsv4/clients", &page); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "current epoch %d, recovery epoch %d (0: not in grace)\n", page.CurrentEpoch, page.RecoveryEpoch)
			fmt.Fprintln(tw, "EPOCH\tCLIENT\tPRINCIPAL HASH")
			for _, r := range page.Clients {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Epoch, r.Name, r.PrincHash)
			}
			return tw.Flush()
		},
	}
	c.flags(cmd)
	return cmd
}

func registrationsCmd() *cobra.Command {
	var c adminClient
	var monName, service string
	var limit int
	cmd := &cobra.Command{
		Use:   "registrations",
		Short: "List monitored-host registrations",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var page admin.RegistrationPage
			if printed, err := c.show(cmd, "/v1/registrations?"+admin.ServiceRegistrationsQuery(service, limit, monName, ""), &page); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MON_NAME\tMY_NAME\tPROG/VERS/PROC\tNODE\tCALLBACK\tADDED")
			for _, r := range page.Registrations {
				fmt.Fprintf(tw, "%s\t%s\t%d/%d/%d\t%s\t%s\t%s\n", r.MonName, r.MyName, r.MyProg, r.MyVers, r.MyProc, r.Node, r.Callback, r.Added.Format(time.RFC3339))
			}
			if page.Next != "" {
				fmt.Fprintf(tw, "(more than %d; use --limit or --json)\n", limit)
			}
			return tw.Flush()
		},
	}
	c.flags(cmd)
	cmd.Flags().StringVar(&monName, "mon-name", "", "only registrations of this monitored host")
	cmd.Flags().StringVar(&service, "service", "", "the registrations of this service (services:) instead of the node's own")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many rows")
	return cmd
}

func transferCmd() *cobra.Command {
	var c adminClient
	var to string
	cmd := &cobra.Command{
		Use:   "transfer-leadership",
		Short: "Ask the leader (at --admin) to hand leadership to another voter",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			leader, err := c.TransferLeadership(cmd.Context(), to)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "leadership transferred; new leader: %s\n", leader)
			return nil
		},
	}
	c.flags(cmd)
	cmd.Flags().StringVar(&to, "to", "", "node id to hand leadership to (default: any serving voter; never a witness)")
	return cmd
}

func fenceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fence",
		Short: "Fencing: confirm that a node is off",
	}
	var c adminClient
	var by string
	confirm := &cobra.Command{
		Use:   "confirm NODE",
		Short: "Confirm that NODE is off, so that a new leader waiting for it may serve",
		Long: `Confirm that NODE is off: powered off, or its NFS server stopped and the
shared storage unmounted by hand. A new leader that cannot prove NODE stopped
(it promised no watchdog, or runs an earlier release, and neither answers nor is
fenced by a fence agent) serves only once NODE answers, an agent fences it, or an
operator confirms it off with this command. The confirmation is recorded with
who and when, shown in nsmd status, and holds until NODE takes over again.
Confirming a node that still serves puts two servers on one filesystem: be sure.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := c.ConfirmFenced(cmd.Context(), args[0], by)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s confirmed off by %s\n", res.Node, res.By)
			return nil
		},
	}
	c.flags(confirm)
	confirm.Flags().StringVar(&by, "by", os.Getenv("USER"), "who confirms (recorded with the credential and address)")
	cmd.AddCommand(confirm)
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
