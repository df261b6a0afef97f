package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/nsm"
	"github.com/nsmd/nsmd/oncrpc"
)

// Packet captures for the interop test: dumpcap on an interface of a
// namespace of ours, then tshark with its RPC, portmap, NSM (stat) and NLM
// dissectors over every frame. Raft, gossip and the admin API are left
// out by the capture filter: they are not ONC RPC.

const captureFilter = "not (tcp port 7300 or port 7946 or tcp port 8024 or port 53 or port 5353)"

// capture is one dumpcap writing one interface of one namespace.
type capture struct {
	name string // e.g. "bridge", "n1-lo"
	path string
	// A marker datagram sent from markNS to markTo:9 crosses the captured
	// interface; see stop.
	markNS string
	markTo string
	cmd    *exec.Cmd
	done   chan struct{}
	log    childLog
	marks  int // flushes so far: each one's markers carry its own number
}

// startCapture starts dumpcap and waits until it says it is capturing.
func startCapture(t *testing.T, ns, iface, name, dir, markNS, markTo string) *capture {
	t.Helper()
	c := &capture{name: name, path: filepath.Join(dir, name+".pcapng"), markNS: markNS, markTo: markTo, done: make(chan struct{})}
	// dumpcap writes to a pipe, which it flushes after every batch of
	// frames (a file it buffers); we copy the pipe to the file.
	c.cmd = exec.Command("ip", "netns", "exec", ns, lookTool(t, "dumpcap"), "-q", "-i", iface, "-f", captureFilter, "-w", "-")
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(c.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := startPinned(c.cmd); err != nil {
		f.Close()
		t.Fatalf("dumpcap on %s: %v", name, err)
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		defer f.Close()
		io.Copy(f, stdout)
	}()
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			fmt.Fprintln(&c.log, sc.Text())
			if !once && strings.HasPrefix(sc.Text(), "Capturing on") {
				once = true
				close(ready)
			}
		}
		io.Copy(io.Discard, stderr)
		<-copied
		c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() { c.stop() })
	select {
	case <-ready:
	case <-c.done:
		t.Fatalf("dumpcap on %s exited: %s", name, c.log.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("dumpcap on %s not capturing after 10s: %s", name, c.log.String())
	}
	return c
}

// markerPort is the discard port; the marker datagram to it is the last
// frame the test waits for in a capture (dissect leaves it out).
const markerPort = 9

// flush makes sure every frame sent so far is in the file: dumpcap hands
// frames over in blocks (and says "Capturing on" a little before it
// really is), so marker datagrams are sent across the interface until one
// shows up in the file. Called right after startCapture, it waits until
// the capture is live. Each flush's markers carry a token of their own: a
// marker left over from an earlier flush (sent while dumpcap still held
// its block) must not end a later one before its frames are in the file.
func (c *capture) flush(t *testing.T) {
	t.Helper()
	c.marks++
	token := fmt.Sprintf("nsmd-e2e capture marker %s/%d", c.name, c.marks)
	filter := fmt.Sprintf("udp.dstport == %d && !icmp && frame contains %q", markerPort, token)
	testutil.WaitForSeen(t, 10*time.Second, "a marker in capture "+c.name, func() (bool, string) {
		err := inNetnsThread(c.markNS, func() error {
			conn, err := net.Dial("udp", net.JoinHostPort(c.markTo, strconv.Itoa(markerPort)))
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write([]byte(token))
			return err
		})
		if err != nil {
			return false, "sending the marker: " + err.Error()
		}
		out, err := exec.Command(lookTool(t, "tshark"), "-n", "-r", c.path, "-Y", filter, "-T", "fields", "-e", "frame.number").Output()
		return err == nil && len(strings.TrimSpace(string(out))) > 0, fmt.Sprint(err)
	})
}

// stop ends the capture and waits until the file is complete.
func (c *capture) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
	}
}

// rpcMsg is one ONC RPC message as tshark dissected it.
type rpcMsg struct {
	capture string
	frame   int
	src     string // ip:port
	dst     string
	reply   bool
	prog    uint32
	vers    uint32
	proc    uint32
	names   string // NSM names in the message (mon_name, my_name), comma-joined
	state   string // NSM state field, if any
}

func (m rpcMsg) String() string {
	kind := "call"
	if m.reply {
		kind = "reply"
	}
	return fmt.Sprintf("%s#%d %s→%s %s %d/%d/%d %s %s", m.capture, m.frame, m.src, m.dst, kind, m.prog, m.vers, m.proc, m.names, m.state)
}

// dissection is what tshark found in one capture.
type dissection struct {
	msgs        []rpcMsg
	frames      int      // frames in the file
	malformed   []string // frames marked malformed or with an error-level expert note
	undissected []string // UDP datagrams / TCP payloads that no RPC dissector took
}

