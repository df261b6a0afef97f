package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// repoRoot is the nsmd repository, two levels up from deploy/pkg.
const repoRoot = "../.."

var (
	debOnce sync.Once
	debPath string
	debErr  error
)

// makeDeb runs the real `make deb` once per test binary, into a
// temporary directory, and returns the path it printed.
func makeDeb(t *testing.T) string {
	t.Helper()
	debOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nsmd-deb-")
		if err != nil {
			debErr = err
			return
		}
		cmd := exec.Command("make", "-s", "-C", repoRoot, "deb", "DEB_OUT="+dir)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			debErr = fmt.Errorf("make deb: %w\n%s%s", err, out, stderr.String())
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		debPath = lines[len(lines)-1]
	})
	if debErr != nil {
		t.Fatal(debErr)
	}
	return debPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if debPath != "" {
		os.RemoveAll(filepath.Dir(debPath))
	}
	os.Exit(code)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s not installed", tool)
		}
	}
}

// TestDebFileNameAndControlFields: `make deb` writes nsmd_<version>_amd64.deb
// with the version git describe gives, and its control fields say what
// the package needs and that it conflicts with nothing (nfs-common stays
// installed; the unit's Conflicts= keeps rpc.statd and nsmd apart).
func TestDebFileNameAndControlFields(t *testing.T) {
	need(t, "make", "dpkg-deb", "git")
	deb := makeDeb(t)
	v, err := version("", func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = repoRoot
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "nsmd_" + v + "_amd64.deb"; filepath.Base(deb) != want {
		t.Errorf("package file %s, want %s", filepath.Base(deb), want)
	}
	info := run(t, "dpkg-deb", "-I", deb)
	fields := map[string]string{}
	for _, l := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), ": "); ok && !strings.Contains(k, " ") {
			fields[k] = v
		}
	}
	for k, want := range map[string]string{"Package": "nsmd", "Version": v, "Architecture": "amd64", "Depends": "adduser, procps", "Section": "net"} {
		if fields[k] != want {
			t.Errorf("control %s = %q, want %q", k, fields[k], want)
		}
	}
	for _, k := range []string{"Conflicts", "Breaks", "Replaces"} {
		if _, ok := fields[k]; ok {
			t.Errorf("control has %s: %q; the package must not conflict with nfs-common", k, fields[k])
		}
	}
	for _, script := range []string{"postinst", "prerm", "postrm", "conffiles", "md5sums"} {
		if !strings.Contains(info, " "+script) {
			t.Errorf("control archive has no %s:\n%s", script, info)
		}
	}
	dir := t.TempDir()
	run(t, "dpkg-deb", "-e", deb, dir)
	conffiles, err := os.ReadFile(filepath.Join(dir, "conffiles"))
	if err != nil || strings.TrimSpace(string(conffiles)) != "/etc/nsmd/nsmd.yaml" {
		t.Errorf("conffiles = %q %v, want /etc/nsmd/nsmd.yaml", conffiles, err)
	}
}

