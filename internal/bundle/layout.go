package bundle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Media types of a bundle stored as an OCI artifact (image-spec v1.1).
const (
	// ArtifactType is the manifest's artifactType.
	ArtifactType = "application/vnd.sandboxd.bundle.v1"
	// MediaTypeConfig is the config blob: bundle.json, byte for byte.
	MediaTypeConfig = "application/vnd.sandboxd.bundle.config.v1+json"
	// MediaTypeLayer is the single layer: the bundle tree without
	// bundle.json, in the canonical tar form.
	MediaTypeLayer = "application/vnd.sandboxd.bundle.layer.v1.tar"
)

// maxJSONBlob bounds index.json and the manifest blob.
const maxJSONBlob = 1 << 20

// Bundle is an evaluator bundle opened from an OCI image layout. Its
// manifest and config were read and checked against their digests; the
// layer is only re-hashed by Verify.
type Bundle struct {
	// Layout is the OCI image layout directory.
	Layout string
	// Digest is the bundle's identity: the digest of its OCI manifest.
	Digest string
	// ConfigDigest is the digest of bundle.json as stored.
	ConfigDigest string
	// LayerDigest is the digest of the canonical tar of the bundle tree;
	// the broker reads the layer from a store by it.
	LayerDigest string
	// LayerSize is the layer's size in bytes.
	LayerSize int64
	// Manifest is the decoded, validated bundle.json.
	Manifest Manifest

	blobs  *store.Store
	limits TreeLimits
	oci    ocispec.Manifest
}

// Pack reads the bundle tree at dir (bundle.json plus files), refuses it
// unless bundle.json is valid and the tree passes the reader rules (its
// control directories present), and stores it as an OCI image layout at
// layout: blobs first, then oci-layout and index.json, each written by
// temp file, fsync and rename. Nothing is written before the tree was
// listed and checked. index.json lists only this bundle afterwards.
func Pack(ctx context.Context, dir, layout string, lim TreeLimits) (*Bundle, error) {
	return PackProgress(ctx, dir, layout, lim, nil)
}

// PackProgress is Pack telling report (if not nil) the layer bytes written
// so far.
func PackProgress(ctx context.Context, dir, layout string, lim TreeLimits, report func(bytes int64)) (*Bundle, error) {
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	config, m, err := readManifestFile(dir)
	if err != nil {
		return nil, err
	}
	entries, recheck, closeRoot, err := scanDir(ctx, dir, lim, ManifestFile)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", dir, err)
	}
	defer closeRoot()
	if err := checkControls(&m, func(name string) bool {
		for _, e := range entries {
			if e.name == name {
				return e.dir
			}
		}
		return false
	}); err != nil {
		return nil, err
	}

	blobs, err := store.OpenWithTemp(filepath.Join(layout, ocispec.ImageBlobsDir), filepath.Join(layout, ".tmp"))
	if err != nil {
		return nil, err
	}
	bw, err := blobs.NewWriter(-1)
	if err != nil {
		return nil, err
	}
	defer bw.Abort()
	var w io.Writer = bw
	if report != nil {
		w = &progressWriter{w: bw, report: report}
	}
	sum, err := writeTree(w, entries)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", dir, err)
	}
	if err := recheck(); err != nil {
		return nil, fmt.Errorf("bundle %s: %w", dir, err)
	}
	if _, _, err := bw.Commit(sum.Digest); err != nil {
		return nil, fmt.Errorf("store layer: %w", err)
	}
	configDigest, err := blobs.PutBytes(config)
	if err != nil {
		return nil, fmt.Errorf("store config: %w", err)
	}
	man := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactType,
		Config: ocispec.Descriptor{
			MediaType: MediaTypeConfig,
			Digest:    digest.Digest(configDigest),
			Size:      int64(len(config)),
		},
		Layers: []ocispec.Descriptor{{
			MediaType: MediaTypeLayer,
			Digest:    digest.Digest(sum.Digest),
			Size:      sum.Size,
		}},
	}
	manBytes, err := json.Marshal(man)
	if err != nil {
		return nil, err
	}
	manDigest, err := blobs.PutBytes(manBytes)
	if err != nil {
		return nil, fmt.Errorf("store manifest: %w", err)
	}
	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{
			MediaType:    ocispec.MediaTypeImageManifest,
			ArtifactType: ArtifactType,
			Digest:       digest.Digest(manDigest),
			Size:         int64(len(manBytes)),
		}},
	}
	indexBytes, err := json.Marshal(index)
	if err != nil {
		return nil, err
	}
	layoutBytes, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(layout, ocispec.ImageLayoutFile), layoutBytes); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(layout, ocispec.ImageIndexFile), indexBytes); err != nil {
		return nil, err
	}
	return &Bundle{
		Layout: layout, Digest: manDigest, ConfigDigest: configDigest,
		LayerDigest: sum.Digest, LayerSize: sum.Size, Manifest: m,
		blobs: blobs, limits: lim, oci: man,
	}, nil
}

