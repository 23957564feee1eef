package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// ErrNotImageArchive marks an import input that is not one image archive:
// neither a `docker save` tarball nor an OCI image-layout archive, or one
// that is malformed, or one that holds other than exactly one image.
var ErrNotImageArchive = errors.New("not an image archive")

// maxArchiveMeta bounds the JSON files of an archive read into memory.
const maxArchiveMeta = 4 << 20

var blobRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Import loads one image from a `docker save` tarball or an OCI
// image-layout archive (as tar) into the engine and returns its image ID,
// the digest of its config, which is what jobs and bundles pin. The input
// is copied to a temporary file under tmpDir first ("" = os.TempDir()),
// since an archive's index may come after its layers. Either way the
// engine is given a docker-archive with no tags: importing never moves a
// tag the engine has.
func Import(ctx context.Context, eng Engine, r io.Reader, tmpDir string) (string, error) {
	f, err := os.CreateTemp(tmpDir, "sandboxd-import-*.tar")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := io.Copy(f, r); err != nil {
		return "", fmt.Errorf("image import: read: %w", err)
	}
	a, err := readArchive(f)
	if err != nil {
		return "", err
	}
	manifest, cfgName, err := a.dockerManifest()
	if err != nil {
		return "", err
	}
	cfg, err := a.read(cfgName)
	if err != nil {
		return "", err
	}
	id := digestOf(cfg)
	if _, err := eng.ImageInspect(ctx, id); err == nil {
		return id, nil
	} else if !errdefs.IsNotFound(err) {
		return "", fmt.Errorf("image import: inspect %s: %w", id, err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(a.rewrite(pw, manifest)) }()
	res, err := eng.ImageLoad(ctx, pr, client.ImageLoadWithQuiet(true))
	if err != nil {
		pr.CloseWithError(err)
		return "", fmt.Errorf("image import: load: %w", err)
	}
	body, _ := io.ReadAll(io.LimitReader(res, 1<<20))
	res.Close()
	if bytes.Contains(body, []byte(`"error"`)) {
		return "", fmt.Errorf("%w: the engine refused it: %s", ErrNotImageArchive, strings.TrimSpace(string(body)))
	}
	if _, err := eng.ImageInspect(ctx, id); err != nil {
		return "", fmt.Errorf("image import: loaded but %s is not in the engine: %w", id, err)
	}
	return id, nil
}

// Saved reads the one image of an image archive in f (a `docker save`
// tarball, or an OCI image layout as tar): its config, and its layers as
// they are stored, sections of f in the config's order. Nothing is
// checked against a digest: that is the caller's to do.
func Saved(f *os.File) (config []byte, layers []*io.SectionReader, err error) {
	a, err := readArchive(f)
	if err != nil {
		return nil, nil, err
	}
	manifest, cfgName, err := a.dockerManifest()
	if err != nil {
		return nil, nil, err
	}
	var m []dockerEntry
	if err := json.Unmarshal(manifest, &m); err != nil {
		return nil, nil, err
	}
	if config, err = a.read(cfgName); err != nil {
		return nil, nil, err
	}
	for _, name := range m[0].Layers {
		s := a.files[name]
		layers = append(layers, io.NewSectionReader(f, s.off, s.size))
	}
	return config, layers, nil
}

// archive is the table of contents of an image archive: each regular
// file's offset and size in the temporary file.
type archive struct {
	f     *os.File
	files map[string]span
	order []string
}

type span struct{ off, size int64 }

func readArchive(f *os.File) (*archive, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	a := &archive{f: f, files: map[string]span{}}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: not a tar archive (%v)", ErrNotImageArchive, err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return nil, fmt.Errorf("%w: %s leaves the archive", ErrNotImageArchive, h.Name)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if _, dup := a.files[name]; dup {
			return nil, fmt.Errorf("%w: %s appears twice", ErrNotImageArchive, name)
		}
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, err
		}
		a.files[name] = span{off, h.Size}
		a.order = append(a.order, name)
	}
	if len(a.files) == 0 {
		return nil, fmt.Errorf("%w: no files (want a docker save tarball or an OCI image-layout archive)", ErrNotImageArchive)
	}
	return a, nil
}

func (a *archive) read(name string) ([]byte, error) {
	s, ok := a.files[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s is named but not in the archive", ErrNotImageArchive, name)
	}
	if s.size > maxArchiveMeta {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrNotImageArchive, name, maxArchiveMeta)
	}
	b := make([]byte, s.size)
	_, err := a.f.ReadAt(b, s.off)
	return b, err
}

func (a *archive) readJSON(name string, v any) error {
	b, err := a.read(name)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrNotImageArchive, name, err)
	}
	return nil
}

