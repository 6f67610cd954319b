// Package systemd tests the systemd units of deploy/systemd with systemd-analyze: each must
// verify without a single message (warnings count) and keep its offline security exposure at
// or under maxExposure (docs/deploy.md, "systemd units").
package systemd

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// maxExposure is the highest `systemd-analyze security --offline=true` exposure a unit may
// have (0 is fully locked down, 10 is not at all).
const maxExposure = 1.5

// units are the unit names checked; a template is checked through one instance.
var units = []string{"quotad-coordinator.service", "quotad-etcd.service", "quotad-region@us.service"}

// analyzeTimeout bounds each systemd-analyze run.
const analyzeTimeout = 60 * time.Second

func TestUnits(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed (Debian's systemd package has it; make test's systemd step installs it)")
	}
	root := unitRoot(t)
	exposure := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)
	for _, u := range units {
		if out, err := analyze(t, "verify", "--root="+root, u); err != nil || out != "" {
			t.Errorf("systemd-analyze verify %s: %v, want no output, got:\n%s", u, err, out)
		}
		out, err := analyze(t, "security", "--offline=true", "--root="+root, "--no-pager", u)
		if err != nil {
			t.Errorf("systemd-analyze security %s: %v:\n%s", u, err, out)
			continue
		}
		m := exposure.FindStringSubmatch(out)
		if m == nil {
			t.Errorf("systemd-analyze security %s: no overall exposure in:\n%s", u, out)
			continue
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatalf("exposure %q: %v", m[1], err)
		}
		t.Logf("%s: exposure %.1f (at most %.1f)", u, v, maxExposure)
		if v > maxExposure {
			t.Errorf("%s: exposure %.1f, want at most %.1f:\n%s", u, v, maxExposure, out)
		}
	}
}

// TestVerifyReportsFaults holds the check above to account: a unit with an unknown key or a
// missing executable must make systemd-analyze verify print something in the same root.
func TestVerifyReportsFaults(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed (Debian's systemd package has it; make test's systemd step installs it)")
	}
	root := unitRoot(t)
	bad := map[string]string{
		"quota-unknown-key.service": "[Service]\nExecStart=/usr/local/bin/quotad dev\nNoSuchKey=yes\n",
		"quota-no-binary.service":   "[Service]\nExecStart=/usr/local/bin/no-such-quotad dev\n",
	}
	for name, text := range bad {
		if err := os.WriteFile(filepath.Join(root, "etc/systemd/system", name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := analyze(t, "verify", "--root="+root, name); err == nil && out == "" {
			t.Errorf("systemd-analyze verify %s printed nothing; the units' check could not fail", name)
		}
	}
}

// unitRoot is a root directory for systemd-analyze --root: the machine's own system units
// (sysinit.target and the rest a unit's default dependencies name), this directory's units
// in /etc/systemd/system, and an executable /usr/local/bin/quotad standing in for the real
// one, which verify requires to exist.
func unitRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	sys := "/usr/lib/systemd/system"
	if _, err := os.Stat(sys); err != nil {
		sys = "/lib/systemd/system"
	}
	copyTree(t, sys, filepath.Join(root, "usr/lib/systemd/system"))
	etc := filepath.Join(root, "etc/systemd/system")
	bin := filepath.Join(root, "usr/local/bin")
	for _, d := range []string{etc, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, "quotad"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("*.service")
	if err != nil || len(files) == 0 {
		t.Fatalf("no *.service in deploy/systemd: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(etc, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// copyTree copies the regular files, directories and symbolic links under src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}

// analyze runs systemd-analyze with args and analyzeTimeout and returns its trimmed combined
// output.
func analyze(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), analyzeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "systemd-analyze", args...)
	cmd.Env = append(os.Environ(), "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