// readManifestFile reads dir/bundle.json without following a symlink and
// decodes it.
func readManifestFile(dir string) ([]byte, Manifest, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, Manifest{}, fmt.Errorf("bundle: %w", err)
	}
	defer root.Close()
	fi, err := root.Lstat(ManifestFile)
	if err != nil {
		return nil, Manifest{}, fmt.Errorf("bundle %s: %w", dir, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, Manifest{}, fmt.Errorf("bundle %s: %s is not a regular file: %w", dir, ManifestFile, ErrNotBundle)
	}
	var buf bytes.Buffer
	lw := &limitWriter{w: &buf, max: maxManifestBytes}
	if err := copyChecked(root, ManifestFile, idOf(fi), lw); err != nil {
		if errors.Is(err, ErrTooLarge) {
			return nil, Manifest{}, manifestErr("", "more than %d bytes", maxManifestBytes)
		}
		return nil, Manifest{}, fmt.Errorf("bundle %s: %w", dir, err)
	}
	m, err := DecodeManifest(buf.Bytes())
	if err != nil {
		return nil, Manifest{}, err
	}
	return buf.Bytes(), m, nil
}

type limitWriter struct {
	w   io.Writer
	n   int64
	max int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n+int64(len(p)) > l.max {
		return 0, ErrTooLarge
	}
	l.n += int64(len(p))
	return l.w.Write(p)
}

// checkControls requires every control directory to be a directory of the tree.
func checkControls(m *Manifest, isDir func(string) bool) error {
	if m.Controls == nil {
		return nil
	}
	for _, c := range []struct{ field, dir string }{
		{"controls.known_good", m.Controls.KnownGood},
		{"controls.known_bad", m.Controls.KnownBad},
	} {
		if c.dir != "" && !isDir(c.dir) {
			return manifestErr(c.field, "%q is not a directory of the bundle tree", c.dir)
		}
	}
	return nil
}

// Open opens the bundle in an OCI image layout. ref is LAYOUT (whose
// index.json must list exactly one bundle) or LAYOUT@sha256:<hex> (the
// bundle with that manifest digest). The manifest and bundle.json are read
// from blobs whose content must hash to their digests; call Verify before
// the bundle's layer is used.
func Open(ref string, lim TreeLimits) (*Bundle, error) {
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	layout, want := ref, ""
	if i := strings.LastIndex(ref, "@sha256:"); i >= 0 {
		layout, want = ref[:i], ref[i+1:]
		if !sandbox.ValidDigest(want) {
			return nil, fmt.Errorf("bundle %q: malformed digest: %w", ref, ErrNotBundle)
		}
	}
	var ol ocispec.ImageLayout
	if err := readJSONFile(filepath.Join(layout, ocispec.ImageLayoutFile), &ol); err != nil {
		return nil, fmt.Errorf("bundle %s: not an OCI image layout: %w: %w", layout, ErrNotBundle, err)
	}
	if ol.Version != ocispec.ImageLayoutVersion {
		return nil, fmt.Errorf("bundle %s: image layout version %q: %w", layout, ol.Version, ErrNotBundle)
	}
	var index ocispec.Index
	if err := readJSONFile(filepath.Join(layout, ocispec.ImageIndexFile), &index); err != nil {
		return nil, fmt.Errorf("bundle %s: index.json: %w: %w", layout, ErrNotBundle, err)
	}
	var desc *ocispec.Descriptor
	for i, d := range index.Manifests {
		if d.MediaType != ocispec.MediaTypeImageManifest || (d.ArtifactType != "" && d.ArtifactType != ArtifactType) {
			continue
		}
		if want != "" && string(d.Digest) != want {
			continue
		}
		if desc != nil {
			return nil, fmt.Errorf("bundle %s: index.json lists more than one bundle; name one as %s@sha256:…: %w", layout, layout, ErrNotBundle)
		}
		desc = &index.Manifests[i]
	}
	if desc == nil {
		return nil, fmt.Errorf("bundle %q: no such bundle in index.json: %w", ref, ErrNotBundle)
	}
	blobs, err := store.OpenWithTemp(filepath.Join(layout, ocispec.ImageBlobsDir), filepath.Join(layout, ".tmp"))
	if err != nil {
		return nil, err
	}
	manBytes, err := readBlob(blobs, *desc)
	if err != nil {
		return nil, err
	}
	var man ocispec.Manifest
	if err := strictJSON(manBytes, &man); err != nil {
		return nil, fmt.Errorf("bundle manifest %s: %w: %w", desc.Digest, ErrNotBundle, err)
	}
	if man.SchemaVersion != 2 || man.MediaType != ocispec.MediaTypeImageManifest ||
		man.Config.MediaType != MediaTypeConfig || len(man.Layers) != 1 || man.Layers[0].MediaType != MediaTypeLayer ||
		(man.ArtifactType != "" && man.ArtifactType != ArtifactType) {
		return nil, fmt.Errorf("bundle manifest %s: not a sandboxd bundle manifest: %w", desc.Digest, ErrNotBundle)
	}
	config, err := readBlob(blobs, man.Config)
	if err != nil {
		return nil, err
	}
	m, err := DecodeManifest(config)
	if err != nil {
		return nil, err
	}
	layer := man.Layers[0]
	if !sandbox.ValidDigest(string(layer.Digest)) || layer.Size < 0 {
		return nil, fmt.Errorf("bundle manifest %s: bad layer descriptor: %w", desc.Digest, ErrNotBundle)
	}
	return &Bundle{
		Layout: layout, Digest: string(desc.Digest), ConfigDigest: string(man.Config.Digest),
		LayerDigest: string(layer.Digest), LayerSize: layer.Size, Manifest: m,
		blobs: blobs, limits: lim, oci: man,
	}, nil
}

