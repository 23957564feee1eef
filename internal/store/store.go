package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Sentinel errors; each matches its class in the sandbox vocabulary.
var (
	// ErrNotFound is returned for a digest the store does not hold
	// (sandbox.ErrNotFound).
	ErrNotFound = sandbox.NewSentinel("blob not found", sandbox.ErrNotFound)
	// ErrDigestMismatch is returned when bytes do not match a claimed
	// digest (sandbox.ErrInvalid).
	ErrDigestMismatch = sandbox.NewSentinel("digest mismatch", sandbox.ErrInvalid)
	// ErrTooLarge is returned when a blob exceeds the size a writer
	// allowed (sandbox.ErrTooLarge).
	ErrTooLarge = sandbox.NewSentinel("blob too large", sandbox.ErrTooLarge)
)

var digestRE = regexp.MustCompile(`^sha256:([0-9a-f]{64})$`)

// Store is a directory of blobs: DIR/sha256/<hex>.
type Store struct {
	dir string
	tmp string
	// unnamed is set when the file system makes unnamed temp files
	// (O_TMPFILE) that can be linked into place: a blob being written then
	// has no directory entry until it is complete and synced, and nothing
	// is left behind by a crash.
	unnamed bool
	// refs are the blobs jobs need now and the writes under way (gc.go).
	refs refs
	mu   sync.Mutex
	// users is DIR/users once the store is shared (share.go).
	users string
	// packs are the packs read so far (pack.go).
	packs packs
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
	return &Store{dir: dir, tmp: tmp, unnamed: canLinkUnnamed(tmp)}, nil
}

// Dir returns the store's root directory.
func (s *Store) Dir() string { return s.dir }

// Path returns where the blob with digest d lives as a file of its own
// (whether or not it exists; a packed blob is not there: pack.go).
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
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return true
	}
	_, ok := s.findPacked(d)
	return ok
}

// File is an open blob: exactly its bytes, whether it is a file of its
// own or a member of a pack.
type File struct {
	*io.SectionReader
	f *os.File
}

// Close closes the file the blob is read from.
func (f *File) Close() error { return f.f.Close() }