// TestDebContentsModesAndOwners: every file the package promises, with its
// mode and owner (the state directory is chowned to nsmd by postinst).
func TestDebContentsModesAndOwners(t *testing.T) {
	need(t, "make", "dpkg-deb", "git")
	deb := makeDeb(t)
	type entry struct{ mode, owner string }
	got := map[string]entry{}
	sc := bufio.NewScanner(strings.NewReader(run(t, "dpkg-deb", "-c", deb)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		got[strings.TrimSuffix(strings.TrimPrefix(f[5], "."), "/")] = entry{f[0], f[1]}
	}
	want := map[string]entry{
		"/usr/sbin/nsmd":                                  {"-rwxr-xr-x", "root/root"},
		"/usr/lib/systemd/system/nsmd.service":            {"-rw-r--r--", "root/root"},
		"/etc/nsmd/nsmd.yaml":                             {"-rw-r--r--", "root/root"},
		"/usr/lib/nsmd/hooks/nfsd-ha":                     {"-rwxr-xr-x", "root/root"},
		"/usr/share/doc/nsmd/README.md":                   {"-rw-r--r--", "root/root"},
		"/usr/share/doc/nsmd/running.md":                  {"-rw-r--r--", "root/root"},
		"/usr/share/doc/nsmd/ha-pair.md":                  {"-rw-r--r--", "root/root"},
		"/usr/share/doc/nsmd/monitoring.md":               {"-rw-r--r--", "root/root"},
		"/usr/share/doc/nsmd/security.md":                 {"-rw-r--r--", "root/root"},
		"/usr/share/doc/nsmd/examples/hooks-as-root.conf": {"-rw-r--r--", "root/root"},
		"/var/lib/nsmd":                                   {"drwxr-x---", "root/root"},
	}
	for p, w := range want {
		if g, ok := got[p]; !ok {
			t.Errorf("%s missing from the package", p)
		} else if g != w {
			t.Errorf("%s: %s %s, want %s %s", p, g.mode, g.owner, w.mode, w.owner)
		}
	}
	for p, e := range got {
		if !strings.HasPrefix(e.mode, "d") {
			if _, ok := want[p]; !ok {
				t.Errorf("unexpected file in the package: %s", p)
			}
		}
	}
	// The packaged files are the repository's.
	root := t.TempDir()
	run(t, "dpkg-deb", "-x", deb, root)
	for src, dst := range map[string]string{
		"deploy/systemd/nsmd.service": "usr/lib/systemd/system/nsmd.service",
		"deploy/etc/nsmd.yaml":        "etc/nsmd/nsmd.yaml",
		"deploy/hooks/nfsd-ha":        "usr/lib/nsmd/hooks/nfsd-ha",
	} {
		a, _ := os.ReadFile(filepath.Join(repoRoot, src))
		b, _ := os.ReadFile(filepath.Join(root, dst))
		if len(a) == 0 || string(a) != string(b) {
			t.Errorf("%s in the package differs from %s", dst, src)
		}
	}
	out, err := exec.Command(filepath.Join(root, "usr/sbin/nsmd"), "agent", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--vip-mode") {
		t.Errorf("packaged binary does not run: %v\n%s", err, out)
	}
}

// unitRoot extracts the package and adds the host's systemd unit tree and
// /bin/kill (ExecReload), so systemd-analyze can check the unit as
// installed, without touching the host.
func unitRoot(t *testing.T) string {
	t.Helper()
	deb := makeDeb(t)
	root := t.TempDir()
	run(t, "dpkg-deb", "-x", deb, root)
	if _, err := os.Stat("/usr/lib/systemd/system/sysinit.target"); err != nil {
		t.Skipf("skipping: no systemd unit tree on this host (%v)", err)
	}
	if err := os.CopyFS(filepath.Join(root, "usr/lib/systemd/system.host"), os.DirFS("/usr/lib/systemd/system")); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	// Units from the host next to nsmd.service, which the package put there.
	entries, _ := os.ReadDir(filepath.Join(root, "usr/lib/systemd/system.host"))
	for _, e := range entries {
		dst := filepath.Join(root, "usr/lib/systemd/system", e.Name())
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		if err := os.Rename(filepath.Join(root, "usr/lib/systemd/system.host", e.Name()), dst); err != nil {
			t.Fatal(err)
		}
	}
	kill, err := exec.LookPath("kill")
	if err != nil || !filepath.IsAbs(kill) {
		t.Skip("skipping: no /bin/kill (procps) on this host; the package depends on it")
	}
	os.MkdirAll(filepath.Join(root, "bin"), 0o755)
	b, err := os.ReadFile(kill)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/kill"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestUnitVerifiesAndIsHardened: systemd-analyze verify accepts the
// installed unit with no complaint at all, its offline security exposure
// is at most 3.0 ("OK"), and the least-privilege settings are there.
func TestUnitVerifiesAndIsHardened(t *testing.T) {
	need(t, "make", "dpkg-deb", "git", "systemd-analyze")
	root := unitRoot(t)
	cmd := exec.Command("systemd-analyze", "verify", "--root="+root, "nsmd.service")
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	cmd = exec.Command("systemd-analyze", "security", "--offline=yes", "--root="+root, "nsmd.service")
	out, _ = cmd.CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for nsmd.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security printed no exposure:\n%s", out)
	}
	exposure, _ := strconv.ParseFloat(string(m[1]), 64)
	t.Logf("systemd-analyze security exposure: %.1f", exposure)
	if exposure > 3.0 {
		t.Errorf("exposure %.1f > 3.0:\n%s", exposure, out)
	}

	// The documented drop-in for nodes whose hooks need root verifies too.
	dropin := filepath.Join(root, "etc/systemd/system/nsmd.service.d")
	if err := os.MkdirAll(dropin, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "usr/share/doc/nsmd/examples/hooks-as-root.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dropin, "hooks-as-root.conf"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command("systemd-analyze", "verify", "--root="+root, "nsmd.service").CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify with hooks-as-root.conf: %v\n%s", err, out)
	}
	os.RemoveAll(dropin)

	unit, err := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system/nsmd.service"))
	if err != nil {
		t.Fatal(err)
	}
	set := map[string][]string{}
	for _, l := range strings.Split(string(unit), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			set[k] = append(set[k], v)
		}
	}
	caps := "CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE CAP_DAC_OVERRIDE"
	for k, want := range map[string]string{
		"Type": "notify", "User": "nsmd", "AmbientCapabilities": caps, "CapabilityBoundingSet": caps,
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"StateDirectory": "nsmd", "Restart": "on-failure", "WatchdogSec": "10s",
		"RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_PACKET",
		"Conflicts":               "rpc-statd.service rpc-statd-notify.service nfsdcld.service",
		"ExecStart":               "/usr/sbin/nsmd agent --config /etc/nsmd/nsmd.yaml",
	} {
		if !slices.Equal(set[k], []string{want}) {
			t.Errorf("%s = %q, want exactly %q", k, set[k], want)
		}
	}
}

