package bundle

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// The canonical tar form, shared by bundle layers and ingested workspaces:
//
//   - entries sorted bytewise by path (the path without a directory's
//     trailing "/"), each path at most once, so every directory comes
//     before its contents; every directory that holds something has its own
//     entry, and empty directories are kept;
//   - names relative, clean, without "./"; directories end in "/";
//   - type flags '5' (directory) and '0' (regular file) only: no links of
//     any kind, no devices, FIFOs or sockets;
//   - uid and gid 0, empty user and group names, mtime 0 (the epoch);
//   - mode 0755 for directories and for files whose owner-execute bit was
//     set, 0644 for every other file; setuid, setgid and sticky never appear;
//   - archive/tar's PAX format: a plain ustar header, preceded by a PAX
//     extended header only when the name needs one (long or non-ASCII);
//     no other extended records, no extended attributes;
//   - ended by two zero blocks, nothing after them.
//
// The digest of a tree is the SHA-256 of exactly these bytes.

// Media type of a canonical tar outside a bundle (e.g. a workspace input).
const MediaTypeTar = "application/vnd.sandboxd.tree.v1.tar"

// Summary describes a canonical tar that was written or checked.
type Summary struct {
	Digest string // sha256 of the canonical tar stream
	Size   int64  // bytes of the tar stream
	Files  int64  // regular files
	Dirs   int64  // directories
	Bytes  int64  // content bytes of the regular files
}

var epoch = time.Unix(0, 0)

// canonicalHeader is the one header the canonical form allows for an entry.
func canonicalHeader(name string, dir, exec bool, size int64) *tar.Header {
	h := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     0o644,
		Size:     size,
		ModTime:  epoch,
		Format:   tar.FormatPAX,
	}
	switch {
	case dir:
		h.Typeflag, h.Name, h.Mode, h.Size = tar.TypeDir, name+"/", 0o755, 0
	case exec:
		h.Mode = 0o755
	}
	return h
}

// tarWriter writes the canonical form and refuses to write anything else:
// entries out of order, or a directory's contents before the directory.
type tarWriter struct {
	tw   *tar.Writer
	cw   *countWriter
	last string
	dirs map[string]bool
	sum  Summary
}

type countWriter struct {
	w  io.Writer
	h  hash.Hash     // nil when w hashes what it is given itself
	hw hashingWriter // then w
	n  int64
}

// hashingWriter is a writer that hashes what it is given (a blob store's
// writer): a tar written into a fresh one is hashed once, by it.
type hashingWriter interface {
	io.Writer
	Digest() string
	Size() int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if c.h != nil {
		c.h.Write(p[:n])
	}
	c.n += int64(n)
	return n, err
}

func (c *countWriter) digest() string {
	if c.hw != nil {
		return c.hw.Digest()
	}
	return "sha256:" + hex.EncodeToString(c.h.Sum(nil))
}

func newTarWriter(w io.Writer) *tarWriter {
	cw := &countWriter{w: w}
	// Only a writer that holds nothing yet: its digest is then the tar's.
	if hw, ok := w.(hashingWriter); ok && hw.Size() == 0 {
		cw.hw = hw
	} else {
		cw.h = sha256.New()
	}
	return &tarWriter{tw: tar.NewWriter(cw), cw: cw, dirs: map[string]bool{"": true}}
}

func (t *tarWriter) order(name string) error {
	if t.sum.Files+t.sum.Dirs > 0 && name <= t.last {
		if name == t.last {
			return fmt.Errorf("%q: %w", name, ErrDuplicate)
		}
		return fmt.Errorf("%q after %q: not sorted: %w", name, t.last, ErrNotCanonical)
	}
	if !t.dirs[parent(name)] {
		return fmt.Errorf("%q before its directory: %w", name, ErrNotCanonical)
	}
	t.last = name
	return nil
}

func (t *tarWriter) dir(name string) error {
	if err := t.order(name); err != nil {
		return err
	}
	if err := t.tw.WriteHeader(canonicalHeader(name, true, false, 0)); err != nil {
		return fmt.Errorf("tar %q: %w", name, err)
	}
	t.dirs[name] = true
	t.sum.Dirs++
	return nil
}

