package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/cluster"
)

// adminFlags adds --admin and --json and returns an HTTP helper.
type adminClient struct {
	addr string
	json bool
	auth adminAuth
}

func (c *adminClient) flags(cmd *cobra.Command) {
	def := os.Getenv("NSMD_ADMIN")
	if def == "" {
		def = "127.0.0.1:8024"
	}
	cmd.Flags().StringVar(&c.addr, "admin", def, "admin API address of a node (host:port) [env NSMD_ADMIN]")
	cmd.Flags().BoolVar(&c.json, "json", false, "print JSON instead of a table")
	c.auth.flags(cmd.Flags())
}

func (c *adminClient) do(method, path string, out any) ([]byte, error) {
	return c.doBody(method, path, nil, out)
}

func (c *adminClient) doBody(method, path string, reqBody io.Reader, out any) ([]byte, error) {
	req, err := http.NewRequest(method, c.auth.base(c.addr)+path, reqBody)
	if err != nil {
		return nil, err
	}
	if err := c.auth.authorize(req); err != nil {
		return nil, err
	}
	tr, err := c.auth.transport()
	if err != nil {
		return nil, err
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Timeout: 15 * time.Second, Transport: tr}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API %s: %w", c.addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read admin API answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return body, fmt.Errorf("%s %s: %s", method, path, e.Error)
		}
		return body, fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return body, fmt.Errorf("decode %s: %w", path, err)
		}
	}
	return body, nil
}

// show GETs path into out; with --json it prints the answer as it came and
// reports printed=true, so the caller skips its table.
func (c *adminClient) show(cmd *cobra.Command, path string, out any) (printed bool, err error) {
	body, err := c.do("GET", path, out)
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
			var s Status
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
			fmt.Fprintf(tw, "nfsv4\t%s\nkernel grace\t%s\n", s.NFSv4.describe(), describeGrace(s.Grace))
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
			var ms []cluster.MemberStatus
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
			var page V4ClientPage
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
	var monName string
	var limit int
	cmd := &cobra.Command{
		Use:   "registrations",
		Short: "List monitored-host registrations",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			q.Set("limit", fmt.Sprint(limit))
			if monName != "" {
				q.Set("mon_name", monName)
			}
			var page RegistrationPage
			if printed, err := c.show(cmd, "/v1/registrations?"+q.Encode(), &page); printed || err != nil {
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
			var res map[string]string
			path := "/v1/leadership/transfer"
			if to != "" {
				path += "?to=" + url.QueryEscape(to)
			}
			if _, err := c.do("POST", path, &res); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "leadership transferred; new leader: %s\n", res["leader_id"])
			return nil
		},
	}
	c.flags(cmd)
	cmd.Flags().StringVar(&to, "to", "", "node id to hand leadership to (default: any serving voter; never a witness)")
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
