package fsm

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// prevReader is a program built from the previous release's fsm package
// (the commit e2e/previous-release names): for each file it names it
// prints "<file> apply <ErrBadCommand?> <registrations>" after applying
// an entry, or "<file> restore <ErrVersion?> <error>" after restoring a
// snapshot.
const prevReader = `package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/raft"
	"prevfsm/fsm"
)

func main() {
	for _, a := range os.Args[1:] {
		b, err := os.ReadFile(a)
		if err != nil {
			panic(err)
		}
		f := fsm.New(fsm.Options{})
		if bytes.HasPrefix(b, []byte("NSMDSNP1")) {
			err := f.Restore(io.NopCloser(bytes.NewReader(b)))
			fmt.Println(a, "restore", errors.Is(err, fsm.ErrVersion), err == nil)
			continue
		}
		out := f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: b})
		err, _ = out.(error)
		fmt.Println(a, "apply", errors.Is(err, fsm.ErrBadCommand), f.Len())
	}
}
`

// buildPrevious builds prevReader against the previous release's fsm
// package, offline, from the module cache; it skips when that cannot be
// done here (no git history, no go tool, -short).
func buildPrevious(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the previous release's fsm package")
	}
	pin, err := os.ReadFile("../e2e/previous-release")
	if err != nil {
		t.Skipf("no previous release named: %v", err)
	}
	var commit string
	for _, l := range strings.Split(string(pin), "\n") {
		if c, ok := strings.CutPrefix(l, "commit "); ok {
			commit = strings.TrimSpace(c)
		}
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	archive := exec.CommandContext(ctx, "sh", "-c", `git archive "$1" fsm | tar -x -C "$2"`, "sh", commit, dir)
	archive.Dir = ".."
	if out, err := archive.CombinedOutput(); err != nil {
		t.Skipf("the previous release %s is not in this repository's history: %v: %s", commit, err, out)
	}
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile("../go.sum")
	if err != nil {
		t.Fatal(err)
	}
	mod = []byte(strings.Replace(string(mod), "module github.com/nsmd/nsmd", "module prevfsm", 1))
	for name, b := range map[string][]byte{"go.mod": mod, "go.sum": sum, "cmd/main.go": []byte(prevReader)} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "prev")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("cannot build the previous release's fsm here: %v: %s", err, out)
	}
	return bin
}

// The previous release, fed this release's placement entries, a
// service's own write (kind 22) and a version-5 snapshot, refuses each
// whole (the entry as malformed, an unknown kind; the snapshot as an
// unknown version) — it never applies part of one. Controls: the same
// entry without the placement command, and a version-3 snapshot, apply
// and restore there.
func TestPreviousReleaseRefusesPlacementState(t *testing.T) {
	bin := buildPrevious(t)
	dir := t.TempDir()
	reg := Register{Reg: mkReg("h", lockd, "n1")}
	files := map[string]string{} // name → the line the previous release must print
	write := func(name string, b []byte, want string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		files[p] = p + " " + want
	}
	for name, c := range map[string]Command{
		"declared":  decl("n1", "home", "fp"),
		"placed":    ServicePlaced{Service: "home", Node: "n1", Epoch: 1, Reason: "placed"},
		"forgotten": ServiceForgotten{Service: "home", Epoch: 1},
		"scoped":    Scoped{Service: "home", Node: "n1", Epoch: 1, Cmd: ClientCreate{Name: "c"}},
	} {
		b, err := Encode(reg, c)
		if err != nil {
			t.Fatal(err)
		}
		write(name, b, "apply true 0")
	}
	control, _ := Encode(reg)
	write("control-entry", control, "apply false 1")
	write("snapshot-v5", persist(t, servicesFSM(t)), "restore true false")
	write("control-snapshot-v3", persist(t, tinyFSM(t)), "restore false true")

	args := make([]string, 0, len(files))
	for p := range files {
		args = append(args, p)
	}
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatalf("previous release's reader: %v", err)
	}
	got := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		got[sc.Text()] = true
	}
	for p, want := range files {
		if !got[want] {
			t.Errorf("%s: the previous release printed\n%s\nwant the line %q", filepath.Base(p), out, want)
		}
	}
}
