package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNfsdHaGivesNfsdOneScope: the shipped hook's start_nfsd gives nfsd
// the NFSv4 server scope through rpc.nfsd's own -S/--scope where the
// installed rpc.nfsd has it (nfs-utils 2.6.3 and later), and through a UTS
// namespace whose hostname is the scope where it does not (older
// nfs-utils: nfsd takes the hostname of the process that starts it).
// rpc.nfsd here is a stand-in that parses its options the way each
// version does and records its arguments and the hostname it saw: no nfsd
// starts.
func TestNfsdHaGivesNfsdOneScope(t *testing.T) {
	hook, err := filepath.Abs("../deploy/hooks/nfsd-ha")
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	const scope = "nfs.example.test"
	for _, c := range []struct {
		name   string
		sets   bool // the stand-in has -S/--scope
		want   string
		asRoot bool
	}{
		{"nfs-utils with --scope", true, "--scope " + scope + " 3 | " + host, false},
		{"older nfs-utils", false, "3 | " + scope, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.asRoot && os.Geteuid() != 0 {
				t.Skip("the UTS namespace needs root")
			}
			dir := t.TempDir()
			log := filepath.Join(dir, "calls")
			stub := `#!/bin/sh
# rpc.nfsd stand-in: getopt rejects an option it does not know first.
for a in "$@"; do
	case "$a" in
	-S | --scope) [ "$SETS" = yes ] || { echo "rpc.nfsd: invalid option -- 'S'" >&2; echo "Usage:" >&2; exit 2; } ;;
	-h) echo "Usage:" >&2; exit 0 ;;
	esac
done
echo "$* | $(hostname)" >> "$LOG"
`
			if err := os.WriteFile(filepath.Join(dir, "rpc.nfsd"), []byte(stub), 0o755); err != nil {
				t.Fatal(err)
			}
			sets := "no"
			if c.sets {
				sets = "yes"
			}
			cmd := exec.Command("sh", "-c", `. "$HOOK" && start_nfsd`)
			cmd.Env = append(os.Environ(), "HOOK="+hook, "PATH="+dir+":"+os.Getenv("PATH"), "LOG="+log, "SETS="+sets,
				"NFS_HA_FUNCTIONS_ONLY=yes", "NSMD_NFSD_HA_CONF=/nonexistent", "NFS_HA_SCOPE="+scope, "NFS_HA_THREADS=3")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("start_nfsd: %v: %s", err, out)
			}
			got, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(string(got)) != c.want {
				t.Fatalf("rpc.nfsd ran as %q, want %q", strings.TrimSpace(string(got)), c.want)
			}
		})
	}
}
