package containerdengine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"slices"
	"testing"

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
// first read keeps the image's config under the state directory, and a
// later process (a new importer) takes the image from it with no read of
// the image, as long as the bytes are the image's config and its
// snapshot is there. Without the memo, the same later process finds no
// image (its record is gone and there is no Docker to import it from).
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
	kept, err := os.ReadFile(newImporter(e).memoPath(id))
	if err != nil || !bytes.Equal(kept, config) {
		t.Fatalf("memo after the first read: %q, %v; want the image's config", kept, err)
	}

	// The record gone: only the memo can give the image now.
	if err := e.c.ImageService().Delete(ctx, imageName(id)); err != nil {
		t.Fatal(err)
	}
	later, err := newImporter(e).ensure(ctx, id)
	if err != nil {
		t.Fatalf("a later process with the memo: %v", err)
	}
	if !slices.Equal(later.env, first.env) || later.chainID != first.chainID || later.id != id {
		t.Fatalf("from the memo: %+v, want %+v", later, first)
	}

	notFound := func(t *testing.T) {
		t.Helper()
		if info, err := newImporter(e).ensure(ctx, id); !errdefs.IsNotFound(err) {
			t.Fatalf("ensure: %+v, %v; want not found", info, err)
		}
	}
	t.Run("bytes that are not the image's config", func(t *testing.T) {
		other := bytes.Replace(config, []byte("WHO=unit"), []byte("WHO=evil"), 1)
		if bytes.Equal(other, config) {
			t.Fatal("the config was not changed")
		}
		if err := os.WriteFile(newImporter(e).memoPath(id), other, 0o600); err != nil {
			t.Fatal(err)
		}
		notFound(t)
	})
	t.Run("no memo", func(t *testing.T) {
		if err := os.Remove(newImporter(e).memoPath(id)); err != nil {
			t.Fatal(err)
		}
		notFound(t)
	})
	t.Run("the image's snapshot gone", func(t *testing.T) {
		newImporter(e).remember(id, config)
		if _, err := newImporter(e).ensure(ctx, id); err != nil {
			t.Fatalf("memo put back: %v", err)
		}
		if err := e.c.SnapshotService(e.cfg.Snapshotter).Remove(ctx, first.chainID); err != nil {
			t.Fatal(err)
		}
		notFound(t)
		if _, err := os.Stat(newImporter(e).memoPath(id)); !os.IsNotExist(err) {
			t.Fatalf("the memo of an image whose snapshot is gone: %v, want it removed", err)
		}
	})
	t.Run("a memo as large as the bound is not read", func(t *testing.T) {
		big := append(bytes.Clone(config), bytes.Repeat([]byte(" "), maxConfigMemo)...)
		sum := sha256.Sum256(big)
		bigID := "sha256:" + hex.EncodeToString(sum[:])
		im := newImporter(e)
		im.remember(bigID, big)
		if _, err := os.Stat(im.memoPath(bigID)); !os.IsNotExist(err) {
			t.Fatalf("a config over the bound was kept: %v", err)
		}
		if err := os.WriteFile(im.memoPath(bigID), big, 0o600); err != nil {
			t.Fatal(err)
		}
		if info, ok := im.recall(bigID); ok {
			t.Fatalf("recalled a memo over the bound: %+v", info)
		}
	})
}
