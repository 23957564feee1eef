package bundle

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/image-spec/schema"

	"github.com/sandboxd/sandboxd/internal/store"
)

// exampleSource copies testdata/example-bundle into a fresh directory, so
// that tests may change it and its modes do not depend on the checkout.
func exampleSource(t *testing.T) string {
	t.Helper()
	src := filepath.Join("testdata", "example-bundle")
	dst := t.TempDir()
	walkTree(t, src, func(p string, fi os.FileInfo) error {
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, b, fi.Mode().Perm())
	})
	return dst
}

func pack(t *testing.T, src string) *Bundle {
	t.Helper()
	b, err := Pack(context.Background(), src, filepath.Join(t.TempDir(), "layout"), DefaultLimits())
	if err != nil {
		t.Fatalf("Pack: %v", err)
	}
	return b
}

func TestPackOpenVerify(t *testing.T) {
	ctx := context.Background()
	b := pack(t, exampleSource(t))
	golden(t, "example-bundle.digest", b.Digest)

	// The checked-in tree itself (whatever its checkout's mtimes and
	// owners) packs to the same digest.
	if got := pack(t, filepath.Join("testdata", "example-bundle")).Digest; got != b.Digest {
		t.Errorf("checked-in tree: got %s, want %s", got, b.Digest)
	}

	for _, ref := range []string{b.Layout, b.Layout + "@" + b.Digest} {
		o, err := Open(ref, DefaultLimits())
		if err != nil {
			t.Fatalf("Open(%s): %v", ref, err)
		}
		if o.Digest != b.Digest || o.LayerDigest != b.LayerDigest || o.ConfigDigest != b.ConfigDigest || o.LayerSize != b.LayerSize {
			t.Errorf("Open(%s): got %s/%s/%s, want %s/%s/%s", ref, o.Digest, o.LayerDigest, o.ConfigDigest, b.Digest, b.LayerDigest, b.ConfigDigest)
		}
		if o.Manifest.Report.Path != "/work/report/test.json" {
			t.Errorf("Open(%s): report.path %q", ref, o.Manifest.Report.Path)
		}
		if err := o.Verify(ctx); err != nil {
			t.Errorf("Verify(%s): %v", ref, err)
		}
	}
	if _, err := Open(b.Layout+"@sha256:"+strings.Repeat("0", 64), DefaultLimits()); !errors.Is(err, ErrNotBundle) {
		t.Errorf("Open(unknown digest): got %v, want ErrNotBundle", err)
	}

	// The layer is the tree without bundle.json, in the canonical form.
	f, err := b.OpenLayer()
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	layer.ReadFrom(f)
	f.Close()
	for _, h := range readHeaders(t, layer.Bytes()) {
		if strings.HasPrefix(h, ManifestFile+" ") {
			t.Errorf("layer holds %s", ManifestFile)
		}
	}
	if got := len(readHeaders(t, layer.Bytes())); got != 11 {
		t.Errorf("layer: got %d entries, want 11", got)
	}

	// Packing again into the same layout changes nothing.
	again, err := Pack(ctx, exampleSource(t), b.Layout, DefaultLimits())
	if err != nil || again.Digest != b.Digest {
		t.Errorf("repack: got %v, %v; want %s", again, err, b.Digest)
	}
}

