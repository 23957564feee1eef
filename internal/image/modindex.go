package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// The go command keeps an index of each standard library package it loads
// (the files' names, imports and build constraints) in its build cache,
// keyed by a hash of the package directory's listing: each file's name,
// size and modification time (cmd/go/internal/modindex, dirHash). The
// warm-up indexes the host's toolchain, whose files have the times of its
// installation; in the image every file's time is zero, so none of those
// keys is ever asked for, and every go command in a sandbox parses the
// sources of every standard package it loads again (about a fifth of a
// small `go test`'s CPU there) and stores the index anew.
//
// rekeyModuleIndex moves each index entry of the warm cache to the key the
// image's copy of that directory has (the same names and sizes, time zero,
// in the image's GOROOT), naming the same index bytes, which hold no
// times. (The host's keys would be of no use in the image, and would make
// its ID depend on when this machine's toolchain was installed.) It
// follows dirHash as of Go 1.26 ("go index v2"); if a toolchain keys its
// index otherwise, the entries moved are never asked for and cost only
// their bytes: the test of this file finds that first
// (TestRekeyedModuleIndexMatchesTheGoCommand).
func rekeyModuleIndex(spec *Spec, env []string, cache string) error {
	cmd := exec.Command("go", "env", "GOROOT", "GOVERSION")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go env: %w", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return fmt.Errorf("go env GOROOT GOVERSION: %q", out)
	}
	goroot, version := filepath.Clean(f[0]), f[1]
	// The image's toolchain: the tree placed from the host's GOROOT.
	var tree *Content
	for i, c := range spec.Contents {
		if c.Type == "tree" && filepath.Clean(c.Src) == goroot {
			tree = &spec.Contents[i]
		}
	}
	if tree == nil {
		return nil // the image has no copy of this toolchain: nothing to match
	}
	excluded := map[string]bool{}
	for _, x := range tree.Exclude {
		excluded[filepath.Clean(x)] = true
	}
	src := filepath.Join(goroot, "src")
	return filepath.WalkDir(src, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(goroot, dir)
		files, ok := listing(dir)
		if !ok {
			return nil
		}
		// A directory the image leaves out, or holds only in part, is not
		// indexed there or indexed otherwise (the index lists its files):
		// its host entry goes, unmoved.
		partial := false
		for d := rel; d != "." && !partial; d = filepath.Dir(d) {
			partial = excluded[d]
		}
		for _, fi := range files {
			partial = partial || excluded[filepath.Join(rel, fi.Name())]
		}
		imageDir := path.Join(tree.Dst, filepath.ToSlash(rel))
		// Standard packages are indexed with GOROOT/src as their module
		// root, the toolchain's commands with GOROOT/src/cmd.
		for _, root := range []string{"src", "src/cmd"} {
			hostKey := indexKey(version, filepath.Join(goroot, root), dir, files, fs.FileInfo.ModTime)
			imageKey := ""
			if !partial {
				imageKey = indexKey(version, path.Join(tree.Dst, root), imageDir, files, func(fs.FileInfo) time.Time { return time.Unix(0, 0) })
			}
			if err := moveEntry(cache, hostKey, imageKey); err != nil {
				return err
			}
		}
		return nil
	})
}

// listing returns a directory's files as dirHash reads them (its
// subdirectories left out), or false where dirHash indexes nothing: a file
// that is not regular.
func listing(dir string) ([]fs.FileInfo, bool) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, false
	}
	var files []fs.FileInfo
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if !e.Type().IsRegular() {
			return nil, false
		}
		fi, err := e.Info()
		if err != nil {
			return nil, false
		}
		files = append(files, fi)
	}
	return files, true
}

// indexKey is dirHash's key of the package directory pkgdir below modroot,
// its files' times given by mtime, in UTC.
func indexKey(version, modroot, pkgdir string, files []fs.FileInfo, mtime func(fs.FileInfo) time.Time) string {
	h := sha256.New()
	// cache.NewHash's salt: the version without its experiments.
	salt := version
	if i := strings.Index(salt, " X:"); i >= 0 {
		salt = salt[:i]
	} else if i := strings.Index(salt, "-X:"); i >= 0 {
		salt = salt[:i]
	}
	h.Write([]byte(salt))
	fmt.Fprintf(h, "modroot %s\n", modroot)
	fmt.Fprintf(h, "package %s %s %v\n", version, "go index v2", pkgdir)
	for _, fi := range files {
		fmt.Fprintf(h, "file %v %v %v\n", fi.Name(), mtime(fi).UTC(), fi.Size())
	}
	return hex.EncodeToString(h.Sum(nil))
}

// moveEntry makes the warm cache's entry of action from, if it has one,
// the entry of action to (the same output, size and time), or removes it
// where to is "".
func moveEntry(cache, from, to string) error {
	old := filepath.Join(cache, from[:2], from+"-a")
	b, err := os.ReadFile(old)
	if err != nil {
		return nil // never indexed
	}
	if to == "" {
		return os.Remove(old)
	}
	if !bytes.HasPrefix(b, []byte("v1 "+from+" ")) {
		return fmt.Errorf("cache entry %s: unexpected form %q", from, b)
	}
	p := filepath.Join(cache, to[:2], to+"-a")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(p, append([]byte("v1 "+to), b[3+len(from):]...), 0o644); err != nil || to == from {
		return err
	}
	return os.Remove(old)
}
