// Command pkg builds nsmd's Debian package with nFPM: `make deb` runs it as
//
//	pkg -config deploy/pkg/nfpm.yaml -binary out/deb/nsmd -out out
//
// from the repository root and prints the path of out/nsmd_<version>_amd64.deb.
// It lives in its own module so that nsmd's go.mod stays free of nFPM's
// dependencies.
//
// The version is $NSMD_VERSION when set, else derived from `git describe`:
// a tag v1.2.3 gives 1.2.3, five commits past it 1.2.3+git5.gabc1234; with no
// tag it is 0.0.0~git<commits>.g<hash> (the ~ sorts it before any release);
// uncommitted changes add .dirty.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
)

func main() {
	conf := flag.String("config", "deploy/pkg/nfpm.yaml", "nFPM config")
	binary := flag.String("binary", "", "the nsmd binary to package (required)")
	out := flag.String("out", "out", "directory for the .deb")
	printVersion := flag.Bool("print-version", false, "print the package version and exit")
	flag.Parse()
	if *printVersion {
		v, err := version(os.Getenv("NSMD_VERSION"), git)
		if err != nil {
			fail(err)
		}
		fmt.Println(v)
		return
	}
	if *binary == "" {
		fail(errors.New("-binary is required"))
	}
	path, err := build(*conf, *binary, *out, os.Getenv("NSMD_VERSION"))
	if err != nil {
		fail(err)
	}
	fmt.Println(path)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "pkg:", err)
	os.Exit(1)
}

// build writes the .deb into outDir and returns its path.
func build(conf, binary, outDir, versionOverride string) (string, error) {
	v, err := version(versionOverride, git)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(binary); err != nil {
		return "", fmt.Errorf("binary: %w", err)
	}
	env := map[string]string{"NSMD_VERSION": v, "NSMD_BINARY": binary}
	cfg, err := nfpm.ParseFileWithEnvMapping(conf, func(k string) string { return env[k] })
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", conf, err)
	}
	info, err := cfg.Get("deb")
	if err != nil {
		return "", fmt.Errorf("deb settings: %w", err)
	}
	if err := nfpm.PrepareForPackager(nfpm.WithDefaults(info), "deb"); err != nil {
		return "", fmt.Errorf("prepare the package: %w", err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(outDir, fmt.Sprintf("%s_%s_%s.deb", info.Name, v, info.Arch))
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return "", err
	}
	if err := deb.Default.Package(info, f); err != nil {
		f.Close()
		os.Remove(tmp)
		return "", fmt.Errorf("package: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return path, os.Rename(tmp, path)
}

func git(args ...string) (string, error) {
	out, err := exec.Command("git", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

var (
	tagged   = regexp.MustCompile(`^v?([0-9][0-9A-Za-z.+~]*?)(?:-([0-9]+)-(g[0-9a-f]+))?(-dirty)?$`)
	debVerOK = regexp.MustCompile(`^[0-9][0-9A-Za-z.+~]*$`)
)

// version is the package version: override when set, else from git.
func version(override string, git func(...string) (string, error)) (string, error) {
	v, err := func() (string, error) {
		if override != "" {
			return override, nil
		}
		if d, err := git("describe", "--tags", "--match", "v[0-9]*", "--dirty"); err == nil {
			m := tagged.FindStringSubmatch(d)
			if m == nil {
				return "", fmt.Errorf("tag %q is not v<version>", d)
			}
			v := m[1]
			if m[2] != "" {
				v += "+git" + m[2] + "." + m[3]
			}
			if m[4] != "" {
				v += ".dirty"
			}
			return v, nil
		}
		n, err := git("rev-list", "--count", "HEAD")
		if err != nil {
			return "", fmt.Errorf("no version: set NSMD_VERSION (%w)", err)
		}
		h, err := git("describe", "--always", "--abbrev=7", "--dirty")
		if err != nil {
			return "", fmt.Errorf("no version: set NSMD_VERSION (%w)", err)
		}
		hash, dirty := strings.CutSuffix(h, "-dirty")
		v := "0.0.0~git" + n + ".g" + hash
		if dirty {
			v += ".dirty"
		}
		return v, nil
	}()
	if err != nil {
		return "", err
	}
	if !debVerOK.MatchString(v) {
		return "", fmt.Errorf("version %q is not a Debian upstream version (a digit first, then [0-9A-Za-z.+~])", v)
	}
	return v, nil
}
