// Package e2e tests the built nsmd binary from outside, as an operator and
// the real NFS peers see it: real processes, real sockets, and real Debian
// programs (rpcinfo, rpcbind, rpc.statd, sm-notify) where a test says so.
// Traffic stays on loopback or inside network namespaces the tests create.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nsmd/nsmd/admin"
	"github.com/nsmd/nsmd/internal/testutil"
	"github.com/nsmd/nsmd/oncrpc"
)

var nsmdBin string

func TestMain(m *testing.M) {
	nsmdBin = os.Getenv("NSMD_BIN")
	if nsmdBin == "" {
		dir, err := os.MkdirTemp("", "nsmd-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		nsmdBin = filepath.Join(dir, "nsmd")
		cmd := exec.Command("go", "build", "-o", nsmdBin, "../cmd/nsmd")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build nsmd:", err)
			os.Exit(1)
		}
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func freePort(t *testing.T, ip string) int { return testutil.FreePort(t, ip) }

// proc is one nsmd process started by a test.
type proc struct {
	t    *testing.T
	args []string
	cmd  *exec.Cmd
	log  *testutil.LockedBuffer
	done chan struct{}
}

// startNsmd runs `nsmd args...`; the process is killed at test end and its
// log printed if the test failed.
func startNsmd(t *testing.T, args ...string) *proc {
	t.Helper()
	return startNsmdEnv(t, nil, args...)
}

// startNsmdEnv is startNsmd with extra environment variables for this
// process only.
func startNsmdEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, args: args, log: &testutil.LockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(nsmdBin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start nsmd: %v", err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("nsmd %s log:\n%s", strings.Join(args, " "), p.log.String())
		}
	})
	return p
}

func (p *proc) kill(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Errorf("nsmd pid %d did not exit after %v", p.cmd.Process.Pid, sig)
	}
}

// getJSON GETs path from the plaintext admin API at adm, with the local
// admin token of NSMD_ADMIN_LOCAL_TOKEN_FILE when set (agentArgs).
func getJSON(adm, path string, out any) error {
	c := &http.Client{Timeout: 2 * time.Second}
	req, err := http.NewRequest("GET", "http://"+adm+path, nil)
	if err != nil {
		return err
	}
	if f := os.Getenv("NSMD_ADMIN_LOCAL_TOKEN_FILE"); f != "" {
		if tok, err := os.ReadFile(f); err == nil {
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, b)
	}
	return json.Unmarshal(b, out)
}

// waitLeader waits until the node at admin has taken over as leader with an
// odd sm_state other than notState.
func waitLeader(t *testing.T, adm string, notState int32) admin.Status {
	t.Helper()
	var s admin.Status
	testutil.WaitForSeen(t, 15*time.Second, "node at "+adm+" to lead", func() (bool, string) {
		s = admin.Status{}
		if err := getJSON(adm, "/v1/status", &s); err != nil {
			return false, err.Error()
		}
		return s.Role == "leader" && s.SMState%2 == 1 && s.SMState != notState, fmt.Sprintf("%+v", s)
	})
	return s
}

// dialNSM opens an NSM client to addr ("tcp" or "udp") from 127.0.0.1.
func dialNSM(t *testing.T, network, addr string) *oncrpc.Client {
	t.Helper()
	c, err := oncrpc.Dial(context.Background(), oncrpc.ClientConfig{Net: network, Addr: addr, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("dial NSM %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