// WriteTo copies the rest of the blob to w straight from its file, which
// lets the kernel copy it (sendfile) when w is a socket. A file cut short
// since it was opened is an io.ErrUnexpectedEOF, never a short copy.
func (f *File) WriteTo(w io.Writer) (int64, error) {
	pos, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, err
	}
	_, base, size := f.Outer()
	rest := size - pos
	if rest <= 0 {
		return 0, nil
	}
	if _, err := f.f.Seek(base+pos, io.SeekStart); err != nil {
		return 0, err
	}
	n, err := io.Copy(w, io.LimitReader(f.f, rest))
	f.Seek(pos+n, io.SeekStart)
	if err == nil && n < rest {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// Open opens the blob d for reading.
func (s *Store) Open(d string) (*File, error) {
	p, err := s.Path(d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err == nil {
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		return &File{io.NewSectionReader(f, 0, st.Size()), f}, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	// A pack swept (or changed) between the look-up and the open is
	// looked up again.
	for range 2 {
		l, ok := s.findPacked(d)
		if !ok {
			break
		}
		f, ok, err := s.openMember(l)
		if err != nil {
			return nil, err
		}
		if ok {
			return f, nil
		}
	}
	return nil, fmt.Errorf("blob %s: %w", d, ErrNotFound)
}

// Size returns the size of blob d.
func (s *Store) Size(d string) (int64, error) {
	p, err := s.Path(d)
	if err != nil {
		return 0, err
	}
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		if l, ok := s.findPacked(d); ok {
			return l.entry().size, nil
		}
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
	mem  *[]byte // the bytes so far, while they fit in memSize
	fd   int     // the temp file, once there is one; -1 before
	name string  // the temp file's path; "" while it is unnamed
	h    hash.Hash
	n    int64
	max  int64
	done bool
	// pk is the pack of a batch's member, written from start on (pack.go).
	pk    *packWriter
	start int64
}

// memSize bounds the blob a Writer keeps in memory rather than in a temp
// file. Creating a file is the dearest step for a small blob, and a blob
// the store already holds then never gets one.
const memSize = 64 << 10

// memBufs keeps the buffers of finished writers for the next ones: a
// sync.Pool is emptied by every garbage collection, and streaming many
// blobs collects often enough that most writers allocated a new one. It
// holds at most what one batch has in flight, a writer's buffer and one
// for holds per blob (about 4 MiB).
var memBufs = make(chan *[]byte, 2*batchWorkers+2)

// getBuf returns an empty buffer of memSize+1 bytes: one more than a
// writer keeps, so that holds can read past a stored copy's size.
func getBuf() *[]byte {
	select {
	case b := <-memBufs:
		return b
	default:
		b := make([]byte, 0, memSize+1)
		return &b
	}
}

func putBuf(b *[]byte) {
	*b = (*b)[:0]
	select {
	case memBufs <- b:
	default:
	}
}

// NewWriter starts a blob. Call Commit (or Batch.Add) to keep it or Abort
// to drop it.
func (s *Store) NewWriter(maxBytes int64) (*Writer, error) {
	return &Writer{s: s, fd: -1, h: sha256.New(), max: maxBytes}, nil
}

func (w *Writer) Write(p []byte) (int, error) {
	if w.done {
		return 0, errors.New("blob writer already finished")
	}
	if w.max >= 0 && w.n+int64(len(p)) > w.max {
		return 0, fmt.Errorf("more than %d bytes: %w", w.max, ErrTooLarge)
	}
	if w.pk != nil {
		if err := w.pk.write(p); err != nil {
			return 0, err
		}
		w.h.Write(p)
		w.n += int64(len(p))
		return len(p), nil
	}
	if w.fd < 0 && w.n+int64(len(p)) <= memSize {
		if w.mem == nil {
			w.mem = getBuf()
		}
		*w.mem = append(*w.mem, p...)
		w.h.Write(p)
		w.n += int64(len(p))
		return len(p), nil
	}
	if w.fd < 0 {
		if err := w.createTemp(); err != nil {
			return 0, err
		}
	}
	n, err := writeFull(w.fd, p)
	w.h.Write(p[:n])
	w.n += int64(n)
	if err != nil {
		return n, fmt.Errorf("blob store: write: %w", err)
	}
	return n, nil
}

// createTemp moves the writer's bytes from memory to a new temp file.
func (w *Writer) createTemp() error {
	var err error
	if w.fd, w.name, err = w.s.openTemp(); err != nil {
		return err
	}
	if w.mem != nil {
		_, err = writeFull(w.fd, *w.mem)
		w.freeMem()
		if err != nil {
			return fmt.Errorf("blob store: write: %w", err)
		}
	}
	return nil
}

func (w *Writer) freeMem() {
	if w.mem != nil {
		putBuf(w.mem)
		w.mem = nil
	}
}

// Size is the number of bytes written so far.
func (w *Writer) Size() int64 { return w.n }

// Digest is the digest of the bytes written so far.
func (w *Writer) Digest() string { return "sha256:" + hex.EncodeToString(w.h.Sum(nil)) }

// check finishes the writer's part: the content must be want, if given.
func (w *Writer) check(want string) (string, error) {
	if w.done {
		return "", errors.New("blob writer already finished")
	}
	d := w.Digest()
	if want != "" && want != d {
		w.Abort()
		return "", fmt.Errorf("claimed %s, content is %s: %w", want, d, ErrDigestMismatch)
	}
	w.done = true
	return d, nil
}

// Commit makes the blob durable and visible under its digest. If want is
// not empty and differs from the content's digest, nothing is kept.
func (w *Writer) Commit(want string) (string, int64, error) {
	if w.pk != nil {
		w.Abort()
		return "", 0, errors.New("a batch's blob is committed by the batch")
	}
	d, err := w.check(want)
	if err != nil {
		return "", 0, err
	}
	if err := w.settle(d); err != nil {
		return "", 0, err
	}
	if err := w.s.syncBlobDir(); err != nil {
		return "", 0, err
	}
	return d, w.n, nil
}

// settle makes the blob's bytes durable and puts them under d, then
// releases the temp file. The name is durable only once the blob
// directory is synced. A failure leaves nothing under d that is not a
// whole, synced blob.
func (w *Writer) settle(d string) (err error) {
	defer w.release()
	dst, _ := w.s.Path(d)
	// The store may already hold these bytes (a job that wrote the same
	// output again, a workspace ingested twice). A copy that hashes to d
	// and is synced is as good as this one, which then never has to reach
	// the disk; a copy that does not is replaced.
	// Under the sweep lock: a copy found here is touched before a sweep
	// can look at it, and is then newer than every hold (see Hold).
	w.s.refs.sweep.RLock()
	defer w.s.refs.sweep.RUnlock()
	if w.s.holds(dst, d, w.n, w.mem) {
		now := time.Now()
		os.Chtimes(dst, now, now)
		return nil
	}
	if w.fd < 0 {
		if err := w.createTemp(); err != nil {
			return err
		}
	}
	if err := sealTemp(w.fd); err != nil {
		return err
	}
	if w.name == "" {
		err := linkUnnamed(w.fd, dst)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("blob store: %w", &os.PathError{Op: "link", Path: dst, Err: err})
		}
		// Something appeared under d since holds looked; rename over it
		// like a named temp file would.
		if w.name, err = linkTemp(w.fd, w.s.tmp); err != nil {
			return fmt.Errorf("blob store: %w", &os.PathError{Op: "link", Path: w.s.tmp, Err: err})
		}
	}
	// Rename is atomic; a concurrent writer of the same content replaces an
	// identical file, which readers cannot tell apart.
	if err := os.Rename(w.name, dst); err != nil {
		return fmt.Errorf("blob store: %w", err)
	}
	w.name = ""
	return nil
}

// holds reports whether the file at dst is a regular file of size bytes
// that hashes to d (or equals mem, the bytes that hash to d, if given)
// and could be synced.
func (s *Store) holds(dst, d string, size int64, mem *[]byte) bool {
	fd, err := unix.Open(dst, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
		return false
	}
	var same bool
	if mem != nil {
		same = sameBytes(fdReader(fd), *mem)
	} else {
		h := sha256.New()
		buf := make([]byte, min(size+1, 256<<10))
		var total int64
		for {
			n, err := readFull(fd, buf)
			h.Write(buf[:n])
			total += int64(n)
			if err != nil {
				return false
			}
			if n < len(buf) {
				break
			}
		}
		same = total == size && "sha256:"+hex.EncodeToString(h.Sum(nil)) == d
	}
	return same && fsync(fd) == nil
}

// sameBytes reports whether r gives exactly want and then ends: the copy
// the store holds is compared with the bytes about to be stored (whose
// digest is known) rather than hashed.
func sameBytes(r io.Reader, want []byte) bool {
	buf := getBuf()
	defer putBuf(buf)
	// One byte more than is left, to see a copy that is longer.
	b := (*buf)[:cap(*buf)]
	for {
		n, err := io.ReadFull(r, b[:min(len(b), len(want)+1)])
		if n > len(want) || !bytes.Equal(b[:n], want[:n]) {
			return false
		}
		want = want[n:]
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return len(want) == 0
		case err != nil:
			return false
		}
	}
}

// fdReader is readFull of a descriptor as an io.Reader.
type fdReader int

func (r fdReader) Read(p []byte) (int, error) {
	n, err := readFull(int(r), p)
	if n == 0 && err == nil && len(p) > 0 {
		return 0, io.EOF
	}
	return n, err
}

// readFull reads into p until it is full or the file ends.
func readFull(fd int, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Read(fd, p[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

// release closes the temp file and removes its name, if it still has one.
func (w *Writer) release() {
	w.freeMem()
	dropTemp(&w.fd, &w.name)
}

// openTemp makes a temp file to write a blob (or a pack) in: unnamed
// where the file system has them, else named (name), which a crash
// leaves for CleanTemp. fd is -1 on error.
func (s *Store) openTemp() (fd int, name string, err error) {
	if s.unnamed {
		fd, err = unix.Open(s.tmp, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o400)
	} else {
		fd, name, err = createTemp(s.tmp)
	}
	if err != nil {
		return -1, "", fmt.Errorf("blob store: %w", &os.PathError{Op: "create temp", Path: s.tmp, Err: err})
	}
	return fd, name, nil
}

// sealTemp makes a written temp file read-only and durable, before it is
// put in place.
func sealTemp(fd int) error {
	if err := unix.Fchmod(fd, 0o400); err != nil {
		return fmt.Errorf("blob store: chmod: %w", err)
	}
	if err := fsync(fd); err != nil {
		return fmt.Errorf("blob store: sync: %w", err)
	}
	return nil
}

// dropTemp closes a temp file and removes its name, if it still has one.
func dropTemp(fd *int, name *string) {
	if *fd >= 0 {
		unix.Close(*fd)
		*fd = -1
	}
	if *name != "" {
		os.Remove(*name)
		*name = ""
	}
}

// Abort drops an unfinished blob. It is safe to call after Commit.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	if w.pk != nil {
		if w.pk.open && w.start == w.pk.indexed {
			w.pk.truncate(w.start)
		}
		return
	}
	w.release()
}

// Verify re-hashes a blob and fails with ErrDigestMismatch unless its
// content still hashes to its name.
func (s *Store) Verify(d string) error {
	got, err := s.ContentDigest(d)
	if err != nil {
		return err
	}
	if got != d {
		return fmt.Errorf("blob %s holds %s: %w", d, got, ErrDigestMismatch)
	}
	return nil
}

// ContentDigest re-hashes the blob named d and returns the digest of what
// it holds now, which differs from d when the file was changed.
func (s *Store) ContentDigest(d string) (string, error) {
	f, err := s.Open(d)
	if err != nil {
		return "", err
	}
	defer f.Close()
	got, _, err := hashOf(f)
	return got, err
}

// hashOf hashes what r holds: its digest and its size.
func hashOf(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return "", n, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}

// syncBlobDir makes the names of the blobs put into place durable.
func (s *Store) syncBlobDir() error {
	if err := syncDir(filepath.Join(s.dir, "sha256")); err != nil {
		return fmt.Errorf("blob store: sync directory: %w", err)
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

// fsync is a variable so that tests can make it fail.
var fsync = func(fd int) error {
	for {
		err := unix.Fsync(fd)
		if err != unix.EINTR {
			return err
		}
	}
}

func writeFull(fd int, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Write(fd, p[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}

// createTemp creates a new, named temp file in dir.
func createTemp(dir string) (int, string, error) {
	for range 10000 {
		name := filepath.Join(dir, "blob-"+strconv.FormatUint(rand.Uint64(), 36))
		fd, err := unix.Open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == unix.EEXIST {
			continue
		}
		return fd, name, err
	}
	return -1, "", unix.EEXIST
}

// linkUnnamed gives the unnamed file fd the name dst; it fails with
// EEXIST if dst exists. linkat with AT_EMPTY_PATH would need
// CAP_DAC_READ_SEARCH; the descriptor's /proc link does not.
func linkUnnamed(fd int, dst string) error {
	return unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, dst, unix.AT_SYMLINK_FOLLOW)
}

// linkTemp gives the unnamed file fd a new temp name in dir.
func linkTemp(fd int, dir string) (string, error) {
	for range 10000 {
		name := filepath.Join(dir, "blob-"+strconv.FormatUint(rand.Uint64(), 36))
		err := linkUnnamed(fd, name)
		if err == unix.EEXIST {
			continue
		}
		return name, err
	}
	return "", unix.EEXIST
}

// canLinkUnnamed reports whether unnamed temp files in dir can be linked
// into place (the file system supports O_TMPFILE and /proc is mounted).
func canLinkUnnamed(dir string) bool {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o400)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	name, err := linkTemp(fd, dir)
	if err != nil {
		return false
	}
	os.Remove(name)
	return true
}

// batchWorkers bounds the blobs a Batch syncs at once: the file system
// groups concurrent syncs into one journal commit.
const batchWorkers = 32

// Batch puts many blobs into the store with one sync of the blob
// directory for all of them instead of one per blob. Each blob added is
// synced and put under its digest in the background while the caller
// writes the next; Commit waits for all of them and makes their names
// durable. A blob may be visible before Commit returns, but only ever
// whole and synced; it is durable when Commit returns nil.
//
// Add and Commit are called from one goroutine.
type Batch struct {
	s      *Store
	pack   *packWriter // once more than packAfter writers were handed out
	given  int
	sem    chan struct{}
	wg     sync.WaitGroup
	added  int
	closed bool
	mu     sync.Mutex
	err    error
}

// NewBatch starts a batch. Call Commit when every blob has been added.
func (s *Store) NewBatch() *Batch {
	return &Batch{s: s, sem: make(chan struct{}, batchWorkers)}
}

// NewWriter starts the batch's next blob: a Writer of the store while
// the batch has handed out at most packAfter, then a member of the
// batch's pack (pack.go). A member is written and added (or aborted)
// before the next writer is asked for; it is only ever added to this
// batch, and never committed on its own.
func (b *Batch) NewWriter(maxBytes int64) (*Writer, error) {
	if b.closed {
		return nil, errors.New("blob batch already committed")
	}
	b.given++
	if b.given <= packAfter {
		return b.s.NewWriter(maxBytes)
	}
	if b.pack == nil {
		pw, err := b.s.newPackWriter()
		if err != nil {
			return nil, err
		}
		b.pack = pw
	}
	start, err := b.pack.begin()
	if err != nil {
		return nil, err
	}
	return &Writer{s: b.s, fd: -1, h: sha256.New(), max: maxBytes, pk: b.pack, start: start}, nil
}

// Add finishes w, checked against want as Commit does, and hands it to
// the batch. It returns the blob's digest and size. An error from an
// earlier blob of the batch is returned here as soon as it is known, and
// w is then dropped.
func (b *Batch) Add(w *Writer, want string) (string, int64, error) {
	if b.closed {
		w.Abort()
		return "", 0, errors.New("blob batch already committed")
	}
	if err := b.failed(); err != nil {
		w.Abort()
		return "", 0, err
	}
	if w.pk != nil && w.pk != b.pack {
		w.Abort()
		return "", 0, errors.New("blob store: a blob of another batch")
	}
	d, err := w.check(want)
	if err != nil {
		return "", 0, err
	}
	if w.pk != nil {
		if err := b.pack.add(w, d); err != nil {
			return "", 0, err
		}
		return d, w.n, nil
	}
	b.sem <- struct{}{}
	b.wg.Add(1)
	b.added++
	go func() {
		defer b.wg.Done()
		defer func() { <-b.sem }()
		if err := w.settle(d); err != nil {
			b.mu.Lock()
			if b.err == nil {
				b.err = fmt.Errorf("blob %s: %w", d, err)
			}
			b.mu.Unlock()
		}
	}()
	return d, w.n, nil
}

func (b *Batch) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// Commit waits for every blob added and makes their names durable with
// one sync of the blob directory. It returns the first failure; the blobs
// that did not fail are whole and in place either way.
func (b *Batch) Commit() error {
	if b.closed {
		return errors.New("blob batch already committed")
	}
	b.closed = true
	var perr error
	if b.pack != nil {
		perr = b.pack.commit()
	}
	b.wg.Wait()
	if b.added == 0 {
		return perr
	}
	// Synced even after a failure: the blobs that made it are whole.
	serr := b.s.syncBlobDir()
	if err := b.failed(); err != nil {
		return err
	}
	return errors.Join(perr, serr)
}