// file writes a file entry; content must write exactly size bytes to w.
func (t *tarWriter) file(name string, exec bool, size int64, content func(w io.Writer) error) error {
	if err := t.order(name); err != nil {
		return err
	}
	if err := t.tw.WriteHeader(canonicalHeader(name, false, exec, size)); err != nil {
		return fmt.Errorf("tar %q: %w", name, err)
	}
	if err := content(t.tw); err != nil {
		return err
	}
	t.sum.Files++
	t.sum.Bytes += size
	return nil
}

func (t *tarWriter) close() (Summary, error) {
	if err := t.tw.Close(); err != nil {
		return Summary{}, fmt.Errorf("tar: %w", err)
	}
	t.sum.Size = t.cw.n
	t.sum.Digest = t.cw.digest()
	return t.sum, nil
}

// budgetReader fails with ErrTooLarge once more than max bytes are read,
// and hashes what passes through (and gives it to keep, if set).
type budgetReader struct {
	r    io.Reader
	h    hash.Hash
	n    int64
	max  int64
	keep *sameAsRead
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.n >= b.max {
		// Only an error if there is more to read.
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			return 0, fmt.Errorf("input is more than %d bytes: %w", b.max, ErrTooLarge)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > b.max-b.n {
		p = p[:b.max-b.n]
	}
	n, err := b.r.Read(p)
	if b.h != nil {
		b.h.Write(p[:n])
	}
	if b.keep != nil {
		b.keep.read(p[:n])
	}
	b.n += int64(n)
	return n, err
}

// typeError maps a tar type flag that is never allowed to its sentinel.
func typeError(name string, flag byte) error {
	switch flag {
	case tar.TypeLink:
		return fmt.Errorf("%q: %w", name, ErrHardLink)
	case tar.TypeSymlink:
		return fmt.Errorf("%q: %w", name, ErrSymlink)
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("%q: %w", name, ErrDevice)
	case tar.TypeFifo:
		return fmt.Errorf("%q: %w", name, ErrFIFO)
	}
	return fmt.Errorf("%q: type %q: %w", name, flag, ErrUnsupportedType)
}

// tarReadError keeps a ceiling or context error recognisable and marks any
// other failure to parse the stream as a malformed (not canonical) tar.
func tarReadError(err error) error {
	var r *refusal
	if errors.As(err, &r) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("reading tar: %w: %w", ErrNotCanonical, err)
}

// CheckTar reads a tar stream and succeeds only if it is exactly in the
// canonical form and within lim; it returns the stream's digest and counts.
// If want is not empty it is a claimed digest, and a different content
// digest is ErrDigestMismatch. The broker uses it to re-check an input
// before staging it; nothing is extracted.
func CheckTar(ctx context.Context, r io.Reader, lim TreeLimits, want string) (Summary, error) {
	return checkTar(ctx, r, lim, want, nil)
}

// checkTar is CheckTar that also reports each directory to onDir.
func checkTar(ctx context.Context, r io.Reader, lim TreeLimits, want string, onDir func(string)) (Summary, error) {
	if err := lim.Validate(); err != nil {
		return Summary{}, err
	}
	if want != "" && !sandbox.ValidDigest(want) {
		return Summary{}, fmt.Errorf("claimed digest %q is malformed: %w", want, ErrDigestMismatch)
	}
	in := &budgetReader{r: r, h: sha256.New(), max: lim.rawTarBudget()}
	// The canonical form is rendered as the stream is read and compared
	// with it byte for byte: equal, the stream is canonical, and its hash
	// is the canonical tar's.
	same := &sameAsRead{in: in}
	in.keep = same
	tr := tar.NewReader(in)
	out := newTarWriter(same)
	var entries int64
	for {
		if err := ctx.Err(); err != nil {
			return Summary{}, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Summary{}, tarReadError(err)
		}
		entries++
		if entries > lim.MaxFiles {
			return Summary{}, fmt.Errorf("more than %d entries: %w", lim.MaxFiles, ErrTooManyFiles)
		}
		name := hdr.Name
		isDir := hdr.Typeflag == tar.TypeDir
		if isDir {
			if !strings.HasSuffix(name, "/") {
				return Summary{}, fmt.Errorf("directory %q without a trailing slash: %w", name, ErrNotCanonical)
			}
			name = strings.TrimSuffix(name, "/")
		}
		if err := checkName(name, lim); err != nil {
			return Summary{}, err
		}
		if !isDir && hdr.Typeflag != tar.TypeReg {
			return Summary{}, typeError(name, hdr.Typeflag)
		}
		if hdr.Size < 0 || hdr.Size > lim.MaxBytes-out.sum.Bytes {
			return Summary{}, fmt.Errorf("%q claims %d bytes, %d left of %d: %w", name, hdr.Size, lim.MaxBytes-out.sum.Bytes, lim.MaxBytes, ErrTooLarge)
		}
		exec := hdr.Mode&0o100 != 0
		if isDir {
			err = out.dir(name)
			if err == nil && onDir != nil {
				onDir(name)
			}
		} else {
			err = out.file(name, exec, hdr.Size, func(w io.Writer) error {
				if _, err := io.CopyN(w, tr, hdr.Size); err != nil {
					return tarReadError(err)
				}
				return nil
			})
		}
		if err != nil {
			return Summary{}, err
		}
	}
	// Whatever follows the end-of-archive blocks is hashed too, so that
	// trailing bytes make the digests differ.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return Summary{}, tarReadError(err)
	}
	sum, err := out.close()
	if err != nil {
		return Summary{}, err
	}
	if err := same.end(); err != nil {
		return Summary{}, err
	}
	if want != "" && want != sum.Digest {
		return Summary{}, fmt.Errorf("claimed %s, content is %s: %w", want, sum.Digest, ErrDigestMismatch)
	}
	return sum, nil
}

