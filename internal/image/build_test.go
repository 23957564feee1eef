package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/sandbox"
)

// fakeEngine is an in-memory image store: it takes what ImageLoad is given
// apart as the engine would and keys the image by its config's digest.
type fakeEngine struct {
	images map[string]loaded
	loads  int
}

type loaded struct {
	config []byte
	layer  []byte
	tags   []string
}

func newFakeEngine() *fakeEngine { return &fakeEngine{images: map[string]loaded{}} }

func (f *fakeEngine) ImageInspect(ctx context.Context, id string, _ ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	if _, ok := f.images[id]; !ok {
		return client.ImageInspectResult{}, fmt.Errorf("image %s: %w", id, errdefs.ErrNotFound)
	}
	var r client.ImageInspectResult
	r.ID = id
	return r, nil
}

func (f *fakeEngine) ImageLoad(ctx context.Context, in io.Reader, _ ...client.ImageLoadOption) (client.ImageLoadResult, error) {
	f.loads++
	files := map[string][]byte{}
	tr := tar.NewReader(in)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[h.Name] = b
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 || len(manifest[0].Layers) != 1 {
		return nil, fmt.Errorf("bad manifest %q: %v", files["manifest.json"], err)
	}
	cfg, layer := files[manifest[0].Config], files[manifest[0].Layers[0]]
	var c struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil || len(c.RootFS.DiffIDs) != 1 {
		return nil, fmt.Errorf("bad config %q: %v", cfg, err)
	}
	if got := sha(layer); got != c.RootFS.DiffIDs[0] {
		return nil, fmt.Errorf("layer digest %s, config says %s", got, c.RootFS.DiffIDs[0])
	}
	f.images[sha(cfg)] = loaded{config: cfg, layer: layer, tags: manifest[0].RepoTags}
	return io.NopCloser(strings.NewReader(`{"stream":"Loaded image"}`)), nil
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// fixture is a small image: a file, a tree (with a link and an executable),
// a text, a directory and a link, all from a temporary directory.
type fixture struct {
	dir  string // holds image.json and the sources
	spec map[string]any
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	write := func(rel, content string, mode os.FileMode) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("bin/tool", "#!/bin/sh\necho tool\n", 0o755)
	write("tree/lib/a.txt", "alpha", 0o644)
	write("tree/lib/run", "run", 0o700)
	write("tree/skip/me", "excluded", 0o644)
	if err := os.Symlink("lib/a.txt", filepath.Join(dir, "tree", "alias")); err != nil {
		t.Fatal(err)
	}
	f := &fixture{dir: dir, spec: map[string]any{
		"schema": SpecSchema,
		"name":   "sandboxd/test",
		"env":    []string{"PATH=/bin"},
		"contents": []map[string]any{
			{"type": "file", "src": "bin/tool", "dst": "/bin/tool", "mode": "0755"},
			{"type": "tree", "src": "tree", "dst": "/opt/tree", "exclude": []string{"skip"}},
			{"type": "text", "dst": "/etc/passwd", "text": "sandbox:x:65534:65534::/work:/bin/sh\n"},
			{"type": "dir", "dst": "/tmp", "mode": "1777"},
			{"type": "symlink", "dst": "/bin/sh", "target": "tool"},
		},
	}}
	return f
}

func (f *fixture) contents() []map[string]any { return f.spec["contents"].([]map[string]any) }

// build writes image.json and builds it into eng, with a skip cache of
// its own so that each build really computes the image.
func (f *fixture) build(t *testing.T, eng *fakeEngine) (*Built, loaded) {
	t.Helper()
	b, err := json.Marshal(f.spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, "image.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	built, err := Build(context.Background(), eng, f.dir, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	img, ok := eng.images[built.ID]
	if !ok {
		t.Fatalf("built %s, but the engine holds %d other images", built.ID, len(eng.images))
	}
	return built, img
}

func TestBuildIsDeterministic(t *testing.T) {
	f := newFixture(t)
	b1, img1 := f.build(t, newFakeEngine())

	// The same inputs on a fresh engine, after the sources' times and
	// owners changed: none of that is in the image.
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, p := range []string{"bin/tool", "tree/lib/a.txt", "tree/lib/run", "tree", "tree/lib"} {
		if err := os.Chtimes(filepath.Join(f.dir, p), old, old); err != nil {
			t.Fatal(err)
		}
		if os.Getuid() == 0 {
			if err := os.Lchown(filepath.Join(f.dir, p), 1234, 5678); err != nil {
				t.Fatal(err)
			}
		}
	}
	b2, img2 := f.build(t, newFakeEngine())
	if b1.ID != b2.ID {
		t.Errorf("image ID: got %s then %s, want the same", b1.ID, b2.ID)
	}
	if sha(img1.layer) != sha(img2.layer) {
		t.Errorf("layer digest: got %s then %s, want the same", sha(img1.layer), sha(img2.layer))
	}
	if !b1.Loaded || !b2.Loaded {
		t.Errorf("got loaded %v and %v, want both loaded into their fresh engines", b1.Loaded, b2.Loaded)
	}
	// The ID is the config's digest, and the config names the layer's.
	var cfg struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(img1.config, &cfg); err != nil {
		t.Fatal(err)
	}
	if b1.ID != sha(img1.config) || cfg.RootFS.DiffIDs[0] != sha(img1.layer) {
		t.Errorf("got ID %s for config %s and diff_id %s for layer %s", b1.ID, sha(img1.config), cfg.RootFS.DiffIDs[0], sha(img1.layer))
	}
	if len(img1.tags) != 1 || img1.tags[0] != "sandboxd/test:latest" {
		t.Errorf("got tags %v, want [sandboxd/test:latest]", img1.tags)
	}
}

// The layer holds exactly what the spec places, sorted, with zero times
// and owners and the modes the spec gives.
func TestBuildLayerContents(t *testing.T) {
	f := newFixture(t)
	_, img := f.build(t, newFakeEngine())
	type ent struct {
		typ  byte
		mode int64
		body string
	}
	want := []struct {
		name string
		ent
	}{
		{"bin/", ent{tar.TypeDir, 0o755, ""}},
		{"bin/sh", ent{tar.TypeSymlink, 0o777, "tool"}},
		{"bin/tool", ent{tar.TypeReg, 0o755, "#!/bin/sh\necho tool\n"}},
		{"etc/", ent{tar.TypeDir, 0o755, ""}},
		{"etc/passwd", ent{tar.TypeReg, 0o644, "sandbox:x:65534:65534::/work:/bin/sh\n"}},
		{"opt/", ent{tar.TypeDir, 0o755, ""}},
		{"opt/tree/", ent{tar.TypeDir, 0o755, ""}},
		{"opt/tree/alias", ent{tar.TypeSymlink, 0o777, "lib/a.txt"}},
		{"opt/tree/lib/", ent{tar.TypeDir, 0o755, ""}},
		{"opt/tree/lib/a.txt", ent{tar.TypeReg, 0o644, "alpha"}},
		{"opt/tree/lib/run", ent{tar.TypeReg, 0o755, "run"}}, // a tree's modes are normalised
		{"tmp/", ent{tar.TypeDir, 0o1777, ""}},
	}
	tr := tar.NewReader(bytes.NewReader(img.layer))
	i := 0
	for ; ; i++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		if h.Typeflag == tar.TypeSymlink {
			body = []byte(h.Linkname)
		}
		if i >= len(want) {
			t.Errorf("unexpected entry %s", h.Name)
			continue
		}
		w := want[i]
		got := ent{h.Typeflag, h.Mode, string(body)}
		if h.Name != w.name || got != w.ent {
			t.Errorf("entry %d: got %s %+v, want %s %+v", i, h.Name, got, w.name, w.ent)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: got time %v, owner %d:%d (%q:%q), want zero", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname)
		}
	}
	if i != len(want) {
		t.Errorf("got %d entries, want %d", i, len(want))
	}
}

// Every input that is part of the image changes its ID; what changes the
// layer changes the layer's digest too.
func TestBuildChangedInputChangesImage(t *testing.T) {
	tests := []struct {
		name        string
		change      func(t *testing.T, f *fixture)
		layerChange bool
	}{
		{"a file's bytes", func(t *testing.T, f *fixture) { rewrite(t, f, "bin/tool", "#!/bin/sh\necho other\n") }, true},
		{"a file's mode in the spec", func(t *testing.T, f *fixture) { f.contents()[0]["mode"] = "0750" }, true},
		{"a tree file's bytes", func(t *testing.T, f *fixture) { rewrite(t, f, "tree/lib/a.txt", "alphA") }, true},
		{"a tree file's executable bit", func(t *testing.T, f *fixture) { chmod(t, f, "tree/lib/a.txt", 0o755) }, true},
		{"a file added to a tree", func(t *testing.T, f *fixture) { rewrite(t, f, "tree/lib/new", "") }, true},
		{"an exclusion dropped", func(t *testing.T, f *fixture) { delete(f.contents()[1], "exclude") }, true},
		{"a link's target in a tree", func(t *testing.T, f *fixture) { relink(t, f, "tree/alias", "lib/run") }, true},
		{"a text", func(t *testing.T, f *fixture) { f.contents()[2]["text"] = "root:x:0:0::/:/bin/sh\n" }, true},
		{"a directory's mode", func(t *testing.T, f *fixture) { f.contents()[3]["mode"] = "0755" }, true},
		{"a symlink's target", func(t *testing.T, f *fixture) { f.contents()[4]["target"] = "/bin/tool" }, true},
		{"a destination", func(t *testing.T, f *fixture) { f.contents()[2]["dst"] = "/etc/group" }, true},
		{"the environment", func(t *testing.T, f *fixture) { f.spec["env"] = []string{"PATH=/usr/bin:/bin"} }, false},
		{"the name", func(t *testing.T, f *fixture) { f.spec["name"] = "sandboxd/other" }, false},
	}
	base := newFixture(t)
	baseBuilt, baseImg := base.build(t, newFakeEngine())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			tt.change(t, f)
			b, img := f.build(t, newFakeEngine())
			if b.ID == baseBuilt.ID {
				t.Errorf("got the same image ID %s, want a new one", b.ID)
			}
			if changed := sha(img.layer) != sha(baseImg.layer); changed != tt.layerChange {
				t.Errorf("layer digest changed: got %v, want %v", changed, tt.layerChange)
			}
		})
	}
	// Control: a fixture changed in nothing builds the base image again,
	// so the differences above come from the changes.
	if b, _ := newFixture(t).build(t, newFakeEngine()); b.ID != baseBuilt.ID {
		t.Fatalf("an unchanged fixture built %s, want %s", b.ID, baseBuilt.ID)
	}
}