// TestLayoutSchemas validates the layout's oci-layout, index.json and
// manifest with image-spec's own JSON schemas.
func TestLayoutSchemas(t *testing.T) {
	b := pack(t, exampleSource(t))
	manPath := filepath.Join(b.Layout, "blobs", "sha256", strings.TrimPrefix(b.Digest, "sha256:"))
	cases := []struct {
		file string
		v    schema.Validator
	}{
		{filepath.Join(b.Layout, "oci-layout"), schema.ValidatorMediaTypeLayoutHeader},
		{filepath.Join(b.Layout, "index.json"), schema.ValidatorMediaTypeImageIndex},
		{manPath, schema.ValidatorMediaTypeManifest},
	}
	for _, tc := range cases {
		data, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		if err := tc.v.Validate(bytes.NewReader(data)); err != nil {
			t.Errorf("%s against %s: %v", filepath.Base(tc.file), tc.v, err)
		}
	}
	// The schema check itself can fail: a manifest without layers' digests is refused.
	bad := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"x/y","size":1},"layers":[]}`)
	if err := schema.ValidatorMediaTypeManifest.Validate(bytes.NewReader(bad)); err == nil {
		t.Error("a manifest whose config has no digest validated")
	}
}

// TestModifiedBlob: a bundle whose blobs changed on disk does not verify
// (layer) or does not open (manifest, config), and its layer is not copied.
func TestModifiedBlob(t *testing.T) {
	ctx := context.Background()
	flip := func(t *testing.T, b *Bundle, d string, at int64) {
		t.Helper()
		p := filepath.Join(b.Layout, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		data[at] ^= 1
		if err := os.WriteFile(p, data, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("layer", func(t *testing.T) {
		b := pack(t, exampleSource(t))
		flip(t, b, b.LayerDigest, 700) // inside the first file's content
		o, err := Open(b.Layout, DefaultLimits())
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		verr := o.Verify(ctx)
		checkRefused(t, verr, ErrDigestMismatch)
		// The refusal names the blob and what it holds now.
		if want := "bundle " + b.Digest + ": blob " + b.LayerDigest + " holds sha256:"; verr == nil || !strings.HasPrefix(verr.Error(), want) {
			t.Errorf("Verify: got %v, want it to begin %q", verr, want)
		}
		dst, err := store.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		checkRefused(t, o.CopyLayer(dst), ErrDigestMismatch)
		storeIsEmpty(t, dst)
	})
	for _, which := range []string{"manifest", "config"} {
		t.Run(which, func(t *testing.T) {
			b := pack(t, exampleSource(t))
			d := b.Digest
			if which == "config" {
				d = b.ConfigDigest
			}
			flip(t, b, d, 10)
			_, err := Open(b.Layout, DefaultLimits())
			checkRefused(t, err, ErrDigestMismatch)
		})
	}
	t.Run("index points elsewhere", func(t *testing.T) {
		b := pack(t, exampleSource(t))
		p := filepath.Join(b.Layout, "index.json")
		data, _ := os.ReadFile(p)
		os.WriteFile(p, bytes.Replace(data, []byte(b.Digest), []byte(b.LayerDigest), 1), 0o644)
		if _, err := Open(b.Layout, DefaultLimits()); err == nil {
			t.Error("a layout whose index names the layer as its manifest opened")
		}
	})
}

func TestCopyLayer(t *testing.T) {
	b := pack(t, exampleSource(t))
	dst, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CopyLayer(dst); err != nil {
		t.Fatal(err)
	}
	if err := dst.Verify(b.LayerDigest); err != nil {
		t.Fatalf("copied layer: %v", err)
	}
	f, err := dst.Open(b.LayerDigest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := CheckTar(context.Background(), f, DefaultLimits(), b.LayerDigest); err != nil {
		t.Errorf("CheckTar on the copied layer: %v", err)
	}
}

// TestPackRefusals: a bad bundle is refused before anything is written.
func TestPackRefusals(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(t *testing.T, dir string)
		want   string
	}{
		{"invalid bundle.json", func(t *testing.T, dir string) {
			p := filepath.Join(dir, ManifestFile)
			data, _ := os.ReadFile(p)
			os.WriteFile(p, bytes.Replace(data, []byte(`"go-test-json"`), []byte(`"xunit"`), 1), 0o644)
		}, "bundle.json: report.format: "},
		{"missing control", func(t *testing.T, dir string) {
			os.RemoveAll(filepath.Join(dir, "controls", "bad"))
		}, "bundle.json: controls.known_bad: "},
		{"control is a file", func(t *testing.T, dir string) {
			os.RemoveAll(filepath.Join(dir, "controls", "good"))
			os.WriteFile(filepath.Join(dir, "controls", "good"), []byte("x"), 0o644)
		}, "bundle.json: controls.known_good: "},
		{"no bundle.json", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, ManifestFile))
		}, "bundle "},
		{"bundle.json is a symlink", func(t *testing.T, dir string) {
			p := filepath.Join(dir, ManifestFile)
			os.Rename(p, filepath.Join(dir, "real.json"))
			os.Symlink("real.json", p)
		}, "bundle "},
		{"hostile tree", func(t *testing.T, dir string) {
			os.Symlink("/etc/passwd", filepath.Join(dir, "tests", "passwd"))
		}, "bundle "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := exampleSource(t)
			tc.mutate(t, src)
			layout := filepath.Join(t.TempDir(), "layout")
			_, err := Pack(context.Background(), src, layout, DefaultLimits())
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error starting %q", err, tc.want)
			}
			if _, err := os.Stat(layout); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("layout exists after a refusal: %v", err)
			}
		})
	}
}
