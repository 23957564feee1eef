package integration

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Input volumes are evicted least recently used first beyond their budget,
// never one a job needs (pinned), and a job whose volume was evicted has
// it populated again from the blob store.
func TestInputVolumesEvictedAndRestaged(t *testing.T) {
	t.Parallel()
	cfg := env.Cfg
	cfg.Name = env.BrokerName + "-e" + strings.ToLower(randSuffix(t))
	cfg.VolumePrefix = cfg.Name
	cfg.CacheDir = t.TempDir()
	b, err := broker.New(env.Eng, env.Blobs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := broker.RemoveCache(context.Background(), env.Eng, cfg.Name); err != nil {
			t.Errorf("remove cache: %v", err)
		}
	})
	bundles := map[string]string{}
	job := func(name string) sandbox.Job {
		return newJob(t, sh("cat /bundle/tests/"+name), func(j *sandbox.Job) {
			j.Inputs = []sandbox.Input{{Name: "bundle", Digest: bundles[name], Path: sandbox.BundlePath}}
		})
	}
	for _, name := range []string{"needed", "idle"} {
		bundles[name] = putTree(t, map[string]string{"tests/": "", "tests/" + name: name + " " + t.Name()})
		if r := env.Run(t, b, job(name)); r.Status != sandbox.StatusSucceeded || stdout(t, r) != name+" "+t.Name() {
			t.Fatalf("%s: %s (%s) %q", name, r.Status, r.Cause, stdout(t, r))
		}
	}
	ctx := context.Background()
	vols, err := b.InputVolumes(ctx)
	if err != nil || len(vols) != 2 {
		t.Fatalf("got %+v, %v, want the two input volumes", vols, err)
	}
	// A queued job needs the least recently used one: the other goes.
	unpin := env.Blobs.Pin(bundles["needed"])
	rep, err := b.EvictInputVolumes(ctx, 1)
	unpin()
	if err != nil {
		t.Fatal(err)
	}
	left, _ := b.InputVolumes(ctx)
	names := func(vs []broker.InputVolume) (out []string) {
		for _, v := range vs {
			out = append(out, v.Digest)
		}
		return out
	}
	if rep.Evicted != 1 || !slices.Equal(names(left), []string{bundles["needed"]}) {
		t.Fatalf("got %+v leaving %v, want only the idle volume evicted", rep, names(left))
	}
	// The evicted input is staged again for the next job that needs it.
	before := b.Stats().VolumesPopulated.Load()
	if r := env.Run(t, b, job("idle")); r.Status != sandbox.StatusSucceeded || stdout(t, r) != "idle "+t.Name() {
		t.Fatalf("after eviction: %s (%s) %q", r.Status, r.Cause, stdout(t, r))
	}
	if got := b.Stats().VolumesPopulated.Load() - before; got != 1 {
		t.Errorf("populated %d volumes for the job whose input was evicted, want 1", got)
	}
}
