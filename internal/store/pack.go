package store

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A pack is one file holding many blobs end to end. A Batch that has
// taken more than packAfter blobs writes the rest into one pack: an
// output tree of 5,000 small files then costs one file creation and one
// sync instead of 5,000 of each. On this project's machines (ext4)
// creating 5,000 files of 20 KiB took 1.6–2.3 s before any sync, and
// syncing each 5.2–7.9 s, while one file of the same 100 MiB, written and
// synced, took 0.21 s.
//
// Every member stays a blob of its own: Has, Open, Size, Verify, Touch,
// Keep, Pin and leases take its digest, and Open reads exactly its bytes.
// A member the store already holds (a file of its own or in a pack), and
// checks, is not written again: that copy is marked used instead, as
// Writer.settle does. A pack is swept as a whole, only when none of its
// members is referenced, pinned or used too recently; a sweep copies a
// leased member out to a file of its own first (copyOutLeased), so that a
// lease never keeps more than the bytes it names.
//
// The file, DIR/packs/<hex>, is
//
//	member bytes, end to end | index | count (8 bytes) | packMagic (8 bytes)
//
// where the index is count entries of a member's SHA-256 (32 bytes) and
// size (8 bytes, big-endian), in the order of the bytes. Its name is the
// SHA-256 of the index, which names every member's content: the same
// members in the same order make the same pack. A file whose layout or
// name does not check is not a pack of this store: it is never read as
// one and never removed.
//
// Memory: the store keeps every member's digest, pack and place (about
// 120 bytes a member) once it has looked for a blob that is not a file
// of its own. A look-up that misses lists DIR/packs again only when it
// changed (its times, with a second of margin for coarse ones): a store on
// a local file system (ext4, xfs), not one whose times are cached (NFS).

const (
	// packAfter is the number of loose blobs a Batch writes before it
	// packs the rest: a job's few outputs (a report, logs) stay loose.
	packAfter = 32
	packMagic = "sbdpack1"
	packEntry = sha256.Size + 8
	packTail  = 16
	// maxPackMembers bounds the members of a pack (its index is then at
	// most 40 MiB); a job's outputs are bounded far below it by
	// sandbox.MaxFileCount.
	maxPackMembers = 1 << 20
)

// entry is one member of a pack: its SHA-256, where its bytes begin and
// how many there are.
type entry struct {
	key       [sha256.Size]byte
	off, size int64
}

// pack is one pack file whose index the store has read.
type pack struct {
	name    string // its file name, the hex of its index's digest
	size    int64  // of the whole file
	members []entry
}

// located is where a packed blob is: member i of pack p.
type located struct {
	p *pack
	i int
}

func (l located) entry() entry { return l.p.members[l.i] }

// stamp is what tells a file or directory changed: inode, size and
// times.
type stamp struct {
	ino          uint64
	size         int64
	mtime, ctime int64
}

