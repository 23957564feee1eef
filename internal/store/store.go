package store

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
)

// ErrNotFound is returned for a digest the store does not hold.
var ErrNotFound = errors.New("blob not found")

// ErrDigestMismatch is returned when written bytes do not match a claimed digest.
var ErrDigestMismatch = errors.New("digest mismatch")

// ErrTooLarge is returned when a blob exceeds the size a writer allowed.
var ErrTooLarge = errors.New("blob too large")

var digestRE = regexp.MustCompile(`^sha256:([0-9a-f]{64})$`)

// Store is a directory of blobs: DIR/sha256/<hex>.
type Store struct {
	dir string
	tmp string
}

// Open returns the store rooted at dir, creating it (mode 0700) if needed.
// Blobs are written in DIR/tmp first.
func Open(dir string) (*Store, error) {
	return OpenWithTemp(dir, filepath.Join(dir, "tmp"))
}

// OpenWithTemp is Open with the directory where blobs are written before
// they are renamed into place; it must be on the same file system. An OCI
// image layout keeps it outside blobs/, where every directory names a
// hash algorithm.
func OpenWithTemp(dir, tmp string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, "sha256"), 0o700); err != nil {
		return nil, fmt.Errorf("blob store %s: %w", dir, err)
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("blob store %s: %w", dir, err)
	}
	return &Store{dir: dir, tmp: tmp}, nil
}

// Dir returns the store's root directory.
func (s *Store) Dir() string { return s.dir }

// Path returns where the blob with digest d lives (whether or not it exists).
func (s *Store) Path(d string) (string, error) {
	m := digestRE.FindStringSubmatch(d)
	if m == nil {
		return "", fmt.Errorf("malformed digest %q", d)
	}
	return filepath.Join(s.dir, "sha256", m[1]), nil
}

// Has reports whether the store holds d.
func (s *Store) Has(d string) bool {
	p, err := s.Path(d)
	if err != nil {
		return false
	}
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// Open opens the blob d for reading.
func (s *Store) Open(d string) (*os.File, error) {
	p, err := s.Path(d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("blob %s: %w", d, ErrNotFound)
	}
	return f, err
}

// Size returns the size of blob d.
func (s *Store) Size(d string) (int64, error) {
	p, err := s.Path(d)
	if err != nil {
		return 0, err
	}
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("blob %s: %w", d, ErrNotFound)
	}
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Put copies r into the store and returns its digest and size. If want is
// not empty, the content must hash to it. maxBytes < 0 means no limit.
func (s *Store) Put(r io.Reader, want string, maxBytes int64) (digest string, size int64, err error) {
	w, err := s.NewWriter(maxBytes)
	if err != nil {
		return "", 0, err
	}
	defer w.Abort()
	if _, err := io.Copy(w, r); err != nil {
		return "", 0, err
	}
	return w.Commit(want)
}

// PutBytes stores b.
func (s *Store) PutBytes(b []byte) (string, error) {
	w, err := s.NewWriter(-1)
	if err != nil {
		return "", err
	}
	defer w.Abort()
	if _, err := w.Write(b); err != nil {
		return "", err
	}
	d, _, err := w.Commit("")
	return d, err
}

// Writer streams one blob into the store, hashing as it writes.
type Writer struct {
	s    *Store
	f    *os.File
	h    hashWriter
	n    int64
	max  int64
	done bool
}

type hashWriter interface {
	io.Writer
	Sum([]byte) []byte
}

// NewWriter starts a blob. Call Commit to keep it or Abort to drop it.
func (s *Store) NewWriter(maxBytes int64) (*Writer, error) {
	f, err := os.CreateTemp(s.tmp, "blob-*")
	if err != nil {
		return nil, fmt.Errorf("blob store: %w", err)
	}
	return &Writer{s: s, f: f, h: sha256.New(), max: maxBytes}, nil
}

func (w *Writer) Write(p []byte) (int, error) {
	if w.max >= 0 && w.n+int64(len(p)) > w.max {
		return 0, fmt.Errorf("more than %d bytes: %w", w.max, ErrTooLarge)
	}
	n, err := w.f.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	return n, err
}

// Size is the number of bytes written so far.
func (w *Writer) Size() int64 { return w.n }

// Digest is the digest of the bytes written so far.
func (w *Writer) Digest() string { return "sha256:" + hex.EncodeToString(w.h.Sum(nil)) }

// Commit makes the blob durable and visible under its digest. If want is
// not empty and differs from the content's digest, nothing is kept.
func (w *Writer) Commit(want string) (string, int64, error) {
	if w.done {
		return "", 0, errors.New("blob writer already finished")
	}
	d := w.Digest()
	if want != "" && want != d {
		w.Abort()
		return "", 0, fmt.Errorf("claimed %s, content is %s: %w", want, d, ErrDigestMismatch)
	}
	if err := w.f.Sync(); err != nil {
		w.Abort()
		return "", 0, err
	}
	if err := w.f.Close(); err != nil {
		w.Abort()
		return "", 0, err
	}
	w.done = true
	dst, _ := w.s.Path(d)
	if err := os.Chmod(w.f.Name(), 0o400); err != nil {
		os.Remove(w.f.Name())
		return "", 0, err
	}
	// Rename is atomic; a concurrent writer of the same content replaces an
	// identical file, which readers cannot tell apart.
	if err := os.Rename(w.f.Name(), dst); err != nil {
		os.Remove(w.f.Name())
		return "", 0, err
	}
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return "", 0, err
	}
	return d, w.n, nil
}

// Abort drops an unfinished blob. It is safe to call after Commit.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	w.f.Close()
	os.Remove(w.f.Name())
}

// Verify re-hashes blob d and reports a mismatch as ErrDigestMismatch.
func (s *Store) Verify(d string) error {
	f, err := s.Open(d)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != d {
		return fmt.Errorf("blob %s holds %s: %w", d, got, ErrDigestMismatch)
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
