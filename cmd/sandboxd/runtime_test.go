package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandboxd/sandboxd/internal/broker/enginefake"
)

// engineTrap is a unix socket standing in for an engine: it counts the
// connections made to it and closes each at once.
type engineTrap struct {
	path  string
	dials atomic.Int64
}

func newEngineTrap(t *testing.T, path string) *engineTrap {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	tr := &engineTrap{path: path}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tr.dials.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return tr
}

// runtimeCommand is a command that takes --runtime, with arguments that
// pass every other check of its flags, and the directory it creates first
// once it goes past them.
type runtimeCommand struct {
	name  string
	args  func(dir string) []string
	state func(dir string) string
}

func runtimeCommands() []runtimeCommand {
	oneShotState := func(dir string) string { return filepath.Join(dir, "state") }
	return []runtimeCommand{
		{"run", func(string) []string {
			return []string{"run", "--bundle", "b", "--workspace", "w", "--ephemeral-key"}
		}, oneShotState},
		// A set that reads and checks (run-set reads it before it opens
		// anything): one instance, its bundle directory and its patch.
		{"run-set", func(dir string) []string {
			os.MkdirAll(filepath.Join(dir, "b"), 0o755)
			os.WriteFile(filepath.Join(dir, "b", "bundle.json"), []byte("{}"), 0o644)
			os.WriteFile(filepath.Join(dir, "p"), nil, 0o644)
			os.WriteFile(filepath.Join(dir, "set.jsonl"), []byte(`{"instance": "i", "bundle": "b", "patch": "p"}`+"\n"), 0o644)
			return []string{"run-set", "--set", filepath.Join(dir, "set.jsonl"), "--ephemeral-key"}
		}, oneShotState},
		{"exec", func(string) []string {
			return []string{"exec", "--image", "sha256:" + strings.Repeat("0", 64)}
		}, oneShotState},
		{"selfcheck", func(string) []string { return []string{"selfcheck"} }, oneShotState},
		// An unreadable key stops serve right after it locks its state.
		{"serve", func(dir string) []string {
			return []string{"serve", "--state", filepath.Join(dir, "serve"), "--socket", filepath.Join(dir, "s.sock"), "--key", filepath.Join(dir, "no.key")}
		}, func(dir string) string { return filepath.Join(dir, "serve") }},
	}
}

// runtimeEnv points every engine a command could open at traps and the
// one-shot state into dir; the helper is a real static binary, so a
// command that went on would open its blob store there.
func runtimeEnv(t *testing.T, dir string) (docker, containerd *engineTrap) {
	t.Helper()
	docker = newEngineTrap(t, filepath.Join(dir, "docker.sock"))
	containerd = newEngineTrap(t, filepath.Join(dir, "containerd.sock"))
	shim := filepath.Join(dir, "sandboxd-shim")
	if err := os.WriteFile(shim, enginefake.ShimBinary(), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_HOST", "unix://"+docker.path)
	t.Setenv("SANDBOXD_CONTAINERD_ADDRESS", containerd.path)
	t.Setenv("SANDBOXD_ENGINE", "")
	t.Setenv("SANDBOXD_STATE", filepath.Join(dir, "state"))
	t.Setenv("SANDBOXD_SHIM", shim)
	t.Setenv("SANDBOXD_RUNSC", shim)
	t.Setenv("SANDBOXD_PROBE", filepath.Join(dir, "no-probe"))
	t.Setenv("SANDBOXD_BROKER_NAME", "sandboxd-runtime-test")
	return docker, containerd
}

// Every command that takes --runtime refuses a value that is not runc or
// runsc the same way: a usage error (exitUsage) naming the value and the
// accepted ones, before it opens an engine, a state directory or a key.
func TestBadRuntimeIsAUsageErrorBeforeAnyEngine(t *testing.T) {
	for _, c := range runtimeCommands() {
		for _, engine := range []string{engineDocker, engineContainerd} {
			t.Run(c.name+"/"+engine, func(t *testing.T) {
				dir := t.TempDir()
				docker, containerd := runtimeEnv(t, dir)
				args := append(c.args(dir), "--engine", engine, "--runtime", "kata")
				if c.name == "exec" {
					args = append(args, "--", "true")
				}
				code, out, errOut := runCmd(t, run, args...)
				if code != exitUsage {
					t.Errorf("exit %d, want %d (usage); stderr %s", code, exitUsage, errOut)
				}
				if want := `invalid value "kata" for flag -runtime: want runc or runsc`; !strings.Contains(errOut, want) {
					t.Errorf("stderr: got %q, want it to say %q", errOut, want)
				}
				if out != "" {
					t.Errorf("stdout: got %q, want nothing", out)
				}
				if n := docker.dials.Load() + containerd.dials.Load(); n != 0 {
					t.Errorf("%d connections to an engine, want none", n)
				}
				if _, err := os.Stat(c.state(dir)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("state %s: got %v, want it never made", c.state(dir), err)
				}
			})
		}
	}
}

// The same commands with a good --runtime do go past the flags and make
// their state directory: the test above would see a command that opened
// anything before it checked --runtime. (No engine answers: each stops at
// the next step.)
func TestGoodRuntimeGoesPastTheFlags(t *testing.T) {
	for _, c := range runtimeCommands() {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			runtimeEnv(t, dir)
			args := append(c.args(dir), "--runtime", "runc")
			if c.name == "exec" {
				args = append(args, "--", "true")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			code := run(ctx, args, io.Discard, io.Discard)
			if code == exitUsage || code == exitOK {
				t.Errorf("exit %d: want the command refused after its flags (no engine answers)", code)
			}
			if _, err := os.Stat(c.state(dir)); err != nil {
				t.Errorf("state %s: %v; want the command to have gone past its flags", c.state(dir), err)
			}
		})
	}
}

// Every command whose flags include --runtime is one of runtimeCommands,
// so the tests above cover a command that starts taking it.
func TestEveryRuntimeCommandIsChecked(t *testing.T) {
	checked := map[string]bool{}
	for _, c := range runtimeCommands() {
		checked[c.name] = true
	}
	for name := range commands() {
		_, _, errOut := runCmd(t, run, name, "--help")
		if takes := strings.Contains(errOut, "  -runtime "); takes != checked[name] {
			t.Errorf("%s: takes --runtime %v, in runtimeCommands %v", name, takes, checked[name])
		}
	}
}
