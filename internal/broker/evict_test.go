package broker

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker/enginefake"
	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// oneShot is a one-shot broker (as `sandboxd run` makes one) on eng, with
// its own state directory: a shared blob store and check records.
func oneShot(t *testing.T, eng *enginefake.Engine, state string) *Broker {
	t.Helper()
	shimPath := filepath.Join(t.TempDir(), "sandboxd-shim")
	if err := os.WriteFile(shimPath, enginefake.ShimBinary(), 0o755); err != nil {
		t.Fatal(err)
	}
	blobs, err := store.Open(filepath.Join(state, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	leave, err := blobs.Share()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leave)
	cfg := Default()
	cfg.Name = "sandboxd-cli"
	cfg.ShimPath = shimPath
	cfg.CacheDir = filepath.Join(state, "checked-volumes")
	cfg.EngineTimeout = 10 * time.Second
	b, err := New(eng, blobs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.ClosePool)
	return b
}

func fakeEngine() *enginefake.Engine {
	eng := enginefake.New()
	eng.AddImage(fakeImage)
	eng.Program = enginefake.Helper("hi", shim.Status{}, nil)
	return eng
}

// runInput runs a job that reads a read-only input of files and returns
// the input's digest.
func runInput(t *testing.T, b *Broker, id string, files map[string]string) string {
	t.Helper()
	in := putInput(t, b.blobs, files)
	if res, _ := runJob(t, b, fakeJob(t, id, withInput("bundle", in))); res.Status != sandbox.StatusSucceeded {
		t.Fatalf("%s: got %s (%s), want succeeded", id, res.Status, res.Cause)
	}
	return in
}

// age makes an input volume look last used ago: created then, its check
// record touched then.
func age(t *testing.T, b *Broker, eng *enginefake.Engine, digest string, ago time.Duration) {
	t.Helper()
	name := b.inputVolumeName(digest)
	then := time.Now().Add(-ago)
	eng.SetVolumeCreated(name, then)
	if err := os.Chtimes(filepath.Join(b.cfg.CacheDir, name), then, then); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

func volumeDigests(t *testing.T, b *Broker) []string {
	t.Helper()
	vols, err := b.InputVolumes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range vols {
		out = append(out, v.Digest)
	}
	slices.Sort(out)
	return out
}

// At the end of a one-shot run its broker collects with the daemon's
// rules: the input volumes of its name beyond the budget go least recently
// used first, never one used in the last MinAge, one a container mounts,
// or, first of all, one whose blob another state holds (the daemon's
// rule for a volume without a blob would take every other state's
// volumes); its state's blobs are orphans once idle.
func TestOneShotCollectionBoundsVolumesAndBlobs(t *testing.T) {
	eng := fakeEngine()
	other := oneShot(t, eng, t.TempDir()) // a one-shot run on another state
	theirs := runInput(t, other, "theirs", map[string]string{"tests/theirs": "theirs"})
	theirsOld := runInput(t, other, "theirs-old", map[string]string{"tests/theirs-old": "theirs, long ago"})

	state := t.TempDir()
	b := oneShot(t, eng, state)
	old := runInput(t, b, "old", map[string]string{"tests/old": "old"})
	older := runInput(t, b, "older", map[string]string{"tests/older": "older"})
	mounted := runInput(t, b, "mounted", map[string]string{"tests/mounted": "mounted"})
	fresh := runInput(t, b, "fresh", map[string]string{"tests/fresh": "fresh"})
	for d, ago := range map[string]time.Duration{old: 2 * time.Hour, older: 3 * time.Hour, mounted: 4 * time.Hour, theirsOld: 5 * time.Hour} {
		age(t, b, eng, d, ago)
	}
	// A job of a third process mounts the oldest one right now.
	c, err := eng.ContainerCreate(context.Background(), client.ContainerCreateOptions{
		Config: &container.Config{Image: fakeImage},
		HostConfig: &container.HostConfig{Mounts: []mount.Mount{{
			Type: mount.TypeVolume, Source: b.inputVolumeName(mounted), Target: sandbox.BundlePath, ReadOnly: true}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// A blob of this state last used an hour ago (before any process
	// sharing the state now began), and one used now.
	stale := putInput(t, b.blobs, map[string]string{"stale": "a workspace of a run long gone"})
	p, _ := b.blobs.Path(stale)
	then := time.Now().Add(-time.Hour)
	os.Chtimes(p, then, then)
	recent := putInput(t, b.blobs, map[string]string{"recent": "a job's output just now"})

	var size int64
	vols, _ := b.InputVolumes(context.Background())
	for _, v := range vols {
		if v.Digest == fresh || v.Digest == theirs {
			size += v.Size
		}
	}
	// The next process's collection, with room for the two fresh volumes.
	next := oneShot(t, eng, state)
	rep, err := next.CollectCaches(context.Background(), CachePolicy{VolumeBudget: size, MinAge: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{fresh, theirs, mounted}
	slices.Sort(want)
	if got := volumeDigests(t, next); !slices.Equal(got, want) {
		t.Errorf("volumes left: got %v, want %v (fresh, another state's recent, the mounted)", got, want)
	}
	if rep.Volumes.Evicted != 3 {
		t.Errorf("got %+v, want 3 volumes evicted (old, older, the other state's old)", rep.Volumes)
	}
	if next.blobs.Has(stale) {
		t.Error("a blob of this state idle for an hour is still there")
	}
	if !next.blobs.Has(recent) {
		t.Error("a blob used just now was removed")
	}
	// The mounted volume goes once its container does.
	eng.ContainerRemove(context.Background(), c.ID, client.ContainerRemoveOptions{Force: true})
	if _, err := next.CollectCaches(context.Background(), CachePolicy{VolumeBudget: size, MinAge: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	want = []string{fresh, theirs}
	slices.Sort(want)
	if got := volumeDigests(t, next); !slices.Equal(got, want) {
		t.Errorf("after its container went: got %v, want %v", got, want)
	}
	// An evicted input is staged again for the next job that needs it.
	before := next.Stats().VolumesPopulated.Load()
	runInput(t, next, "old-again", map[string]string{"tests/old": "old"})
	if got := next.Stats().VolumesPopulated.Load() - before; got != 1 {
		t.Errorf("populated %d volumes for the evicted input, want 1", got)
	}
}

// Everything this test set up is within a collection's floor: nothing goes.
func TestOneShotCollectionSparesRecentUse(t *testing.T) {
	eng := fakeEngine()
	b := oneShot(t, eng, t.TempDir())
	a := runInput(t, b, "a", map[string]string{"tests/a": "a"})
	c := runInput(t, b, "c", map[string]string{"tests/c": "c"})
	rep, err := b.CollectCaches(context.Background(), CachePolicy{VolumeBudget: 0, MinAge: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{a, c}
	slices.Sort(want)
	if got := volumeDigests(t, b); !slices.Equal(got, want) || rep.Volumes.Evicted != 0 || rep.Blobs.Removed != 0 {
		t.Errorf("got volumes %v and %+v, want nothing removed", got, rep)
	}
	if err := (CachePolicy{VolumeBudget: 1}).Validate(); err == nil {
		t.Error("a policy without a floor validates")
	}
}
