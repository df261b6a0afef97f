package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nsmd/nsmd/fsm"
	"github.com/nsmd/nsmd/internal/testutil"
)

// fakeStore is a node kept in a map: what the handlers need, nothing else.
type fakeStore struct {
	mu       sync.Mutex
	regs     map[fsm.MonID]fsm.Registration
	state    int32
	leader   string
	transfer error
	crashed  chan struct{}
	// services: the list GET /v1/services returns; moves: every
	// MoveService call ("service>to"), answered moveErr.
	services []ServiceStatus
	moves    []string
	moveErr  error
}

func newFakeStore() *fakeStore {
	return &fakeStore{regs: map[fsm.MonID]fsm.Registration{}, state: 3, leader: "n1", crashed: make(chan struct{})}
}

func (f *fakeStore) Status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Status{NodeID: "n1", Role: "leader", LeaderID: f.leader, SMState: f.state, Registrations: len(f.regs),
		LastHookFailure: &HookFailure{Hook: "on_leader", Event: "leader", Err: "exit status 1", Output: "exportfs: /srv/secret: No such file"},
		Grace: &Grace{SMState: f.state, Settle: "3s",
			NLM: GraceManager{Expected: 3, Back: 1, Missing: []string{"client-a.example", "10.9.8.7"}},
			NFSv4: GraceManager{Expected: 2, Back: 0, Missing: []string{"Linux NFSv4.2 client-b", "Linux NFSv4.1 client-c"},
				LastSeen: map[string]time.Time{"Linux NFSv4.2 client-b": time.Unix(50, 0).UTC()}}}}
}

// clientNames are the client names the fake store's status carries.
var clientNames = []string{"client-a.example", "10.9.8.7", "client-b", "client-c"}

func (f *fakeStore) Members() []Member {
	return []Member{{ID: "n1", State: "alive", Suffrage: "Voter", Leader: true, Role: "leader"}}
}

func (f *fakeStore) ServiceRegistrations(service string, after fsm.MonID, limit int, monName string) ([]fsm.Registration, error) {
	if service != "home" {
		return nil, fmt.Errorf("%w %q", ErrUnknownService, service)
	}
	return f.Registrations(after, limit, monName), nil
}

func (f *fakeStore) Registrations(after fsm.MonID, limit int, monName string) []fsm.Registration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fsm.Registration
	for _, g := range f.regs {
		if g.ID.Compare(after) > 0 && (monName == "" || g.ID.MonName == monName) {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b fsm.Registration) int { return a.ID.Compare(b.ID) })
	return out[:min(limit, len(out))]
}

func (f *fakeStore) NFSv4Clients() V4ClientPage {
	return V4ClientPage{CurrentEpoch: 2, Clients: []V4ClientJSON{V4ClientRow("current", fsm.V4Client{Name: "c\x00", PrincHash: "\x01"})}}
}

func (f *fakeStore) LastTakeover() fsm.Takeover {
	return fsm.Takeover{Node: "n1", At: time.Unix(100, 0)}
}

func (f *fakeStore) TransferLeadership(to string) (string, error) {
	if f.transfer != nil {
		return "", f.transfer
	}
	return "n2", nil
}

func (f *fakeStore) Import(_ context.Context, regs []fsm.Registration, state int32) (int32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range regs {
		f.regs[g.ID] = g
	}
	f.state = max(f.state, state) + 2
	return f.state, nil
}

func (f *fakeStore) Ready(context.Context) error { return nil }

func (f *fakeStore) Crash() { close(f.crashed) }

