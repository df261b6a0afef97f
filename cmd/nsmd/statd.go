package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/nsm"
)

// ImportRequest is the body of POST /v1/import.
type ImportRequest struct {
	// State is the sm_state the previous server had; ours goes above it.
	State int32 `json:"state"`
	// Node owns the registrations (delivers their callbacks); default:
	// the node that receives the request.
	Node          string             `json:"node,omitempty"`
	Registrations []RegistrationJSON `json:"registrations"`
}

// ImportResult is the answer of POST /v1/import.
type ImportResult struct {
	Imported int   `json:"imported"`
	SMState  int32 `json:"sm_state"`
}

func (a *agent) handleImport(w http.ResponseWriter, r *http.Request) {
	var req ImportRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 256<<20)).Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, "bad import body: %v", err)
		return
	}
	owner := req.Node
	if owner == "" {
		owner = a.cfg.NodeID
	}
	now := time.Now().UTC()
	regs := make([]fsm.Registration, 0, len(req.Registrations))
	for i, rj := range req.Registrations {
		reg, err := rj.registration(owner, now)
		if err != nil {
			httpError(w, http.StatusBadRequest, "registration %d: %v", i, err)
			return
		}
		regs = append(regs, reg)
	}
	state, err := a.node.Import(r.Context(), regs, req.State)
	if err != nil {
		httpError(w, http.StatusServiceUnavailable, "import: %v", err)
		return
	}
	writeJSON(w, ImportResult{Imported: len(regs), SMState: state})
}

// registration validates an imported row as SM_MON would.
func (rj RegistrationJSON) registration(owner string, now time.Time) (fsm.Registration, error) {
	if !nsm.ValidName(rj.MonName) || !nsm.ValidName(rj.MyName) {
		return fsm.Registration{}, fmt.Errorf("invalid mon_name %q or my_name %q", rj.MonName, rj.MyName)
	}
	reg := fsm.Registration{
		ID:    fsm.MonID{MonName: rj.MonName, My: fsm.MyID{MyName: rj.MyName, Prog: rj.MyProg, Vers: rj.MyVers, Proc: rj.MyProc}},
		Node:  owner,
		Added: now,
	}
	priv, err := hex.DecodeString(rj.Priv)
	if err != nil || len(priv) != nsm.PrivLen {
		return reg, fmt.Errorf("priv %q is not %d hex bytes", rj.Priv, nsm.PrivLen)
	}
	copy(reg.Priv[:], priv)
	if reg.Callback, err = netip.ParseAddr(rj.Callback); err != nil {
		return reg, fmt.Errorf("callback %q: %w", rj.Callback, err)
	}
	if ip, err := netip.ParseAddr(rj.MonName); err == nil {
		reg.Addrs = []netip.Addr{ip}
	}
	return reg, nil
}

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
			req := ImportRequest{State: d.State, Node: node, Registrations: []RegistrationJSON{}}
			for _, r := range d.Records {
				req.Registrations = append(req.Registrations, RegistrationJSON{
					MonName: r.MonName, MyName: r.My.MyName, MyProg: r.My.Prog, MyVers: r.My.Vers, MyProc: r.My.Proc,
					Priv: hex.EncodeToString(r.Priv[:]), Callback: r.Callback.String(),
				})
			}
			body, _ := json.Marshal(req)
			var res ImportResult
			if _, err := c.post("/v1/import", body, &res); err != nil {
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
			var s Status
			if _, err := c.do("GET", "/v1/status", &s); err != nil {
				return err
			}
			d := nsm.StatdDir{State: s.SMState}
			after := ""
			for {
				q := url.Values{"limit": {"10000"}}
				if after != "" {
					q.Set("after", after)
				}
				var page RegistrationPage
				if _, err := c.do("GET", "/v1/registrations?"+q.Encode(), &page); err != nil {
					return err
				}
				for _, rj := range page.Registrations {
					if node != "" && rj.Node != node {
						continue
					}
					reg, err := rj.registration(rj.Node, time.Time{})
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

// post sends a JSON body.
func (c *adminClient) post(path string, body []byte, out any) ([]byte, error) {
	return c.doBody("POST", path, bytes.NewReader(body), out)
}
