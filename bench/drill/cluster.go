package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nsmd/nsmd/admin"
)

// How a drill finds the cluster's nodes and judges it healthy: the admin API
// of each node, its status, the one leader that every node agrees on.

// hostPort is an admin address without scheme (host:port, or the URL as
// given when it has a path).
func hostPort(addr string) string {
	_, rest, ok := strings.Cut(addr, "://")
	if !ok {
		return strings.TrimRight(addr, "/")
	}
	return strings.TrimRight(rest, "/")
}

// call is one admin API request bounded by timeout; out may be nil.
func (d *runner) call(ctx context.Context, method, adm, path string, timeout time.Duration, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, d.o.Auth.URL(adm)+path, nil)
	if err == nil {
		err = d.o.Auth.Authorize(req)
	}
	if err != nil {
		return fmt.Errorf("admin API %s: %w", adm, err)
	}
	resp, err := d.hc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API %s: %w", adm, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("admin API %s: read %s: %w", adm, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e admin.ErrorBody
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return &httpError{fmt.Sprintf("%s %s on %s: %s", method, path, adm, e.Error)}
		}
		return &httpError{fmt.Sprintf("%s %s on %s: %s", method, path, adm, resp.Status)}
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("admin API %s: decode %s: %w", adm, path, err)
		}
	}
	return nil
}

// httpError is an answer the node gave (not a lost connection).
type httpError struct{ msg string }

// discover learns the nodes: the given admin addresses, then the members
// they report, whose admin API is probed at their NSM (or raft) host with
// each given admin port.
func (d *runner) discover(ctx context.Context) error {
	byID := map[string]*Node{}
	var order []string
	var ports []string
	var members []admin.Member
	var errs []error
	for _, adm := range d.o.Admins {
		var s admin.Status
		if err := d.call(ctx, "GET", adm, "/v1/status", 3*time.Second, &s); err != nil {
			errs = append(errs, err)
			continue
		}
		if s.Process != nil && s.Process.InProcess {
			d.inProcess = true
		}
		if _, ok := byID[s.NodeID]; !ok {
			byID[s.NodeID] = &Node{ID: s.NodeID, Admin: hostPort(adm), NSMAddr: s.NSMAddr}
			order = append(order, s.NodeID)
		}
		if u := hostPort(adm); !strings.Contains(u, "/") {
			if _, p, err := net.SplitHostPort(u); err == nil && !slices.Contains(ports, p) {
				ports = append(ports, p)
			}
		}
		if members == nil {
			if err := d.call(ctx, "GET", adm, "/v1/members", 3*time.Second, &members); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(byID) == 0 {
		return fmt.Errorf("drill: no admin API answered: %w", errors.Join(errs...))
	}
	d.members = members
	for _, m := range members {
		n, ok := byID[m.ID]
		if !ok {
			n = &Node{ID: m.ID, NSMAddr: m.NSMAddr}
			byID[m.ID] = n
			order = append(order, m.ID)
			n.Admin = d.probeAdmin(ctx, m, ports)
		}
		n.Voter = m.Suffrage == "Voter"
		if n.NSMAddr == "" {
			n.NSMAddr = m.NSMAddr
		}
	}
	for _, id := range order {
		n := byID[id]
		d.nodes = append(d.nodes, *n)
		if n.Voter {
			d.voters++
		}
	}
	if members == nil { // an old node without /v1/members: all given nodes vote
		d.voters = len(d.nodes)
		for i := range d.nodes {
			d.nodes[i].Voter = true
		}
	}
	if len(d.nodes) < 2 {
		return fmt.Errorf("drill: only one node known (%s); a failover needs two or more", d.nodes[0].ID)
	}
	return nil
}

// probeAdmin looks for member m's admin API at its hosts with the given
// ports; "" if none answers as m.
func (d *runner) probeAdmin(ctx context.Context, m admin.Member, ports []string) string {
	var hosts []string
	for _, a := range []string{m.NSMAddr, m.RaftAddr, m.GossipAddr} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" && !slices.Contains(hosts, h) {
			if ip, err := netip.ParseAddr(h); err == nil && ip.IsUnspecified() {
				continue
			}
			hosts = append(hosts, h)
		}
	}
	for _, h := range hosts {
		for _, p := range ports {
			addr := net.JoinHostPort(h, p)
			var s admin.Status
			if d.call(ctx, "GET", addr, "/v1/status", time.Second, &s) == nil && s.NodeID == m.ID {
				return addr
			}
		}
	}
	return ""
}

