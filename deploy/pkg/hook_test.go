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
	out, err := runHook(t, append(base, "NFS_HA_CLIENTS=10.0.0.0/24", "NFS_HA_MMP=off"), "check")
	if err != nil || strings.TrimSpace(out) != "exportfs -o rw,sync,no_subtree_check,root_squash,fsid=1 10.0.0.0/24:/srv/nfs" {
		t.Fatalf("check with NFS_HA_CLIENTS: %v\n%s", err, out)
	}
	// The operator may ask for every host and for root.
	out, err = runHook(t, append(base, "NFS_HA_CLIENTS=*", "NFS_HA_EXPORT_OPTIONS=rw,sync,no_root_squash,fsid=1", "NFS_HA_MMP=off"), "check")
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

// fakeDumpe2fs puts a dumpe2fs on PATH that prints features as the
// superblock's feature list (or fails when features is "FAIL"), and
// returns the PATH setting.
func fakeDumpe2fs(t *testing.T, features string) string {
	t.Helper()
	dir := t.TempDir()
	script := "#!/bin/sh\necho 'dumpe2fs 1.47.0 (5-Feb-2023)'\nprintf 'Filesystem features:      %s\\n' '" + features + "'\n"
	if features == "FAIL" {
		script = "#!/bin/sh\necho 'dumpe2fs: Bad magic number in super-block' >&2\nexit 1\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "dumpe2fs"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return "PATH=" + dir + ":" + os.Getenv("PATH")
}

// The hook checks ext4 multi-mount protection on the shared device, the
// guard that holds when a paused VM's watchdog cannot: require refuses a
// device without it (or one it cannot read) before anything is mounted,
// warn (the default, so that an upgrade never stops a running service)
// says so and goes on, off does not look; another filesystem gets a
// warning; a bad value is refused. Run as check (changes nothing) and as
// start, which stops before the mount (the refusal, or no VIP here).
func TestHookChecksExt4MultiMountProtection(t *testing.T) {
	const noMMP = "has_journal ext_attr resize_inode dir_index filetype extent 64bit flex_bg sparse_super large_file huge_file dir_nlink extra_isize metadata_csum"
	base := []string{"NFS_HA_DEVICE=/dev/sdz", "NFS_HA_MOUNT=/srv/nfs", "NFS_HA_CLIENTS=10.0.0.0/24", "NSMD_ROLE=leader", "NSMD_VIP=192.0.2.250/24", "NFS_HA_NFSV4=no"}
	for _, c := range []struct {
		name, mmp, fstype, features string
		fails                       bool
		says, notSays               string
	}{
		{name: "require_with_mmp", mmp: "require", features: noMMP + " mmp", says: "/dev/sdz has ext4 multi-mount protection"},
		{name: "require_without_mmp", mmp: "require", features: noMMP, fails: true, says: "NFS_HA_MMP=require: /dev/sdz has no ext4 multi-mount protection", notSays: "cannot mount"},
		{name: "require_unreadable", mmp: "require", features: "FAIL", fails: true, says: "NFS_HA_MMP=require: cannot read the ext4 features of /dev/sdz"},
		{name: "default_warns_without_mmp", features: noMMP, says: "WARNING: /dev/sdz has no ext4 multi-mount protection"},
		{name: "warn_unreadable", mmp: "warn", features: "FAIL", says: "WARNING: cannot read the ext4 features"},
		{name: "off_does_not_look", mmp: "off", features: noMMP, notSays: "multi-mount protection"},
		{name: "xfs_warns", mmp: "require", fstype: "xfs", features: noMMP, says: "WARNING: NFS_HA_MMP=require: xfs has no multi-mount protection"},
		{name: "bad_value", mmp: "on", features: noMMP + " mmp", fails: true, says: "NFS_HA_MMP is 'on': require, warn or off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := append(append([]string(nil), base...), fakeDumpe2fs(t, c.features))
			if c.mmp != "" {
				env = append(env, "NFS_HA_MMP="+c.mmp)
			}
			if c.fstype != "" {
				env = append(env, "NFS_HA_FSTYPE="+c.fstype)
			}
			for _, cmd := range []string{"check", "start"} {
				out, err := runHook(t, env, cmd)
				failed := err != nil
				if cmd == "start" {
					// start goes on to the VIP check, which fails on this
					// host: a start the MMP check let through fails there.
					if !strings.Contains(out, "is not on this host") && !c.fails {
						t.Fatalf("%s: start did not reach the VIP check:\n%s", cmd, out)
					}
					failed = !strings.Contains(out, "is not on this host")
				}
				if failed != c.fails || (c.says != "" && !strings.Contains(out, c.says)) || (c.notSays != "" && strings.Contains(out, c.notSays)) {
					t.Fatalf("nfsd-ha %s (NFS_HA_MMP=%q, %s): %v\n%s", cmd, c.mmp, c.name, err, out)
				}
			}
		})
	}
}
