package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/image"
)

// Rebuilding unchanged inputs gives the same image ID and is skipped; a
// changed input gives another ID.
func TestImageBuildIsReproducible(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	spec := `{"schema":"sandboxd.image/v1","name":"sandboxd/it-repro","env":["PATH=/bin"],"contents":[
		{"type":"file","src":"/bin/busybox","dst":"/bin/busybox","mode":"0755"},
		{"type":"text","dst":"/etc/marker","text":"` + t.Name() + `"}]}`
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	first, err := image.Build(ctx, env.Docker, dir, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeImage(t, first.ID) })
	again, err := image.Build(ctx, env.Docker, dir, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != first.ID || again.Loaded {
		t.Fatalf("rebuild: id %s loaded=%v, want %s not loaded", again.ID, again.Loaded, first.ID)
	}
	changed := []byte(spec[:len(spec)-4] + `x"}]}`)
	if err := os.WriteFile(filepath.Join(dir, "image.json"), changed, 0o644); err != nil {
		t.Fatal(err)
	}
	other, err := image.Build(ctx, env.Docker, dir, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeImage(t, other.ID) })
	if other.ID == first.ID {
		t.Fatal("a changed input kept the image ID")
	}
}

func removeImage(t *testing.T, id string) {
	if _, err := env.Docker.ImageRemove(context.Background(), id, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil {
		t.Logf("remove image %s: %v", id, err)
	}
}