// serve starts the handlers of f with a token-protected guard.
func serve(t *testing.T, f *fakeStore, crash bool) (*httptest.Server, string, *prometheus.Registry) {
	t.Helper()
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	g, err := NewGuard(GuardConfig{TokenFile: tokFile, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewHandler(f, HandlerConfig{NodeID: "n1", DrillCrash: crash, Guard: g, Metrics: reg}))
	t.Cleanup(srv.Close)
	return srv, tokFile, reg
}

func TestGuardTokenRulesAndShortToken(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tooshort\n"), 0o600)
	if _, err := NewGuard(GuardConfig{TokenFile: short}); err == nil || !strings.Contains(err.Error(), "want at least 16") {
		t.Fatalf("short token: %v", err)
	}
	req := httptest.NewRequest("POST", "/v1/leadership/transfer", nil)
	for _, c := range []struct {
		cfg  GuardConfig
		want bool
	}{
		{GuardConfig{Open: true}, true},             // loopback-only or insecure, no TLS, no token
		{GuardConfig{}, false},                      // neither
		{GuardConfig{TLS: true, Open: true}, false}, // TLS: a certificate or the token
	} {
		g, err := NewGuard(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := g.Authorized(req); got != c.want {
			t.Errorf("%+v: authorized %v, want %v", c.cfg, got, c.want)
		}
	}
}

func TestPrivilegedEndpointsNeedTheTokenAndCountRefusals(t *testing.T) {
	f := newFakeStore()
	srv, tokFile, reg := serve(t, f, false)
	anon := &Client{Addr: srv.URL}
	if _, err := anon.Registrations(context.Background(), 10, "", ""); err == nil ||
		err.Error() != "GET /v1/registrations?limit=10: GET /v1/registrations needs a client certificate of the cluster CA (--tls-cert/--tls-key) or the admin token (--token-file)" {
		t.Fatalf("registrations without token: %v", err)
	}
	if _, err := anon.Status(context.Background()); err != nil {
		t.Fatalf("status is a read: %v", err)
	}
	mfs, _ := reg.Gather()
	if len(mfs) != 1 || mfs[0].GetName() != "nsmd_admin_denied_total" || mfs[0].GetMetric()[0].GetCounter().GetValue() != 1 {
		t.Fatalf("refusal not counted: %v", mfs)
	}
	op := &Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}
	if _, err := op.Registrations(context.Background(), 10, "", ""); err != nil {
		t.Fatalf("registrations with the token: %v", err)
	}
}

// An imported sm_state outside 0…fsm.MaxImportedState is refused before
// anything is imported: near the end of the int32 range the takeovers
// that follow would run out of new states.
func TestImportRefusesAStateOutsideItsRange(t *testing.T) {
	f := newFakeStore()
	srv, tokFile, _ := serve(t, f, false)
	c := &Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}
	ctx := context.Background()
	row := RegistrationJSON{MonName: "10.0.0.1", MyName: "nfs1", MyProg: 100021, MyVers: 3, MyProc: 16, Priv: strings.Repeat("ab", 16), Callback: "127.0.0.1"}
	for _, st := range []int32{2147483646, fsm.MaxImportedState + 1, -1} {
		_, err := c.Import(ctx, ImportRequest{State: st, Registrations: []RegistrationJSON{row}})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("state %d is outside 0…%d", st, fsm.MaxImportedState)) {
			t.Fatalf("import of state %d: %v", st, err)
		}
	}
	// A registration whose callback is not the lock manager's (rpc.statd's SM_MON rule).
	other := row
	other.MyProg, other.MyProc = 100003, 1
	if _, err := c.Import(ctx, ImportRequest{State: 3, Registrations: []RegistrationJSON{other}}); err == nil || !strings.Contains(err.Error(), "my_prog 100003 my_proc 1") {
		t.Fatalf("import of a non-NLM callback: %v", err)
	}
	f.mu.Lock()
	n := len(f.regs)
	f.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d registrations imported by refused imports", n)
	}
	if res, err := c.Import(ctx, ImportRequest{State: fsm.MaxImportedState, Registrations: []RegistrationJSON{row}}); err != nil || res.Imported != 1 {
		t.Fatalf("import of the largest state: %+v %v", res, err)
	}
}