func stampOf(st *unix.Stat_t) stamp {
	return stamp{ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
}

// packs is the store's view of DIR/packs: every pack read so far and
// where each member is.
type packs struct {
	mu    sync.Mutex
	known map[string]*pack
	where map[[sha256.Size]byte]located
	// dups counts, for a member more than one known pack holds, the
	// copies besides the one in where.
	dups map[[sha256.Size]byte]int
	// rejected are the files found not to be packs, as they were then:
	// read again only once they changed.
	rejected map[string]stamp
	// scanned is DIR/packs as it was when last listed, at scannedAt: a
	// look-up that misses lists it again only if it changed since, or if
	// it was listed within a second of its last change (file times are
	// coarse: a change in the same tick leaves them as they were).
	scanned   stamp
	scannedAt time.Time

	dirMu sync.Mutex
	// dirDurable is set once DIR/packs is there and DIR was synced since:
	// the directory's own entry is durable.
	dirDurable bool
}

func (s *Store) packDir() string { return filepath.Join(s.dir, "packs") }

func (s *Store) packPath(name string) string { return filepath.Join(s.packDir(), name) }

// digestKey is the SHA-256 of a well-formed digest.
func digestKey(d string) ([sha256.Size]byte, bool) {
	var k [sha256.Size]byte
	m := digestRE.FindStringSubmatch(d)
	if m == nil {
		return k, false
	}
	_, err := hex.Decode(k[:], []byte(m[1]))
	return k, err == nil
}

func keyDigest(k [sha256.Size]byte) string { return "sha256:" + hex.EncodeToString(k[:]) }

// findPacked returns where the packed blob d is, in a pack file that is
// there now. When it does not know d it reads the packs it has not seen
// (written since, by this process or another) if DIR/packs changed, and
// forgets the packs that are gone.
func (s *Store) findPacked(d string) (located, bool) {
	k, ok := digestKey(d)
	if !ok {
		return located{}, false
	}
	pk := &s.packs
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if l, ok := pk.where[k]; ok {
		if st, err := os.Lstat(s.packPath(l.p.name)); err == nil && st.Mode().IsRegular() && st.Size() == l.p.size {
			return l, true
		}
		s.dropPackLocked(l.p)
		pk.scanned = stamp{}
	}
	s.scanPacksLocked(false)
	l, ok := pk.where[k]
	return l, ok
}

// forgetPack drops p, a pack whose file is gone or no longer what was
// read: the next look-up reads DIR/packs again.
func (s *Store) forgetPack(p *pack) {
	pk := &s.packs
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.known[p.name] == p {
		s.dropPackLocked(p)
	}
	pk.scanned = stamp{}
}

// knownPacks reads the packs not seen yet, forgets those that are gone,
// and returns the rest.
func (s *Store) knownPacks() []*pack {
	pk := &s.packs
	pk.mu.Lock()
	defer pk.mu.Unlock()
	s.scanPacksLocked(true)
	out := make([]*pack, 0, len(pk.known))
	for _, p := range pk.known {
		out = append(out, p)
	}
	return out
}

// scanPacksLocked reads the index of every pack not known yet and forgets
// the packs that are gone; unless all, only if DIR/packs changed since it
// was last listed. The caller holds packs.mu.
func (s *Store) scanPacksLocked(all bool) {
	pk := &s.packs
	var dst unix.Stat_t
	if err := unix.Lstat(s.packDir(), &dst); err != nil {
		if errors.Is(err, unix.ENOENT) {
			for _, p := range pk.known {
				s.dropPackLocked(p)
			}
		}
		return
	}
	now := stampOf(&dst)
	if !all && now == pk.scanned && pk.scannedAt.Sub(time.Unix(0, max(now.mtime, now.ctime))) > time.Second {
		return
	}
	at := time.Now()
	ents, err := os.ReadDir(s.packDir())
	if err != nil {
		return // nothing can be known: forget nothing
	}
	seen := make(map[string]bool, len(ents))
	for _, e := range ents {
		name := e.Name()
		seen[name] = true
		if _, ok := pk.known[name]; ok {
			continue
		}
		var st unix.Stat_t
		if unix.Lstat(s.packPath(name), &st) != nil {
			continue
		}
		if was, ok := pk.rejected[name]; ok && was == stampOf(&st) {
			continue
		}
		var p *pack
		err := errNotAPack
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			p, err = readPack(s.packPath(name), name)
		}
		if errors.Is(err, errNotAPack) {
			// Remembered until it changes; an error reading it (too many
			// open files, I/O) is not: the next scan reads it again.
			if pk.rejected == nil {
				pk.rejected = map[string]stamp{}
			}
			pk.rejected[name] = stampOf(&st)
			continue
		}
		if err != nil {
			pk.scanned = stamp{}
			continue
		}
		s.addPackLocked(p, false)
	}
	for name, p := range pk.known {
		if !seen[name] {
			s.dropPackLocked(p)
		}
	}
	for name := range pk.rejected {
		if !seen[name] {
			delete(pk.rejected, name)
		}
	}
	pk.scanned, pk.scannedAt = now, at
}

// addPackLocked puts p's members in the map: in place of any other copy
// if newest (a pack just written, holding members the store had no sound
// copy of), else only where no other pack holds them. A member held by
// more than one pack is counted in dups.
func (s *Store) addPackLocked(p *pack, newest bool) {
	pk := &s.packs
	if pk.known == nil {
		pk.known = map[string]*pack{}
		pk.where = map[[sha256.Size]byte]located{}
		pk.dups = map[[sha256.Size]byte]int{}
	}
	if old, ok := pk.known[p.name]; ok {
		if old == p {
			return
		}
		s.dropPackLocked(old)
	}
	pk.known[p.name] = p
	for i, e := range p.members {
		_, ok := pk.where[e.key]
		if ok {
			pk.dups[e.key]++
		}
		if newest || !ok {
			pk.where[e.key] = located{p: p, i: i}
		}
	}
}

