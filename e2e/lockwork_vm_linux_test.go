package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nsmd/nsmd/internal/testutil"
)

// lockWork is the lock-safety workload of a real-kernel drill: workers
// (`vmagent contend`, one process each) in client VMs contend for files
// with blocking locks, writing the file's next sequence number under the
// lock and checking nobody else wrote meanwhile. The checker: no OVERLAP
// or ERROR line (EIO, ENOLCK: a lost lock), every worker makes progress
// after every fault, and per file the sequence numbers written are 1…N,
// each once, each written by the holder that read N−1 — two holders at
// once would both read N and write N+1. Its negative control is the pair
// test's (nfs4_vm_linux_test.go, negativeControl): locks lost on purpose,
// and these checks see it.
type lockWork struct {
	t       *testing.T
	workers []*lockWorker
	// servers are the VMs whose lock state a stall's report shows (their
	// lockd's kernel stack, their /proc/locks); a drill sets them.
	servers []*testVM
}

// lockWorker is one `vmagent contend` process.
type lockWorker struct {
	vm    *testVM
	name  string // unique across the workload: its CS lines carry it
	files []string
	// hold is how long a section holds its lock (default 100 ms); gap the
	// longest pause between two sections (default 1 s): a drill of many
	// workers on few cores spaces them out.
	hold, gap time.Duration
	pid       int
}

// section is one critical section a worker reported.
type section struct {
	file        string
	read, wrote int
	worker      string
	waitedMS    int64 // how long its lock request waited
	atMS        int64 // when it ended, Unix ms on the worker's VM clock
}

func (s section) String() string {
	return fmt.Sprintf("%s read %d wrote %d (waited %d ms, ended %s on its clock)", s.worker, s.read, s.wrote, s.waitedMS,
		time.UnixMilli(s.atMS).UTC().Format("15:04:05.000"))
}

// startLockWork starts every worker and waits until each finished a
// critical section; servers are the VMs a stall's report looks into.
func startLockWork(t *testing.T, servers []*testVM, workers ...*lockWorker) *lockWork {
	t.Helper()
	w := &lockWork{t: t, workers: workers, servers: servers}
	for _, k := range workers {
		hold, gap := k.hold, k.gap
		if hold == 0 {
			hold = 100 * time.Millisecond
		}
		if gap == 0 {
			gap = time.Second
		}
		line, pid := k.vm.start(60*time.Second, fmt.Sprintf("vmagent contend %s %v %v %s", k.name, hold, gap, strings.Join(k.files, " ")))
		if !strings.HasPrefix(line, "contending") {
			t.Fatalf("%s worker: %q", k.name, line)
		}
		k.pid = pid
	}
	w.waitProgress("every worker in a critical section", 120*time.Second, nil)
	return w
}

// log reads worker k's output: its sections, and the OVERLAP/ERROR lines
// (problems).
func (w *lockWork) log(k *lockWorker) (secs []section, problems []string, done bool) {
	w.t.Helper()
	rc, out, err := k.vm.try(10*time.Second, fmt.Sprintf("cat /run/vmagent/%d.log", k.pid))
	if err != nil || rc != 0 {
		w.t.Fatalf("%s worker log: rc %d %v", k.name, rc, err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 4 && f[0] == "CS":
			r, _ := strconv.Atoi(f[2])
			wr, _ := strconv.Atoi(f[3])
			sec := section{file: f[1], read: r, wrote: wr, worker: k.name}
			if len(f) >= 6 {
				sec.waitedMS, _ = strconv.ParseInt(f[4], 10, 64)
				sec.atMS, _ = strconv.ParseInt(f[5], 10, 64)
			}
			secs = append(secs, sec)
		case len(f) > 0 && (f[0] == "OVERLAP" || f[0] == "ERROR"):
			problems = append(problems, k.name+": "+line)
		case len(f) > 0 && f[0] == "DONE":
			done = true
		}
	}
	return secs, problems, done
}

// progress is how many sections each worker finished; a problem line
// fails the test at once.
func (w *lockWork) progress() map[*lockWorker][]section {
	n := map[*lockWorker][]section{}
	for _, k := range w.workers {
		secs, problems, _ := w.log(k)
		if len(problems) > 0 {
			w.t.Fatalf("lock-safety workload: %s", strings.Join(problems, "; "))
		}
		n[k] = secs
	}
	return n
}