// Verify re-hashes every blob of the bundle (manifest, config, layer),
// checks their sizes, checks that the layer is a canonical tar within the
// limits the bundle was opened with and that it holds the control
// directories. A bundle that does not verify must never be mounted; the
// error matches ErrDigestMismatch when a blob's content changed.
func (b *Bundle) Verify(ctx context.Context) error {
	descs := []ocispec.Descriptor{{Digest: digest.Digest(b.Digest), Size: -1}, b.oci.Config, b.oci.Layers[0]}
	for _, d := range descs {
		got, err := b.blobs.ContentDigest(string(d.Digest))
		if err != nil {
			return fmt.Errorf("bundle %s: %w", b.Digest, err)
		}
		if got != string(d.Digest) {
			return fmt.Errorf("bundle %s: blob %s holds %s: %w", b.Digest, d.Digest, got, ErrDigestMismatch)
		}
		if d.Size >= 0 {
			if n, err := b.blobs.Size(string(d.Digest)); err != nil || n != d.Size {
				return fmt.Errorf("bundle %s: blob %s is %d bytes, descriptor says %d: %w", b.Digest, d.Digest, n, d.Size, ErrDigestMismatch)
			}
		}
	}
	f, err := b.blobs.Open(b.LayerDigest)
	if err != nil {
		return err
	}
	defer f.Close()
	dirs := map[string]bool{}
	sum, err := checkTar(ctx, f, b.limits, b.LayerDigest, func(name string) { dirs[name] = true })
	if err != nil {
		return fmt.Errorf("bundle %s: layer: %w", b.Digest, err)
	}
	if sum.Size != b.LayerSize {
		return fmt.Errorf("bundle %s: layer is %d bytes, descriptor says %d: %w", b.Digest, sum.Size, b.LayerSize, ErrDigestMismatch)
	}
	return checkControls(&b.Manifest, func(name string) bool { return dirs[name] })
}

// OpenLayer opens the layer blob (the canonical tar of the bundle tree).
func (b *Bundle) OpenLayer() (io.ReadCloser, error) { return b.blobs.Open(b.LayerDigest) }

// CopyLayer puts the layer into dst (e.g. the broker's blob store) unless
// dst already holds it; dst checks the content against LayerDigest, so a
// modified layer is refused and nothing is kept.
func (b *Bundle) CopyLayer(dst *store.Store) error {
	if dst.Has(b.LayerDigest) {
		return nil
	}
	f, err := b.OpenLayer()
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, err := dst.Put(f, b.LayerDigest, b.LayerSize); err != nil {
		if errors.Is(err, store.ErrDigestMismatch) || errors.Is(err, store.ErrTooLarge) {
			return fmt.Errorf("bundle %s: layer: %w: %w", b.Digest, ErrDigestMismatch, err)
		}
		return fmt.Errorf("bundle %s: copy layer: %w", b.Digest, err)
	}
	return nil
}

// readBlob reads a small blob and checks it against its descriptor.
func readBlob(blobs *store.Store, d ocispec.Descriptor) ([]byte, error) {
	if !sandbox.ValidDigest(string(d.Digest)) || d.Size < 0 || d.Size > maxJSONBlob {
		return nil, fmt.Errorf("descriptor %s (%d bytes): %w", d.Digest, d.Size, ErrNotBundle)
	}
	f, err := blobs.Open(string(d.Digest))
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", d.Digest, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, d.Size+1))
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", d.Digest, err)
	}
	if int64(len(data)) != d.Size || sandbox.DigestBytes(data) != string(d.Digest) {
		return nil, fmt.Errorf("blob %s does not match its descriptor: %w", d.Digest, ErrDigestMismatch)
	}
	return data, nil
}

func readJSONFile(name string, v any) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxJSONBlob+1))
	if err != nil {
		return err
	}
	if len(data) > maxJSONBlob {
		return fmt.Errorf("%s: more than %d bytes", name, maxJSONBlob)
	}
	return strictJSON(data, v)
}

// strictJSON decodes one JSON value into v; OCI documents may carry fields
// this version does not know, so unknown fields are allowed here, but
// trailing data is not.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}

// writeFileAtomic replaces name with data: temp file, fsync, rename, fsync
// of the directory.
func writeFileAtomic(name string, data []byte) error {
	dir := filepath.Dir(name)
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(name)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), name); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
