//go:build linux

package slowfs

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFsyncTakesTheDelay: with a delay set, fsync through the mount takes
// at least that long and the data reaches the backing directory; with
// none, it does not wait for it.
func TestFsyncTakesTheDelay(t *testing.T) {
	if why := Usable(); why != "" {
		t.Skip(why)
	}
	backing, mnt := t.TempDir(), t.TempDir()
	f, err := Mount(backing, mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Error(err)
		}
	})
	sync := func() time.Duration {
		t.Helper()
		fh, err := os.OpenFile(filepath.Join(mnt, "x"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		if _, err := fh.WriteString("hello\n"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := fh.Sync(); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	const delay = 200 * time.Millisecond
	if d := sync(); d >= delay {
		t.Fatalf("fsync with no delay set took %v", d)
	}
	f.SetDelay(delay)
	if d := sync(); d < delay {
		t.Fatalf("fsync with a %v delay took %v", delay, d)
	}
	b, err := os.ReadFile(filepath.Join(backing, "x"))
	if err != nil || string(b) != "hello\nhello\n" {
		t.Fatalf("backing file: %q %v", b, err)
	}
	if f.Syncs() < 2 {
		t.Fatalf("%d syncs counted", f.Syncs())
	}
}