func TestImportValidatesRowsAndRegistrationsPage(t *testing.T) {
	f := newFakeStore()
	srv, tokFile, _ := serve(t, f, false)
	c := &Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}
	ctx := context.Background()
	row := func(name string) RegistrationJSON {
		return RegistrationJSON{MonName: name, MyName: "nfs1", MyProg: 100021, MyVers: 3, MyProc: 16, Priv: strings.Repeat("ab", 16), Callback: "127.0.0.1"}
	}
	bad := row("10.0.0.9")
	bad.Priv = "abcd"
	if _, err := c.Import(ctx, ImportRequest{State: 41, Registrations: []RegistrationJSON{row("10.0.0.1"), bad}}); err == nil ||
		!strings.Contains(err.Error(), "registration 1: priv \"abcd\" is not 16 hex bytes") {
		t.Fatalf("import with a bad priv: %v", err)
	}
	var rows []RegistrationJSON
	for i := range 5 {
		rows = append(rows, row(fmt.Sprintf("10.0.0.%d", i+1)))
	}
	res, err := c.Import(ctx, ImportRequest{State: 41, Registrations: rows})
	if err != nil || res.Imported != 5 || res.SMState != 43 {
		t.Fatalf("import: %+v %v", res, err)
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		page, err := c.Registrations(ctx, 2, "", after)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Registrations {
			if r.Node != "n1" || len(r.Addrs) != 1 || r.Addrs[0] != r.MonName {
				t.Errorf("row %+v: want owner n1 (the receiving node) and its address", r)
			}
			got = append(got, r.MonName)
		}
		if page.Next == "" {
			if pages != 2 {
				t.Errorf("%d pages of 2 for 5 rows, want 3", pages+1)
			}
			break
		}
		after = page.Next
	}
	if want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}; !slices.Equal(got, want) {
		t.Errorf("paged %v, want %v", got, want)
	}
	if _, err := c.Get(ctx, "/v1/registrations?limit=0", nil); err == nil || !strings.Contains(err.Error(), "limit must be 1..10000") {
		t.Errorf("limit 0: %v", err)
	}
}

func TestTransferAnswersByKindOfError(t *testing.T) {
	f := newFakeStore()
	srv, tokFile, _ := serve(t, f, false)
	c := &Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}
	ctx := context.Background()
	body, err := c.Do(ctx, "POST", "/v1/leadership/transfer", nil, nil)
	if err != nil || string(body) != "{\n  \"leader_id\": \"n2\",\n  \"result\": \"transferred\"\n}\n" {
		t.Fatalf("transfer answer %q %v", body, err)
	}
	for _, c2 := range []struct {
		err  error
		code string
		msg  string
	}{
		{fmt.Errorf("%w (leader: %q)", ErrNotLeader, "n3"), "409", `this node is not the leader (leader: "n3")`},
		{BadRequest(errors.New("node w is a witness")), "400", "leadership transfer: node w is a witness"},
		{errors.New("timed out"), "500", "leadership transfer: timed out"},
	} {
		f.transfer = c2.err
		req, _ := http.NewRequest("POST", srv.URL+"/v1/leadership/transfer", nil)
		c.Auth.Authorize(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if fmt.Sprint(resp.StatusCode) != c2.code {
			t.Errorf("%v: %d, want %s", c2.err, resp.StatusCode, c2.code)
		}
		if _, err := c.TransferLeadership(ctx, "x"); err == nil || err.Error() != "POST /v1/leadership/transfer?to=x: "+c2.msg {
			t.Errorf("%v: client error %v, want the message %q", c2.err, err, c2.msg)
		}
	}
}

func TestCrashOnlyWithDrillCrash(t *testing.T) {
	f := newFakeStore()
	srv, tokFile, _ := serve(t, f, false)
	c := &Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}
	if _, err := c.Do(context.Background(), "POST", "/v1/drill/crash", nil, nil); err == nil || !strings.Contains(err.Error(), "drill_crash: false") {
		t.Fatalf("crash without drill_crash: %v", err)
	}
	srv2, tokFile2, _ := serve(t, f, true)
	c2 := &Client{Addr: srv2.URL, Auth: Auth{TokenFile: tokFile2}}
	var res CrashResult
	if _, err := c2.Do(context.Background(), "POST", "/v1/drill/crash", nil, &res); err != nil || res.NodeID != "n1" {
		t.Fatalf("crash: %+v %v", res, err)
	}
	select {
	case <-f.crashed:
	case <-time.After(5 * time.Second):
		t.Fatal("the answer went out but the node did not crash")
	}
}