// dockerEntry is one image of a docker-archive manifest.json.
type dockerEntry struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// dockerManifest returns the untagged docker-archive manifest of the one
// image the archive holds, converting an OCI layout's index, and the name
// of the config file.
func (a *archive) dockerManifest() ([]byte, string, error) {
	var e dockerEntry
	switch {
	case a.has("manifest.json"):
		var m []dockerEntry
		if err := a.readJSON("manifest.json", &m); err != nil {
			return nil, "", err
		}
		if len(m) != 1 {
			return nil, "", fmt.Errorf("%w: manifest.json names %d images, want 1", ErrNotImageArchive, len(m))
		}
		e = m[0]
	case a.has("oci-layout") && a.has("index.json"):
		var err error
		if e, err = a.ociEntry(); err != nil {
			return nil, "", err
		}
	default:
		return nil, "", fmt.Errorf("%w: neither manifest.json (docker save) nor oci-layout and index.json (OCI image layout) at its root", ErrNotImageArchive)
	}
	if e.Config == "" || len(e.Layers) == 0 {
		return nil, "", fmt.Errorf("%w: the image names no config or no layers", ErrNotImageArchive)
	}
	for _, n := range append([]string{e.Config}, e.Layers...) {
		if !a.has(n) {
			return nil, "", fmt.Errorf("%w: %s is named but not in the archive", ErrNotImageArchive, n)
		}
	}
	out, _ := json.Marshal([]dockerEntry{{Config: e.Config, RepoTags: []string{}, Layers: e.Layers}})
	return out, e.Config, nil
}

// ociEntry reads an OCI layout's only image manifest as a docker-archive
// entry naming the blobs by path.
func (a *archive) ociEntry() (dockerEntry, error) {
	type descriptor struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
	}
	var idx struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := a.readJSON("index.json", &idx); err != nil {
		return dockerEntry{}, err
	}
	if len(idx.Manifests) != 1 {
		return dockerEntry{}, fmt.Errorf("%w: index.json names %d manifests, want 1", ErrNotImageArchive, len(idx.Manifests))
	}
	blob := func(d descriptor) (string, error) {
		if !blobRE.MatchString(d.Digest) {
			return "", fmt.Errorf("%w: %q is not a sha256 digest", ErrNotImageArchive, d.Digest)
		}
		return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:"), nil
	}
	mname, err := blob(idx.Manifests[0])
	if err != nil {
		return dockerEntry{}, err
	}
	if mt := idx.Manifests[0].MediaType; mt != "application/vnd.oci.image.manifest.v1+json" {
		return dockerEntry{}, fmt.Errorf("%w: index.json names a %q, want one image manifest", ErrNotImageArchive, mt)
	}
	mb, err := a.read(mname)
	if err != nil {
		return dockerEntry{}, err
	}
	if digestOf(mb) != idx.Manifests[0].Digest {
		return dockerEntry{}, fmt.Errorf("%w: manifest %s does not match its digest", ErrNotImageArchive, idx.Manifests[0].Digest)
	}
	var m struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(mb, &m); err != nil {
		return dockerEntry{}, fmt.Errorf("%w: manifest: %v", ErrNotImageArchive, err)
	}
	var e dockerEntry
	if e.Config, err = blob(m.Config); err != nil {
		return dockerEntry{}, err
	}
	cb, err := a.read(e.Config)
	if err != nil {
		return dockerEntry{}, err
	}
	if digestOf(cb) != m.Config.Digest {
		return dockerEntry{}, fmt.Errorf("%w: config %s does not match its digest", ErrNotImageArchive, m.Config.Digest)
	}
	for _, l := range m.Layers {
		n, err := blob(l)
		if err != nil {
			return dockerEntry{}, err
		}
		e.Layers = append(e.Layers, n) // the engine checks each layer against the config's diff IDs
	}
	return e, nil
}

func (a *archive) has(name string) bool { _, ok := a.files[name]; return ok }

// rewrite writes the docker-archive the engine loads: the archive's
// files, with manifest.json replaced and no repositories file (no tags).
func (a *archive) rewrite(w io.Writer, manifest []byte) error {
	tw := tar.NewWriter(w)
	for _, name := range a.order {
		if name == "manifest.json" || name == "repositories" || name == "index.json" || name == "oci-layout" {
			continue
		}
		s := a.files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: s.size, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := io.Copy(tw, io.NewSectionReader(a.f, s.off, s.size)); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: "manifest.json", Mode: 0o644, Size: int64(len(manifest)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(manifest); err != nil {
		return err
	}
	return tw.Close()
}
