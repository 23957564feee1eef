package containerdengine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// Every shim containerd may run is named, wherever it looks (it keeps the
// one it found first for its life); runc is where the shim's exec.LookPath
// finds it.
func TestBinariesAreFoundAsContainerdFindsThem(t *testing.T) {
	root := t.TempDir()
	t.Chdir(root)
	cwd, exe, p1, p2, rel := filepath.Join(root, "cwd"), filepath.Join(root, "exe"), filepath.Join(root, "p1"), filepath.Join(root, "p2"), "relative"
	for _, d := range []string{cwd, exe, p1, p2, rel} {
		os.MkdirAll(d, 0o755)
	}
	s := containerdSide{path: rel + ":" + p1 + ":" + p2, cwd: cwd, exeDir: exe}

	if got := s.shimPaths(shimBinary); len(got) != 0 {
		t.Fatalf("no shim anywhere: %q", got)
	}
	writeFile(t, filepath.Join(rel, shimBinary), "x", 0o755) // a relative PATH entry: not containerd's
	writeFile(t, filepath.Join(exe, shimBinary), "x", 0o644) // containerd only stats it there
	writeFile(t, filepath.Join(p1, shimBinary), "x", 0o644)  // not executable: LookPath passes it
	writeFile(t, filepath.Join(p2, shimBinary), "x", 0o755)
	writeFile(t, filepath.Join(cwd, shimBinary), "x", 0o644)
	want := []string{filepath.Join(cwd, shimBinary), filepath.Join(exe, shimBinary), filepath.Join(p2, shimBinary)}
	if got := s.shimPaths(shimBinary); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("shims: %q, want %q", got, want)
	}

	// runc: the first executable regular file in PATH; a relative entry
	// (the shim's bundle) and a directory of that name are passed.
	if _, err := s.lookPath("runc"); err == nil {
		t.Fatal("found a runc where there is none")
	}
	writeFile(t, filepath.Join(rel, "runc"), "x", 0o755)
	os.MkdirAll(filepath.Join(p1, "runc"), 0o755)
	writeFile(t, filepath.Join(p2, "runc"), "x", 0o755)
	if got, err := s.lookPath("runc"); err != nil || got != filepath.Join(p2, "runc") {
		t.Fatalf("runc: %q, %v", got, err)
	}
}

// A process's side is read from its /proc directory: its PATH, working
// directory and executable's directory.
func TestReadSideReadsTheProcess(t *testing.T) {
	s, err := readSide("/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	exe, _ := os.Executable()
	if s.path != os.Getenv("PATH") || s.cwd != wd || s.exeDir != filepath.Dir(exe) {
		t.Fatalf("side %+v; want PATH %q, cwd %q, exe dir %q", s, os.Getenv("PATH"), wd, filepath.Dir(exe))
	}
}

// The socket's peer must be containerd: a process of another executable
// (a forwarder, systemd holding an activated socket) is not read.
func TestThePeerMustBeContainerd(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "not-containerd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if _, err := containerdProcess(sock); err == nil || !strings.Contains(err.Error(), "not containerd") {
		t.Fatalf("a socket of this test's process: %v", err)
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
	writeFile(t, script, "#!/bin/sh\n"+strings.Repeat("#\n", maxWrapper)+"# sandboxd-runs: /opt/a/runsc\n", 0o755)
	if _, err := wrapperRuns(script); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("a script longer than a wrapper: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := wrapperRuns(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a FIFO (never waited on): %v", err)
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
			if _, dup := m[c.Name]; dup {
				t.Fatalf("part %s named twice (this host has one shim)", c.Name)
			}
			m[c.Name] = c.Version
			if u := c.Details["Unknown"]; (u != "") != (c.Name == "runtime runsc runs" && strings.Contains(c.Version, "unreadable")) {
				t.Errorf("part %s: %q, marked unknown %q", c.Name, c.Version, u)
			}
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

	// A binary that cannot be read is named so, and marked unknown.
	os.Remove(runsc)
	if got := parts()["runtime runsc runs"]; !strings.HasPrefix(got, runsc+" unreadable: ") {
		t.Fatalf("a missing binary: %q", got)
	}
	// Nor is a FIFO in its place waited on.
	if err := syscall.Mkfifo(runsc, 0o700); err != nil {
		t.Fatal(err)
	}
	if got := parts()["runtime runsc runs"]; !strings.HasPrefix(got, runsc+" unreadable: ") {
		t.Fatalf("a FIFO: %q", got)
	}
}
