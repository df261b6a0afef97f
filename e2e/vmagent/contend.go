//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// contend is the lock-safety workload of the real-kernel drills. Each
// worker (one per client VM, named NAME) loops over FILEs: F_SETLKW on the
// whole file; read "SEQ WRITER"; write "SEQ+1 NAME"; fsync; hold for HOLD;
// read again and require exactly what it wrote (another writer inside the
// critical section shows up here); unlock; pause up to GAP (random), so a
// client whose blocked lock polls (NFSv4.0 has no lock callback: its
// client retries with a backoff up to 30 s) finds the file free now and
// then. One line per section:
//
//	CS <file> <seq read> <seq written> <lock wait ms> <unix ms at unlock>
//
// and one line per problem, which the test treats as a failure:
//
//	OVERLAP <file> <what we wrote> <what we read back>
//	ERROR <file> <operation> <error>     (EIO after a lost lock, ENOLCK …)
//
// The test joins every worker's CS lines: per file, the sequence numbers
// written must be 1, 2, 3 … with no gap and no repeat — two holders at once
// would both read N and write N+1. The file /run/vmagent/NAME.stop, or
// SIGTERM, ends the loop after the current section; the last line is
// "DONE <sections> <problems>". The test stops a worker by the file: a
// signal that interrupts a blocked F_SETLKW makes the kernel's NFSv3
// client cancel the request and send it again, and a grant that crosses
// the cancel stays held on the server for a process that never learns
// it has it (its next request then waits for itself).
func contend(args []string) error {
	if len(args) < 4 {
		return errors.New("usage: vmagent contend NAME HOLD GAP FILE...")
	}
	name := args[0]
	hold, err := time.ParseDuration(args[1])
	if err != nil {
		return fmt.Errorf("HOLD: %w", err)
	}
	gap, err := time.ParseDuration(args[2])
	if err != nil || gap <= 0 {
		return fmt.Errorf("GAP: %q: want a positive duration", args[2])
	}
	files := args[3:]
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	stopFile := "/run/vmagent/" + name + ".stop"
	os.Remove(stopFile)
	fmt.Println("contending", name, strings.Join(files, " "))
	sections, problems := 0, 0
	for i := 0; ; i++ {
		_, err := os.Stat(stopFile)
		select {
		case <-stop:
			err = nil
		default:
		}
		if err == nil {
			fmt.Println("DONE", sections, problems)
			return nil
		}
		f := files[i%len(files)]
		if err := section(name, f, hold); err != nil {
			problems++
			fmt.Println(err)
			time.Sleep(200 * time.Millisecond) // do not spin on a dead file
			continue
		}
		sections++
		time.Sleep(rand.N(gap))
	}
}

// section runs one critical section on path; a non-nil error is the
// OVERLAP/ERROR line to print.
func section(name, path string, hold time.Duration) error {
	fail := func(op string, err error) error { return fmt.Errorf("ERROR %s %s %v", path, op, err) }
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fail("open", err)
	}
	defer f.Close() // closing drops the lock too
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	asked := time.Now()
	for {
		err = unix.FcntlFlock(f.Fd(), unix.F_SETLKW, &lk)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return fail("lock", err)
	}
	waited := time.Since(asked)
	buf := make([]byte, 256)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fail("read", err)
	}
	seq := 0
	if fields := strings.Fields(string(buf[:n])); len(fields) >= 1 {
		if seq, err = strconv.Atoi(fields[0]); err != nil {
			return fail("parse", fmt.Errorf("%q: %w", buf[:n], err))
		}
	}
	mine := fmt.Sprintf("%d %s\n", seq+1, name)
	if _, err := f.WriteAt([]byte(mine), 0); err != nil {
		return fail("write", err)
	}
	if err := f.Truncate(int64(len(mine))); err != nil {
		return fail("truncate", err)
	}
	if err := f.Sync(); err != nil {
		return fail("fsync", err)
	}
	time.Sleep(hold)
	n, err = f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fail("reread", err)
	}
	if string(buf[:n]) != mine {
		return fmt.Errorf("OVERLAP %s %q %q", path, mine, buf[:n])
	}
	lk.Type = unix.F_UNLCK
	if err := unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk); err != nil {
		return fail("unlock", err)
	}
	fmt.Printf("CS %s %d %d %d %d\n", path, seq, seq+1, waited.Milliseconds(), time.Now().UnixMilli())
	return nil
}

// firstLock starts a lock attempt on a new file every interval until one
// is granted; it prints "granted FILE after SECONDS" then (since its
// "probing" line, on this machine's monotonic clock) and returns (the
// other attempts die with the process).
//
// Attempt i creates its file in DIR/p<i mod n> when DIR has the
// subdirectories p0…p<n−1> (made before the fault: probeDirs in the
// tests), else in DIR. A create holds its parent directory's lock for as
// long as the NFSv4 OPEN takes, and an OPEN refused in grace is retried
// by the kernel client after a pause that doubles (0.1, 0.2 … 3.2 s): in
// one directory the fresh attempts would queue behind the first one's
// pause and the first grant would come up to a pause after the grace.
func firstLock(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: vmagent firstlock DIR EVERY")
	}
	every, err := time.ParseDuration(args[1])
	if err != nil {
		return fmt.Errorf("EVERY: %w", err)
	}
	dirs := probeDirsIn(args[0])
	granted := make(chan string, 1)
	failed := make(chan error, 1)
	fmt.Println("probing", args[0], "in", len(dirs), "directories")
	start := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	for i := 0; ; i++ {
		path := fmt.Sprintf("%s/free-%d-%d", dirs[i%len(dirs)], os.Getpid(), i)
		go func() {
			f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				failed <- fmt.Errorf("open %s: %w", path, err)
				return
			}
			// f stays open: the lock lives until the process exits.
			lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
			if err := unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk); err != nil {
				failed <- fmt.Errorf("lock %s: %w", path, err)
				return
			}
			granted <- path
		}()
		select {
		case p := <-granted:
			fmt.Printf("granted %s after %.3f\n", p, time.Since(start).Seconds())
			return nil
		case err := <-failed:
			fmt.Println("attempt failed:", err)
		case <-t.C:
		}
	}
}

// probeDirsIn lists dir's subdirectories p0, p1 … (up to the first
// missing), or dir alone when it has none.
func probeDirsIn(dir string) []string {
	var out []string
	for i := 0; ; i++ {
		d := fmt.Sprintf("%s/p%d", dir, i)
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			break
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return []string{dir}
	}
	return out
}
