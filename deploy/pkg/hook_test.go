package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runHook runs the shipped nfsd-ha with only env (and a PATH), its
// settings file pointed at an empty one, and returns its output.
func runHook(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{filepath.Join(repoRoot, "deploy/hooks/nfsd-ha")}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "NSMD_NFSD_HA_CONF=" + os.DevNull}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The shipped hook exports nothing unless the operator names the
// clients, and squashes a client's root unless asked not to: start
// refuses without NFS_HA_CLIENTS before it mounts anything, and check
// prints the export start would make.
func TestHookNeedsClientsAndSquashesRootByDefault(t *testing.T) {
	base := []string{"NFS_HA_DEVICE=/dev/null", "NFS_HA_MOUNT=/srv/nfs"}
	for _, cmd := range []string{"start", "check"} {
		out, err := runHook(t, base, cmd)
		if err == nil || !strings.Contains(out, "NFS_HA_CLIENTS is not set") || !strings.Contains(out, "refusing to export /srv/nfs to every host") {
			t.Fatalf("nfsd-ha %s without NFS_HA_CLIENTS: %v\n%s", cmd, err, out)
		}
	}
	// As an nsmd on_leader hook (NSMD_EVENT=leader), the same refusal.
	if out, err := runHook(t, append(base, "NSMD_EVENT=leader", "NSMD_ROLE=leader")); err == nil || !strings.Contains(out, "NFS_HA_CLIENTS is not set") {
		t.Fatalf("on_leader without NFS_HA_CLIENTS: %v\n%s", err, out)
	}
	out, err := runHook(t, append(base, "NFS_HA_CLIENTS=10.0.0.0/24"), "check")
	if err != nil || strings.TrimSpace(out) != "exportfs -o rw,sync,no_subtree_check,root_squash,fsid=1 10.0.0.0/24:/srv/nfs" {
		t.Fatalf("check with NFS_HA_CLIENTS: %v\n%s", err, out)
	}
	// The operator may ask for every host and for root.
	out, err = runHook(t, append(base, "NFS_HA_CLIENTS=*", "NFS_HA_EXPORT_OPTIONS=rw,sync,no_root_squash,fsid=1"), "check")
	if err != nil || strings.TrimSpace(out) != "exportfs -o rw,sync,no_root_squash,fsid=1 *:/srv/nfs" {
		t.Fatalf("check with explicit settings: %v\n%s", err, out)
	}
}

// A bad NFS_HA_DELEGATIONS is refused with its name before anything is
// mounted; yes and no pass the settings check.
func TestHookRefusesABadDelegationsSetting(t *testing.T) {
	base := []string{"NFS_HA_DEVICE=/dev/null", "NFS_HA_MOUNT=/srv/nfs", "NFS_HA_CLIENTS=10.0.0.0/24"}
	for _, cmd := range []string{"start", "check"} {
		out, err := runHook(t, append(base, "NFS_HA_DELEGATIONS=off"), cmd)
		if err == nil || !strings.Contains(out, "NFS_HA_DELEGATIONS is 'off': yes or no") {
			t.Fatalf("nfsd-ha %s with NFS_HA_DELEGATIONS=off: %v\n%s", cmd, err, out)
		}
	}
	for _, v := range []string{"yes", "no"} {
		if out, err := runHook(t, append(base, "NFS_HA_DELEGATIONS="+v), "check"); err != nil {
			t.Fatalf("NFS_HA_DELEGATIONS=%s: %v\n%s", v, err, out)
		}
	}
}