// dropPackLocked forgets p; its members that another known pack holds
// are found there. Only those are looked for in the other packs: a drop
// costs p's members, not the store's.
func (s *Store) dropPackLocked(p *pack) {
	pk := &s.packs
	if pk.known[p.name] != p {
		return // forgotten already
	}
	delete(pk.known, p.name)
	var lost map[[sha256.Size]byte]bool
	for _, e := range p.members {
		l, ok := pk.where[e.key]
		if !ok {
			continue
		}
		held := pk.dups[e.key] > 0
		if held {
			if pk.dups[e.key]--; pk.dups[e.key] == 0 {
				delete(pk.dups, e.key)
			}
		}
		if l.p != p {
			continue
		}
		delete(pk.where, e.key)
		if held {
			if lost == nil {
				lost = map[[sha256.Size]byte]bool{}
			}
			lost[e.key] = true
		}
	}
	if len(lost) == 0 {
		return
	}
	for _, q := range pk.known {
		for i, e := range q.members {
			if lost[e.key] {
				if _, ok := pk.where[e.key]; !ok {
					pk.where[e.key] = located{p: q, i: i}
				}
			}
		}
	}
}

// errNotAPack is a file in DIR/packs whose layout or name does not check.
var errNotAPack = errors.New("not a pack")

// openPack opens the pack file at path for reading, never through a
// symlink and never blocking on what is not a regular file.
func openPack(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
}

// readPack reads and checks the pack file at path, whose file name is
// name: its tail, its index (hashed before anything is made of it) and
// the sizes, which must add up to the bytes before the index.
func readPack(path, name string) (*pack, error) {
	f, err := openPack(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() < packTail {
		return nil, fmt.Errorf("not a regular file ending in the magic: %w", errNotAPack)
	}
	var tail [packTail]byte
	if _, err := f.ReadAt(tail[:], st.Size()-packTail); err != nil {
		return nil, err
	}
	if string(tail[8:]) != packMagic {
		return nil, fmt.Errorf("not a regular file ending in the magic: %w", errNotAPack)
	}
	count := binary.BigEndian.Uint64(tail[:8])
	if count == 0 || count > maxPackMembers || int64(count)*packEntry > st.Size()-packTail {
		return nil, fmt.Errorf("bad index: %w", errNotAPack)
	}
	indexLen := int64(count) * packEntry
	indexAt := st.Size() - packTail - indexLen
	h := sha256.New()
	if n, err := io.Copy(h, io.NewSectionReader(f, indexAt, indexLen)); err != nil || n != indexLen {
		return nil, fmt.Errorf("read pack index: %v", err)
	}
	if hex.EncodeToString(h.Sum(nil)) != name {
		return nil, fmt.Errorf("the name is not its index's digest: %w", errNotAPack)
	}
	r := bufio.NewReaderSize(io.NewSectionReader(f, indexAt, indexLen), 1<<20)
	p := &pack{name: name, size: st.Size(), members: make([]entry, count)}
	var e [packEntry]byte
	var off int64
	for i := range p.members {
		if _, err := io.ReadFull(r, e[:]); err != nil {
			return nil, fmt.Errorf("read pack index: %w", err)
		}
		copy(p.members[i].key[:], e[:sha256.Size])
		n := binary.BigEndian.Uint64(e[sha256.Size:])
		if n > uint64(indexAt-off) {
			return nil, fmt.Errorf("bad index: %w", errNotAPack)
		}
		p.members[i].off, p.members[i].size = off, int64(n)
		off += int64(n)
	}
	if off != indexAt {
		return nil, fmt.Errorf("bad index: %w", errNotAPack)
	}
	// The index read twice must be the one hashed.
	h.Reset()
	for _, m := range p.members {
		h.Write(m.key[:])
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(m.size)))
	}
	if hex.EncodeToString(h.Sum(nil)) != name {
		return nil, errors.New("pack index changed while read")
	}
	return p, nil
}

