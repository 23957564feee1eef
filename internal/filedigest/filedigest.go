package filedigest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ErrChanged marks a file whose bytes no longer have the digest it was
// known by.
var ErrChanged = errors.New("file changed since its digest was taken")

// settle is how long a file must have been unchanged when it was hashed
// for its digest to be remembered. File timestamps are taken from a coarse
// clock: a file written again within the same tick as the write before
// keeps its times, so a digest taken between the two would be stale with
// nothing to show it (git's "racy" index entries). Two seconds is well
// above any tick.
var settle = 2 * time.Second

// File is a file known by its digest.
type File struct {
	Path   string
	Digest string // "sha256:" and 64 hex digits
	Size   int64
}

// Open returns the file at path and its digest: the one remembered in memo
// (a directory; "" remembers nothing) for this very file, else one taken
// now by reading it, remembered for the next process when the file had
// settled. A memo that cannot be read or written is only a slower Open.
func Open(path, memo string) (File, error) {
	// Not blocked by a FIFO in the file's place: identify refuses it.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	before, err := identify(f)
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", path, err)
	}
	rec, abs := recordPath(memo, path)
	if rec != "" {
		if d, ok := recall(rec, abs, before); ok {
			return File{Path: path, Digest: d, Size: before.Size}, nil
		}
	}
	began := time.Now()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return File{}, fmt.Errorf("read %s: %w", path, err)
	}
	after, err := identify(f)
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", path, err)
	}
	if after != before || n != before.Size {
		return File{}, fmt.Errorf("%s: %w while it was read", path, ErrChanged)
	}
	d := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if rec != "" && before.settledBy(began) {
		remember(rec, record{Path: abs, Identity: before, Digest: d})
	}
	return File{Path: path, Digest: d, Size: n}, nil
}

// Read returns the file's bytes, refusing them (ErrChanged) unless they
// have the digest it is known by.
func (f File) Read() ([]byte, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != f.Digest {
		return nil, fmt.Errorf("%s: %w: it has %s, was known as %s", f.Path, ErrChanged, got, f.Digest)
	}
	return b, nil
}

// identity is what tells one version of a file from another without
// reading it.
type identity struct {
	Dev, Ino         uint64
	Size             int64
	MtimeNS, CtimeNS int64
}

func identify(f *os.File) (identity, error) {
	fi, err := f.Stat()
	if err != nil {
		return identity{}, err
	}
	if !fi.Mode().IsRegular() {
		return identity{}, errors.New("not a regular file")
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return identity{}, errors.New("no file identity on this system")
	}
	return identity{
		Dev: uint64(st.Dev), Ino: uint64(st.Ino), Size: st.Size,
		MtimeNS: st.Mtim.Nano(), CtimeNS: st.Ctim.Nano(),
	}, nil
}

// settledBy reports whether the file had not changed for settle before t.
func (id identity) settledBy(t time.Time) bool {
	limit := t.Add(-settle).UnixNano()
	return id.MtimeNS < limit && id.CtimeNS < limit
}

// maxRecord bounds a record's size (one is ~300 bytes).
const maxRecord = 4 << 10

// record is one remembered digest.
type record struct {
	Path     string   `json:"path"`
	Identity identity `json:"identity"`
	Digest   string   `json:"digest"`
}

// recordPath names path's record in memo (one file per absolute path) and
// returns that absolute path; "" for no memo.
func recordPath(memo, path string) (rec, abs string) {
	if memo == "" {
		return "", ""
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", ""
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(memo, hex.EncodeToString(sum[:16])+".json"), abs
}

// recall returns the digest rec remembers for the file at abs, if that
// file is the one it was taken of.
func recall(rec, abs string, id identity) (string, bool) {
	// A record is small and a regular file: anything else (a FIFO, a
	// link, a huge file) is no record, and never blocks or fills memory.
	f, err := os.OpenFile(rec, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", false
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRecord+1))
	if err != nil || len(b) > maxRecord {
		return "", false
	}
	var r record
	if json.Unmarshal(b, &r) != nil || r.Path != abs || r.Identity != id || !validDigest(r.Digest) {
		return "", false
	}
	return r.Digest, true
}

// remember writes a record whole (a temp file renamed over it) or not at
// all; a reader finds the old record, the new one, or none.
func remember(rec string, r record) {
	b, err := json.Marshal(r)
	if err != nil || os.MkdirAll(filepath.Dir(rec), 0o700) != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(rec), ".record-*")
	if err != nil {
		return
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil && cerr == nil {
		err = os.Rename(tmp.Name(), rec)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
}

// validDigest reports whether d is "sha256:" and 64 lowercase hex digits.
func validDigest(d string) bool {
	hexPart, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hexPart) != 64 {
		return false
	}
	for _, c := range hexPart {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
