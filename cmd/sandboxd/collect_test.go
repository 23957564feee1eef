package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/broker/enginefake"
	"github.com/sandboxd/sandboxd/internal/store"
)

// A one-shot command's collection that fails, or panics, says so on
// stderr and nothing else: it runs after the exit code is chosen, and
// returns nothing that could change it.
func TestCollectCachesFailureOnlySaysSo(t *testing.T) {
	dir := t.TempDir()
	shimPath := filepath.Join(dir, "sandboxd-shim")
	if err := os.WriteFile(shimPath, enginefake.ShimBinary(), 0o755); err != nil {
		t.Fatal(err)
	}
	blobs, err := store.Open(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	leave, err := blobs.Share()
	if err != nil {
		t.Fatal(err)
	}
	cfg := broker.Default()
	cfg.ShimPath = shimPath
	b, err := broker.New(enginefake.New(), blobs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The blob store cannot be listed: its sweep fails.
	if err := os.RemoveAll(filepath.Join(dir, "blobs", "sha256")); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	left := false
	collectCaches(context.Background(), b, func() { left = true; leave() }, broker.DefaultCachePolicy(), &stderr, "sandboxd run")
	if !left {
		t.Error("the process did not leave the shared store before collecting")
	}
	if got := stderr.String(); !strings.HasPrefix(got, "sandboxd run: collect caches: ") || !strings.Contains(got, "(the result stands)") {
		t.Errorf("stderr: got %q, want the failure said", got)
	}
	stderr.Reset()
	collectCaches(context.Background(), b, func() { panic("boom") }, broker.DefaultCachePolicy(), &stderr, "sandboxd exec")
	if got := stderr.String(); !strings.Contains(got, "sandboxd exec: collect caches: panic: boom") {
		t.Errorf("stderr: got %q, want the panic said", got)
	}
}

// A one-shot broker's cache volumes are named after it, never the
// daemon's: its collection removes the volumes of its name, which a
// daemon sharing their names would mount.
func TestOneShotVolumesAreNotTheDaemons(t *testing.T) {
	for _, env := range []string{"", "ci-runner-7"} {
		t.Setenv("SANDBOXD_BROKER_NAME", env)
		cfg := oneShotConfig()
		want := "sandboxd-cli"
		if env != "" {
			want = env
		}
		if cfg.Name != want || cfg.VolumePrefix != want {
			t.Errorf("SANDBOXD_BROKER_NAME=%q: name %q, volume prefix %q; want both %q", env, cfg.Name, cfg.VolumePrefix, want)
		}
		if d := broker.Default(); cfg.Name == d.Name || cfg.VolumePrefix == d.VolumePrefix {
			t.Errorf("SANDBOXD_BROKER_NAME=%q: name %q, prefix %q share the daemon's default (%q, %q)", env, cfg.Name, cfg.VolumePrefix, d.Name, d.VolumePrefix)
		}
	}
}