// openMember opens the packed blob l, checking that its pack file is
// still the one read: a pack removed, replaced or cut short since is
// forgotten, and (false) the caller looks again.
func (s *Store) openMember(l located) (*File, bool, error) {
	f, err := openPack(s.packPath(l.p.name))
	if errors.Is(err, fs.ErrNotExist) {
		s.forgetPack(l.p)
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, err
	}
	if !st.Mode().IsRegular() || st.Size() != l.p.size {
		f.Close()
		s.forgetPack(l.p)
		return nil, false, nil
	}
	e := l.entry()
	return &File{io.NewSectionReader(f, e.off, e.size), f}, true, nil
}

// hasLoose reports whether d is a file of its own.
func (s *Store) hasLoose(d string) bool {
	p, err := s.Path(d)
	if err != nil {
		return false
	}
	st, err := os.Lstat(p)
	return err == nil && st.Mode().IsRegular()
}

// keepCopy reports whether the store holds a copy of d (size bytes) that
// hashes to d, and marks it used now; in is the pack that holds it ("" for
// a file of its own). mine, if not nil, are the bytes about to be stored
// (which hash to d): a copy is then compared with them rather than hashed.
// A file of its own that does not hold d is removed: the copy about to be
// written is then the one read. The caller holds the sweep lock for
// reading, so that no sweep removes the copy before it is marked.
func (s *Store) keepCopy(d string, size int64, mine []byte) (held bool, in string) {
	var mem *[]byte
	if mine != nil {
		mem = &mine
	}
	if p, err := s.Path(d); err == nil {
		if s.holds(p, d, size, mem) {
			now := time.Now()
			return os.Chtimes(p, now, now) == nil, ""
		}
		// Removed only once it is known not to hold d: an error reading
		// it (too many open files, I/O) says nothing of its bytes.
		if got, err := looseDigest(p); err == nil && got != d {
			os.Remove(p)
		}
	}
	for range 2 {
		l, ok := s.findPacked(d)
		if !ok || l.entry().size != size {
			return false, ""
		}
		f, ok, err := s.openMember(l)
		if err != nil {
			return false, ""
		}
		if !ok {
			continue
		}
		var same bool
		if mine != nil {
			same = sameBytes(f, mine)
		} else {
			got, n, err := hashOf(f)
			same = err == nil && n == size && got == d
		}
		f.Close()
		if !same {
			return false, ""
		}
		now := time.Now()
		return os.Chtimes(s.packPath(l.p.name), now, now) == nil, l.p.name
	}
	return false, ""
}

// looseDigest hashes the regular file at p (never through a symlink).
func looseDigest(p string) (string, error) {
	f, err := openPack(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return "", errors.New("not a regular file")
	}
	got, _, err := hashOf(f)
	return got, err
}

