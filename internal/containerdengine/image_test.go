package containerdengine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// imageInNamespace puts an image of one layer in e's namespace, as an
// import leaves it: its manifest and config in the content store, its
// record, and its layer's snapshot unpacked (empty: nothing reads it).
// It returns the image's ID and config bytes.
func imageInNamespace(t *testing.T, e *Engine, env ...string) (string, []byte) {
	t.Helper()
	ctx := e.ns(context.Background())
	l, err := e.c.LeasesService().Create(ctx, leases.WithRandomID())
	if err != nil {
		t.Fatal(err)
	}
	ctx = leases.WithLease(ctx, l.ID)
	layer := digest.FromString("layer of " + t.Name())
	config, err := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config:   ocispec.ImageConfig{Env: env},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layer}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cs := e.c.ContentStore()
	put := func(mediaType string, b []byte) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
		if err := content.WriteBlob(ctx, cs, d.Digest.String(), bytes.NewReader(b), d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	cfg := put(ocispec.MediaTypeImageConfig, config)
	manifest, err := json.Marshal(ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: cfg, Layers: []ocispec.Descriptor{}})
	if err != nil {
		t.Fatal(err)
	}
	m := put(ocispec.MediaTypeImageManifest, manifest)
	m.Platform = &ocispec.Platform{Architecture: "amd64", OS: "linux"}
	id := cfg.Digest.String()
	if _, err := e.c.ImageService().Create(ctx, images.Image{Name: imageName(id), Target: m}); err != nil {
		t.Fatal(err)
	}
	sn := e.c.SnapshotService(e.cfg.Snapshotter)
	if _, err := sn.Prepare(ctx, "unpacking-"+layer.Encoded(), ""); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, layer.String(), "unpacking-"+layer.Encoded()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := e.ns(context.Background())
		e.c.ImageService().Delete(ctx, imageName(id))
		sn.Remove(ctx, layer.String())
		e.c.LeasesService().Delete(ctx, l, leases.SynchronousDelete)
	})
	return id, config
}

