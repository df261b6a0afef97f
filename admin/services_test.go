package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func (f *fakeStore) Services() ([]ServiceStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.services), nil
}

func (f *fakeStore) MoveService(_ context.Context, service, to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.moves = append(f.moves, service+">"+to)
	return f.moveErr
}

func exampleServices() []ServiceStatus {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return []ServiceStatus{
		{ID: "home", Address: "10.0.0.50/24", Owner: "nfs1", Epoch: 4, State: ServiceServing, Fingerprint: "832063574c84a0fe",
			DeclaredBy: map[string]string{"nfs1": "832063574c84a0fe", "nfs2": "832063574c84a0fe"},
			LastMove:   &ServiceMove{From: "nfs2", To: "nfs1", Reason: "planned", At: at, Epoch: 4}},
		{ID: "scratch", Address: "10.0.0.51/24", State: ServiceConflict, Fingerprint: "1111111111111111",
			DeclaredBy: map[string]string{"nfs1": "1111111111111111", "nfs2": "2222222222222222"},
			Conflict:   "nfs2's spec of scratch differs from nfs1's"},
	}
}

// GET /v1/services is a read: every reader gets the whole list (it names
// no client), and an empty list is [], never null.
func TestServicesListIsForEveryReader(t *testing.T) {
	f := newFakeStore()
	srv, tokFile, _ := serve(t, f, false)
	anon := &Client{Addr: srv.URL}
	body, err := anon.Get(context.Background(), "/v1/services", nil)
	if err != nil || strings.TrimSpace(string(body)) != "[]" {
		t.Fatalf("no services: %q %v, want []", body, err)
	}
	f.services = exampleServices()
	got, err := anon.Services(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	op, err := (&Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}).Services(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, exampleServices()) || !reflect.DeepEqual(op, got) {
		t.Fatalf("reader got %+v, operator %+v, want %+v", got, op, exampleServices())
	}
}

// A service's failed hook output (local.last_failure.output) is an
// operator's, in GET /v1/services and in the overview, as the node's own
// last hook failure in /v1/status; the rest of the run and local details
// are everyone's, and the store's list is not changed for the next
// reader.
func TestServicesHookOutputOnlyToOperators(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	f := newFakeStore()
	f.services = exampleServices()
	f.services[0].Run = &ServiceRun{Node: "nfs1", Phase: RunServing, Epoch: 4, LeaseSeconds: 2.5, Proof: &ServiceProof{Node: "nfs2", By: "clean"}}
	f.services[0].Local = &ServiceLocal{Node: "nfs1", Phase: "serving", Epoch: 4, AddressHeld: true,
		LastHook:    &ServiceHook{Hook: "on_leader", Reason: "start", Epoch: 4, At: at},
		LastFailure: &HookFailure{Hook: "on_follower", Event: "follower", Reason: "stop", At: at, Err: "exit status 32", Output: "umount: /srv/home: target is busy"}}
	srv, tokFile, _ := serve(t, f, false)
	ctx := context.Background()
	anon := &Client{Addr: srv.URL}
	op := &Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}
	for _, c := range []struct {
		name       string
		cl         *Client
		wantOutput string
	}{{"reader", anon, ""}, {"operator", op, "umount: /srv/home: target is busy"}, {"reader again", anon, ""}} {
		list, err := c.cl.Services(ctx)
		if err != nil || len(list) != 2 || list[0].Local == nil || list[0].Local.LastFailure == nil || list[0].Run == nil {
			t.Fatalf("%s: %+v %v", c.name, list, err)
		}
		if got := list[0].Local.LastFailure.Output; got != c.wantOutput {
			t.Errorf("%s: GET /v1/services hook output %q, want %q", c.name, got, c.wantOutput)
		}
		if l := list[0].Local; l.LastFailure.Err != "exit status 32" || !l.AddressHeld || l.LastHook == nil || *list[0].Run.Proof != (ServiceProof{Node: "nfs2", By: "clean"}) {
			t.Errorf("%s: details lost: run %+v local %+v", c.name, list[0].Run, l)
		}
		var o Overview
		if _, err := c.cl.Get(ctx, "/v1/overview", &o); err != nil || len(o.Services) != 2 || o.Services[0].Local == nil {
			t.Fatalf("%s: overview %+v %v", c.name, o.Services, err)
		}
		if got := o.Services[0].Local.LastFailure.Output; got != c.wantOutput {
			t.Errorf("%s: overview hook output %q, want %q", c.name, got, c.wantOutput)
		}
	}
}

