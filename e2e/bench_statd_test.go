package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// benchJSON is the part of `nsmd bench mon --json` this test reads.
type benchJSON struct {
	Target     string         `json:"target"`
	PortFrom   string         `json:"port_from"`
	Proto      string         `json:"proto"`
	Calls      int            `json:"calls"`
	OK         int            `json:"ok"`
	Failed     int            `json:"failed"`
	Errors     map[string]int `json:"errors"`
	Privileged bool           `json:"privileged_source_port"`
	Source     string         `json:"source"`
	OKPerS     float64        `json:"ok_per_s"`
	Latency    struct {
		P50MS float64 `json:"p50_ms"`
		P99MS float64 `json:"p99_ms"`
	} `json:"latency"`
}

func runBench(t *testing.T, args ...string) benchJSON {
	t.Helper()
	cmd := exec.Command(nsmdBin, append([]string{"bench", "mon", "--json"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nsmd bench mon %s: %v\n%s\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	var r benchJSON
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, out)
	}
	t.Logf("bench mon %s: %d ok of %d, %.0f ok/s, p50 %.2fms p99 %.2fms, from %s", strings.Join(args, " "), r.OK, r.Calls, r.OKPerS, r.Latency.P50MS, r.Latency.P99MS, r.Source)
	return r
}

// TestBenchMonAgainstRealStatd points `nsmd bench mon` at the Debian
// rpc.statd (port from its rpcbind, as an operator would) and checks that
// every SM_MON succeeded and that statd wrote a monitor record in sm/ for
// each name, with the my_id the bench sent (100021/3/16, my_name
// 127.0.0.1): the tool measures a real statd, not just nsmd.
func TestBenchMonAgainstRealStatd(t *testing.T) {
	if !inNetns(t) {
		return
	}
	rs := startRealStatd(t)
	r := runBench(t, "--addr", "127.0.0.1", "-c", "4", "-n", "200")
	if r.OK != 200 || r.Calls != 200 || r.Failed != 0 {
		t.Fatalf("rpc.statd: %d ok of %d, errors %v", r.OK, r.Calls, r.Errors)
	}
	if r.PortFrom != "portmapper" || r.Target != net.JoinHostPort("127.0.0.1", strconv.Itoa(int(rs.port))) {
		t.Errorf("target %s (port %s), want statd's TCP port %d from rpcbind", r.Target, r.PortFrom, rs.port)
	}
	if !r.Privileged || !strings.HasPrefix(r.Source, "127.0.0.1:") {
		t.Errorf("source %s privileged %v, want 127.0.0.1 from a port below 1024 (as root)", r.Source, r.Privileged)
	}
	// UDP with the SM_UNMON half: what is unmonitored leaves sm/.
	u := runBench(t, "--addr", "127.0.0.1", "--proto", "udp", "-c", "2", "-n", "40", "--unmon", "--mon-base", "127.2.0.1")
	if u.OK != 40 || u.Failed != 0 || u.PortFrom != "portmapper" {
		t.Fatalf("rpc.statd over UDP: %+v", u)
	}

	names := map[string]bool{}
	ents, err := os.ReadDir(filepath.Join(rs.dir, "sm"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		names[e.Name()] = true
	}
	for i := 1; i <= 200; i++ {
		name := fmt.Sprintf("127.1.0.%d", i)
		if !names[name] {
			t.Errorf("statd has no record sm/%s", name)
			continue
		}
		delete(names, name)
	}
	// The UDP run leaves at most one name per caller (2 × depth 1) monitored.
	for n := range names {
		if !strings.HasPrefix(n, "127.2.0.") {
			t.Errorf("unexpected record sm/%s", n)
		}
	}
	if len(names) > 2 {
		t.Errorf("%d records from the --unmon run left, want at most 2: %v", len(names), names)
	}
	b, err := os.ReadFile(filepath.Join(rs.dir, "sm", "127.1.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	// "%08x %08x %08x %08x %s %s %s": address, prog, vers, proc, priv, mon_name, my_name.
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	if len(f) != 7 || f[1] != "000186b5" || f[2] != "00000003" || f[3] != "00000010" || len(f[4]) != 32 ||
		f[5] != "127.1.0.1" || f[6] != "127.0.0.1" {
		t.Errorf("sm/127.1.0.1 = %q, want my_id 100021/3/16, a 16-byte priv, mon_name 127.1.0.1, my_name 127.0.0.1", b)
	}
}