func TestOverviewShowsRowsOnlyToOperatorsAndNeverPriv(t *testing.T) {
	f := newFakeStore()
	srv, tokFile, _ := serve(t, f, false)
	op := &Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}
	ctx := context.Background()
	if _, err := op.Import(ctx, ImportRequest{Registrations: []RegistrationJSON{{MonName: "client-a", MyName: "nfs1", MyProg: 100021, MyVers: 4, MyProc: 16, Priv: strings.Repeat("cd", 16), Callback: "127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	var o Overview
	raw, err := (&Client{Addr: srv.URL}).Get(ctx, "/v1/overview", &o)
	if err != nil {
		t.Fatal(err)
	}
	if r := o.Registrations; r.Total != 1 || len(r.Rows) != 0 || r.More != 1 || r.Hidden == "" || strings.Contains(string(raw), "client-a") {
		t.Errorf("anonymous overview: %s", raw)
	}
	if o.LastTakeover == nil || o.LastTakeover.Node != "n1" || len(o.Members) != 1 {
		t.Errorf("overview: %s", raw)
	}
	o = Overview{}
	if raw, err = op.Get(ctx, "/v1/overview", &o); err != nil {
		t.Fatal(err)
	}
	if r := o.Registrations; len(r.Rows) != 1 || r.Rows[0].MonName != "client-a" || r.More != 0 || strings.Contains(string(raw), "cdcd") {
		t.Errorf("operator overview: %s", raw)
	}
	var page V4ClientPage
	if _, err := op.Get(ctx, "/v1/nfsv4/clients", &page); err != nil || page.Clients[0].Name != `"c\x00"` || page.Clients[0].PrincHash != "01" {
		t.Errorf("nfsv4 clients: %+v %v", page, err)
	}
}

// A privileged request a browser could have been made to send is refused
// before the credential is even looked at: a cross-site write (Origin,
// Sec-Fetch-Site), a write whose body is not JSON (an HTML form's), and,
// on a plaintext API, a Host that is a name (DNS rebinding). nsmd's own
// client passes every check.
func TestPrivilegedRequestsFromBrowsersAreRefused(t *testing.T) {
	f := newFakeStore()
	srv, tokFile, reg := serve(t, f, false)
	tok, _ := os.ReadFile(tokFile)
	do := func(method, path, host, ctype string, body string, hdr map[string]string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if body == "" {
			req.Body, req.ContentLength = nil, 0
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if host != "" {
			req.Host = host
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	imp := `{"state": 3, "registrations": []}`
	cases := []struct {
		name, method, path, host, ctype, body string
		hdr                                   map[string]string
		want                                  int
	}{
		{"cross-site form post", "POST", "/v1/import", "", "text/plain", imp, map[string]string{"Origin": "http://evil.example"}, 403},
		{"fetch from another site", "POST", "/v1/leadership/transfer", "", "", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"form body without origin", "POST", "/v1/import", "", "application/x-www-form-urlencoded", imp, nil, 415},
		{"no content type", "POST", "/v1/import", "", "", imp, nil, 415},
		{"rebound host name, read", "GET", "/v1/registrations", "evil.example:8024", "", "", nil, 403},
		{"rebound host name, write", "POST", "/v1/import", "rebind.evil.example", "application/json", imp, nil, 403},
		{"json import", "POST", "/v1/import", "", "application/json; charset=utf-8", imp, nil, 200},
		{"localhost", "GET", "/v1/registrations", "localhost:8024", "", "", nil, 200},
		{"ipv6 literal", "GET", "/v1/registrations", "[::1]:8024", "", "", nil, 200},
		{"same-origin fetch", "POST", "/v1/import", "", "application/json", imp, map[string]string{"Sec-Fetch-Site": "same-origin"}, 200},
	}
	for _, c := range cases {
		if got, body := do(c.method, c.path, c.host, c.ctype, c.body, c.hdr); got != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, got, body, c.want)
		}
	}
	if got := testutil.GatheredValue(t, reg, "nsmd_admin_denied_total", "path", "/v1/import"); got != 4 {
		t.Errorf("refused imports counted %v, want 4", got)
	}
	// nsmd's client: JSON body, no browser headers.
	c := &Client{Addr: srv.URL, Auth: Auth{TokenFile: tokFile}}
	if _, err := c.Import(context.Background(), ImportRequest{State: 5, Registrations: []RegistrationJSON{}}); err != nil {
		t.Fatalf("client import: %v", err)
	}
}

// The local token: created once with mode 0640 and kept across starts;
// the client sends it only to a loopback address and only when it can
// read it; a guard on it names the file in its refusal.
func TestLocalTokenIsCreatedOnceAndSentOnlyOnLoopback(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "admin.token")
	created, err := CreateLocalToken(path)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("token file mode %v (%v), want 0640", st.Mode().Perm(), err)
	}
	first, _ := os.ReadFile(path)
	if created, err := CreateLocalToken(path); err != nil || created {
		t.Fatalf("second start: created=%v err=%v, want the file kept", created, err)
	}
	if again, _ := os.ReadFile(path); string(again) != string(first) || len(strings.TrimSpace(string(first))) != 64 {
		t.Fatalf("token changed or malformed: %q then %q", first, again)
	}
	g, err := NewGuard(GuardConfig{TokenFile: path, LocalToken: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewHandler(newFakeStore(), HandlerConfig{NodeID: "n1", Guard: g}))
	defer srv.Close()
	anon := &Client{Addr: srv.URL}
	if _, err := anon.Registrations(context.Background(), 1, "", ""); err == nil || !strings.Contains(err.Error(), "needs the local admin token "+path) {
		t.Fatalf("without the token: %v", err)
	}
	local := &Client{Addr: srv.URL, Auth: Auth{LocalTokenFile: path}}
	if _, err := local.Registrations(context.Background(), 1, "", ""); err != nil {
		t.Fatalf("with the local token: %v", err)
	}
	// Not sent to another host (the request goes nowhere: only the header is checked).
	req := httptest.NewRequest("GET", "http://10.0.0.1:8024/v1/registrations", nil)
	if err := (&Auth{LocalTokenFile: path}).Authorize(req); err != nil || req.Header.Get("Authorization") != "" {
		t.Fatalf("local token sent to 10.0.0.1: %q %v", req.Header.Get("Authorization"), err)
	}
	// Unreadable or missing: skipped, the server's refusal says why.
	req = httptest.NewRequest("GET", "http://127.0.0.1:8024/v1/registrations", nil)
	if err := (&Auth{LocalTokenFile: path + ".missing"}).Authorize(req); err != nil || req.Header.Get("Authorization") != "" {
		t.Fatalf("missing local token: %q %v", req.Header.Get("Authorization"), err)
	}
}

// The last hook failure's output (it may say anything about the host) is
// in /v1/status for privileged callers only; others see that the hook
// failed, and how, without it.
func TestStatusShowsHookOutputOnlyToOperators(t *testing.T) {
	srv, tokFile, _ := serve(t, newFakeStore(), false)
	tok, err := os.ReadFile(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	get := func(token string) HookFailure {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/v1/status", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st Status
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.LastHookFailure == nil {
			t.Fatalf("status: %+v %v", st, err)
		}
		return *st.LastHookFailure
	}
	if f := get(""); f.Output != "" || f.Err == "" || f.Hook != "on_leader" {
		t.Fatalf("without credentials: %+v, want the failure without its output", f)
	}
	if f := get(strings.TrimSpace(string(tok))); f.Output == "" {
		t.Fatalf("with the token: %+v, want the output", f)
	}
}

// TestTimelineSummaryListsTheStepsReached: nsmd status's takeover line
// renders whatever steps the timeline has, from the election.
func TestTimelineSummaryListsTheStepsReached(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tl := Timeline{State: 7, Steps: []TimelineStep{
		{Name: "prev_leader_contact", Label: "previous leader (or witness) last heard", At: at.Add(-300 * time.Millisecond)},
		{Name: "elected", Label: "elected", At: at},
		{Name: "vip", Label: "VIP taken", At: at.Add(15 * time.Millisecond)},
		{Name: "zz_newer", Label: "zz_newer", At: at.Add(2 * time.Second)},
	}}
	want := "sm_state 7: previous leader (or witness) last heard -300ms, elected +0ms, VIP taken +15ms, zz_newer +2000ms"
	if got := TimelineSummary(&tl); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if got := TimelineSummary(nil); got != "this node has not taken over since it started" {
		t.Fatalf("no takeover: %s", got)
	}
}

// TestClientNamesAreShownOnlyToOperators: /v1/status and /v1/overview
// name the clients grace waits for (and when each was last seen) only to
// an operator, as the overview's registrations; anyone else gets the
// counts. The control: the operator's answer has every name, so the
// reader's check looks where the names would be.
func TestClientNamesAreShownOnlyToOperators(t *testing.T) {
	srv, tokFile, _ := serve(t, newFakeStore(), false)
	tok, err := os.ReadFile(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, token string) (string, Status) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %v", path, resp.StatusCode, err)
		}
		var st Status
		if path == "/v1/overview" {
			var o Overview
			err = json.Unmarshal(body, &o)
			st = o.Status
		} else {
			err = json.Unmarshal(body, &st)
		}
		if err != nil || st.Grace == nil {
			t.Fatalf("%s: %s %v", path, body, err)
		}
		return string(body), st
	}
	for _, path := range []string{"/v1/status", "/v1/overview"} {
		t.Run(path+"/reader", func(t *testing.T) {
			body, st := get(path, "")
			for _, name := range clientNames {
				if strings.Contains(body, name) {
					t.Errorf("an unprivileged reader sees the client name %q:\n%s", name, body)
				}
			}
			if strings.Contains(body, "/srv/secret") {
				t.Errorf("an unprivileged reader sees the hook's output:\n%s", body)
			}
			if strings.Contains(body, "last_seen") || strings.Contains(body, `"missing"`) {
				t.Errorf("an unprivileged reader sees missing/last_seen:\n%s", body)
			}
			g := st.Grace
			if g.NLM.Expected != 3 || g.NLM.Back != 1 || g.NLM.MissingHidden != 2 ||
				g.NFSv4.Expected != 2 || g.NFSv4.MissingHidden != 2 {
				t.Errorf("counts: nlm %+v nfsv4 %+v, want expected/back kept and 2 names hidden each", g.NLM, g.NFSv4)
			}
			if sum := GraceSummary(g); !strings.Contains(sum, "waiting for 2, names shown only to an operator") {
				t.Errorf("nsmd status line for a reader: %s", sum)
			}
		})
		t.Run(path+"/operator", func(t *testing.T) {
			body, st := get(path, strings.TrimSpace(string(tok)))
			for _, name := range append(clientNames, "/srv/secret") {
				if !strings.Contains(body, name) {
					t.Errorf("an operator does not see the client name %q:\n%s", name, body)
				}
			}
			if st.Grace.NFSv4.LastSeen["Linux NFSv4.2 client-b"].IsZero() || st.Grace.NLM.MissingHidden != 0 {
				t.Errorf("operator's grace: %+v", st.Grace)
			}
		})
	}
}

// nsmd status's fence line says when a pause of this VM is not covered,
// and says nothing of it otherwise (the control).
func TestFenceSummarySaysAPauseIsNotCovered(t *testing.T) {
	f := Fence{Mode: "watchdog", Hypervisor: "cpuinfo hypervisor flag", PauseUncovered: true}
	if got := f.Summary(); !strings.Contains(got, "a VM (cpuinfo hypervisor flag) fenced by its watchdog alone: a PAUSE of it is NOT COVERED") {
		t.Errorf("Summary = %q", got)
	}
	f = Fence{Mode: "watchdog+agent", Hypervisor: "cpuinfo hypervisor flag"}
	if got := f.Summary(); strings.Contains(got, "PAUSE") {
		t.Errorf("control: with a fence agent, Summary = %q", got)
	}
}

// GET /v1/registrations?service=S lists that service's registrations; an
// unknown service is 404, and without service the node's own are listed.
func TestRegistrationsOfAService(t *testing.T) {
	f := newFakeStore()
	f.regs[fsm.MonID{MonName: "c1"}] = fsm.Registration{ID: fsm.MonID{MonName: "c1"}}
	srv, tokFile, _ := serve(t, f, false)
	tok, _ := os.ReadFile(tokFile)
	for q, want := range map[string]int{"service=home": 200, "service=nope": 404, "": 200} {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/registrations?"+q, nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("?%s: %d, want %d", q, resp.StatusCode, want)
		}
	}
}
