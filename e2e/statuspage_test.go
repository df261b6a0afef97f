package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
)

// The status page (GET / on the admin address) in a real headless
// Chromium (Debian package chromium, driven over the DevTools protocol by
// chromedp) against real nsmd processes on loopback.

// pageNode is one nsmd process of the status-page cluster.
type pageNode struct {
	id, admin, nsm string
	args           []string
	p              *proc
}

// startPageCluster starts 3 agents on 127.0.0.1-3 (free ports, loopback
// VIP vip) whose privileged admin calls need the bearer token.
func startPageCluster(t *testing.T, vip, token string) []*pageNode {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var nodes []*pageNode
	var join []string
	gossip := make([]int, 3)
	for i := range 3 {
		ip := fmt.Sprintf("127.0.0.%d", i+1)
		gossip[i] = freePort(t, ip)
		join = append(join, net.JoinHostPort(ip, strconv.Itoa(gossip[i])))
	}
	nsmPort := freePort(t, vip) // the VIP listener uses the NSM port: free on every address
	for i := range 3 {
		ip := fmt.Sprintf("127.0.0.%d", i+1)
		n := &pageNode{
			id:    fmt.Sprintf("page%d", i+1),
			admin: net.JoinHostPort(ip, strconv.Itoa(freePort(t, ip))),
			nsm:   net.JoinHostPort(ip, strconv.Itoa(nsmPort)),
		}
		n.args = []string{"agent", "--node-id", n.id, "--data-dir", t.TempDir(), "--bind", ip,
			"--raft-port", strconv.Itoa(freePort(t, ip)), "--gossip-port", strconv.Itoa(gossip[i]),
			"--nsm-addr", n.nsm, "--admin-addr", n.admin, "--rpcbind", "off",
			"--bootstrap-expect", "3", "--join", strings.Join(join, ","),
			"--vip", vip + "/32", "--vip-mode", "loopback", "--notify-name", "nfs.test", "--notify-window", "1m",
			"--admin-token-file", tokenFile}
		n.p = startNsmd(t, n.args...)
		nodes = append(nodes, n)
	}
	return nodes
}

// pageLeader waits until every node in nodes agrees on a leader among them
// that serves (odd sm_state above notState) and returns it.
func pageLeader(t *testing.T, nodes []*pageNode, notState int32) (*pageNode, admin.Status) {
	t.Helper()
	var lead *pageNode
	var ls admin.Status
	testutil.WaitForSeen(t, 15*time.Second, "a serving leader all nodes agree on", func() (bool, string) {
		var seen []string
		lead = nil
		agree := ""
		for _, n := range nodes {
			var s admin.Status
			if err := getJSON(n.admin, "/v1/status", &s); err != nil {
				return false, err.Error()
			}
			seen = append(seen, fmt.Sprintf("%s:%s leader=%q sm=%d", n.id, s.Role, s.LeaderID, s.SMState))
			if agree == "" {
				agree = s.LeaderID
			}
			if s.LeaderID == "" || s.LeaderID != agree {
				return false, strings.Join(seen, ", ")
			}
			if s.Role == "leader" && s.SMState%2 == 1 && s.SMState != notState {
				lead, ls = n, s
			}
		}
		return lead != nil && lead.id == agree, strings.Join(seen, ", ")
	})
	return lead, ls
}

// chromium returns the browser's path, or skips: the browser tests need a
// real one.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (Debian package chromium; .ci/run installs it): the status page is tested only in a real browser")
	return ""
}

// startBrowser starts headless Chromium with a fresh profile directory; at
// test end it is stopped and the test fails if any process of that profile
// (browser, renderer, zygote, GPU helper) is still alive.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	bin := chromium(t)
	profile := t.TempDir() // removed after the check below (cleanups run in reverse)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.UserDataDir(profile),
		chromedp.Flag("disable-dev-shm-usage", true))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run its sandbox as root
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc() // kills the browser process group and waits for it
		deadline := time.Now().Add(5 * time.Second)
		for {
			left := profileProcs(profile)
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("chromium processes still running after the test: %v", left)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium %s: %v", bin, err)
	}
	return bctx
}