// tshark runs tshark -r path with args and returns its output lines.
func tshark(t *testing.T, path string, args ...string) []string {
	t.Helper()
	// Privileged source ports are often some service's well-known port
	// (873 is rsync): let the ONC RPC heuristics speak before the port
	// tables, and decode the NSM port as RPC. RTCP's UDP heuristic is off:
	// with heuristics first it once claimed one of our RPC datagrams (an
	// xid is random, and its first two bytes can look like an RTCP
	// header), and the packet was then counted as not dissected as RPC.
	pre := []string{"-n", "-r", path, "-o", "tcp.try_heuristic_first:TRUE", "-o", "udp.try_heuristic_first:TRUE",
		"--disable-heuristic", "rtcp_udp",
		"-d", fmt.Sprintf("tcp.port==%d,rpc", nsmPort), "-d", fmt.Sprintf("udp.port==%d,rpc", nsmPort)}
	out, err := exec.Command(lookTool(t, "tshark"), append(pre, args...)...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("tshark -r %s %v: %v %s", path, args, err, stderr)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// dissect runs tshark over a finished capture.
func dissect(t *testing.T, c *capture) dissection {
	t.Helper()
	var d dissection
	d.frames = len(tshark(t, c.path, "-T", "fields", "-e", "frame.number"))
	d.malformed = tshark(t, c.path, "-Y", `_ws.malformed || _ws.expert.severity == "Error"`)
	d.undissected = tshark(t, c.path, "-Y", fmt.Sprintf("(udp && !icmp && !rpc && udp.dstport != %d) || (tcp.len > 0 && !rpc)", markerPort),
		"-T", "fields", "-E", "separator=/t", "-e", "frame.number", "-e", "ip.src", "-e", "ip.dst",
		"-e", "udp.srcport", "-e", "udp.dstport", "-e", "tcp.srcport", "-e", "tcp.dstport")
	fields := []string{"frame.number", "ip.src", "ip.dst", "udp.srcport", "udp.dstport", "tcp.srcport", "tcp.dstport",
		"rpc.msgtyp", "rpc.program", "rpc.programversion", "rpc.procedure", "stat.mon_id.name", "stat.name", "stat.my_id.hostname", "stat.state", "stat.stat_res.state"}
	args := []string{"-Y", "rpc && !icmp", "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	for _, line := range tshark(t, c.path, args...) {
		f := strings.Split(line, "\t")
		for len(f) < len(fields) {
			f = append(f, "")
		}
		frame, _ := strconv.Atoi(f[0])
		sport, dport := f[3], f[4]
		if sport == "" {
			sport, dport = f[5], f[6]
		}
		// One TCP segment may carry several RPC messages: one entry each.
		types := strings.Split(f[7], ",")
		for i, mt := range types {
			m := rpcMsg{capture: c.name, frame: frame, src: f[1] + ":" + sport, dst: f[2] + ":" + dport, reply: mt == "1"}
			m.prog = nth(f[8], i)
			m.vers = nth(f[9], i)
			m.proc = nth(f[10], i)
			m.names = strings.Trim(strings.Join([]string{f[11], f[12], f[13]}, ","), ",")
			m.state = strings.Trim(f[14]+","+f[15], ",")
			d.msgs = append(d.msgs, m)
		}
	}
	return d
}

// nth is the i-th comma-separated number of s (the last one if fewer).
func nth(s string, i int) uint32 {
	parts := strings.Split(s, ",")
	if i >= len(parts) {
		i = len(parts) - 1
	}
	v, _ := strconv.ParseUint(strings.TrimSpace(parts[i]), 0, 32)
	return uint32(v)
}

// TestCaptureCheckSeesMalformedRPC shows that the capture check of the
// interop test can fail: a truncated SM_MON call (an RPC header promising
// arguments that are not there) sent to the NSM port on a namespace's
// loopback is marked malformed by tshark, and a well-formed NULL call is
// not.
func TestCaptureCheckSeesMalformedRPC(t *testing.T) {
	if os.Getenv(clientHostEnv) != "" || os.Getenv(realStatdEnv) != "" {
		t.Skip("inside a helper process")
	}
	if why := canNetns(); why != "" {
		t.Skip("skipping capture self-check: " + why)
	}
	lookTool(t, "dumpcap")
	ns := topoPrefix() + "cap"
	if _, err := ipCmd("netns", "add", ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ipCmd("netns", "del", ns) })
	if _, err := ipCmd("-n", ns, "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	c := startCapture(t, ns, "lo", "selfcheck", t.TempDir(), ns, "127.0.0.1")
	c.flush(t) // live
	call := func(proc uint32, args []byte) []byte {
		w := oncrpc.NewWriter(nil)
		// AUTH_NONE credential and verifier.
		oncrpc.CallHeader{XID: 0x1234 + proc, Prog: nsm.Program.Prog, Vers: nsm.Program.Vers, Proc: proc}.MarshalXDR(w)
		return append(w.Bytes(), args...)
	}
	err := inNetnsThread(ns, func() error {
		// Unconnected: the port unreachable for the first datagram must
		// not fail the second send.
		conn, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer conn.Close()
		to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: nsmPort}
		if _, err := conn.WriteTo(call(0, nil), to); err != nil { // NULL: fine
			return err
		}
		_, err = conn.WriteTo(call(nsm.ProcMon, []byte{0, 0, 0, 0x40}), to) // mon_name of 64 bytes, then nothing
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	c.flush(t)
	c.stop()
	d := dissect(t, c)
	if len(d.malformed) != 1 || len(d.msgs) != 2 {
		t.Fatalf("want the truncated SM_MON (only) marked malformed among 2 RPC calls; got %d malformed %q, %d messages %v",
			len(d.malformed), d.malformed, len(d.msgs), d.msgs)
	}
	t.Logf("tshark marks the truncated SM_MON: %s", d.malformed[0])
}
