package bundle

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Workspaces. A candidate workspace is ingested from a directory or from a
// tar stream under the reader rules and stored as a canonical tar whose
// digest is the workspace's identity:
//
//   - only directories and regular files are kept; a symlink is kept only
//     as a copy of the regular file its chain ends at inside the tree (a
//     chain that leaves the tree is ErrSymlinkEscapes; one ending at a
//     directory, at nothing or in a loop is ErrSymlink); no hard links (a
//     directory's file with more than one link, or a tar link entry, is
//     ErrHardLink); devices, FIFOs and sockets are refused;
//   - every name passes the name rules (checkName);
//   - the ceilings in TreeLimits hold while reading, before the bytes they
//     guard are accepted: a tar header's size is checked before its content
//     is read, a directory's entries are counted as they are listed;
//   - from a directory, every file is compared (device, inode, size, mtime,
//     ctime, mode) when listed, when opened, after it was read and at its
//     path afterwards, and exactly its listed size must be read: a file
//     that changes while it is being read is ErrChanged;
//   - from a tar, input order does not matter: contents are spooled to a
//     private temporary file and written out sorted; a parent directory
//     the tar does not list is added, "./" prefixes and the root entry are
//     dropped, a pax global header carrying only a comment (git archive)
//     is ignored.
//
// Nothing is committed to a store unless the whole tree was accepted.

// Options configure an ingestion.
type Options struct {
	// Limits are the ceilings; the zero value means DefaultLimits.
	Limits TreeLimits
	// Expect, if set, is the digest the caller claims the workspace has. It
	// is checked, never used as the identity: a mismatch is
	// ErrDigestMismatch and nothing is stored.
	Expect string
	// Refuse are a bundle's workspace rules (rules.go): a path one of them
	// matches is ErrRefusedPath and nothing is stored.
	Refuse []string
	// Progress, if set, is told the canonical bytes written so far.
	Progress func(bytes int64)
}

func (o Options) limits() TreeLimits {
	if o.Limits == (TreeLimits{}) {
		return DefaultLimits()
	}
	return o.Limits
}

// WriteDir writes the tree at dir to w in the canonical form.
func WriteDir(ctx context.Context, dir string, w io.Writer, lim TreeLimits) (Summary, error) {
	return writeDir(ctx, dir, w, lim)
}

func writeDir(ctx context.Context, dir string, w io.Writer, lim TreeLimits, skip ...string) (Summary, error) {
	return writeDirRefusing(ctx, dir, w, lim, nil, skip...)
}

func writeDirRefusing(ctx context.Context, dir string, w io.Writer, lim TreeLimits, refuse []string, skip ...string) (Summary, error) {
	entries, recheck, closeRoot, err := scanDir(ctx, dir, lim, skip...)
	if err != nil {
		return Summary{}, err
	}
	defer closeRoot()
	if err := refuseEntries(entries, refuse); err != nil {
		return Summary{}, err
	}
	sum, err := writeTree(w, entries)
	if err != nil {
		return Summary{}, err
	}
	if err := recheck(); err != nil {
		return Summary{}, err
	}
	return sum, nil
}

// WriteTar reads a tar stream (any common format and order), applies the
// reader rules and writes the tree to w in the canonical form. Nothing is
// written to w unless the whole input was accepted.
func WriteTar(ctx context.Context, r io.Reader, w io.Writer, lim TreeLimits) (Summary, error) {
	return writeTarRefusing(ctx, r, w, lim, nil)
}

func writeTarRefusing(ctx context.Context, r io.Reader, w io.Writer, lim TreeLimits, refuse []string) (Summary, error) {
	if err := lim.Validate(); err != nil {
		return Summary{}, err
	}
	spool, err := os.CreateTemp("", "sandboxd-ingest-*")
	if err != nil {
		return Summary{}, fmt.Errorf("ingest: spool: %w", err)
	}
	defer spool.Close()
	os.Remove(spool.Name()) // nothing else can open it; it goes with the descriptor

	nodes, err := spoolTar(ctx, r, spool, lim)
	if err != nil {
		return Summary{}, err
	}
	entries, err := nodes.entries(spool, lim)
	if err != nil {
		return Summary{}, err
	}
	if err := refuseEntries(entries, refuse); err != nil {
		return Summary{}, err
	}
	return writeTree(w, entries)
}

// tarNode is one name of a tar being ingested.
type tarNode struct {
	kind   nodeKind
	exec   bool
	size   int64
	off    int64  // content offset in the spool file
	target string // symlink target
}

