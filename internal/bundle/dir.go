package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// testHookOpened, if set, runs after a file's content is opened and before
// it is read; tests use it to change files mid-read.
var testHookOpened func(name string)

// fileID is what identifies a file's state: it must be the same when the
// tree is listed, when the file is opened, after it is read and at its path
// afterwards, or the file changed while it was being read.
//
// Every field is the kernel's own (stat(2)), so that an identity taken from
// an fs.FileInfo and one from a stat of a descriptor compare exactly.
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
	mode         uint32 // type and permission bits
}

func idOf(fi fs.FileInfo) fileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		// Never on Linux; an identity that matches nothing fails closed.
		return fileID{size: -1}
	}
	return fileID{
		dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		mtime: unix.Timespec(st.Mtim), ctime: unix.Timespec(st.Ctim), mode: st.Mode,
	}
}

func idOfStat(st *unix.Stat_t) fileID {
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino), size: st.Size, mtime: st.Mtim, ctime: st.Ctim, mode: uint32(st.Mode)}
}

// dirScan is the first pass over a directory: it lists and checks every
// entry and decides what to write, without reading any content.
type dirScan struct {
	ctx     context.Context
	root    *os.Root
	lim     TreeLimits
	skip    map[string]bool
	entries []entry
	dirs    map[string]fileID // every directory listed, to re-check after writing
	handles *dirHandles       // the entries read their files through it
	count   int64
	bytes   int64
}

// scanDir lists the tree at dir under the reader rules. skip names
// top-level entries left out (bundle.json of a bundle). The returned
// entries read their content lazily, re-checking each file as they do;
// recheck must be called after they were written.
func scanDir(ctx context.Context, dir string, lim TreeLimits, skip ...string) (entries []entry, recheck func() error, closeRoot func(), err error) {
	if err := lim.Validate(); err != nil {
		return nil, nil, nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("open tree: %w", err)
	}
	s := &dirScan{ctx: ctx, root: root, lim: lim, skip: map[string]bool{}, dirs: map[string]fileID{}}
	s.handles = &dirHandles{root: root, listed: s.dirs}
	for _, n := range skip {
		s.skip[n] = true
	}
	if err := s.walk(""); err != nil {
		root.Close()
		return nil, nil, nil, err
	}
	recheck = func() error {
		for name, id := range s.dirs {
			fi, err := root.Lstat(dirOrDot(name))
			if err != nil || !sameState(id, idOf(fi)) {
				return fmt.Errorf("directory %q: %w", dirOrDot(name), ErrChanged)
			}
		}
		return nil
	}
	return s.entries, recheck, func() { s.handles.close(); root.Close() }, nil
}

func dirOrDot(name string) string {
	if name == "" {
		return "."
	}
	return name
}

func (s *dirScan) walk(dir string) error {
	fi, err := s.root.Lstat(dirOrDot(dir))
	if err != nil {
		return fmt.Errorf("list %q: %w", dirOrDot(dir), err)
	}
	f, err := s.root.Open(dirOrDot(dir))
	if err != nil {
		return fmt.Errorf("list %q: %w", dirOrDot(dir), err)
	}
	defer f.Close()
	ofi, err := f.Stat()
	if err != nil || !fi.IsDir() || !sameFile(idOf(fi), idOf(ofi)) {
		return fmt.Errorf("directory %q: %w", dirOrDot(dir), ErrChanged)
	}
	s.dirs[dir] = idOf(fi)
	for {
		if err := s.ctx.Err(); err != nil {
			return err
		}
		batch, err := f.ReadDir(256)
		for _, de := range batch {
			name := path.Join(dir, de.Name())
			if dir == "" && s.skip[name] {
				continue
			}
			if err := s.add(name); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %q: %w", dirOrDot(dir), err)
		}
	}
}

// add checks one listed name and records it; directories are walked.
func (s *dirScan) add(name string) error {
	s.count++
	if s.count > s.lim.MaxFiles {
		return fmt.Errorf("more than %d entries: %w", s.lim.MaxFiles, ErrTooManyFiles)
	}
	if err := checkName(name, s.lim); err != nil {
		return err
	}
	fi, err := s.root.Lstat(name)
	if err != nil {
		return fmt.Errorf("%q: %w: %w", name, ErrChanged, err)
	}
	mode := fi.Mode()
	switch {
	case mode.IsDir():
		s.entries = append(s.entries, entry{name: name, dir: true})
		return s.walk(name)
	case mode.IsRegular():
		return s.addFile(name, name, fi)
	case mode&fs.ModeSymlink != 0:
		target, err := s.root.Readlink(name)
		if err != nil {
			return fmt.Errorf("%q: %w: %w", name, ErrChanged, err)
		}
		final, err := resolveSymlink(name, target, s.lookup)
		if err != nil {
			return err
		}
		tfi, err := s.root.Lstat(final)
		if err != nil || !tfi.Mode().IsRegular() {
			return fmt.Errorf("%q -> %q: %w", name, final, ErrChanged)
		}
		return s.addFile(name, final, tfi)
	case mode&fs.ModeDevice != 0:
		return fmt.Errorf("%q: %w", name, ErrDevice)
	case mode&fs.ModeNamedPipe != 0:
		return fmt.Errorf("%q: %w", name, ErrFIFO)
	default:
		return fmt.Errorf("%q: %v: %w", name, mode.Type(), ErrUnsupportedType)
	}
}

