package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/config"
)

// serviceStore is a node with services as the admin API sees it; only the
// services' methods are implemented (the embedded nil Store panics on any
// other: these tests call no other endpoint).
type serviceStore struct {
	admin.Store
	mu    sync.Mutex
	list  []admin.ServiceStatus
	moves []string
}

func (s *serviceStore) Services() ([]admin.ServiceStatus, error) { return s.list, nil }

func (s *serviceStore) MoveService(_ context.Context, service, to string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.list {
		if l.ID == service {
			s.moves = append(s.moves, service+">"+to)
			return nil
		}
	}
	return admin.ErrUnknownService
}

// serveServices starts the real admin handlers over st, with the admin
// token required for privileged calls; it returns the address and the
// token file.
func serveServices(t *testing.T, st *serviceStore) (string, string) {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := admin.NewGuard(admin.GuardConfig{TokenFile: tok})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(admin.NewHandler(st, admin.HandlerConfig{NodeID: "nfs1", Guard: g}))
	t.Cleanup(srv.Close)
	return srv.URL, tok
}

func TestServicesTableAndMove(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	st := &serviceStore{list: []admin.ServiceStatus{
		{ID: "home", Address: "10.0.0.50/24", Owner: "nfs1", Epoch: 4, State: admin.ServiceServing, Fingerprint: "832063574c84a0fe",
			LastMove: &admin.ServiceMove{From: "nfs2", To: "nfs1", Reason: "planned", At: at, Epoch: 4}},
		{ID: "scratch", Address: "10.0.0.51/24", State: admin.ServiceConflict, Conflict: "nfs2's spec of scratch differs from nfs1's"},
	}}
	addr, tok := serveServices(t, st)
	out, err := runCLI(t, "services", "--admin", addr)
	if err != nil {
		t.Fatal(err)
	}
	want := `SERVICE  ADDRESS       OWNER  EPOCH  STATE    CONFLICT
home     10.0.0.50/24  nfs1   4      serving  -
scratch  10.0.0.51/24  -      0      conflict nfs2's spec of scratch differs from nfs1's
`
	if normalize(out) != normalize(want) {
		t.Fatalf("nsmd services:\n%s\nwant:\n%s", out, want)
	}
	// The node that runs a service adds what it does with it, below the
	// same table.
	st.list[0].Run = &admin.ServiceRun{Node: "nfs1", Phase: admin.RunServing, Epoch: 4, LeaseSeconds: 2.345,
		Proof: &admin.ServiceProof{Node: "nfs2", By: "clean", Seconds: 0.12}}
	st.list[0].Local = &admin.ServiceLocal{Node: "nfs1", Phase: "serving", Epoch: 4, AddressHeld: true,
		LastHook: &admin.ServiceHook{Hook: "on_leader", Reason: "start", Epoch: 4, At: at}}
	st.list[1].Local = &admin.ServiceLocal{Node: "nfs1", Phase: "failed",
		LastHook: &admin.ServiceHook{Hook: "on_follower", Reason: "start-of-process", Err: "exit status 32", At: at}}
	// home's own NFSv4 tracking and grace (service namespaces).
	st.list[0].Local.NFSv4 = &admin.ServiceNFSv4{Tracking: true, Pipe: &admin.Pipe{State: "open"}, CurrentEpoch: 5, RecoveryEpoch: 4, Clients: 1, Reclaimable: 3, Reclaimed: 1}
	st.list[0].Local.Grace = &admin.Grace{SMState: 9, Started: at,
		NLM:   admin.GraceManager{Expected: 1, Back: 1, Ended: &admin.GraceEnd{At: at, Reason: "all_reclaimed"}, Seconds: 2},
		NFSv4: admin.GraceManager{Expected: 3, Back: 1, Missing: []string{"c2", "c3"}}}
	out, err = runCLI(t, "services", "--admin", addr)
	if err != nil {
		t.Fatal(err)
	}
	want += `
on this node (nfs1):
SERVICE  RUN      EPOCH  LEASE  PREVIOUS SERVER                 ADDRESS   LAST HOOK
home     serving  4      2.3s   nfs2 stopped (clean, 0.1s)      held      on_leader start (epoch 4) ok at 2025-01-02T03:04:05Z
scratch  failed   -      -      -                               not held  on_follower start-of-process (epoch 0) FAILED: exit status 32 at 2025-01-02T03:04:05Z
home nfsv4: tracking served (pipe open), epoch 5, 1 client records, in grace: 1 of 3 clients reclaimed
home grace: sm_state 9: lockd ended after 2.0s (all_reclaimed, 1 of 1 clients back); nfsd open (1 of 3 clients back; waiting for 2, names shown only to an operator)
`
	if normalize(out) != normalize(want) {
		t.Fatalf("nsmd services on the serving node:\n%s\nwant:\n%s", out, want)
	}
	// An operator is told whom a service's grace waits for.
	out, err = runCLI(t, "services", "--admin", addr, "--token-file", tok)
	if err != nil || !strings.Contains(out, "home grace: sm_state 9: lockd ended after 2.0s (all_reclaimed, 1 of 1 clients back); nfsd open (1 of 3 clients back; waiting for c2, c3)") {
		t.Fatalf("nsmd services as an operator: %v\n%s", err, out)
	}
	out, err = runCLI(t, "services", "--admin", addr, "--json")
	var list []admin.ServiceStatus
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 2 || list[0].LastMove == nil || list[0].Run == nil || list[1].Local == nil {
		t.Fatalf("nsmd services --json: %v\n%s", err, out)
	}

	// A move needs the token, and --to.
	if out, err := runCLI(t, "move", "home", "--to", "nfs2", "--admin", addr, "--local-token-file", ""); err == nil || !strings.Contains(err.Error(), "admin token") {
		t.Fatalf("move without the token: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "move", "home", "--admin", addr, "--token-file", tok); err == nil || !strings.Contains(err.Error(), "--to NODE is required") {
		t.Fatalf("move without --to: %v", err)
	}
	if _, err := runCLI(t, "move", "nope", "--to", "nfs2", "--admin", addr, "--token-file", tok); err == nil || !strings.Contains(err.Error(), "no such service") {
		t.Fatalf("move of an unknown service: %v", err)
	}
	out, err = runCLI(t, "move", "home", "--to", "nfs2", "--admin", addr, "--token-file", tok)
	if err != nil || strings.TrimSpace(out) != "service home moved to nfs2" {
		t.Fatalf("move: %v\n%s", err, out)
	}
	if len(st.moves) != 1 || st.moves[0] != "home>nfs2" {
		t.Fatalf("the node saw moves %v", st.moves)
	}

	// Without services: says so, and prints no table.
	st.list = nil
	out, err = runCLI(t, "services", "--admin", addr)
	if err != nil || !strings.Contains(out, "no services configured") {
		t.Fatalf("no services: %v\n%s", err, out)
	}
}

// normalize collapses runs of spaces (the table's padding).
func normalize(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// nsmd agent --help says where services: is set: the file only.
func TestAgentHelpSaysServicesAreFileOnly(t *testing.T) {
	out, err := runCLI(t, "agent", "--help")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, config.ServicesHelp) {
		t.Fatalf("agent --help does not say where services: is set:\n%s", out)
	}
}