type tarNodes map[string]*tarNode

func spoolTar(ctx context.Context, r io.Reader, spool *os.File, lim TreeLimits) (tarNodes, error) {
	in := &budgetReader{r: r, max: lim.rawTarBudget()}
	tr := tar.NewReader(in)
	nodes := tarNodes{}
	var entries, bytes, off int64
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, tarReadError(err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			if len(hdr.PAXRecords) == 1 && hdr.PAXRecords["comment"] != "" {
				continue
			}
			return nil, fmt.Errorf("pax global header: %w", ErrUnsupportedType)
		}
		entries++
		if entries > lim.MaxFiles {
			return nil, fmt.Errorf("more than %d entries: %w", lim.MaxFiles, ErrTooManyFiles)
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		if hdr.Typeflag == tar.TypeDir {
			name = strings.TrimSuffix(name, "/")
			if name == "" || name == "." {
				continue // the root itself
			}
		}
		if err := checkName(name, lim); err != nil {
			return nil, err
		}
		if nodes[name] != nil {
			return nil, fmt.Errorf("%q: %w", name, ErrDuplicate)
		}
		n := &tarNode{}
		switch hdr.Typeflag {
		case tar.TypeDir:
			n.kind = nodeDir
		case tar.TypeReg:
			if hdr.Size < 0 || hdr.Size > lim.MaxBytes-bytes {
				return nil, fmt.Errorf("%q claims %d bytes, %d left of %d: %w", name, hdr.Size, lim.MaxBytes-bytes, lim.MaxBytes, ErrTooLarge)
			}
			n.kind, n.exec, n.size, n.off = nodeFile, hdr.Mode&0o100 != 0, hdr.Size, off
			if _, err := io.CopyN(spoolWriter{spool}, tr, hdr.Size); err != nil {
				var werr spoolWriteErr
				if errors.As(err, &werr) {
					return nil, fmt.Errorf("ingest: spool: %w", werr.err)
				}
				return nil, tarReadError(err)
			}
			bytes += hdr.Size
			off += hdr.Size
		case tar.TypeSymlink:
			n.kind, n.target = nodeSymlink, hdr.Linkname
		default:
			return nil, typeError(name, hdr.Typeflag)
		}
		nodes[name] = n
	}
	return nodes, nil
}

// spoolWriter marks its errors so that a full disk is not reported as a
// malformed tar.
type spoolWriter struct{ f *os.File }

type spoolWriteErr struct{ err error }

func (e spoolWriteErr) Error() string { return e.err.Error() }

func (s spoolWriter) Write(p []byte) (int, error) {
	n, err := s.f.Write(p)
	if err != nil {
		return n, spoolWriteErr{err}
	}
	return n, nil
}

// entries checks the structure of the spooled tree (parents are
// directories, symlinks resolve inside it) and turns it into entries.
func (nodes tarNodes) entries(spool *os.File, lim TreeLimits) ([]entry, error) {
	names := make([]string, 0, len(nodes))
	for name := range nodes {
		names = append(names, name)
	}
	count := int64(len(names))
	for _, name := range names {
		for p := parent(name); p != ""; p = parent(p) {
			n := nodes[p]
			if n == nil {
				count++
				if count > lim.MaxFiles {
					return nil, fmt.Errorf("more than %d entries with implied directories: %w", lim.MaxFiles, ErrTooManyFiles)
				}
				nodes[p] = &tarNode{kind: nodeDir}
				continue
			}
			switch n.kind {
			case nodeDir:
				continue
			case nodeSymlink:
				return nil, fmt.Errorf("%q is inside symlink %q: %w", name, p, ErrSymlink)
			default:
				return nil, fmt.Errorf("%q is inside file %q: %w", name, p, ErrDuplicate)
			}
		}
	}
	lookup := func(name string) (nodeKind, string, error) {
		n := nodes[name]
		if n == nil {
			return nodeMissing, "", nil
		}
		return n.kind, n.target, nil
	}
	var bytes int64
	out := make([]entry, 0, len(nodes))
	for name, n := range nodes {
		src := n
		if n.kind == nodeSymlink {
			final, err := resolveSymlink(name, n.target, lookup)
			if err != nil {
				return nil, err
			}
			src = nodes[final]
		}
		if src.kind == nodeDir {
			out = append(out, entry{name: name, dir: true})
			continue
		}
		// A symlink's copy counts again: links must not multiply the bytes.
		if src.size > lim.MaxBytes-bytes {
			return nil, fmt.Errorf("%q: more than %d bytes with symlinks copied: %w", name, lim.MaxBytes, ErrTooLarge)
		}
		bytes += src.size
		section := io.NewSectionReader(spool, src.off, src.size)
		out = append(out, entry{name: name, exec: src.exec, size: src.size, content: func(w io.Writer) error {
			if _, err := io.Copy(w, section); err != nil {
				return fmt.Errorf("ingest: spool: %w", err)
			}
			return nil
		}})
	}
	return out, nil
}

