package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// NotifyInNetns creates the namespace nsmd-bench-<pid>, runs exe args
// inside it (with a private mount namespace and a tmpfs on /run, which
// sm-notify writes to) and returns the report the child writes on fd 3.
// The namespace is deleted when it returns, also on error or when ctx ends
// (the child is then stopped by its pid: SIGTERM, SIGKILL after 10 s).
func NotifyInNetns(ctx context.Context, o NotifyOptions, exe string, args []string, stderr io.Writer) (*NotifyReport, error) {
	raw, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	ns := fmt.Sprintf("nsmd-bench-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("create network namespace %s: %v: %s", ns, err, strings.TrimSpace(string(out)))
	}
	defer func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			fmt.Fprintf(stderr, "bench notify: removing network namespace %s: %v: %s\n", ns, err, strings.TrimSpace(string(out)))
		}
	}()
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("lo up in %s: %v: %s", ns, err, strings.TrimSpace(string(out)))
	}

	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	// ip netns exec and unshare (without --fork) exec in place, and so does
	// sh: the pid we start is the child's own.
	const script = `mount -t tmpfs nsmd-bench /run && exec "$0" "$@"`
	argv := append([]string{"netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script, exe}, args...)
	cmd := exec.Command("ip", argv...)
	parentNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("cannot tell my network namespace: %w", err)
	}
	cmd.Env = append(os.Environ(), NotifyChildEnv+"="+string(raw), "NSMD_BENCH_NETNS="+ns, notifyParentNetnsEnv+"="+parentNS)
	cmd.ExtraFiles = []*os.File{pw} // fd 3
	// If we die without cleaning up, the child is told to (SIGTERM).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, fmt.Errorf("run in %s: %w", ns, err)
	}
	pw.Close()

	type decoded struct {
		rep *NotifyReport
		err error
	}
	got := make(chan decoded, 1)
	go func() { // ends at EOF: when the child exits
		var rep NotifyReport
		b, err := io.ReadAll(pr)
		switch {
		case err != nil:
			got <- decoded{err: err}
		case len(b) == 0:
			got <- decoded{}
		default:
			err = json.Unmarshal(b, &rep)
			got <- decoded{rep: &rep, err: err}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-ctx.Done():
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case waitErr = <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			waitErr = <-exited
		}
		<-got
		return nil, ctx.Err()
	}
	d := <-got
	switch {
	case d.err != nil:
		return nil, fmt.Errorf("the run in %s: bad report: %w", ns, d.err)
	case d.rep == nil && waitErr != nil:
		return nil, fmt.Errorf("the run in %s failed: %w", ns, waitErr)
	case d.rep == nil:
		return nil, fmt.Errorf("the run in %s wrote no report", ns)
	}
	return d.rep, nil
}

// notifyParentNetnsEnv carries the parent's network namespace
// (/proc/self/ns/net) to the child, which must be in another one.
const notifyParentNetnsEnv = "NSMD_BENCH_PARENT_NETNS"

// notifyCheckPrivateNetns refuses to run the child in the parent's
// network namespace (it binds port 111 on thousands of addresses).
func notifyCheckPrivateNetns() error {
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("cannot tell my network namespace: %w", err)
	}
	parent := os.Getenv(notifyParentNetnsEnv)
	if parent == "" || self == parent {
		return errors.New("internal: the bench child must run in a network namespace of its own, started by nsmd bench notify")
	}
	return nil
}

// notifyRaiseNofile raises RLIMIT_NOFILE towards want: past the hard
// limit when allowed (CAP_SYS_RESOURCE), else to the hard limit. It
// returns the soft limit in force.
func notifyRaiseNofile(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	up := syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up); err == nil {
		return want, nil
	}
	up = syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up); err != nil {
		return lim.Cur, nil
	}
	return lim.Max, nil
}

// notifyHosts bind-mounts a hosts file naming the VIP over /etc/hosts
// in this process's private mount namespace (the child's: unshare --mount
// --propagation private), so sm-notify -v can resolve the VIP both ways
// (it refuses a my_name without a reverse mapping). The host's /etc/hosts
// is not touched.
func notifyHosts(dir string) error {
	old, err := os.ReadFile("/etc/hosts")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	path := dir + "/hosts"
	content := string(old) + "\n" + notifyVIP + " nsmd-bench-vip\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return err
	}
	if err := syscall.Mount(path, "/etc/hosts", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount a hosts file naming the VIP over /etc/hosts (private mount namespace): %w", err)
	}
	return nil
}

// notifyChildAttr makes a process we start (sm-notify) get SIGKILL if
// we die first.
func notifyChildAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// listenPktinfo opens a UDP socket on 0.0.0.0:port (0: any) with
// SO_REUSEPORT, so that several can share the port, and IP_PKTINFO, so
// that each datagram read says which address it was sent to. Its receive
// buffer is forced to 8 MiB (SO_RCVBUFFORCE: root; best effort).
func listenPktinfo(port uint16) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); serr != nil {
				return
			}
			if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1); serr != nil {
				return
			}
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
		})
		return errors.Join(err, serr)
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(int(port))))
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

// pktinfoDst is the destination address in a datagram's IP_PKTINFO.
func pktinfoDst(oob []byte) (netip.Addr, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo {
			var a [4]byte
			copy(a[:], m.Data[8:12]) // struct in_pktinfo: ipi_ifindex, ipi_spec_dst, ipi_addr
			return netip.AddrFrom4(a), true
		}
	}
	return netip.Addr{}, false
}

// pktinfoSrc is the control message that sends a datagram from src.
func pktinfoSrc(src netip.Addr) []byte {
	return unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: src.As4()})
}
