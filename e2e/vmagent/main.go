//go:build linux

// Command vmagent is the e2e tier's hand inside a test VM (see
// e2e/vm_linux_test.go). The VM's init starts `vmagent serve ADDR`; the test,
// on the bridge it built, sends one JSON request per connection and gets one
// JSON answer back. It is test tooling: it runs whatever it is told as root,
// and it only ever listens on the VM's address on that private bridge.
//
//	vmagent serve ADDR     answer requests (below) on ADDR
//	vmagent lock FILE      take a whole-file fcntl write lock (F_SETLKW), print
//	                       "locked FILE", hold it until killed
//	vmagent trylock FILE   F_SETLK once: exit 0 ("locked", released on exit),
//	                       3 when another owner holds it ("denied"), 1 on error
//	vmagent contend NAME HOLD GAP FILE...
//	                       the lock-safety workload (contend.go): until
//	                       SIGTERM, take a blocking write lock on each FILE
//	                       in turn, bump the sequence number in it under the
//	                       lock, hold it HOLD, check nobody else wrote, pause
//	                       up to GAP, and print one line per critical section
//	vmagent firstlock DIR EVERY
//	                       every EVERY, a new attempt (open + F_SETLK) on a
//	                       fresh file in DIR (in DIR/p<i> when it has
//	                       those: contend.go), each in its own thread: the
//	                       first that gets its lock prints "granted FILE
//	                       after SECONDS" (since "probing") and the process exits (the time a new lock is
//	                       first granted after a failover, despite the
//	                       client's own backoff while the server is in grace)
//	vmagent ask ADDR LINE  send LINE to the test harness at ADDR (TCP), print
//	                       its one-line answer (the fence-agent stand-in's
//	                       channel: e2e/fence_vm_linux_test.go)
//	vmagent watchdog DEV SECONDS
//	                       arm watchdog DEV with that timeout, ping it once,
//	                       print "pinged TIMEOUT", never ping again (the
//	                       machine resets; watchdog.go)
//
// Request {"cmd": "...", "timeout_ms": N, "detach": bool}: run `sh -c cmd`;
// "@cat FILE..." instead reads the files itself (no process: the fencing
// test's sampler asks every 300 ms) and answers their contents, one after
// the other, rc 1 if one could not be read.
// Without detach the answer comes when it exits (rc, combined output). With
// detach the process keeps running (its own session, output appended to
// /run/vmagent/<pid>.log) and the answer comes at its first output line, or
// at its exit, or at the timeout, whichever is first; the answer carries the
// pid. No request ever waits past its timeout.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Request is one command from the test.
type Request struct {
	Cmd       string `json:"cmd"`
	TimeoutMS int    `json:"timeout_ms"`
	Detach    bool   `json:"detach"`
}

