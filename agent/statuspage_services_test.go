package agent

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
)

// pageHarness runs the status page's script (app.js, as embedded) under
// node with a minimal stand-in for the browser's DOM and fetch: fetch
// answers the overview given, once; the script's first render is then
// read back as the text of the services section's rows and whether the
// section is hidden. The stand-in is the test's, the script is the one
// the binary serves.
const pageHarness = `
'use strict';
const fs = require('fs');
const [appPath, overviewPath] = process.argv.slice(2);
class Node {}
class Text extends Node { constructor(t) { super(); this.textContent = t; } }
class Elem extends Node {
  constructor(tag) { super(); this.tag = tag; this.children = []; this.className = ''; this.hidden = false; this.dataset = {}; this._text = ''; }
  append(...cs) { for (const c of cs) this.children.push(c); }
  replaceChildren(...cs) { this.children = cs; }
  addEventListener() {}
  get textContent() { return this.children.length ? this.children.map((c) => c.textContent).join('') : this._text; }
  set textContent(v) { this.children = []; this._text = String(v); }
  get tBodies() { if (!this._body) this._body = new Elem('tbody'); return [this._body]; }
}
const byId = new Map();
global.Node = Node;
global.document = {
  title: '',
  getElementById(id) { if (!byId.has(id)) byId.set(id, new Elem('div')); return byId.get(id); },
  createElement(tag) { return new Elem(tag); },
  createTextNode(t) { return new Text(t); },
};
const overview = JSON.parse(fs.readFileSync(overviewPath, 'utf8'));
let fetched = 0;
global.fetch = async () => { fetched++; return { ok: true, json: async () => overview }; };
global.setTimeout = () => 0; // no second poll
global.clearTimeout = () => {};
eval(fs.readFileSync(appPath, 'utf8')); // the page's script, as a browser runs it
setImmediate(() => setImmediate(() => {
  const sec = document.getElementById('services-section');
  const rows = document.getElementById('services').tBodies[0].children.map((tr) => tr.children.map((td) => td.textContent));
  const conn = document.getElementById('conn');
  process.stdout.write(JSON.stringify({ fetched, conn: conn.className, hidden: sec.hidden, rows }));
}));
`

type pageServices struct {
	Fetched int        `json:"fetched"`
	Conn    string     `json:"conn"`
	Hidden  bool       `json:"hidden"`
	Rows    [][]string `json:"rows"`
}

// renderPage runs the embedded app.js over o and returns what its
// services section shows.
func renderPage(t *testing.T, node string, o admin.Overview) pageServices {
	t.Helper()
	dir := t.TempDir()
	js, err := statusPageFiles.ReadFile("statuspage/app.js")
	if err != nil {
		t.Fatal(err)
	}
	ov, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"app.js": js, "overview.json": ov, "harness.js": []byte(pageHarness)}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(node, filepath.Join(dir, "harness.js"), filepath.Join(dir, "app.js"), filepath.Join(dir, "overview.json")).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var p pageServices
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatalf("harness output %q: %v", out, err)
	}
	if p.Fetched != 1 || p.Conn != "conn ok" {
		t.Fatalf("the page did not render an overview: %+v", p)
	}
	return p
}

// TestStatusPageListsServices: the status page shows a Services section
// with one row per service (where it runs, its epoch and state, what this
// node does with it: its run's phase, epoch and lease, the previous
// server's proof, the address, the last hook, its own NFSv4 tracking and
// grace; the last move, how the
// servers' specs differ) when the overview has services,
// and no section without them. It runs the page's own script under node
// (skipped where node is not installed).
func TestStatusPageListsServices(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node (JavaScript) is not installed: the page's script cannot run here")
	}
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	o := admin.Overview{
		Status:        admin.Status{NodeID: "nfs1", Role: "leader", LeaderID: "nfs1"},
		Registrations: admin.OverviewRegs{Rows: []admin.OverviewReg{}},
		Now:           at,
	}
	// Without services: no section (the control: the same page, hidden).
	if p := renderPage(t, node, o); !p.Hidden || len(p.Rows) != 0 {
		t.Fatalf("no services: section hidden=%v rows %v, want hidden and empty", p.Hidden, p.Rows)
	}
	o.Services = []admin.ServiceStatus{
		{ID: "home", Address: "10.0.0.50/24", Owner: "nfs1", Epoch: 4, State: admin.ServiceServing,
			DeclaredBy: map[string]string{"nfs1": "aa", "nfs2": "aa"},
			LastMove:   &admin.ServiceMove{From: "nfs2", To: "nfs1", Reason: "planned", At: at, Epoch: 4},
			Run:        &admin.ServiceRun{Node: "nfs1", Phase: admin.RunServing, Epoch: 4, LeaseSeconds: 2.345, Proof: &admin.ServiceProof{Node: "nfs2", By: "clean"}},
			Local: &admin.ServiceLocal{Node: "nfs1", Phase: "serving", Epoch: 4, AddressHeld: true,
				LastHook: &admin.ServiceHook{Hook: "on_leader", Reason: "start", Epoch: 4, At: at},
				NFSv4:    &admin.ServiceNFSv4{Tracking: true, Pipe: &admin.Pipe{State: "open"}, CurrentEpoch: 5, RecoveryEpoch: 4, Clients: 1, Reclaimable: 3, Reclaimed: 1},
				Grace: &admin.Grace{Started: at, NLM: admin.GraceManager{Expected: 1, Back: 1, Ended: &admin.GraceEnd{At: at, Reason: "all_reclaimed"}, Seconds: 2},
					NFSv4: admin.GraceManager{Expected: 3, Back: 1, MissingHidden: 2}}}},
		{ID: "proj", Address: "10.0.0.52/24", Owner: "nfs2", Epoch: 2, State: admin.ServicePlaced,
			Local: &admin.ServiceLocal{Node: "nfs1", Phase: "failed", Epoch: 1,
				LastHook: &admin.ServiceHook{Hook: "on_follower", Reason: "stop", Epoch: 1, Err: "exit status 32", At: at}}},
		{ID: "scratch", Address: "10.0.0.51/24", State: admin.ServiceConflict,
			DeclaredBy: map[string]string{"nfs2": "bb", "nfs1": "aa", "w": ""},
			Conflict:   "nfs2's spec of scratch differs from nfs1's"},
	}
	p := renderPage(t, node, o)
	want := [][]string{
		{"home", "10.0.0.50/24", "nfs1", "4", "serving",
			"serving at epoch 4 · lease 2.3 s · nfs2 proven stopped (clean) · address held · on_leader start ok at 2025-01-02 03:04:05Z · " +
				"NFSv4 tracking pipe open, 1 client records, 1 of 3 reclaimed · grace since 2025-01-02 03:04:05Z: lockd ended after 2.0 s (all_reclaimed, 1 of 1 clients back), " +
				"nfsd open (1 of 3 clients back, waiting for 2 not named (names are shown only to an operator: the admin token below))",
			"nfs2 → nfs1 (planned) at 2025-01-02 03:04:05Z, epoch 4", ""},
		{"proj", "10.0.0.52/24", "nfs2", "2", "placed", "failed · address not held · on_follower stop FAILED: exit status 32 at 2025-01-02 03:04:05Z", "", ""},
		{"scratch", "10.0.0.51/24", "–", "0", "conflict", "", "", "nfs2's spec of scratch differs from nfs1's · nfs1 aa, nfs2 bb, w does not declare it"},
	}
	if p.Hidden || !reflect.DeepEqual(p.Rows, want) {
		t.Fatalf("services: hidden=%v rows\n%q\nwant\n%q", p.Hidden, p.Rows, want)
	}
}