// TestDebInstallsAndPurges installs the package with the real dpkg into an
// overlay of this machine's root (a private mount namespace, a tmpfs upper
// layer: the host is not changed): postinst creates the nsmd system user
// and hands it /var/lib/nsmd; the conffile is registered; remove keeps the
// conffile and state, purge deletes both.
func TestDebInstallsAndPurges(t *testing.T) {
	need(t, "make", "dpkg-deb", "git", "unshare", "chroot", "dpkg")
	if os.Geteuid() != 0 {
		t.Skip("skipping: installing into an overlay of / needs root")
	}
	deb := makeDeb(t)
	dir := t.TempDir()
	script := `set -e
d=$1
mount -t tmpfs nsmd-deb-test "$d"
mkdir "$d/upper" "$d/work" "$d/root"
mount -t overlay overlay -o lowerdir=/,upperdir="$d/upper",workdir="$d/work" "$d/root"
mount --bind /proc "$d/root/proc"
mount --bind /dev "$d/root/dev"
cp "$2" "$d/root/nsmd.deb"
r() { chroot "$d/root" "$@"; }
if r getent passwd nsmd >/dev/null; then echo "nsmd user exists before install"; exit 1; fi
r dpkg -i /nsmd.deb >/dev/null
echo "user $(r getent passwd nsmd | cut -d: -f1,6,7)"
echo "state $(r stat -c '%U:%G %a' /var/lib/nsmd)"
echo "status $(r dpkg-query -W -f '${Status}' nsmd)"
echo "conffiles $(r dpkg-query -W -f '${Conffiles}' nsmd | awk '{print $1}')"
r dpkg -r nsmd >/dev/null
echo "removed: config $(test -e "$d/root/etc/nsmd/nsmd.yaml" && echo kept || echo gone), binary $(test -e "$d/root/usr/sbin/nsmd" && echo kept || echo gone)"
r dpkg -P nsmd >/dev/null
echo "purged: config $(test -e "$d/root/etc/nsmd/nsmd.yaml" && echo kept || echo gone), state $(test -e "$d/root/var/lib/nsmd" && echo kept || echo gone)"
`
	out := run(t, "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", dir, deb)
	t.Logf("install in an overlay:\n%s", out)
	for _, want := range []string{
		"user nsmd:/var/lib/nsmd:/usr/sbin/nologin",
		"state nsmd:nsmd 750",
		"status install ok installed",
		"conffiles /etc/nsmd/nsmd.yaml",
		"removed: config kept, binary gone",
		"purged: config gone, state gone",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %q", want)
		}
	}
	if out, err := exec.Command("getent", "passwd", "nsmd").Output(); err == nil && len(out) > 0 {
		t.Logf("note: the host has an nsmd user of its own: %s", out)
	}
}

// TestVersionFromGit: the Debian version derived from git describe.
func TestVersionFromGit(t *testing.T) {
	fake := func(describe, count, always string) func(...string) (string, error) {
		return func(args ...string) (string, error) {
			switch {
			case args[0] == "describe" && args[1] == "--tags":
				if describe == "" {
					return "", errors.New("no tags")
				}
				return describe, nil
			case args[0] == "rev-list":
				return count, nil
			default:
				return always, nil
			}
		}
	}
	for _, tc := range []struct {
		override, describe, count, always, want string
	}{
		{"", "v1.2.3", "", "", "1.2.3"},
		{"", "v1.2.3-5-gabc1234", "", "", "1.2.3+git5.gabc1234"},
		{"", "v1.2.3-5-gabc1234-dirty", "", "", "1.2.3+git5.gabc1234.dirty"},
		{"", "", "93", "66edc65", "0.0.0~git93.g66edc65"},
		{"", "", "93", "66edc65-dirty", "0.0.0~git93.g66edc65.dirty"},
		{"2.0.0", "v1.0", "", "", "2.0.0"},
	} {
		got, err := version(tc.override, fake(tc.describe, tc.count, tc.always))
		if err != nil || got != tc.want {
			t.Errorf("version(%q, describe %q) = %q, %v; want %q", tc.override, tc.describe, got, err, tc.want)
		}
	}
	if _, err := version("v1.0", nil); err == nil {
		t.Error("a version starting with v is not a Debian version: want an error")
	}
}