// ensurePackDir makes DIR/packs and makes its entry durable, once per
// Store: DIR is synced even when the directory was there, since the
// process that made it may have died before it synced DIR.
func (s *Store) ensurePackDir() error {
	pk := &s.packs
	pk.dirMu.Lock()
	defer pk.dirMu.Unlock()
	if pk.dirDurable {
		return nil
	}
	if err := os.Mkdir(s.packDir(), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("blob store: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("blob store: sync directory: %w", err)
	}
	pk.dirDurable = true
	return nil
}

// verifyPack reports whether the pack file at path is p's layout and
// every member hashes to its digest.
func verifyPack(path string, p *pack) bool {
	f, err := openPack(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() || st.Size() != p.size {
		return false
	}
	r := bufio.NewReaderSize(f, 1<<20)
	h := sha256.New()
	var sum [sha256.Size]byte
	for _, e := range p.members {
		h.Reset()
		if n, err := io.CopyN(h, r, e.size); err != nil || n != e.size {
			return false
		}
		if h.Sum(sum[:0]); sum != e.key {
			return false
		}
	}
	return true
}

// errPackClosed is returned for a write to a pack whose batch committed.
var errPackClosed = errors.New("blob store: the batch's pack is already committed")

// packWriter is the pack a Batch writes its members into: a temp file
// (unnamed where the file system has them), written at off. One member
// is written at a time: it begins where the members added so far end.
type packWriter struct {
	s       *Store
	fd      int
	name    string // the temp file's path; "" while it is unnamed
	buf     []byte // bytes not yet written at off
	off     int64  // where buf goes
	index   []byte
	indexed int64 // the bytes of the members added
	open    bool  // a member is being written
	keys    map[[sha256.Size]byte]bool
	err     error
	// heldIn are the packs, and heldLoose says files of their own, where
	// members were found: commit makes them durable too (another writer
	// may not have synced them yet).
	heldIn    map[string]bool
	heldLoose bool
}

// packBuf is how much a packWriter gathers before it writes.
const packBuf = 1 << 20

func (s *Store) newPackWriter() (*packWriter, error) {
	pw := &packWriter{s: s, keys: map[[sha256.Size]byte]bool{}}
	var err error
	if pw.fd, pw.name, err = s.openTemp(); err != nil {
		return nil, err
	}
	pw.buf = make([]byte, 0, packBuf)
	return pw, nil
}

// begin starts a member; it returns where its bytes begin.
func (pw *packWriter) begin() (int64, error) {
	switch {
	case pw.err != nil:
		return 0, pw.err
	case pw.open:
		return 0, errors.New("blob store: the batch's previous blob is neither added nor aborted")
	case len(pw.keys) >= maxPackMembers:
		return 0, fmt.Errorf("blob store: more than %d blobs in one batch", maxPackMembers)
	}
	pw.open = true
	return pw.end(), nil
}

// end is where the next byte of the pack goes.
func (pw *packWriter) end() int64 { return pw.off + int64(len(pw.buf)) }

func (pw *packWriter) write(p []byte) error {
	if pw.err != nil {
		return pw.err
	}
	for len(p) > 0 {
		k := min(len(p), cap(pw.buf)-len(pw.buf))
		pw.buf = append(pw.buf, p[:k]...)
		p = p[k:]
		if len(pw.buf) == cap(pw.buf) {
			if err := pw.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (pw *packWriter) flush() error {
	if pw.err != nil {
		return pw.err
	}
	for b := pw.buf; len(b) > 0; {
		n, err := unix.Pwrite(pw.fd, b, pw.off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			pw.err = fmt.Errorf("blob store: write: %w", err)
			return pw.err
		}
		pw.off += int64(n)
		b = b[n:]
	}
	pw.buf = pw.buf[:0]
	return nil
}

// truncate drops every byte from at on: an aborted member, or one the
// store holds already.
func (pw *packWriter) truncate(at int64) {
	pw.open = false
	if pw.err != nil {
		return
	}
	if at >= pw.off {
		pw.buf = pw.buf[:at-pw.off]
		return
	}
	pw.buf = pw.buf[:0]
	if err := unix.Ftruncate(pw.fd, at); err != nil {
		pw.err = fmt.Errorf("blob store: truncate: %w", err)
		return
	}
	pw.off = at
}

// add ends the member w, which began at start, with its digest d: it
// goes into the index unless this pack or the store holds it already,
// when its bytes are dropped.
func (pw *packWriter) add(w *Writer, d string) error {
	if pw.err != nil {
		return pw.err
	}
	if !pw.open || w.start != pw.indexed || w.start+w.n != pw.end() {
		pw.truncate(pw.indexed)
		return errors.New("blob store: a batch's blobs were written out of turn")
	}
	var key [sha256.Size]byte
	w.h.Sum(key[:0])
	if pw.keys[key] {
		pw.truncate(w.start)
		return nil
	}
	s := pw.s
	s.refs.sweep.RLock()
	var mine []byte // the member's bytes, if they are all still in buf
	if w.start >= pw.off {
		mine = pw.buf[w.start-pw.off : w.start-pw.off+w.n]
	}
	held, in := s.keepCopy(d, w.n, mine)
	s.refs.sweep.RUnlock()
	if held {
		if in == "" {
			pw.heldLoose = true
		} else {
			if pw.heldIn == nil {
				pw.heldIn = map[string]bool{}
			}
			pw.heldIn[in] = true
		}
		pw.truncate(w.start)
		return nil
	}
	pw.keys[key] = true
	pw.index = append(pw.index, key[:]...)
	pw.index = binary.BigEndian.AppendUint64(pw.index, uint64(w.n))
	pw.indexed += w.n
	pw.open = false
	return nil
}

// commit ends the pack with its index, syncs it and puts it in place,
// unless a copy in place checks already. It does nothing for a pack with
// no member.
func (pw *packWriter) commit() error {
	defer pw.release()
	if pw.err != nil {
		return pw.err
	}
	// A member neither added nor aborted is not part of the pack.
	pw.truncate(pw.indexed)
	if pw.err != nil {
		return pw.err
	}
	if err := pw.syncHeld(); err != nil {
		return err
	}
	count := len(pw.index) / packEntry
	if count == 0 {
		return nil
	}
	var tail [packTail]byte
	binary.BigEndian.PutUint64(tail[:8], uint64(count))
	copy(tail[8:], packMagic)
	if err := pw.write(pw.index); err != nil {
		return err
	}
	if err := pw.write(tail[:]); err != nil {
		return err
	}
	if err := pw.flush(); err != nil {
		return err
	}
	sum := sha256.Sum256(pw.index)
	name := hex.EncodeToString(sum[:])
	p := &pack{name: name, size: pw.off, members: make([]entry, count)}
	var off int64
	for i := range p.members {
		e := pw.index[i*packEntry:]
		copy(p.members[i].key[:], e[:sha256.Size])
		p.members[i].off = off
		p.members[i].size = int64(binary.BigEndian.Uint64(e[sha256.Size:packEntry]))
		off += p.members[i].size
	}
	s := pw.s
	if err := s.ensurePackDir(); err != nil {
		return err
	}
	if err := sealTemp(pw.fd); err != nil {
		return err
	}
	if pw.name == "" {
		var err error
		if pw.name, err = linkTemp(pw.fd, s.tmp); err != nil {
			return fmt.Errorf("blob store: %w", &os.PathError{Op: "link", Path: s.tmp, Err: err})
		}
	}
	dst := s.packPath(name)
	// As Writer.settle: a copy in place that checks is kept and marked
	// used, under the sweep lock so that no sweep removes it before.
	s.refs.sweep.RLock()
	defer s.refs.sweep.RUnlock()
	if old, err := readPack(dst, name); err == nil && verifyPack(dst, old) {
		now := time.Now()
		if err := os.Chtimes(dst, now, now); err != nil {
			return fmt.Errorf("blob store: %w", err)
		}
		p = old
	} else if err := os.Rename(pw.name, dst); err != nil {
		return fmt.Errorf("blob store: %w", err)
	} else {
		pw.name = ""
	}
	// Synced in both cases: the entry in place may be another writer's
	// that it has not synced yet.
	if err := syncDir(s.packDir()); err != nil {
		return fmt.Errorf("blob store: sync directory: %w", err)
	}
	s.packs.mu.Lock()
	s.addPackLocked(p, true)
	s.packs.mu.Unlock()
	return nil
}

// syncHeld makes durable the copies members were found in: the packs
// (synced, as holds syncs a file of its own) and the directory entries of
// both kinds.
func (pw *packWriter) syncHeld() error {
	s := pw.s
	if pw.heldLoose {
		if err := s.syncBlobDir(); err != nil {
			return err
		}
	}
	if len(pw.heldIn) == 0 {
		return nil
	}
	if err := s.ensurePackDir(); err != nil {
		return err
	}
	for name := range pw.heldIn {
		f, err := openPack(s.packPath(name))
		if err != nil {
			return fmt.Errorf("blob store: %w", err)
		}
		err = fsync(int(f.Fd()))
		f.Close()
		if err != nil {
			return fmt.Errorf("blob store: sync: %w", err)
		}
	}
	if err := syncDir(s.packDir()); err != nil {
		return fmt.Errorf("blob store: sync directory: %w", err)
	}
	return nil
}

// release closes the temp file and removes its name, if it still has
// one; the pack takes no more writes.
func (pw *packWriter) release() {
	dropTemp(&pw.fd, &pw.name)
	pw.buf = nil
	if pw.err == nil {
		pw.err = errPackClosed
	}
}
