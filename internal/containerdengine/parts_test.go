package containerdengine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/moby/client"
)

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func sha256Of(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// A shim is found where containerd looks for it, in its order; runc where
// the shim's exec.LookPath finds it.
func TestBinariesAreFoundAsContainerdFindsThem(t *testing.T) {
	root := t.TempDir()
	cwd, exe, p1, p2 := filepath.Join(root, "cwd"), filepath.Join(root, "exe"), filepath.Join(root, "p1"), filepath.Join(root, "p2")
	for _, d := range []string{cwd, exe, p1, p2} {
		os.MkdirAll(d, 0o755)
	}
	s := containerdSide{path: "relative:" + p1 + ":" + p2, cwd: cwd, exeDir: exe}

	if _, err := s.shimPath(shimBinary); err == nil || !strings.Contains(err.Error(), "in none of") {
		t.Fatalf("no shim anywhere: %v", err)
	}
	writeFile(t, filepath.Join(exe, shimBinary), "x", 0o644) // containerd only stats it there
	if got, err := s.shimPath(shimBinary); err != nil || got != filepath.Join(exe, shimBinary) {
		t.Fatalf("beside containerd: %q, %v", got, err)
	}
	writeFile(t, filepath.Join(p2, shimBinary), "x", 0o755)
	writeFile(t, filepath.Join(p1, shimBinary), "x", 0o644) // not executable: LookPath passes it
	if got, err := s.shimPath(shimBinary); err != nil || got != filepath.Join(p2, shimBinary) {
		t.Fatalf("in PATH: %q, %v", got, err)
	}
	writeFile(t, filepath.Join(cwd, shimBinary), "x", 0o644)
	if got, err := s.shimPath(shimBinary); err != nil || got != filepath.Join(cwd, shimBinary) {
		t.Fatalf("in the working directory: %q, %v", got, err)
	}

	// runc: the first executable regular file in PATH; a relative entry
	// (the shim's bundle) and a directory of that name are passed.
	if _, err := s.lookPath("runc"); err == nil {
		t.Fatal("found a runc where there is none")
	}
	os.MkdirAll(filepath.Join(p1, "runc"), 0o755)
	writeFile(t, filepath.Join(p2, "runc"), "x", 0o755)
	if got, err := s.lookPath("runc"); err != nil || got != filepath.Join(p2, "runc") {
		t.Fatalf("runc: %q, %v", got, err)
	}
}

func TestWrapperRunsNamesWhatAScriptSaysItRuns(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "wrapper")
	writeFile(t, script, "#!/bin/sh\n# sandboxd-runs: /opt/a/runsc\n#sandboxd-runs: /not/this\n# sandboxd-runs: /opt/b//x \nexec /opt/a/runsc \"$@\"\n", 0o755)
	got, err := wrapperRuns(script)
	if err != nil || strings.Join(got, ",") != "/opt/a/runsc,/opt/b/x" {
		t.Fatalf("got %q, %v", got, err)
	}
	writeFile(t, script, "#!/bin/sh\n# sandboxd-runs: bin/runsc\n", 0o755)
	if _, err := wrapperRuns(script); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Fatalf("a relative path: %v", err)
	}
	bin := filepath.Join(dir, "binary")
	writeFile(t, bin, "\x7fELF\n# sandboxd-runs: /opt/a/runsc\n", 0o755)
	if got, err := wrapperRuns(bin); err != nil || len(got) != 0 {
		t.Fatalf("a binary is not read for lines: %q, %v", got, err)
	}
	if _, err := wrapperRuns(filepath.Join(dir, "none")); err == nil {
		t.Fatal("a missing wrapper gave no error")
	}
}

// ServerVersion names the binaries that run this engine's containers by
// path and digest, so that one replaced on disk changes a self-check's key
// (selfcheck.Key.Components): the shim and the runc containerd runs, and a
// runtime wrapper with what it says it runs.
func TestServerVersionNamesTheBinariesThatRunContainers(t *testing.T) {
	e := realContainerd(t)
	dir := t.TempDir()
	wrapper, runsc := filepath.Join(dir, "sandboxd-runsc"), filepath.Join(dir, "runsc")
	writeFile(t, runsc, "the runsc of before", 0o755)
	writeFile(t, wrapper, "#!/bin/sh\n# sandboxd-runs: "+runsc+"\nexec "+runsc+" \"$@\"\n", 0o755)
	e.runtimes = map[string]string{"runc": "runc", "runsc": wrapper}

	parts := func() map[string]string {
		t.Helper()
		v, err := e.ServerVersion(context.Background(), client.ServerVersionOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, c := range v.Components {
			if _, dup := m[c.Name]; dup && c.Name != "runtime runsc runs" {
				t.Fatalf("part %s named twice", c.Name)
			}
			m[c.Name] = c.Version
			if c.Name == "containerd" && c.Details["GitCommit"] == "" {
				t.Errorf("containerd's part has no revision: %+v", c)
			}
		}
		return m
	}
	before := parts()
	t.Logf("parts: %q", before)
	for _, name := range []string{shimBinary, "runtime runc"} {
		path, digest, ok := strings.Cut(before[name], " ")
		if !ok || !filepath.IsAbs(path) || digest != sha256Of(t, path) {
			t.Fatalf("%s: %q, want an absolute path and its digest (all: %q)", name, before[name], before)
		}
		if base := filepath.Base(path); base != map[string]string{shimBinary: shimBinary, "runtime runc": "runc"}[name] {
			t.Fatalf("%s is %s", name, path)
		}
	}
	if want := wrapper + " " + sha256Of(t, wrapper); before["runtime runsc"] != want {
		t.Fatalf("runsc's wrapper: %q, want %q", before["runtime runsc"], want)
	}
	if want := runsc + " " + sha256Of(t, runsc); before["runtime runsc runs"] != want {
		t.Fatalf("what the wrapper runs: %q, want %q", before["runtime runsc runs"], want)
	}

	// Replaced in place (the same file, other bytes): its part changes,
	// and nothing else.
	f, err := os.OpenFile(runsc, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("the runsc of after")
	f.Close()
	after := parts()
	for name, v := range before {
		if changed := after[name] != v; changed != (name == "runtime runsc runs") {
			t.Errorf("%s: %q, then %q", name, v, after[name])
		}
	}

	// A binary that cannot be read is named so, not left out.
	os.Remove(runsc)
	if got := parts()["runtime runsc runs"]; !strings.HasPrefix(got, runsc+" unreadable: ") {
		t.Fatalf("a missing binary: %q", got)
	}
}