// Ingest ingests the workspace at src (a directory, or a tar file) into st
// and returns the summary of its canonical tar, which st holds under
// Summary.Digest. A refused workspace leaves nothing in st. With a nil st
// the canonical tar is only hashed (a dry run with the same checks).
func Ingest(ctx context.Context, st *store.Store, src string, opt Options) (Summary, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return Summary{}, fmt.Errorf("workspace: %w", err)
	}
	switch {
	case fi.IsDir():
		return toStore(st, opt, func(w io.Writer) (Summary, error) {
			return writeDirRefusing(ctx, src, w, opt.limits(), opt.Refuse)
		})
	case fi.Mode().IsRegular():
		f, err := os.Open(src)
		if err != nil {
			return Summary{}, fmt.Errorf("workspace: %w", err)
		}
		defer f.Close()
		return IngestTar(ctx, st, f, opt)
	}
	return Summary{}, fmt.Errorf("workspace %s: not a directory or a tar file: %w", src, ErrUnsupportedType)
}

// IngestTar ingests a workspace given as a tar stream into st.
func IngestTar(ctx context.Context, st *store.Store, r io.Reader, opt Options) (Summary, error) {
	return toStore(st, opt, func(w io.Writer) (Summary, error) {
		return writeTarRefusing(ctx, r, w, opt.limits(), opt.Refuse)
	})
}

// toStore runs write into a new blob of st and commits it only if write
// succeeded and the content matches opt.Expect.
func toStore(st *store.Store, opt Options, write func(w io.Writer) (Summary, error)) (Summary, error) {
	if opt.Expect != "" && !sandbox.ValidDigest(opt.Expect) {
		return Summary{}, fmt.Errorf("claimed digest %q is malformed: %w", opt.Expect, ErrDigestMismatch)
	}
	counted := func(w io.Writer) io.Writer {
		if opt.Progress == nil {
			return w
		}
		if hw, ok := w.(hashingWriter); ok {
			return &hashedProgressWriter{progressWriter{w: w, report: opt.Progress}, hw}
		}
		return &progressWriter{w: w, report: opt.Progress}
	}
	if st == nil {
		sink := writeBehind(newHashOnly())
		defer sink.close()
		sum, err := write(counted(sink))
		if cerr := sink.close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			return Summary{}, err
		}
		if opt.Expect != "" && opt.Expect != sum.Digest {
			return Summary{}, fmt.Errorf("claimed %s, content is %s: %w", opt.Expect, sum.Digest, ErrDigestMismatch)
		}
		return sum, nil
	}
	bw, err := st.NewWriter(-1)
	if err != nil {
		return Summary{}, err
	}
	defer bw.Abort()
	// The store's writer hashes and writes on another goroutine than
	// the one reading the tree; it is done (close) before bw is aborted.
	sink := writeBehind(bw)
	defer sink.close() // before bw.Abort, even if write panics
	sum, err := write(counted(sink))
	if cerr := sink.close(); err == nil && cerr != nil {
		err = fmt.Errorf("store workspace: %w", cerr)
	}
	if err != nil {
		return Summary{}, err
	}
	if opt.Expect != "" && opt.Expect != sum.Digest {
		return Summary{}, fmt.Errorf("claimed %s, content is %s: %w", opt.Expect, sum.Digest, ErrDigestMismatch)
	}
	if _, _, err := bw.Commit(sum.Digest); err != nil {
		return Summary{}, fmt.Errorf("store workspace: %w", err)
	}
	return sum, nil
}

// progressWriter reports the bytes written through it.
type progressWriter struct {
	w      io.Writer
	n      int64
	report func(int64)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	p.report(p.n)
	return n, err
}

// hashedProgressWriter is a progressWriter around a hashingWriter.
type hashedProgressWriter struct {
	progressWriter
	hw hashingWriter
}

func (p *hashedProgressWriter) Digest() string { return p.hw.Digest() }
func (p *hashedProgressWriter) Size() int64    { return p.hw.Size() }