// waitProgress waits until every worker (of those only admits; nil: all)
// finished one critical section more. A stall is explained before the
// test fails: where each stalled worker's threads wait in its kernel, and
// each server's lockd and locks, one line each (a CI summary keeps a log
// entry's first line).
func (w *lockWork) waitProgress(what string, timeout time.Duration, only func(*lockWorker) bool) {
	w.t.Helper()
	before := w.progress()
	deadline := time.Now().Add(timeout)
	for {
		now := w.progress()
		var seen []string
		var stalled []*lockWorker
		for _, k := range w.workers {
			if only != nil && !only(k) {
				continue
			}
			if len(now[k]) <= len(before[k]) {
				stalled = append(stalled, k)
			}
			seen = append(seen, fmt.Sprintf("%s %d→%d", k.name, len(before[k]), len(now[k])))
		}
		if len(stalled) == 0 {
			return
		}
		if time.Now().After(deadline) {
			w.explain(stalled)
			w.t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, strings.Join(seen, ", "))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// explain logs what a stall looks like from inside the guests.
func (w *lockWork) explain(stalled []*lockWorker) {
	oneLine := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	for _, k := range stalled {
		_, out, err := k.vm.try(10*time.Second, fmt.Sprintf(
			"for t in /proc/%d/task/*; do echo \"[$(cat $t/wchan)]\" $(sed 's/+.*//' $t/stack | tr '\\n' '<'); done; echo '| last:' $(tail -n 1 /run/vmagent/%d.log); echo '| locks:' $(cat /proc/locks | tr '\\n' ';')", k.pid, k.pid))
		w.t.Logf("STALL %s (pid %d on %s): %s %v", k.name, k.pid, k.vm.name, oneLine(out), err)
	}
	for _, s := range w.servers {
		_, out, err := s.try(10*time.Second,
			"for p in $(pgrep -x lockd); do echo \"lockd $p [$(cat /proc/$p/wchan)]\" $(sed 's/+.*//' /proc/$p/stack | tr '\\n' '<'); done; echo '| locks:' $(cat /proc/locks | tr '\\n' ';'); echo '| dmesg:' $(dmesg | grep -iE 'lockd|nlm|statd|nsm' | tail -n 5 | tr '\\n' ';')")
		w.t.Logf("STALL server %s: %s %v", s.name, oneLine(out), err)
	}
}

// stop ends every worker after its current section and checks every
// section's write; it returns them all.
func (w *lockWork) stop() []section {
	t := w.t
	t.Helper()
	var all []section
	for _, k := range w.workers { // by its stop file, never a signal (contend.go says why)
		k.vm.sh(10*time.Second, "touch /run/vmagent/"+k.name+".stop")
	}
	for _, k := range w.workers {
		testutil.WaitForSeen(t, 90*time.Second, k.name+"'s worker to stop", func() (bool, string) {
			_, _, done := w.log(k)
			time.Sleep(200 * time.Millisecond)
			return done, ""
		})
		secs, problems, _ := w.log(k)
		if len(problems) > 0 {
			t.Fatalf("lock-safety workload: %s", strings.Join(problems, "; "))
		}
		all = append(all, secs...)
	}
	checkSequences(t, all)
	return all
}

// checkSequences fails the test unless sequenceError finds nothing.
func checkSequences(t *testing.T, secs []section) {
	t.Helper()
	if err := sequenceError(secs, true); err != nil {
		t.Fatal(err)
	}
}

// sequenceError: per file, each section must have read the number
// written just before it, no number is written twice, and (complete: the
// workers have stopped, no section is in flight) the numbers are 1…N with
// no gap.
func sequenceError(secs []section, complete bool) error {
	byFile := map[string]map[int]section{}
	for _, s := range secs {
		if byFile[s.file] == nil {
			byFile[s.file] = map[int]section{}
		}
		if prev, dup := byFile[s.file][s.wrote]; dup {
			return fmt.Errorf("%s: sequence %d written twice: %v, then %v: two holders of one lock, or a write lost", s.file, s.wrote, prev, s)
		}
		if s.wrote != s.read+1 {
			return fmt.Errorf("%s: %s read %d and wrote %d", s.file, s.worker, s.read, s.wrote)
		}
		byFile[s.file][s.wrote] = s
	}
	if !complete {
		return nil
	}
	for f, m := range byFile {
		for i := 1; i <= len(m); i++ {
			if _, ok := m[i]; !ok {
				return fmt.Errorf("%s: %d sections but sequence %d missing: a section's write was lost", f, len(m), i)
			}
		}
	}
	return nil
}

// violation is what the checks see of the workload so far (the first
// problem line, else a sequence error), without failing the test: a
// negative control's question. "" when nothing.
func (w *lockWork) violation() string {
	var all []section
	for _, k := range w.workers {
		secs, problems, _ := w.log(k)
		if len(problems) > 0 {
			return problems[0]
		}
		all = append(all, secs...)
	}
	if err := sequenceError(all, false); err != nil {
		return err.Error()
	}
	return ""
}

// kill ends every worker without checking anything.
func (w *lockWork) kill() {
	for _, k := range w.workers {
		k.vm.try(10*time.Second, fmt.Sprintf("kill %d", k.pid))
	}
}
