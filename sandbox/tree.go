package sandbox

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"path"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// TreeEntry is one entry of a file tree written by WriteTree.
type TreeEntry struct {
	// Name is the entry's relative, clean, "/"-separated path.
	Name string
	// Dir marks a directory (kept even when empty). Directories that hold
	// something are written whether or not they are listed.
	Dir bool
	// Exec marks a file whose owner-execute bit is set (mode 0755; every
	// other file is 0644).
	Exec bool
	// Size is the file's length in bytes.
	Size int64
	// Digest, when set, is the file content's digest; WriteTree refuses
	// content that does not hash to it.
	Digest string
	// Open returns the file's content; it is called once, when the entry
	// is written, and the reader is closed after.
	Open func() (io.ReadCloser, error)
}

// WriteTree writes entries to w in sandboxd's canonical tar form, the only
// form the broker accepts as a job input, and returns its digest, the
// SHA-256 of exactly the bytes written: entries sorted bytewise by path,
// each directory before its contents, directories and regular files only,
// uid/gid 0, no owner names, mtime 0, mode 0755 or 0644, archive/tar's PAX
// format (a PAX header only where a name needs one), two zero blocks at the
// end. It is the form `sandboxd workspace ingest` computes for a directory
// and the daemon rebuilds for a candidate's export; the same tree always
// has the same digest.
func WriteTree(w io.Writer, entries []TreeEntry) (string, error) {
	all := map[string]TreeEntry{}
	for i, e := range entries {
		if err := checkTreeName(e.Name); err != nil {
			return "", fmt.Errorf("tree entry %d: %w", i, err)
		}
		if _, dup := all[e.Name]; dup {
			return "", fmt.Errorf("tree entry %q: %w: listed twice", e.Name, ErrInvalid)
		}
		if !e.Dir && (e.Size < 0 || e.Open == nil) {
			return "", fmt.Errorf("tree entry %q: %w: a file needs a size and content", e.Name, ErrInvalid)
		}
		all[e.Name] = e
	}
	for name, e := range all {
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if p, ok := all[d]; ok && !p.Dir {
				return "", fmt.Errorf("tree entry %q: %w: %q is a file", e.Name, ErrInvalid, d)
			}
			if _, ok := all[d]; !ok {
				all[d] = TreeEntry{Name: d, Dir: true}
			}
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	slices.Sort(names)

	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(w, h))
	for _, n := range names {
		e := all[n]
		if err := tw.WriteHeader(treeHeader(e)); err != nil {
			return "", fmt.Errorf("tree entry %q: %w", n, err)
		}
		if e.Dir {
			continue
		}
		if err := copyEntry(tw, e); err != nil {
			return "", fmt.Errorf("tree entry %q: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("tree: %w", err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// treeHeader is the one header the canonical form allows for an entry.
func treeHeader(e TreeEntry) *tar.Header {
	h := &tar.Header{Typeflag: tar.TypeReg, Name: e.Name, Mode: 0o644, Size: e.Size, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
	switch {
	case e.Dir:
		h.Typeflag, h.Name, h.Mode, h.Size = tar.TypeDir, e.Name+"/", 0o755, 0
	case e.Exec:
		h.Mode = 0o755
	}
	return h
}

func copyEntry(tw *tar.Writer, e TreeEntry) error {
	rc, err := e.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	var sum hash.Hash = sha256.New()
	n, err := io.Copy(io.MultiWriter(tw, sum), io.LimitReader(rc, e.Size+1))
	if err != nil {
		return err
	}
	if n != e.Size {
		return fmt.Errorf("%w: content is %d bytes, not %d", ErrInvalid, n, e.Size)
	}
	if e.Digest != "" {
		if got := "sha256:" + hex.EncodeToString(sum.Sum(nil)); got != e.Digest {
			return fmt.Errorf("%w: content hashes to %s, not %s", ErrInvalid, got, e.Digest)
		}
	}
	return nil
}

func checkTreeName(name string) error {
	if name == "" || name == "." || strings.HasPrefix(name, "/") || path.Clean(name) != name ||
		name == ".." || strings.HasPrefix(name, "../") || strings.ContainsRune(name, 0) || !utf8.ValidString(name) {
		return fmt.Errorf("%w: name %q is not a clean relative path", ErrInvalid, name)
	}
	return nil
}
