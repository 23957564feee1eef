package image

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
)

// SpecSchema is the image spec version this release reads.
const SpecSchema = "sandboxd.image/v1"

// Spec describes an evaluator image.
type Spec struct {
	Schema string `json:"schema"`
	// Name is the repository name the image is tagged with for people
	// (jobs always use the image ID).
	Name string `json:"name"`
	// Env is the image's default environment; the broker takes PATH from it.
	Env []string `json:"env"`
	// Contents are applied in order; later entries may not replace earlier ones.
	Contents []Content `json:"contents"`
}

// Content is one thing placed in the image.
type Content struct {
	// Type is "file", "tree", "dir", "symlink", "text", "busybox-links",
	// "gocache" (a Go build cache warmed by testing the module at Src with
	// this machine's toolchain, so sandboxes need not compile the standard
	// library again), "gobuild" (the main package in the directory Src,
	// built static by this machine's toolchain, placed at Dst), "debs"
	// (the files of pinned Debian packages; see debs.go) or "pycompile"
	// (the Python sources placed so far below Dst, byte-compiled by the
	// host interpreter Src; see pycompile.go).
	Type string `json:"type"`
	// Src is a host path: absolute, or relative to the spec's directory.
	Src string `json:"src,omitempty"`
	// Dst is the absolute path in the image.
	Dst string `json:"dst"`
	// Mode is an octal permission string for file, dir, text and gobuild
	// ("0755").
	Mode string `json:"mode,omitempty"`
	// Exclude lists paths relative to Src left out of a tree, or paths in
	// the packages' file systems left out of debs (with all below them).
	Exclude []string `json:"exclude,omitempty"`
	// Packages are the Debian packages of a debs content, each pinned as
	// name=version; nothing they depend on is added unless pinned too.
	Packages []string `json:"packages,omitempty"`
	// Python is the exact version (platform.python_version()) the
	// interpreter of a pycompile content must be: the image's.
	Python string `json:"python,omitempty"`
	// Target is a symlink's target.
	Target string `json:"target,omitempty"`
	// Text is the content of a text file.
	Text string `json:"text,omitempty"`
	// Volume marks a tree, gocache or pycompile content whose destination
	// directory (all of it, whatever content placed its files) a broker
	// may serve from a read-only volume it fills from this image (label
	// sandbox.ImageTreesLabel): where the engine's storage driver is
	// fuse-overlayfs, whose directory listings of large directories can
	// repeat or skip entries (see README), and whose every lookup costs a
	// round trip through FUSE.
	Volume bool `json:"volume,omitempty"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9]+([._/-][a-z0-9]+)*$`)

// LoadSpec reads and validates DIR/image.json.
func LoadSpec(dir string) (*Spec, error) {
	p := filepath.Join(dir, "image.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("image spec: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("image spec %s: %w", p, err)
	}
	if err := s.validate(dir); err != nil {
		return nil, fmt.Errorf("image spec %s: %w", p, err)
	}
	return &s, nil
}

func (s *Spec) validate(dir string) error {
	if s.Schema != SpecSchema {
		return fmt.Errorf("schema: %q is not %q", s.Schema, SpecSchema)
	}
	if !nameRE.MatchString(s.Name) {
		return fmt.Errorf("name: %q is not a valid repository name", s.Name)
	}
	for i := range s.Contents {
		c := &s.Contents[i]
		f := fmt.Sprintf("contents[%d]", i)
		if !path.IsAbs(c.Dst) || path.Clean(c.Dst) != c.Dst || (c.Dst == "/" && c.Type != "debs") {
			return fmt.Errorf("%s.dst: %q is not a clean absolute path", f, c.Dst)
		}
		if c.Src != "" && !filepath.IsAbs(c.Src) {
			c.Src = filepath.Join(dir, c.Src)
		}
		switch c.Type {
		case "pycompile":
			if c.Src == "" || c.Python == "" {
				return fmt.Errorf("%s: src and python are required for pycompile", f)
			}
		case "file", "tree", "busybox-links", "gocache", "gobuild":
			if c.Src == "" {
				return fmt.Errorf("%s.src: required for %s", f, c.Type)
			}
		case "symlink":
			if c.Target == "" {
				return fmt.Errorf("%s.target: required for symlink", f)
			}
		case "debs":
			if len(c.Packages) == 0 {
				return fmt.Errorf("%s.packages: required for debs", f)
			}
			seen := map[string]bool{}
			for _, pin := range c.Packages {
				name, _, _ := strings.Cut(pin, "=")
				if !pinRE.MatchString(pin) || seen[name] {
					return fmt.Errorf("%s.packages: %q is not a name=version pin of a package pinned once", f, pin)
				}
				seen[name] = true
			}
		case "dir", "text":
		default:
			return fmt.Errorf("%s.type: unknown type %q", f, c.Type)
		}
		if c.Volume && c.Type != "tree" && c.Type != "gocache" && c.Type != "pycompile" {
			return fmt.Errorf("%s.volume: only a tree, a gocache or a pycompile's directory can be served from a volume, not a %s", f, c.Type)
		}
		if c.Mode != "" {
			if _, err := strconv.ParseUint(c.Mode, 8, 32); err != nil {
				return fmt.Errorf("%s.mode: %q is not octal", f, c.Mode)
			}
		}
	}
	if trees := volumeTrees(s); trees != "" {
		if _, err := sandbox.ParseImageTrees(trees); err != nil {
			return fmt.Errorf("contents marked volume: %w", err)
		}
	}
	return nil
}

func (c *Content) mode(def int64) int64 {
	if c.Mode == "" {
		return def
	}
	m, _ := strconv.ParseUint(c.Mode, 8, 32)
	return int64(m)
}