// A one-shot process reads an image from containerd once per machine: the
// first read keeps the image's config and its record's target under the
// state directory, and a later process (a new importer) takes the image
// from the memo with no read of its manifest or config (here deleted from
// the content store, so that nothing else could give it), as long as the
// memo's bytes are the image's config, the record names the same target
// and the image's snapshot is there.
func TestAnImageIsReadOncePerMachine(t *testing.T) {
	e := realContainerd(t)
	e.cfg.Snapshotter = "overlayfs"
	ctx := e.ns(context.Background())
	id, config := imageInNamespace(t, e, "PATH=/bin", "WHO=unit")

	first, err := newImporter(e).ensure(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(first.env, []string{"PATH=/bin", "WHO=unit"}) || first.chainID == "" {
		t.Fatalf("first read: %+v", first)
	}
	memoPath := newImporter(e).memoPath(id)
	memo, err := os.ReadFile(memoPath)
	if err != nil || !bytes.HasSuffix(memo, config) {
		t.Fatalf("memo after the first read: %q, %v; want the image's config", memo, err)
	}
	img, err := e.c.GetImage(ctx, imageName(id))
	if err != nil {
		t.Fatal(err)
	}
	target := img.Target().Digest.String()
	if want := "target " + target + "\n"; !bytes.HasPrefix(memo, []byte(want)) {
		t.Fatalf("memo %q does not begin with %q", memo, want)
	}

	// The config gone from the content store: only the memo can give the
	// image now.
	if err := e.c.ContentStore().Delete(ctx, digest.Digest(id)); err != nil {
		t.Fatal(err)
	}
	later, err := newImporter(e).ensure(ctx, id)
	if err != nil {
		t.Fatalf("a later process with the memo: %v", err)
	}
	if !slices.Equal(later.env, first.env) || later.chainID != first.chainID || later.id != id {
		t.Fatalf("from the memo: %+v, want %+v", later, first)
	}

	refused := func(t *testing.T, memo []byte) {
		t.Helper()
		if err := os.WriteFile(memoPath, memo, 0o600); err != nil {
			t.Fatal(err)
		}
		if info, err := newImporter(e).ensure(ctx, id); err == nil {
			t.Fatalf("ensure: %+v; want the image read again, and its config not found", info)
		}
	}
	t.Run("bytes that are not the image's config", func(t *testing.T) {
		other := bytes.Replace(memo, []byte("WHO=unit"), []byte("WHO=evil"), 1)
		if bytes.Equal(other, memo) {
			t.Fatal("the config was not changed")
		}
		refused(t, other)
	})
	t.Run("a memo of another record", func(t *testing.T) {
		refused(t, append([]byte("target "+digest.FromString("another manifest").String()+"\n"), config...))
	})
	t.Run("a memo that is a link", func(t *testing.T) {
		good := filepath.Join(t.TempDir(), "memo")
		if err := os.WriteFile(good, memo, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Remove(memoPath)
		if err := os.Symlink(good, memoPath); err != nil {
			t.Fatal(err)
		}
		if info, err := newImporter(e).ensure(ctx, id); err == nil {
			t.Fatalf("ensure through a link: %+v; want it not followed", info)
		}
		os.Remove(memoPath)
	})
	t.Run("the image's snapshot gone", func(t *testing.T) {
		newImporter(e).remember(id, target, config)
		if _, err := newImporter(e).ensure(ctx, id); err != nil {
			t.Fatalf("memo put back: %v", err)
		}
		if err := e.c.SnapshotService(e.cfg.Snapshotter).Remove(ctx, first.chainID); err != nil {
			t.Fatal(err)
		}
		if info, err := newImporter(e).ensure(ctx, id); err == nil {
			t.Fatalf("ensure: %+v; want the image read again, and its config not found", info)
		}
	})
	t.Run("the image's record gone", func(t *testing.T) {
		newImporter(e).remember(id, target, config)
		if err := e.c.ImageService().Delete(ctx, imageName(id)); err != nil {
			t.Fatal(err)
		}
		if info, err := newImporter(e).ensure(ctx, id); !errdefs.IsNotFound(err) {
			t.Fatalf("ensure: %+v, %v; want not found (no record, no Docker to import from)", info, err)
		}
		if _, err := os.Lstat(memoPath); !os.IsNotExist(err) {
			t.Fatalf("the memo of an image whose record is gone: %v, want it removed", err)
		}
	})
	t.Run("a memo as large as the bound is not read", func(t *testing.T) {
		big := append(bytes.Clone(config), bytes.Repeat([]byte(" "), maxMemo)...)
		sum := sha256.Sum256(big)
		bigID := "sha256:" + hex.EncodeToString(sum[:])
		im := newImporter(e)
		im.remember(bigID, target, big)
		if _, err := os.Stat(im.memoPath(bigID)); !os.IsNotExist(err) {
			t.Fatalf("a config over the bound was kept: %v", err)
		}
		if err := os.WriteFile(im.memoPath(bigID), append([]byte("target "+target+"\n"), big...), 0o600); err != nil {
			t.Fatal(err)
		}
		if info, ok := im.recall(bigID, target); ok {
			t.Fatalf("recalled a memo over the bound: %+v", info)
		}
	})
}

// A memo's temporary file that a killed process left is removed once it is
// old; a young one (another process's write under way) and the memos
// themselves stay.
func TestOldMemoTempsArePruned(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{".memo-old", ".memo-young", strings.Repeat("a", 64)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	for _, name := range []string{".memo-old", strings.Repeat("a", 64)} {
		if err := os.Chtimes(filepath.Join(dir, name), old, old); err != nil {
			t.Fatal(err)
		}
	}
	pruneMemoTemps(dir, time.Hour)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{".memo-young", strings.Repeat("a", 64)}; !slices.Equal(left, want) {
		t.Fatalf("left %q, want %q", left, want)
	}
}
