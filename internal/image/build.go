package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Engine is the subset of the engine client the builder uses.
type Engine interface {
	ImageInspect(ctx context.Context, imageID string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ImageLoad(ctx context.Context, input io.Reader, opts ...client.ImageLoadOption) (client.ImageLoadResult, error)
}

type entry struct {
	name     string // relative, no leading slash
	typ      byte
	mode     int64
	src      string // host file for regular files
	text     []byte // content for text files
	linkname string
}

// Built describes a built image.
type Built struct {
	ID     string // sha256:… of the config
	Name   string
	Loaded bool // false when the engine already had it
}

// Build builds the image described by DIR/image.json and loads it unless
// the engine already has an image with the same ID. tmpDir holds the layer
// while it is written ("" = os.TempDir()). rep, if not nil, is told the
// build's progress.
func Build(ctx context.Context, eng Engine, dir, tmpDir string, rep progress.Reporter) (b *Built, err error) {
	spec, err := LoadSpec(dir)
	if err != nil {
		return nil, err
	}
	step := progress.Start(rep, "image build "+spec.Name)
	defer func() {
		switch {
		case err != nil:
			step.End("failed")
		case b.Loaded:
			step.End("loaded " + b.ID)
		default:
			step.End("already present " + b.ID)
		}
	}()
	step.Update("hashing inputs", -1, -1)
	key, err := inputsKey(spec)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", spec.Name, err)
	}
	if id, ok := lookupBuilt(ctx, eng, key); ok {
		return &Built{ID: id, Name: spec.Name}, nil
	}
	step.Update("collecting files", -1, -1)
	entries, err := collect(spec)
	if err != nil {
		return nil, err
	}
	step.Update("collecting files", -1, int64(len(entries)))
	layer, err := os.CreateTemp(tmpDir, "sandboxd-layer-*.tar")
	if err != nil {
		return nil, err
	}
	defer os.Remove(layer.Name())
	defer layer.Close()
	h := sha256.New()
	if err := writeLayer(progress.Counting(step, "writing layer", io.MultiWriter(layer, h)), entries); err != nil {
		return nil, fmt.Errorf("image %s: write layer: %w", spec.Name, err)
	}
	diffID := "sha256:" + hex.EncodeToString(h.Sum(nil))
	cfg, err := configJSON(spec, diffID)
	if err != nil {
		return nil, err
	}
	id := digestOf(cfg)
	b = &Built{ID: id, Name: spec.Name}
	if _, err := eng.ImageInspect(ctx, id); err == nil {
		rememberBuilt(key, id)
		return b, nil
	} else if !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("image %s: inspect %s: %w", spec.Name, id, err)
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeArchive(progress.Counting(step, "loading into the engine", pw), spec.Name, cfg, layer))
	}()
	res, err := eng.ImageLoad(ctx, pr, client.ImageLoadWithQuiet(true))
	if err != nil {
		pr.CloseWithError(err)
		return nil, fmt.Errorf("image %s: load: %w", spec.Name, err)
	}
	body, _ := io.ReadAll(io.LimitReader(res, 1<<20))
	res.Close()
	if bytes.Contains(body, []byte(`"error"`)) {
		return nil, fmt.Errorf("image %s: load: %s", spec.Name, strings.TrimSpace(string(body)))
	}
	if _, err := eng.ImageInspect(ctx, id); err != nil {
		return nil, fmt.Errorf("image %s: loaded but %s is not in the engine: %w", spec.Name, id, err)
	}
	b.Loaded = true
	rememberBuilt(key, id)
	return b, nil
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func configJSON(spec *Spec, diffID string) ([]byte, error) {
	env := spec.Env
	if env == nil {
		env = []string{}
	}
	labels := map[string]string{"org.opencontainers.image.title": spec.Name}
	if pins := packagesLabel(spec); pins != "" {
		labels[PackagesLabel] = pins
	}
	if trees := volumeTrees(spec); trees != "" {
		labels[sandbox.ImageTreesLabel] = trees
	}
	cfg := map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Env":        env,
			"WorkingDir": "/",
			"Labels":     labels,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history": []map[string]any{{"created_by": "sandboxd image build", "comment": spec.Name}},
	}
	return json.Marshal(cfg)
}

// volumeTrees is the value of the image's sandbox.ImageTreesLabel: the
// JSON list of the destinations of its contents marked volume, or "".
func volumeTrees(spec *Spec) string {
	var trees []string
	for _, c := range spec.Contents {
		if c.Volume {
			trees = append(trees, c.Dst)
		}
	}
	if len(trees) == 0 {
		return ""
	}
	slices.Sort(trees)
	b, _ := json.Marshal(trees)
	return string(b)
}