// profileProcs lists the pids whose command line names profile.
func profileProcs(profile string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmd, []byte(profile)) {
			if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && bytes.Contains(st, []byte(") Z ")) {
				continue // a zombie is dead; its parent reaps it
			}
			pids = append(pids, pid)
		}
	}
	return pids
}

// openTab opens url in a new tab of the browser.
func openTab(t *testing.T, browser context.Context, url string) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	if err := chromedp.Do(tab, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	return tab
}

// evalJS evaluates expr in the tab (with a bound on the call itself).
func evalJS[T any](tab context.Context, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(tab, 5*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

// waitText waits until the text of element id satisfies ok.
func waitText(t *testing.T, tab context.Context, id string, timeout time.Duration, what string, ok func(string) bool) string {
	t.Helper()
	var text string
	testutil.WaitForSeen(t, timeout, what, func() (bool, string) {
		var err error
		if text, err = evalJS[string](tab, fmt.Sprintf("document.getElementById(%q).textContent", id)); err != nil {
			return false, err.Error()
		}
		return ok(text), fmt.Sprintf("#%s = %q", id, text)
	})
	return text
}

// TestStatusPageInChromium opens the status page of a 3-process cluster in
// headless Chromium: names a client chose are rendered as text, and after
// a SIGKILL of the leader the open page shows the new leader without a
// reload, while the dead node's page says it is unreachable, keeps
// retrying and recovers when that node is back.
func TestStatusPageInChromium(t *testing.T) {
	chromium(t) // skip before starting anything when there is no browser
	start := time.Now()
	const token = "page-test-token-0123456789abcdef"
	nodes := startPageCluster(t, "127.0.0.91", token)
	browser := startBrowser(t)
	lead, ls := pageLeader(t, nodes, 0)
	t.Logf("cluster up, leader %s sm_state %d after %v", lead.id, ls.SMState, time.Since(start).Round(time.Millisecond))
	var follower *pageNode
	for _, n := range nodes {
		if n != lead {
			follower = n
			break
		}
	}

	t.Run("HostileNamesAreText", func(t *testing.T) {
		// A name with '/' never gets in (rpc.statd's rule: it names a file):
		// the classic <script>…</script> payload is refused at SM_MON.
		c := dialNSM(t, "tcp", lead.nsm)
		call := func(mon nsm.Mon) nsm.SMStatRes {
			var res nsm.SMStatRes
			if err := c.Call(context.Background(), nsm.Program.Prog, nsm.Program.Vers, nsm.ProcMon, &mon, &res); err != nil {
				t.Fatalf("SM_MON %q: %v", mon.ID.MonName, err)
			}
			return res
		}
		my := nsm.MyID{MyName: "lockd", Prog: 100021, Vers: 3, Proc: 16}
		if res := call(nsm.Mon{ID: nsm.MonID{MonName: "<script>window.pwned=1</script>", My: my}}); res.Res != nsm.StatFail {
			t.Fatalf("SM_MON with mon_name <script>…</script> = %+v, want stat_fail", res)
		}
		// What does get in: a my_name through SM_MON (not resolved, only
		// checked for '/' and a leading '.'), and a mon_name through
		// POST /v1/import (statd migration: checked, not resolved).
		const myName = `<img src=x onerror="window.pwned=2">`
		const monName = `<img src=x onerror="window.pwned=1"><script>window.pwned=1`
		if res := call(nsm.Mon{ID: nsm.MonID{MonName: "127.0.0.92", My: nsm.MyID{MyName: myName, Prog: 100021, Vers: 3, Proc: 16}}}); res.Res != nsm.StatSucc {
			t.Fatalf("SM_MON with my_name %q = %+v, want stat_succ", myName, res)
		}
		body, _ := json.Marshal(admin.ImportRequest{Registrations: []admin.RegistrationJSON{{
			MonName: monName, MyName: "lockd", MyProg: 100021, MyVers: 3, MyProc: 16,
			Priv: strings.Repeat("ab", 16), Callback: "127.0.0.1",
		}}})
		req, _ := http.NewRequest("POST", "http://"+lead.admin+"/v1/import", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("import: %s", resp.Status)
		}

		// The payloads are live: put into a page as HTML, they run.
		probe := openTab(t, browser, "about:blank")
		if _, err := evalJS[int](probe, fmt.Sprintf(`document.body.innerHTML = %q + %q; 0`, monName, myName)); err != nil {
			t.Fatal(err)
		}
		testutil.WaitForSeen(t, 5*time.Second, "the payload to run when rendered as HTML (self-check)", func() (bool, string) {
			v, err := evalJS[string](probe, "String(window.pwned)")
			return err == nil && v != "undefined", fmt.Sprintf("window.pwned = %s (%v)", v, err)
		})

		// Without the token the page has the count and no names; the
		// operator types the token into the page's form and sees them.
		tab := openTab(t, browser, "http://"+follower.admin+"/")
		type cell struct{ Mon, My string }
		var rows []cell
		waitText(t, tab, "reg-count", 10*time.Second, "the registration count", func(s string) bool { return s == "(2)" })
		unpriv, err := evalJS[struct {
			Rows   int
			Hidden string
			Names  bool
		}](tab, `({Rows: document.querySelectorAll('#regs tbody tr').length,
			Hidden: document.getElementById('reg-hidden').hidden ? '' : document.getElementById('reg-hidden').textContent,
			Names: document.body.textContent.includes('pwned')})`)
		if err != nil {
			t.Fatal(err)
		}
		if unpriv.Rows != 0 || unpriv.Hidden == "" || unpriv.Names {
			t.Fatalf("page without the token: %+v, want no rows, a note why, no names", unpriv)
		}
		if err := chromedp.Do(tab, chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#token-form button"))); err != nil {
			t.Fatalf("type the token: %v", err)
		}
		// The status page shows the names as text, and nothing of them ran.
		testutil.WaitForSeen(t, 10*time.Second, "both registrations listed on the page", func() (bool, string) {
			var err error
			if rows, err = evalJS[[]cell](tab, `[...document.querySelectorAll('#regs tbody tr')].map(r => ({Mon: r.cells[0]?.textContent ?? '', My: r.cells[1]?.textContent ?? ''}))`); err != nil {
				return false, err.Error()
			}
			return len(rows) == 2, fmt.Sprintf("%q", rows)
		})
		var gotMon, gotMy bool
		for _, r := range rows {
			gotMon = gotMon || r.Mon == monName
			gotMy = gotMy || r.My == myName
		}
		if !gotMon || !gotMy {
			t.Errorf("rows %q: want mon_name %q and my_name %q as literal text", rows, monName, myName)
		}
		markup, err := evalJS[struct {
			Elements int
			Pwned    string
			Priv     bool
		}](tab, `({Elements: document.querySelectorAll('main img, main script, main svg').length,
			Pwned: String(window.pwned),
			Priv: document.body.textContent.includes('abababab')})`)
		if err != nil {
			t.Fatal(err)
		}
		if markup.Elements != 0 || markup.Pwned != "undefined" || markup.Priv {
			t.Errorf("page: %d img/script elements made of names, window.pwned = %v, priv cookie shown: %v", markup.Elements, markup.Pwned, markup.Priv)
		}
	})

	t.Run("EveryFieldRendersAsText", func(t *testing.T) {
		tab := openTab(t, browser, "http://"+lead.admin+"/")
		// The version is an object in the JSON: the page shows its string.
		self := waitText(t, tab, "self", 10*time.Second, "this node's line with its version", func(s string) bool { return strings.Contains(s, "version ") })
		if strings.Contains(self, "[object Object]") || strings.Contains(self, "undefined") {
			t.Errorf("#self = %q", self)
		}
		// These nodes run without a kernel nfsd: tracking off, and said so.
		for id, want := range map[string]string{"nfsv4": "not served (", "kgrace": "lockd ", "fence": "none (this node serves no storage)"} {
			got := waitText(t, tab, id, 10*time.Second, "#"+id, func(s string) bool { return s != "–" })
			if !strings.Contains(got, want) || strings.Contains(got, "[object Object]") || strings.Contains(got, "undefined") {
				t.Errorf("#%s = %q, want it to contain %q", id, got, want)
			}
		}
	})

	t.Run("FollowsFailoverWithoutReload", func(t *testing.T) {
		onFollower := openTab(t, browser, "http://"+follower.admin+"/")
		onLeader := openTab(t, browser, "http://"+lead.admin+"/")
		for _, tab := range []context.Context{onFollower, onLeader} {
			waitText(t, tab, "leader", 10*time.Second, "the page to show leader "+lead.id, func(s string) bool { return s == lead.id })
			// Set in the loaded document: a reload would lose it.
			if _, err := evalJS[int](tab, `window.e2eMarker = 'loaded-once'; 0`); err != nil {
				t.Fatal(err)
			}
		}

		// The state the cluster serves now (the import above raised it):
		// the next leader must serve a newer one.
		var pre admin.Status
		if err := getJSON(lead.admin, "/v1/status", &pre); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		lead.p.kill(syscall.SIGKILL)
		var rest []*pageNode
		for _, n := range nodes {
			if n != lead {
				rest = append(rest, n)
			}
		}
		next, ns := pageLeader(t, rest, pre.SMState)
		shown := waitText(t, onFollower, "leader", 15*time.Second, "the follower's page to show the new leader "+next.id,
			func(s string) bool { return s == next.id })
		t.Logf("page shows new leader %s %v after the SIGKILL", shown, time.Since(killed).Round(time.Millisecond))
		waitText(t, onFollower, "sm-state", 5*time.Second, fmt.Sprintf("sm_state %d on the page", ns.SMState),
			func(s string) bool { return s == strconv.Itoa(int(ns.SMState)) })
		down := waitText(t, onLeader, "conn", 10*time.Second, "the dead node's page to say so",
			func(s string) bool { return strings.Contains(s, lead.id+" unreachable") })
		t.Logf("dead node's page: %q", down)
		// It keeps retrying: the attempt count rises.
		attempt := func(s string) int {
			_, n, _ := strings.Cut(s, "attempt ")
			v, _ := strconv.Atoi(n)
			return v
		}
		first := attempt(down)
		waitText(t, onLeader, "conn", 10*time.Second, "another retry", func(s string) bool { return attempt(s) > first })

		// Back on its data directory (a rebooted server), the same page
		// recovers and shows the leader the cluster agrees on.
		lead.p = startNsmd(t, lead.args...)
		waitText(t, onLeader, "conn", 15*time.Second, "the restarted node's page to be live again",
			func(s string) bool { return strings.HasPrefix(s, "live") })
		waitText(t, onLeader, "leader", 15*time.Second, "the restarted node's page to show leader "+next.id,
			func(s string) bool { return s == next.id })

		for _, tab := range []context.Context{onFollower, onLeader} {
			marker, err := evalJS[string](tab, `window.e2eMarker || ''`)
			if err != nil {
				t.Fatal(err)
			}
			if marker != "loaded-once" {
				t.Errorf("window.e2eMarker = %q: the page was reloaded", marker)
			}
		}
		history, err := evalJS[int](onFollower, `document.querySelectorAll('#history tbody tr').length`)
		if err != nil || history < 2 {
			t.Errorf("sm_state history on the page has %d rows (%v), want the takeovers before and after the kill", history, err)
		}
	})
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}