type answer struct {
	node Node
	s    admin.Status
	err  error
	at   time.Time
}

// statuses asks every node with a known admin API (except skip) for its
// status in parallel. With stop set it returns as soon as stop accepts an
// answer (the other requests are cancelled and waited for).
func (d *runner) statuses(ctx context.Context, skip string, stop func(admin.Status) bool) []answer {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan answer, len(d.nodes))
	var wg sync.WaitGroup
	n := 0
	for _, node := range d.nodes {
		if node.Admin == "" || node.ID == skip {
			continue
		}
		n++
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s admin.Status
			err := d.call(ctx, "GET", node.Admin, "/v1/status", statusTimeout, &s)
			ch <- answer{node: node, s: s, err: err, at: time.Now()}
		}()
	}
	var out []answer
	for range n {
		a := <-ch
		out = append(out, a)
		if a.err != nil && ctx.Err() == nil && d.unanswered != nil {
			d.unanswered[a.node.ID] = true
		}
		if a.err == nil && stop != nil && stop(a.s) {
			break
		}
	}
	cancel()
	wg.Wait()
	return out
}

// waitHealthy waits (up to the timeout) for one agreed leader that holds
// the VIP, and for killed nodes to come back — or, if one does not, for
// enough voters to survive another leader kill. It returns the leader.
func (d *runner) waitHealthy(ctx context.Context, run int) (Node, error) {
	deadline := time.Now().Add(d.o.Timeout)
	var why string
	for {
		answers := d.statuses(ctx, "", nil)
		leader, ok, reason := d.healthy(answers)
		why = reason
		if ok {
			if len(d.down) > 0 {
				var ids []string
				for id := range d.down {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				d.progressf("run %d: %s not back; %d of %d voters up, enough to lose another leader\n", run, strings.Join(ids, ", "), d.votersUp(), d.voters)
			}
			return leader, nil
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return Node{}, ctx.Err()
		case <-time.After(healthPoll):
		}
	}
	if len(d.down) > 0 && run > 1 {
		var ids []string
		for id := range d.down {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return Node{}, &stopError{fmt.Sprintf(
			"stopping after run %d: killed node %s did not come back within %v (nothing restarted it: nsmd dev does after --restart-after, a real node needs its supervisor), and killing another leader would leave %d of %d voters: no quorum",
			run-1, strings.Join(ids, ", "), d.o.Timeout, d.votersUp()-1, d.voters)}
	}
	return Node{}, fmt.Errorf("drill: cluster not healthy within %v: %s", d.o.Timeout, why)
}

// votersUp counts voters not known to be down.
func (d *runner) votersUp() int {
	n := 0
	for _, node := range d.nodes {
		if node.Voter && !d.down[node.ID] {
			n++
		}
	}
	return n
}

// healthy judges one round of status answers.
func (d *runner) healthy(answers []answer) (Node, bool, string) {
	var leaders []answer
	ids := map[string]bool{}
	for _, a := range answers {
		if a.err != nil {
			continue
		}
		delete(d.down, a.node.ID) // came back
		ids[a.s.LeaderID] = true
		if a.s.Role == "leader" {
			leaders = append(leaders, a)
		}
	}
	switch {
	case len(leaders) == 0:
		return Node{}, false, "no node reports role=leader"
	case len(leaders) > 1:
		return Node{}, false, fmt.Sprintf("%d nodes report role=leader", len(leaders))
	case len(ids) > 1:
		return Node{}, false, "nodes disagree on the leader"
	}
	l := leaders[0]
	if l.s.VIP != "" && !l.s.VIPHeld {
		return Node{}, false, fmt.Sprintf("leader %s does not hold the VIP yet", l.node.ID)
	}
	// Every node that answers has caught up: a node just restarted that
	// is still behind the leader's log cannot win the next election, and
	// killing the leader then tests a degraded cluster, not a failover.
	for _, a := range answers {
		if a.err == nil && a.s.AppliedIndex < l.s.AppliedIndex {
			return Node{}, false, fmt.Sprintf("%s has applied index %d, the leader %d: catching up", a.node.ID, a.s.AppliedIndex, l.s.AppliedIndex)
		}
	}
	if len(d.down) > 0 && d.votersUp()-1 <= d.voters/2 {
		return Node{}, false, "waiting for a killed node to come back"
	}
	return l.node, true, ""
}
