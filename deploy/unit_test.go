// Package deploy holds the systemd unit; its test checks the unit with
// systemd's own tools.
package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// maxExposure is the highest `systemd-analyze security` exposure the unit
// may have (0 is fully confined, 10 is unconfined).
const maxExposure = 4.0

// systemdAnalyze finds the tool; outside CI its absence skips the test
// (scripts/setup installs it, so under CI=true it is a failure).
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("systemd-analyze not found and CI=true (scripts/setup installs it): %v", err)
		}
		t.Skip("systemd-analyze not found (apt-get install systemd)")
	}
	return p
}

// TestUnitVerifies runs `systemd-analyze verify` on the unit, with its
// ExecStart binary (not installed here) replaced by a stub: any complaint
// about a directive fails.
func TestUnitVerifies(t *testing.T) {
	tool := systemdAnalyze(t)
	unit, err := os.ReadFile("sandboxd.service")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	stub := filepath.Join(dir, "sandboxd")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const bin = "ExecStart=/usr/local/bin/sandboxd "
	if !strings.Contains(string(unit), "\n"+bin) {
		t.Fatalf("the unit has no %q line", bin)
	}
	stubbed := strings.Replace(string(unit), "\n"+bin, "\nExecStart="+stub+" ", 1)
	path := filepath.Join(dir, "sandboxd.service")
	if err := os.WriteFile(path, []byte(stubbed), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tool, "verify", "--man=no", path).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestUnitExposure keeps the unit confined: `systemd-analyze security`
// must rate it at most maxExposure.
func TestUnitExposure(t *testing.T) {
	tool := systemdAnalyze(t)
	out, err := exec.Command(tool, "security", "--offline=true", "sandboxd.service").CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for sandboxd\.service: (\d+\.\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	got, _ := strconv.ParseFloat(string(m[1]), 64)
	if got > maxExposure {
		t.Errorf("exposure %.1f, want at most %.1f:\n%s", got, maxExposure, out)
	}
	t.Logf("exposure %.1f", got)
}

// TestUnitDocumentation: every Documentation= file the unit names is one
// of the repository's, installed under /usr/local/share/doc/sandboxd as the
// unit's comment says.
func TestUnitDocumentation(t *testing.T) {
	unit, err := os.ReadFile("sandboxd.service")
	if err != nil {
		t.Fatal(err)
	}
	const docDir = "file:///usr/local/share/doc/sandboxd/"
	n := 0
	for _, l := range strings.Split(string(unit), "\n") {
		v, ok := strings.CutPrefix(l, "Documentation=")
		if !ok {
			continue
		}
		for _, link := range strings.Fields(v) {
			n++
			rel, ok := strings.CutPrefix(link, docDir)
			if !ok {
				t.Errorf("Documentation=%s: not a file under %s", link, docDir)
				continue
			}
			if _, err := os.Stat(filepath.Join("..", rel)); err != nil {
				t.Errorf("Documentation=%s: the repository has no %s: %v", link, rel, err)
			}
			if !strings.Contains(string(unit), rel+" in /usr/local/share/doc/sandboxd/") {
				t.Errorf("Documentation=%s: the install comment does not say to install %s there", link, rel)
			}
		}
	}
	if n == 0 {
		t.Error("the unit has no Documentation=")
	}
}