func writeArchive(w io.Writer, name string, cfg []byte, layer io.Reader) error {
	tw := tar.NewWriter(w)
	cfgName := strings.TrimPrefix(digestOf(cfg), "sha256:") + ".json"
	manifest, _ := json.Marshal([]map[string]any{{
		"Config":   cfgName,
		"RepoTags": []string{name + ":latest"},
		"Layers":   []string{"layer.tar"},
	}})
	st, err := layer.(*os.File).Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "layer.tar", Mode: 0o644, Size: st.Size(), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, layer); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{cfgName, cfg}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func collect(spec *Spec) (map[string]*entry, error) {
	m := map[string]*entry{}
	add := func(e *entry) error {
		if old, ok := m[e.name]; ok {
			if old.typ == tar.TypeDir && e.typ == tar.TypeDir {
				return nil
			}
			return fmt.Errorf("image %s: /%s is placed twice", spec.Name, e.name)
		}
		// Parent directories.
		for d := path.Dir(e.name); d != "." && d != "/"; d = path.Dir(d) {
			if p, ok := m[d]; ok {
				if p.typ != tar.TypeDir {
					return fmt.Errorf("image %s: /%s is not a directory", spec.Name, d)
				}
				break
			}
			m[d] = &entry{name: d, typ: tar.TypeDir, mode: 0o755}
		}
		m[e.name] = e
		return nil
	}
	for _, c := range spec.Contents {
		dst := strings.TrimPrefix(c.Dst, "/")
		var err error
		switch c.Type {
		case "file":
			st, serr := os.Stat(c.Src)
			if serr != nil {
				return nil, fmt.Errorf("image %s: %w", spec.Name, serr)
			}
			if !st.Mode().IsRegular() {
				return nil, fmt.Errorf("image %s: %s is not a regular file", spec.Name, c.Src)
			}
			err = add(&entry{name: dst, typ: tar.TypeReg, mode: c.mode(int64(st.Mode().Perm())), src: c.Src})
		case "text":
			err = add(&entry{name: dst, typ: tar.TypeReg, mode: c.mode(0o644), text: []byte(c.Text)})
		case "dir":
			err = add(&entry{name: dst, typ: tar.TypeDir, mode: c.mode(0o755)})
		case "symlink":
			err = add(&entry{name: dst, typ: tar.TypeSymlink, mode: 0o777, linkname: c.Target})
		case "tree":
			err = addTree(c, dst, add)
		case "busybox-links":
			err = addBusyboxLinks(c, dst, add)
		case "gocache":
			err = addGoCache(spec, c, dst, add)
		case "gobuild":
			err = addGoBuild(c, dst, add)
		case "debs":
			err = addDebs(c, add)
		case "pycompile":
			err = addPyCompile(c, dst, m, add)
		}
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

func addTree(c Content, dst string, add func(*entry) error) error {
	root := filepath.Clean(c.Src)
	excluded := map[string]bool{}
	for _, x := range c.Exclude {
		excluded[filepath.Clean(x)] = true
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if excluded[rel] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		name := dst
		if rel != "." {
			name = path.Join(dst, filepath.ToSlash(rel))
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return add(&entry{name: name, typ: tar.TypeDir, mode: 0o755})
		case info.Mode().IsRegular():
			mode := int64(0o644)
			if info.Mode()&0o111 != 0 {
				mode = 0o755
			}
			return add(&entry{name: name, typ: tar.TypeReg, mode: mode, src: p})
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return add(&entry{name: name, typ: tar.TypeSymlink, mode: 0o777, linkname: target})
		}
		return nil // sockets, FIFOs and devices are never placed in images
	})
}

func addBusyboxLinks(c Content, dst string, add func(*entry) error) error {
	out, err := exec.Command(c.Src, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", c.Src, err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := add(&entry{name: path.Join(dst, applet), typ: tar.TypeSymlink, mode: 0o777, linkname: "busybox"}); err != nil {
			return err
		}
	}
	return nil
}

func writeLayer(w io.Writer, m map[string]*entry) error {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		if err := writeEntry(tw, m[n]); err != nil {
			return err
		}
	}
	return tw.Close()
}

func writeEntry(tw *tar.Writer, e *entry) error {
	h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.linkname, Format: tar.FormatPAX}
	if e.typ == tar.TypeDir {
		h.Name += "/"
	}
	var r io.Reader
	switch {
	case e.typ != tar.TypeReg:
	case e.src != "":
		f, err := os.Open(e.src)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		h.Size = st.Size()
		r = f
	default:
		h.Size = int64(len(e.text))
		r = bytes.NewReader(e.text)
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if r != nil {
		if n, err := io.Copy(tw, r); err != nil {
			return err
		} else if n != h.Size {
			return errors.New("file changed while being read: " + e.src)
		}
	}
	return nil
}
