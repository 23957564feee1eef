package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// builderRevision changes whenever the builder places other bytes for the
// same inputs (2: the gocache's module index keyed for the image's file
// times), so an image built by an earlier builder is not taken for its
// inputs' image.
const builderRevision = 2

// inputsKey digests everything an image is built from: the spec, the bytes
// of single files, and the names, modes, sizes and modification times of
// trees (hashing a whole toolchain on every call would cost more than the
// check saves). A changed input gives a new key and so a rebuild; the image
// ID itself always comes from the layer's bytes.
func inputsKey(spec *Spec) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "builder %d\n", builderRevision)
	js, _ := json.Marshal(spec)
	fmt.Fprintf(h, "spec %s\n", js)
	for _, c := range spec.Contents {
		switch c.Type {
		case "file", "busybox-links", "pycompile":
			if err := hashFile(h, c.Src); err != nil {
				return "", err
			}
		case "tree":
			if err := hashTreeMeta(h, c.Src); err != nil {
				return "", err
			}
		case "gocache", "gobuild":
			cmd := exec.Command("go", "env", "GOVERSION", "GOROOT")
			cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOENV=off") // the toolchain that builds
			out, err := cmd.Output()
			if err != nil {
				return "", fmt.Errorf("go env: %w", err)
			}
			fmt.Fprintf(h, "go %s\n", out)
			if err := hashTreeMeta(h, c.Src); err != nil {
				return "", err
			}
			if mod := moduleFile(c.Src); c.Type == "gobuild" && mod != "" {
				// Its go and godebug lines are part of the program.
				if err := hashFile(h, mod); err != nil {
					return "", err
				}
			}
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fh := sha256.New()
	if _, err := io.Copy(fh, f); err != nil {
		return err
	}
	fmt.Fprintf(w, "file %s %x\n", p, fh.Sum(nil))
	return nil
}

func hashTreeMeta(w io.Writer, root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "tree %s %v %d %d\n", p, info.Mode(), info.Size(), info.ModTime().UnixNano())
		return nil
	})
}

// The skip cache maps an inputs key to the image ID it built, in a file
// per key under the user cache directory. It is only a shortcut: the ID is
// used only if the engine still has that image, and the image ID itself
// always comes from the layer's bytes (never from the key, which depends on
// file times), so the same inputs give the same ID on every machine.
func builtPath(key string) (string, bool) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", false
	}
	return filepath.Join(dir, "sandboxd", "images", strings.TrimPrefix(key, "sha256:")), true
}

func lookupBuilt(ctx context.Context, eng Engine, key string) (string, bool) {
	p, ok := builtPath(key)
	if !ok {
		return "", false
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", false
	}
	id := strings.TrimSpace(string(b))
	if img, err := eng.ImageInspect(ctx, id); err != nil || img.ID != id {
		return "", false
	}
	return id, true
}

func rememberBuilt(key, id string) {
	p, ok := builtPath(key)
	if !ok {
		return
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return
	}
	// A temp file of its own: builds may run at once.
	f, err := os.CreateTemp(filepath.Dir(p), ".built-*")
	if err != nil {
		return
	}
	_, werr := f.WriteString(id + "\n")
	if cerr := f.Close(); werr != nil || cerr != nil || os.Rename(f.Name(), p) != nil {
		os.Remove(f.Name())
	}
}
