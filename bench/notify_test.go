package bench

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestBenchNotifyHostListIsDistinctLoopbackWithEvenlySpreadDeadHosts(t *testing.T) {
	seen := map[string]bool{}
	for i := range notifyMaxHosts {
		a := notifyAddr(i)
		b := a.As4()
		if b[0] != 127 || b[1] == 0 || b[3] == 0 || b[3] == 255 || seen[a.String()] {
			t.Fatalf("host %d: address %v (127.x.y.z with x ≥ 1, z in 1..254, distinct)", i, a)
		}
		seen[a.String()] = true
		if j, ok := notifyIndex(a); !ok || j != i {
			t.Fatalf("notifyIndex(%v) = %d, %v; want %d", a, j, ok, i)
		}
	}
	for _, a := range []string{"127.0.0.100", "127.0.0.1", "10.1.0.1", "127.1.0.251", "127.1.0.0", "::1"} {
		if j, ok := notifyIndex(netip.MustParseAddr(a)); ok {
			t.Errorf("notifyIndex(%s) = %d: not a host address", a, j)
		}
	}
	for _, c := range []struct {
		hosts int
		pct   float64
		dead  int
	}{{50, 10, 5}, {1000, 10, 100}, {10000, 0, 0}, {10000, 10, 1000}, {7, 50, 3}, {100, 2.5, 2}} {
		dead, run, maxRun := 0, 0, 0
		for i := range c.hosts {
			if notifyDead(i, c.pct) {
				dead++
				run++
				maxRun = max(maxRun, run)
			} else {
				run = 0
			}
		}
		if dead != c.dead || (c.pct <= 50 && maxRun > 1) {
			t.Errorf("%d hosts, %v%% dead: %d dead (want %d), longest run of dead hosts %d", c.hosts, c.pct, dead, c.dead, maxRun)
		}
		if live := len(notifyLive(c.hosts, c.pct)); live != c.hosts-c.dead {
			t.Errorf("%d hosts, %v%% dead: %d live", c.hosts, c.pct, live)
		}
	}
}

func TestBenchNotifyRefusesBadOptions(t *testing.T) {
	good := NotifyOptions{Hosts: 10, DeadMode: DeadSilent, Fakes: FakesAuto, Fault: FaultKill, Timeout: time.Second, SMNotifyTimeout: time.Second, Conns: 1}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*NotifyOptions){
		"no hosts":       func(o *NotifyOptions) { o.Hosts = 0 },
		"too many hosts": func(o *NotifyOptions) { o.Hosts = notifyMaxHosts + 1 },
		"all dead":       func(o *NotifyOptions) { o.DeadPct = 100 },
		"fault":          func(o *NotifyOptions) { o.Fault = "reboot" },
		"dead mode":      func(o *NotifyOptions) { o.DeadMode = "zombie" },
		"timeout":        func(o *NotifyOptions) { o.Timeout = 0 },
		"conns":          func(o *NotifyOptions) { o.Conns = 0 },
		"fakes":          func(o *NotifyOptions) { o.Fakes = "" },
		"refused dead hosts on wildcard sockets": func(o *NotifyOptions) {
			o.Fakes, o.DeadMode = FakesWildcard, DeadRefused
		},
	} {
		o := good
		mod(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, o)
		}
	}
}

func TestBenchNotifyPrintsTableJSONAndPlot(t *testing.T) {
	rep := &NotifyReport{Hosts: 10, Live: 9, Dead: 1, Fault: FaultKill, Nodes: 3, OldState: 3, NewState: 5,
		NSMD: NotifyPhase{Name: "nsmd", Live: 9, Notified: 9, CompleteMS: 12, MaxMS: 12, P50MS: 5,
			Curve: []NotifyPoint{{MS: 1, Count: 1}, {MS: 12, Count: 9}}},
		SMNotify: &NotifyPhase{Name: "sm-notify", Live: 9, Notified: 8, CompleteMS: 3000,
			Curve: []NotifyPoint{{MS: 10, Count: 1}, {MS: 200, Count: 8}}},
		Ratio: 250, RatioBound: true}
	var b bytes.Buffer
	PrintNotify(&b, rep)
	for _, want := range []string{"9/9", "8/9", ">3s", "at least 250.0×", "sm_state 3 → 5"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	svg := NotifySVG(rep)
	if !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<polyline") != 2 || !strings.HasSuffix(svg, "</svg>\n") {
		t.Errorf("plot:\n%s", svg)
	}
	raw, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back NotifyReport
	if err := json.Unmarshal(raw, &back); err != nil || back.SMNotify == nil || back.NSMD.Notified != 9 {
		t.Errorf("JSON round trip: %v %+v", err, back)
	}
}
