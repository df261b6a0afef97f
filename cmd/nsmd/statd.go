package main

import (
	"encoding/hex"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/nsm"
)

func importStatdCmd() *cobra.Command {
	var c adminClient
	var node string
	cmd := &cobra.Command{
		Use:   "import-statd DIR",
		Short: "Register everything in an rpc.statd state directory (sm/, sm.bak/, state) in the cluster",
		Long: `import-statd reads rpc.statd's monitor records and state number from DIR
(usually /var/lib/nfs) and registers them through the node at --admin. The
cluster's sm_state is raised above the imported one, and the leader sends
SM_NOTIFY to every monitored host.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := nsm.ReadStatdDir(args[0])
			if err != nil {
				return err
			}
			req := admin.ImportRequest{State: d.State, Node: node, Registrations: []admin.RegistrationJSON{}}
			for _, r := range d.Records {
				req.Registrations = append(req.Registrations, admin.RegistrationJSON{
					MonName: r.MonName, MyName: r.My.MyName, MyProg: r.My.Prog, MyVers: r.My.Vers, MyProc: r.My.Proc,
					Priv: hex.EncodeToString(r.Priv[:]), Callback: r.Callback.String(),
				})
			}
			res, err := c.Import(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "imported %d registrations from %s (statd state %d); cluster sm_state now %d\n",
				res.Imported, args[0], d.State, res.SMState)
			return nil
		},
	}
	c.flags(cmd)
	cmd.Flags().StringVar(&node, "node", "", "node id that owns the imported registrations (default: the node at --admin)")
	return cmd
}

func exportStatdCmd() *cobra.Command {
	var c adminClient
	var node string
	cmd := &cobra.Command{
		Use:   "export-statd DIR",
		Short: "Write the cluster's registrations as an rpc.statd state directory (for sm-notify as a fallback)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			d := nsm.StatdDir{State: s.SMState}
			after := ""
			for {
				page, err := c.Registrations(cmd.Context(), 10000, "", after)
				if err != nil {
					return err
				}
				for _, rj := range page.Registrations {
					if node != "" && rj.Node != node {
						continue
					}
					reg, err := rj.Registration(rj.Node, time.Time{})
					if err != nil {
						return err
					}
					d.Records = append(d.Records, nsm.StatdRecord{Callback: reg.Callback, My: reg.ID.My, Priv: reg.Priv, MonName: reg.ID.MonName})
				}
				if page.Next == "" {
					break
				}
				after = page.Next
			}
			if err := nsm.WriteStatdDir(args[0], d); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d registrations and state %d to %s\n", len(d.Records), d.State, args[0])
			return nil
		},
	}
	c.flags(cmd)
	cmd.Flags().StringVar(&node, "node", "", "only registrations owned by this node id")
	return cmd
}