// The order of the spec's contents is not in the image (entries are
// sorted), as long as nothing is placed twice.
func TestBuildContentsOrderDoesNotMatter(t *testing.T) {
	f := newFixture(t)
	b1, _ := f.build(t, newFakeEngine())
	c := f.contents()
	f.spec["contents"] = []map[string]any{c[4], c[3], c[2], c[1], c[0]}
	b2, _ := f.build(t, newFakeEngine())
	if b1.ID != b2.ID {
		t.Errorf("got %s and %s for the same contents in another order, want one ID", b1.ID, b2.ID)
	}
}

// An image the engine already has is not loaded again.
func TestBuildSkipsAnImageTheEngineHas(t *testing.T) {
	f := newFixture(t)
	eng := newFakeEngine()
	b1, _ := f.build(t, eng)
	b2, _ := f.build(t, eng)
	if !b1.Loaded || b2.Loaded || eng.loads != 1 || b1.ID != b2.ID {
		t.Errorf("got loaded %v then %v, %d loads, IDs %s %s; want one load of one image", b1.Loaded, b2.Loaded, eng.loads, b1.ID, b2.ID)
	}
}

// The skip cache's key covers a tree's file times (it does not hash the
// bytes of a whole toolchain), so a touched tree is rebuilt: to the same ID.
func TestInputsKey(t *testing.T) {
	f := newFixture(t)
	load := func() *Spec {
		b, _ := json.Marshal(f.spec)
		if err := os.WriteFile(filepath.Join(f.dir, "image.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := LoadSpec(f.dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	key := func() string {
		k, err := inputsKey(load())
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k1 := key()
	if k2 := key(); k2 != k1 {
		t.Fatalf("got keys %s then %s for the same inputs", k1, k2)
	}
	tests := []struct {
		name   string
		change func()
	}{
		{"a file's bytes", func() { rewrite(t, f, "bin/tool", "x") }},
		{"a tree file's time", func() {
			tm := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
			if err := os.Chtimes(filepath.Join(f.dir, "tree/lib/a.txt"), tm, tm); err != nil {
				t.Fatal(err)
			}
		}},
		{"the spec", func() { f.spec["env"] = []string{} }},
	}
	prev := k1
	for _, tt := range tests {
		tt.change()
		k := key()
		if k == prev {
			t.Errorf("%s: got the same key %s, want a new one", tt.name, k)
		}
		prev = k
	}
}

func rewrite(t *testing.T, f *fixture, rel, content string) {
	t.Helper()
	p := filepath.Join(f.dir, rel)
	st, err := os.Stat(p)
	mode := os.FileMode(0o644)
	if err == nil {
		mode = st.Mode().Perm()
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, f *fixture, rel string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(filepath.Join(f.dir, rel), mode); err != nil {
		t.Fatal(err)
	}
}

func relink(t *testing.T, f *fixture, rel, target string) {
	t.Helper()
	p := filepath.Join(f.dir, rel)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// Contents marked volume are named, sorted, in the config's label that a
// broker reads (sandbox.ImageTreesLabel); an image without any has none.
func TestVolumeTreesLabel(t *testing.T) {
	spec := &Spec{Name: "a", Contents: []Content{
		{Type: "tree", Src: "/x", Dst: "/usr/local/go", Volume: true},
		{Type: "tree", Src: "/y", Dst: "/opt/plain"},
		{Type: "gocache", Src: "/z", Dst: "/usr/local/share/gocache", Volume: true},
		{Type: "pycompile", Src: "/usr/bin/python3.11", Python: "3.11.2", Dst: "/usr/lib/python3/dist-packages", Volume: true},
	}}
	labels := func(s *Spec) map[string]string {
		b, err := configJSON(s, "sha256:"+strings.Repeat("0", 64))
		if err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Config struct{ Labels map[string]string }
		}
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		return cfg.Config.Labels
	}
	if got, want := labels(spec)[sandbox.ImageTreesLabel], `["/usr/lib/python3/dist-packages","/usr/local/go","/usr/local/share/gocache"]`; got != want {
		t.Errorf("label %q, want %q", got, want)
	}
	spec.Contents[0].Volume, spec.Contents[2].Volume, spec.Contents[3].Volume = false, false, false
	if got, ok := labels(spec)[sandbox.ImageTreesLabel]; ok {
		t.Errorf("no content marked volume: label %q", got)
	}
}
