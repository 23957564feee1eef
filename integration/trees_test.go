package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/sandbox"
)

// An image's trees are read from a read-only volume the broker fills from
// the image and checks against it: the job reads the image's files, cannot
// write them, and its result names the mount; a volume changed before a
// process checked it is filled again, never used; an evicted one is filled
// again for the next job.
func TestImageTreesFromVolumes(t *testing.T) {
	t.Parallel()
	if env.EngineName != "docker" {
		t.Skip("image trees are served on Docker (the engine exports the image); containerd reads them from its snapshot")
	}
	ctx := context.Background()
	dir := t.TempDir()
	tree := filepath.Join(env.Repo, "internal", "broker", "testdata", "tree-image", "tree")
	spec := `{"schema":"sandboxd.image/v1","name":"sandboxd/it-trees","env":["PATH=/bin"],"contents":[
		{"type":"file","src":"/bin/busybox","dst":"/bin/busybox","mode":"0755"},
		{"type":"busybox-links","src":"/bin/busybox","dst":"/bin"},
		{"type":"tree","src":"` + tree + `","dst":"/opt/tree","volume":true},
		{"type":"dir","dst":"/opt/tree/empty","mode":"0750"},
		{"type":"text","dst":"/etc/marker","text":"` + t.Name() + `"},
		{"type":"text","dst":"/etc/passwd","text":"root:x:0:0:root:/root:/bin/sh\nsandbox:x:65534:65534:sandbox:/work:/bin/sh\n"},
		{"type":"dir","dst":"/work"},{"type":"dir","dst":"/tmp","mode":"1777"},{"type":"dir","dst":"/.sandboxd"}]}`
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := image.Build(ctx, env.Docker, dir, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeImage(t, img.ID) })

	newBroker := func(name string) *broker.Broker {
		cfg := env.Cfg
		cfg.Name, cfg.VolumePrefix = name, name
		cfg.CacheDir = t.TempDir()
		cfg.ImageTrees = broker.ImageTreesOn
		b, err := broker.New(env.Eng, env.Blobs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	name := env.BrokerName + "-t" + strings.ToLower(randSuffix(t))
	cleanName(t, name)
	newTreeJob := func() sandbox.Job {
		return newJob(t, sh(`cat /opt/tree/a.txt /opt/tree/sub/deeper/x; readlink /opt/tree/link; /opt/tree/sub/run.sh
		stat -c '%a %u:%g %n' /opt/tree/empty /opt/tree/sub/run.sh
		touch /opt/tree/new 2>/dev/null && echo WROTE; cat /etc/marker`), func(j *sandbox.Job) { j.Image = img.ID })
	}
	job := newTreeJob()
	want := "hello\ndeep\nsub/run.sh\nhi\n750 0:0 /opt/tree/empty\n755 0:0 /opt/tree/sub/run.sh\n" + t.Name()
	run := func(b *broker.Broker, what string) {
		t.Helper()
		r := env.Run(t, b, job)
		if r.Status != sandbox.StatusSucceeded {
			t.Fatalf("%s: %s (%s)", what, r.Status, r.Cause)
		}
		if got := stdout(t, r); got != want {
			t.Fatalf("%s: %q, want %q", what, got, want)
		}
		if !slices.ContainsFunc(r.Security.Mounts, func(m sandbox.Mount) bool {
			return m.Target == "/opt/tree" && m.ReadOnly && strings.HasPrefix(m.Source, name+"-tree-")
		}) {
			t.Fatalf("%s: the result's mounts %+v have no read-only tree volume at /opt/tree", what, r.Security.Mounts)
		}
	}
	b := newBroker(name)
	run(b, "first job")
	if got := b.Stats().VolumesPopulated.Load(); got != 1 {
		t.Errorf("first job: %d volumes filled, want 1 (the tree)", got)
	}
	vols, err := b.InputVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(vols, func(v broker.InputVolume) bool { return v.Tree == "/opt/tree" })
	if i < 0 || vols[i].Digest != img.ID || vols[i].Size != 6+5+18 {
		t.Fatalf("volumes %+v: want the tree of %s, 29 bytes", vols, img.ID)
	}
	vol := vols[i].Name

	// Changed behind the broker's back, before another process checked
	// it: that process fills it again.
	tamper(t, vol, "a.txt", "HELLO\n")
	b2 := newBroker(name)
	run(b2, "after tampering")
	if got := b2.Stats().VolumesPopulated.Load(); got != 1 {
		t.Errorf("after tampering: %d volumes filled, want 1", got)
	}

	// Evicted (nothing pins an image's tree), it is filled for the next job.
	rep, err := b2.EvictInputVolumes(ctx, 0)
	if err != nil || rep.Evicted < 1 {
		t.Fatalf("evict: %+v, %v", rep, err)
	}
	if _, err := env.Eng.VolumeInspect(ctx, vol, client.VolumeInspectOptions{}); err == nil {
		t.Fatalf("volume %s still there after its eviction", vol)
	}
	run(b2, "after eviction")
	if got := b2.Stats().VolumesPopulated.Load(); got != 2 {
		t.Errorf("after eviction: %d volumes filled in all, want 2", got)
	}

	// Two processes of one name on two state directories (no lock file
	// in common) at once: one fills the volume, the other waits for it
	// and uses what it checks; neither fills it while the other reads.
	name2 := name + "x"
	cleanName(t, name2)
	pair := []*broker.Broker{newBroker(name2), newBroker(name2)}
	var wg sync.WaitGroup
	results := make([]sandbox.Result, 2)
	errs := make([]error, 2)
	jobs := []sandbox.Job{newTreeJob(), newTreeJob()}
	for i, pb := range pair {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			results[i], errs[i] = pb.Run(ctx, jobs[i])
		})
	}
	wg.Wait()
	filled := 0
	for i := range pair {
		if errs[i] != nil || results[i].Status != sandbox.StatusSucceeded {
			t.Fatalf("side by side, broker %d: %v %s (%s)", i, errs[i], results[i].Status, results[i].Cause)
		}
		if got := stdout(t, results[i]); got != want {
			t.Errorf("side by side, broker %d: %q, want %q", i, got, want)
		}
		filled += int(pair[i].Stats().VolumesPopulated.Load())
	}
	if filled != 1 {
		t.Errorf("side by side: the tree's volume filled %d times, want once", filled)
	}
}

// cleanName removes the cache of the broker name when the test ends and
// fails it if anything of that name is left.
func cleanName(t *testing.T, name string) {
	t.Cleanup(func() {
		ctx := context.Background()
		if err := broker.RemoveCache(ctx, env.Eng, name); err != nil {
			t.Errorf("remove cache: %v", err)
		}
		if left := env.Leftovers(ctx, broker.LabelBroker+"="+name); len(left) > 0 {
			t.Errorf("broker %s left behind: %v", name, left)
		}
	})
}

// tamper writes content at file in the volume, as anyone with the engine
// could.
func tamper(t *testing.T, vol, file, content string) {
	t.Helper()
	ctx := context.Background()
	c, err := env.Eng.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: env.Minimal, Entrypoint: []string{"/nonexistent"}, Labels: map[string]string{broker.LabelBroker: env.BrokerName}},
		HostConfig: &container.HostConfig{NetworkMode: "none", Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: vol, Target: "/v"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Eng.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: file, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
	tw.Write([]byte(content))
	tw.Close()
	if _, err := env.Eng.CopyToContainer(ctx, c.ID, client.CopyToContainerOptions{DestinationPath: "/v", Content: &buf}); err != nil {
		t.Fatal(err)
	}
}