// POST /v1/services/move is privileged (as a leadership transfer), needs
// both parameters, and maps the store's errors to their statuses.
func TestMoveServiceIsPrivilegedAndChecked(t *testing.T) {
	f := newFakeStore()
	srv, tokFile, _ := serve(t, f, false)
	ctx := context.Background()
	if _, err := (&Client{Addr: srv.URL}).MoveService(ctx, "home", "nfs2"); err == nil || !strings.Contains(err.Error(), "needs a client certificate") {
		t.Fatalf("move without the token: %v", err)
	}
	if len(f.moves) != 0 {
		t.Fatalf("a refused request reached the store: %v", f.moves)
	}
	op := &Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}
	res, err := op.MoveService(ctx, "home", "nfs2")
	if err != nil || res != (ServiceMoveResult{Result: "moved", Service: "home", To: "nfs2"}) {
		t.Fatalf("move: %+v %v", res, err)
	}
	if !slices.Equal(f.moves, []string{"home>nfs2"}) {
		t.Fatalf("store saw %v", f.moves)
	}
	for _, c := range []struct {
		query string
		err   error
		code  int
		want  string
	}{
		{"service=home", nil, http.StatusBadRequest, "both service and to are required"},
		{"to=nfs2", nil, http.StatusBadRequest, "both service and to are required"},
		{"service=home&to=nfs2", ErrNoServices, http.StatusBadRequest, "services are not configured"},
		{"service=x&to=nfs2", fmt.Errorf("%w: x", ErrUnknownService), http.StatusBadRequest, "no such service: x"},
		{"service=home&to=w", BadRequest(errors.New("w is a witness")), http.StatusBadRequest, "w is a witness"},
		{"service=home&to=nfs2", fmt.Errorf("%w (leader: \"nfs1\")", ErrNotLeader), http.StatusConflict, "not the leader"},
		{"service=home&to=nfs2", errors.New("raft: timeout"), http.StatusInternalServerError, "raft: timeout"},
	} {
		f.mu.Lock()
		f.moveErr = c.err
		f.mu.Unlock()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/services/move?"+c.query, nil)
		if err := op.Auth.Authorize(req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e ErrorBody
		json.Unmarshal(b, &e)
		if resp.StatusCode != c.code || !strings.Contains(e.Error, c.want) {
			t.Errorf("%s (store: %v): %d %q, want %d and %q", c.query, c.err, resp.StatusCode, e.Error, c.code, c.want)
		}
	}
}

// The status page's overview carries the services when there are some,
// and no services key at all when there are none.
func TestOverviewCarriesServicesOnlyWhenThereAreSome(t *testing.T) {
	f := newFakeStore()
	srv, _, _ := serve(t, f, false)
	anon := &Client{Addr: srv.URL}
	body, err := anon.Get(context.Background(), "/v1/overview", nil)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["services"]; ok {
		t.Fatalf("overview without services has a services key: %s", raw["services"])
	}
	f.services = exampleServices()
	var o Overview
	if _, err := anon.Get(context.Background(), "/v1/overview", &o); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o.Services, exampleServices()) {
		t.Fatalf("overview services %+v", o.Services)
	}
}

func TestServicesSummary(t *testing.T) {
	got := ServicesSummary([]ServiceStatus{
		{ID: "home", Owner: "nfs1", Epoch: 4, State: ServicePlaced},
		{ID: "scratch", Epoch: 2, State: ServiceConflict, Conflict: "the members' specs of scratch differ"},
	})
	want := "home on nfs1 (epoch 4, placed); scratch on - (epoch 2, conflict): the members' specs of scratch differ"
	if got != want {
		t.Errorf("ServicesSummary:\n got %s\nwant %s", got, want)
	}
}

// The names of the clients a service's grace waits for (local.grace) are
// an operator's, as the node's grace's in /v1/status: a reader gets
// their number; the counts are everyone's, and the list is not changed.
func TestServiceGraceNamesOnlyToOperators(t *testing.T) {
	list := []ServiceStatus{{ID: "a", Local: &ServiceLocal{Node: "n1",
		NFSv4: &ServiceNFSv4{Tracking: true, RecoveryEpoch: 2, Reclaimable: 2, Reclaimed: 1},
		Grace: &Grace{NLM: GraceManager{Expected: 1, Missing: []string{"10.0.0.7"}},
			NFSv4: GraceManager{Expected: 2, Back: 1, Missing: []string{"Linux NFSv4.2 c1"}}}}}}
	if got := ServicesForReader(list, true)[0].Local.Grace.NFSv4.Missing; !slices.Equal(got, []string{"Linux NFSv4.2 c1"}) {
		t.Errorf("operator: missing %q", got)
	}
	r := ServicesForReader(list, false)[0].Local
	if g := r.Grace; len(g.NFSv4.Missing) != 0 || g.NFSv4.MissingHidden != 1 || g.NFSv4.Expected != 2 || g.NFSv4.Back != 1 ||
		len(g.NLM.Missing) != 0 || g.NLM.MissingHidden != 1 {
		t.Errorf("reader: grace %+v", g)
	}
	if r.NFSv4 == nil || r.NFSv4.Reclaimed != 1 {
		t.Errorf("reader: nfsv4 %+v", r.NFSv4)
	}
	if got := list[0].Local.Grace.NFSv4.Missing; len(got) != 1 {
		t.Errorf("the store's list changed: %q", got)
	}
}