// Response is the agent's answer.
type Response struct {
	RC       int    `json:"rc"` // exit code; -1 still running (detach) or killed by the timeout
	Out      string `json:"out"`
	Pid      int    `json:"pid,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Err      string `json:"err,omitempty"`
}

const logDir = "/run/vmagent"

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: vmagent serve ADDR | lock FILE | trylock FILE")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2])
	case "lock":
		err = lock(os.Args[2], true)
		if err == nil {
			fmt.Println("locked", os.Args[2])
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
			<-sig // held until the process is told to stop, or killed
			return
		}
	case "contend":
		err = contend(os.Args[2:])
	case "firstlock":
		err = firstLock(os.Args[2:])
	case "ask":
		err = ask(os.Args[2:])
	case "watchdog":
		err = watchdog(os.Args[2:])
	case "trylock":
		err = lock(os.Args[2], false)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			fmt.Println("denied", os.Args[2])
			os.Exit(3)
		}
		if err == nil {
			fmt.Println("locked", os.Args[2])
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vmagent:", err)
		os.Exit(1)
	}
}

// lock takes a whole-file POSIX write lock on path (NFS: an NLM lock).
func lock(path string, wait bool) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	// f stays open for the life of the process: closing it drops the lock.
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	cmd := unix.F_SETLK
	if wait {
		cmd = unix.F_SETLKW
	}
	for {
		err = unix.FcntlFlock(f.Fd(), cmd, &lk)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	return nil
}

func serve(addr string) error {
	// init gives us no PATH; the commands we run expect the usual one.
	os.Setenv("PATH", "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("vmagent listening on", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go handle(c)
	}
}

func handle(c net.Conn) {
	defer c.Close()
	var req Request
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&req); err != nil {
		json.NewEncoder(c).Encode(Response{RC: -1, Err: "bad request: " + err.Error()})
		return
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	var resp Response
	if files, ok := strings.CutPrefix(req.Cmd, "@cat "); ok {
		json.NewEncoder(c).Encode(catFiles(strings.Fields(files)))
		return
	}
	if req.Detach {
		resp = detach(req.Cmd, timeout)
	} else {
		resp = run(req.Cmd, timeout)
	}
	json.NewEncoder(c).Encode(resp)
}

func run(command string, timeout time.Duration) Response {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second // a daemon that kept our pipe does not hold the answer
	out, err := cmd.CombinedOutput()
	resp := Response{Out: string(out), RC: cmd.ProcessState.ExitCode()}
	if ctx.Err() != nil {
		resp.TimedOut, resp.RC = true, -1
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) && !resp.TimedOut {
		resp.Err = err.Error()
	}
	return resp
}

func detach(command string, timeout time.Duration) Response {
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		return Response{RC: -1, Err: err.Error()}
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return Response{RC: -1, Err: err.Error()}
	}
	pw.Close()
	logf, err := os.Create(filepath.Join(logDir, strconv.Itoa(cmd.Process.Pid)+".log"))
	if err != nil {
		logf = nil
	}
	first := make(chan string, 1)
	exited := make(chan int, 1)
	go func() { // copy the output to the log; hand over the first line
		rd := bufio.NewReader(pr)
		sent := false
		for {
			line, err := rd.ReadString('\n')
			if line != "" && logf != nil {
				logf.WriteString(line)
			}
			if !sent && (strings.HasSuffix(line, "\n") || (err != nil && line != "")) {
				first <- line
				sent = true
			}
			if err != nil {
				break
			}
		}
		pr.Close()
		if logf != nil {
			logf.Close()
		}
	}()
	go func() {
		cmd.Wait()
		exited <- cmd.ProcessState.ExitCode()
	}()
	resp := Response{RC: -1, Pid: cmd.Process.Pid}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l := <-first:
		resp.Out = l
		select { // a command that printed and exited at once: say how
		case rc := <-exited:
			resp.RC = rc
		case <-time.After(50 * time.Millisecond):
		}
	case rc := <-exited:
		resp.RC = rc
		select {
		case l := <-first:
			resp.Out = l
		case <-time.After(100 * time.Millisecond):
		}
	case <-t.C:
		resp.TimedOut = true
	}
	return resp
}

// ask sends one line to the test harness at args[0] and prints the line it
// answers. The harness may take a while (it powers a VM off first), so the
// answer is awaited up to 60 s.
func ask(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: vmagent ask ADDR LINE")
	}
	c, err := net.DialTimeout("tcp", args[0], 5*time.Second)
	if err != nil {
		return fmt.Errorf("ask: %w", err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(60 * time.Second)); err != nil {
		return fmt.Errorf("ask: %w", err)
	}
	if _, err := fmt.Fprintln(c, args[1]); err != nil {
		return fmt.Errorf("ask: send: %w", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("ask: answer: %w", err)
	}
	fmt.Print(line)
	return nil
}

// catFiles reads files without starting a process.
func catFiles(files []string) Response {
	var b strings.Builder
	rc := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			rc = 1
			continue
		}
		b.Write(data)
	}
	return Response{RC: rc, Out: b.String()}
}