// sameAsRead compares what a canonical tar writer writes with what was
// read of a stream, in order: the reader is always ahead (a header or a
// chunk of content is written once it was read), so the writer's bytes
// are matched against those read and not yet matched. It is a
// hashingWriter whose digest is the stream's: the two are the same bytes
// unless end says otherwise.
type sameAsRead struct {
	in      *budgetReader
	pending []byte // read, not yet written
	written int64
	differs string // why not, once the two part
}

// maxPending bounds what is kept of the stream ahead of the writer: the
// writer trails by a header and a copy buffer; farther, the stream has
// bytes its canonical form has not (padding, junk after the end).
const maxPending = 4 << 20

func (s *sameAsRead) read(p []byte) {
	if s.differs != "" {
		return
	}
	if len(s.pending)+len(p) > maxPending {
		s.differs = fmt.Sprintf("more than %d bytes past byte %d that its canonical form does not have", maxPending, s.written)
		s.pending = nil
		return
	}
	s.pending = append(s.pending, p...)
}

func (s *sameAsRead) Write(p []byte) (int, error) {
	if s.differs == "" {
		switch {
		case len(p) > len(s.pending):
			s.differs = fmt.Sprintf("its canonical form goes on past byte %d", s.written+int64(len(s.pending)))
		case !bytes.Equal(p, s.pending[:len(p)]):
			s.differs = fmt.Sprintf("it differs from its canonical form within bytes %d to %d", s.written, s.written+int64(len(p)))
		default:
			// Move what is left to the front once the matched part is the
			// larger: the buffer stays about one read long.
			rest := s.pending[len(p):]
			if len(rest) < len(p) {
				s.pending = append(s.pending[:0], rest...)
			} else {
				s.pending = rest
			}
		}
	}
	s.written += int64(len(p))
	return len(p), nil
}

func (s *sameAsRead) Size() int64    { return s.written }
func (s *sameAsRead) Digest() string { return "sha256:" + hex.EncodeToString(s.in.h.Sum(nil)) }

// end reports whether the stream, read to its end, was exactly its
// canonical form.
func (s *sameAsRead) end() error {
	if s.differs == "" && len(s.pending) > 0 {
		s.differs = fmt.Sprintf("%d bytes follow its canonical form", len(s.pending))
	}
	if s.differs != "" {
		return fmt.Errorf("the stream is not canonical: %s: %w", s.differs, ErrNotCanonical)
	}
	return nil
}