func (s *dirScan) lookup(name string) (nodeKind, string, error) {
	if err := checkName(name, s.lim); err != nil {
		return 0, "", err
	}
	fi, err := s.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nodeMissing, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("%q: %w", name, err)
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		return nodeDir, "", nil
	case m.IsRegular():
		return nodeFile, "", nil
	case m&fs.ModeSymlink != 0:
		t, err := s.root.Readlink(name)
		if err != nil {
			return 0, "", fmt.Errorf("%q: %w", name, err)
		}
		return nodeSymlink, t, nil
	}
	return nodeOther, "", nil
}

// addFile records name as a regular file whose content is read from src
// (src differs from name for a symlink kept as a copy).
func (s *dirScan) addFile(name, src string, fi fs.FileInfo) error {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
		return fmt.Errorf("%q has %d links: %w", src, st.Nlink, ErrHardLink)
	}
	if fi.Size() > s.lim.MaxBytes-s.bytes {
		return fmt.Errorf("%q is %d bytes, %d left of %d: %w", name, fi.Size(), s.lim.MaxBytes-s.bytes, s.lim.MaxBytes, ErrTooLarge)
	}
	s.bytes += fi.Size()
	id := idOf(fi)
	h := s.handles
	s.entries = append(s.entries, entry{
		name: name,
		exec: fi.Mode()&0o100 != 0,
		size: fi.Size(),
		content: func(w io.Writer) error {
			return h.copyChecked(src, id, w)
		},
	})
	return nil
}

// dirHandles opens the files of a tree relative to their directory, kept
// open while the files of that directory are read (the canonical order
// keeps them together), rather than walking every file's whole path again
// for its open and for its check after reading (two walks of os.Root, each
// an open and a close per path component, for every file). A directory is
// opened through the root (never outside it, whatever its path's links)
// and must be the one listed (device and inode); its later state is the
// tree's recheck.
type dirHandles struct {
	mu     sync.Mutex // one file at a time: the entries share the open directory
	root   *os.Root
	listed map[string]fileID // the directories as listed; nil: not checked
	name   string            // the directory open in f
	f      *os.File
	buf    []byte // files are read through it
}

// dir returns a descriptor of the directory dir ("" is the root).
func (h *dirHandles) dir(dir string) (int, error) {
	if h.f != nil && h.name == dir {
		return int(h.f.Fd()), nil
	}
	h.close()
	f, err := h.root.Open(dirOrDot(dir))
	if err != nil {
		return -1, fmt.Errorf("directory %q: %w: %w", dirOrDot(dir), ErrChanged, err)
	}
	fi, err := f.Stat()
	want, listed := h.listed[dir]
	if err != nil || !fi.IsDir() || (h.listed != nil && (!listed || !sameFile(want, idOf(fi)))) {
		f.Close()
		return -1, fmt.Errorf("directory %q: %w", dirOrDot(dir), ErrChanged)
	}
	h.f, h.name = f, dir
	return int(f.Fd()), nil
}

func (h *dirHandles) close() {
	if h.f != nil {
		h.f.Close()
		h.f = nil
	}
}

// copyChecked copies the file at name (a path in the tree), which was
// listed as id, refusing it if it is not that same file, unchanged,
// before, during and after reading.
func (h *dirHandles) copyChecked(name string, id fileID, w io.Writer) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	dirfd, err := h.dir(path.Dir("/" + name)[1:])
	if err != nil {
		return err
	}
	base := path.Base(name)
	// O_NONBLOCK: should a FIFO have replaced the file, opening must not
	// hang. O_NOFOLLOW: the last component is never followed; the
	// directory is the listed one.
	fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%q: %w: %w", name, ErrChanged, err)
	}
	// The descriptor is used as it is (no os.File: that would ask the
	// kernel three more times per file whether it can be polled).
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || !sameState(id, idOfStat(&st)) {
		return fmt.Errorf("%q differs from when it was listed: %w", name, ErrChanged)
	}
	if testHookOpened != nil {
		testHookOpened(name)
	}
	if want := int(min(id.size+1, 256<<10)); len(h.buf) < want {
		h.buf = make([]byte, want)
	}
	for left := id.size; left > 0; {
		n, err := readFd(fd, h.buf[:min(left, int64(len(h.buf)))])
		if err != nil {
			return fmt.Errorf("%q: %w", name, err)
		}
		if n == 0 {
			return fmt.Errorf("%q shrank to %d bytes while read: %w", name, id.size-left, ErrChanged)
		}
		if _, err := w.Write(h.buf[:n]); err != nil {
			return fmt.Errorf("%q: %w", name, err)
		}
		left -= int64(n)
	}
	if m, _ := readFd(fd, h.buf[:1]); m > 0 {
		return fmt.Errorf("%q grew while read: %w", name, ErrChanged)
	}
	if err := unix.Fstat(fd, &st); err != nil || !sameState(id, idOfStat(&st)) {
		return fmt.Errorf("%q was modified while read: %w", name, ErrChanged)
	}
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || !sameState(id, idOfStat(&st)) {
		return fmt.Errorf("%q was replaced while read: %w", name, ErrChanged)
	}
	return nil
}

// copyChecked is dirHandles.copyChecked of one file of root.
func copyChecked(root *os.Root, name string, id fileID, w io.Writer) error {
	h := &dirHandles{root: root}
	defer h.close()
	return h.copyChecked(name, id, w)
}

// readFd is read(2) of fd into p, tried again when interrupted.
func readFd(fd int, p []byte) (int, error) {
	for {
		n, err := unix.Read(fd, p)
		if err == unix.EINTR {
			continue
		}
		return max(n, 0), err
	}
}

func sameFile(a, b fileID) bool { return a.dev == b.dev && a.ino == b.ino }

func sameState(a, b fileID) bool { return a == b }
