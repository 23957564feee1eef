package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// packBatch puts contents into s with one batch and returns their digests.
func packBatch(t *testing.T, s *Store, contents [][]byte) []string {
	t.Helper()
	b := s.NewBatch()
	var digests []string
	for _, c := range contents {
		w, err := b.NewWriter(int64(len(c)))
		if err != nil {
			t.Fatal(err)
		}
		for rest := c; len(rest) > 0; {
			k := min(len(rest), 7_000)
			if _, err := w.Write(rest[:k]); err != nil {
				t.Fatal(err)
			}
			rest = rest[k:]
		}
		d, n, err := b.Add(w, "")
		if err != nil {
			t.Fatal(err)
		}
		if d != digestOf(c) || n != int64(len(c)) {
			t.Fatalf("Add = %s %d, want %s %d", d, n, digestOf(c), len(c))
		}
		digests = append(digests, d)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	return digests
}

// packFiles lists DIR/packs.
func packFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "packs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// holdsExactly fails unless the store gives each digest's exact bytes
// through Has, Size, Open (read whole, at an offset, after a seek) and
// Verify.
func holdsExactly(t *testing.T, s *Store, digests []string, contents [][]byte) {
	t.Helper()
	for i, d := range digests {
		c := contents[i]
		if !s.Has(d) {
			t.Fatalf("blob %d: Has = false", i)
		}
		if n, err := s.Size(d); err != nil || n != int64(len(c)) {
			t.Fatalf("blob %d: Size = %d, %v, want %d", i, n, err, len(c))
		}
		f, err := s.Open(d)
		if err != nil {
			t.Fatalf("blob %d: %v", i, err)
		}
		got, err := io.ReadAll(f)
		if err != nil || !bytes.Equal(got, c) || f.Size() != int64(len(c)) {
			t.Fatalf("blob %d: read %d bytes (%v), want its %d", i, len(got), err, len(c))
		}
		if len(c) > 3 {
			tail := make([]byte, 3)
			if _, err := f.ReadAt(tail, int64(len(c)-3)); err != nil || !bytes.Equal(tail, c[len(c)-3:]) {
				t.Fatalf("blob %d: ReadAt of its last bytes: %q %v", i, tail, err)
			}
			if _, err := f.ReadAt(tail, int64(len(c)-1)); err != io.EOF {
				t.Fatalf("blob %d: ReadAt past its end: %v, want EOF", i, err)
			}
		}
		f.Close()
		if err := s.Verify(d); err != nil {
			t.Fatalf("blob %d: %v", i, err)
		}
	}
}

// A batch's first packAfter blobs are files of their own and the rest
// one pack; every blob is whole and addressable by its digest when
// Commit returns, from this store and from another process's.
func TestBatchPacksWhatComesAfterItsFirstBlobs(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		contents := blobContents(packAfter + 200)
		digests := packBatch(t, s, contents)
		loose, _ := os.ReadDir(filepath.Join(dir, "sha256"))
		packs := packFiles(t, dir)
		if len(loose) != packAfter || len(packs) != 1 {
			t.Fatalf("%d loose blobs and %d packs, want %d and 1", len(loose), len(packs), packAfter)
		}
		st, err := os.Stat(filepath.Join(dir, "packs", packs[0]))
		if err != nil || st.Mode().Perm() != 0o400 {
			t.Fatalf("pack: %v %v, want a read-only file", st, err)
		}
		holdsExactly(t, s, digests, contents)
		emptyTemp(t, dir)
		other, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		holdsExactly(t, other, digests, contents)
	})
}

// A member aborted half-way, or refused for a claimed digest its content
// does not have, leaves nothing; the members after it are whole.
func TestPackMemberAbortedOrRefused(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		contents := blobContents(packAfter + 20)
		b := s.NewBatch()
		var kept []string
		var keptContents [][]byte
		var dropped []string
		for i, c := range contents {
			w, err := b.NewWriter(-1)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(c); err != nil {
				t.Fatal(err)
			}
			switch {
			case i == packAfter+3:
				w.Abort()
				dropped = append(dropped, digestOf(c))
			case i == packAfter+7:
				if _, _, err := b.Add(w, digestOf([]byte("something else"))); !errors.Is(err, ErrDigestMismatch) {
					t.Fatalf("got %v, want ErrDigestMismatch", err)
				}
				dropped = append(dropped, digestOf(c))
			default:
				d, _, err := b.Add(w, "")
				if err != nil {
					t.Fatal(err)
				}
				kept, keptContents = append(kept, d), append(keptContents, c)
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		holdsExactly(t, s, kept, keptContents)
		for _, d := range dropped {
			if s.Has(d) {
				t.Fatalf("%s is in the store", d)
			}
			if _, err := s.Open(d); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Open of a dropped member: %v, want ErrNotFound", err)
			}
		}
		emptyTemp(t, dir)
	})
}

// A pack that cannot be synced fails the batch's Commit: it is not put in
// place, and no temp file is left.
func TestPackSyncFailure(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		orig := fsync
		t.Cleanup(func() { fsync = orig })
		fsync = func(fd int) error {
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && st.Size > 256<<10 {
				return unix.EIO
			}
			return orig(fd)
		}
		contents := blobContents(packAfter + 30)
		b := s.NewBatch()
		for _, c := range contents {
			w, _ := b.NewWriter(-1)
			w.Write(c)
			if _, _, err := b.Add(w, ""); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Commit(); !errors.Is(err, unix.EIO) {
			t.Fatalf("got %v, want the sync's EIO", err)
		}
		if p := packFiles(t, dir); len(p) != 0 {
			t.Fatalf("packs after a failed sync: %v", p)
		}
		if s.Has(digestOf(contents[packAfter+1])) {
			t.Fatal("a member of the pack that failed is in the store")
		}
		emptyTemp(t, dir)
	})
}

// Members the store holds already, in a pack or as files of their own,
// or twice in one batch, are not written again; the same batch again
// writes no pack.
func TestMembersTheStoreHoldsAreNotWrittenAgain(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		first := blobContents(packAfter + 50)
		packBatch(t, s, first)
		firstPack := packFiles(t, dir)
		old := time.Now().Add(-time.Hour)
		os.Chtimes(filepath.Join(dir, "packs", firstPack[0]), old, old)
		packBatch(t, s, first)
		if again := packFiles(t, dir); len(again) != 1 {
			t.Fatalf("packs %v after the same batch, want only %v", again, firstPack)
		}
		if st, _ := os.Stat(filepath.Join(dir, "packs", firstPack[0])); st.ModTime().Before(time.Now().Add(-time.Minute)) {
			t.Fatal("the pack holding the members was not marked used")
		}
		var fresh [][]byte
		for i := range 10 {
			fresh = append(fresh, []byte(fmt.Sprintf("fresh content %d", i)))
		}
		// packAfter loose ones, then: packed members held already, files of
		// their own held already, fresh ones, one fresh one twice.
		second := append(slices.Clone(first[packAfter:2*packAfter]), first[packAfter:packAfter+20]...)
		second = append(second, first[:5]...)
		second = append(second, fresh...)
		second = append(second, fresh[3])
		digests := packBatch(t, s, second)
		holdsExactly(t, s, digests, second)
		l, ok := s.findPacked(digestOf(fresh[0]))
		if !ok {
			t.Fatal("fresh member not packed")
		}
		if n := len(l.p.members); n != len(fresh) {
			t.Fatalf("the new pack has %d members, want the %d fresh ones", n, len(fresh))
		}
		emptyTemp(t, dir)
	})
}

// A member whose stored copy no longer checks is written again, and the
// new copy is the one read; Verify tells the tampered one.
func TestATamperedMemberIsWrittenAgain(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		contents := blobContents(packAfter + 10)
		digests := packBatch(t, s, contents)
		p := filepath.Join(dir, "packs", packFiles(t, dir)[0])
		os.Chmod(p, 0o600)
		raw, _ := os.ReadFile(p)
		last := digests[len(digests)-1]
		l, ok := s.findPacked(last)
		if !ok {
			t.Fatal("last member not found")
		}
		raw[l.entry().off] ^= 1
		os.WriteFile(p, raw, 0o600)
		if err := s.Verify(last); !errors.Is(err, ErrDigestMismatch) {
			t.Fatalf("Verify of a tampered member: %v, want ErrDigestMismatch", err)
		}
		packBatch(t, s, contents)
		holdsExactly(t, s, digests, contents)
		if n := len(packFiles(t, dir)); n != 2 {
			t.Fatalf("%d packs, want the first and one holding the repaired member", n)
		}
		other, _ := Open(dir)
		if err := other.Verify(last); err != nil && !errors.Is(err, ErrDigestMismatch) {
			t.Fatal(err)
		}
		emptyTemp(t, dir)
	})
}

// A member must be added or aborted before the next one is begun, and
// belongs to its own batch; a write after the batch committed fails.
// None of it leaves a pack that reads wrong.
func TestPackMembersInTurn(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	b, other := s.NewBatch(), s.NewBatch()
	for range packAfter {
		w, _ := b.NewWriter(-1)
		w.Write([]byte("loose " + fmt.Sprint(b.given)))
		b.Add(w, "")
		w, _ = other.NewWriter(-1)
		w.Write([]byte("other loose " + fmt.Sprint(other.given)))
		other.Add(w, "")
	}
	w1, err := b.NewWriter(-1)
	if err != nil {
		t.Fatal(err)
	}
	w1.Write([]byte("AAA"))
	if _, err := b.NewWriter(-1); err == nil {
		t.Fatal("a second member began while the first is open")
	}
	w1.Write([]byte("A"))
	if _, _, err := b.Add(w1, ""); err != nil {
		t.Fatal(err)
	}
	foreign, _ := other.NewWriter(-1)
	foreign.Write([]byte("foreign"))
	if _, _, err := b.Add(foreign, ""); err == nil {
		t.Fatal("a member of another batch was added")
	}
	// A member bigger than the writer's buffer, aborted after a flush.
	big, _ := b.NewWriter(-1)
	big.Write(bytes.Repeat([]byte("b"), 3*packBuf/2))
	big.Abort()
	w2, err := b.NewWriter(-1)
	if err != nil {
		t.Fatal(err)
	}
	w2.Write([]byte("after the big one"))
	if _, _, err := b.Add(w2, ""); err != nil {
		t.Fatal(err)
	}
	open, _ := b.NewWriter(-1)
	open.Write([]byte("never added"))
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := open.Write([]byte("late")); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a write after the batch committed succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a write after the batch committed hangs")
	}
	fresh, _ := Open(dir)
	for _, st := range []*Store{s, fresh} {
		holdsExactly(t, st, []string{digestOf([]byte("AAAA")), digestOf([]byte("after the big one"))}, [][]byte{[]byte("AAAA"), []byte("after the big one")})
		for _, c := range []string{"never added", "foreign", strings.Repeat("b", 3*packBuf/2)} {
			if st.Has(digestOf([]byte(c))) {
				t.Fatalf("%.20q is in the store", c)
			}
		}
	}
}

// A pack cut short or replaced after it was read is never read short: the
// member is not found.
func TestAPackCutShortIsNotReadShort(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	contents := blobContents(packAfter + 10)
	digests := packBatch(t, s, contents)
	d := digests[len(digests)-1]
	if !s.Has(d) {
		t.Fatal("member not found")
	}
	p := filepath.Join(dir, "packs", packFiles(t, dir)[0])
	os.Chmod(p, 0o600)
	if err := os.Truncate(p, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open(d); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Open of a member of a pack cut short: %v, want ErrNotFound", err)
	}
	if s.Has(d) {
		t.Fatal("Has finds a member of a pack cut short")
	}
}

// A file in DIR/packs whose layout or name does not check is no pack: its
// "members" are not in the store, and no sweep removes it.
func TestNotAPackIsNeverReadNorRemoved(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	contents := blobContents(packAfter + 5)
	digests := packBatch(t, s, contents)
	name := packFiles(t, dir)[0]
	raw, _ := os.ReadFile(filepath.Join(dir, "packs", name))
	bad := map[string][]byte{
		strings.Repeat("0", 64):    raw,                // a name that is not its index's digest
		"truncated":                raw[:len(raw)-1],   // no magic
		"short":                    []byte("sbdpack1"), // shorter than a tail
		"count":                    append(bytes.Clone(raw[:len(raw)-16]), 0, 0, 0, 0, 0, 0, 0, 9, 's', 'b', 'd', 'p', 'a', 'c', 'k', '1'),
		"extra-" + name[:8]:        append([]byte{0}, raw...), // sizes that do not add up
		"empty":                    {},                        //
		"dir-" + name[:8] + ".d/x": nil,                       // a directory
	}
	os.Remove(filepath.Join(dir, "packs", name))
	s2, _ := Open(dir)
	for n, b := range bad {
		p := filepath.Join(dir, "packs", n)
		if b == nil {
			os.MkdirAll(p, 0o700)
			continue
		}
		if err := os.WriteFile(p, b, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []*Store{s, s2} {
		for _, d := range digests[packAfter:] {
			if st.Has(d) {
				t.Fatalf("%s found in a file that is not a pack", d)
			}
		}
		if _, err := st.Sweep(SweepPolicy{Referenced: none}); err != nil {
			t.Fatal(err)
		}
	}
	if got := packFiles(t, dir); len(got) != len(bad) {
		t.Fatalf("after sweeps DIR/packs holds %v, want all %d files left alone", got, len(bad))
	}
}

// A sweep removes a pack only when none of its members is referenced,
// leased or pinned, and then every member with it.
func TestSweepRemovesAPackOnlyWhenNoMemberIsNeeded(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	contents := blobContents(packAfter + 40)
	digests := packBatch(t, s, contents)
	packed := digests[packAfter:]
	one := packed[17]
	p := filepath.Join(dir, "packs", packFiles(t, dir)[0])
	old := time.Now().Add(-time.Hour)
	os.Chtimes(p, old, old)

	rep, err := s.Sweep(SweepPolicy{Referenced: func(d string) bool { return d == one }})
	if err != nil || !s.Has(packed[0]) || rep.Removed != packAfter {
		t.Fatalf("with one member referenced: %+v %v, pack there %v; want only the %d loose blobs gone", rep, err, s.Has(packed[0]), packAfter)
	}
	if rep.Blobs != len(packed) {
		t.Fatalf("report counts %d blobs kept, want the pack's %d", rep.Blobs, len(packed))
	}
	unpin := s.Pin(one)
	os.Chtimes(p, old, old)
	if _, err := s.Sweep(SweepPolicy{Referenced: none}); err != nil || !s.Has(packed[0]) {
		t.Fatalf("with one member pinned the pack went (%v)", err)
	}
	unpin()
	// A lease keeps its member, copied out, not the pack.
	if err := s.Lease(one); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(p, old, old)
	if _, err := s.Sweep(SweepPolicy{Referenced: none, LeaseTTL: time.Hour}); err != nil || s.Has(packed[0]) || !s.Has(one) || !s.hasLoose(one) {
		t.Fatalf("with one member leased: %v; want the pack gone and the leased member kept as a file of its own", err)
	}
	holdsExactly(t, s, []string{one}, [][]byte{contents[packAfter+17]})
	s.Unlease(one)
	// Packed again: the leased member is a file of its own now, and
	// not in the new pack.
	if _, err := s.Sweep(SweepPolicy{Referenced: none}); err != nil {
		t.Fatal(err)
	}
	digests = packBatch(t, s, contents)
	packed = digests[packAfter:]
	p = filepath.Join(dir, "packs", packFiles(t, dir)[0])
	one = packed[5]
	// Touching a member marks its pack used: MinAge spares it.
	os.Chtimes(p, old, old)
	if err := s.Touch(one); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sweep(SweepPolicy{Referenced: none, MinAge: time.Minute}); err != nil || !s.Has(packed[0]) {
		t.Fatalf("a pack used a moment ago went (%v)", err)
	}
	os.Chtimes(p, old, old)
	rep, err = s.Sweep(SweepPolicy{Referenced: none})
	if err != nil || rep.Removed != len(digests) || rep.Blobs != 0 {
		t.Fatalf("sweep: %+v %v, want all %d blobs removed", rep, err, len(digests))
	}
	for _, d := range packed {
		if s.Has(d) {
			t.Fatalf("%s still in the store", d)
		}
		if _, err := s.Open(d); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Open: %v, want ErrNotFound", err)
		}
	}
	if got := packFiles(t, dir); len(got) != 0 {
		t.Fatalf("packs left: %v", got)
	}
}

// Over budget, a pack is evicted whole, least recently used first, and a
// pack another store instance (another process) removed is no longer
// found by this one.
func TestPackEvictedWholeAndSeenGoneByOthers(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	older := blobContents(packAfter + 10)
	newer := make([][]byte, len(older))
	for i, c := range older {
		newer[i] = append(bytes.Clone(c), 'n')
	}
	a := packBatch(t, s, older)
	b := packBatch(t, s, newer)
	names := map[string]bool{}
	for _, n := range packFiles(t, dir) {
		names[n] = true
	}
	la, _ := s.findPacked(a[packAfter])
	lb, _ := s.findPacked(b[packAfter])
	if len(names) != 2 || la.p.name == lb.p.name {
		t.Fatalf("packs %v, want two", names)
	}
	t1, t2 := time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(dir, "packs", la.p.name), t1, t1)
	os.Chtimes(filepath.Join(dir, "packs", lb.p.name), t2, t2)
	// Another process's view, read before the eviction.
	other, _ := Open(dir)
	if !other.Has(a[packAfter]) {
		t.Fatal("the other store does not see the pack")
	}
	all := func(string) bool { return true }
	st, _ := os.Stat(filepath.Join(dir, "packs", lb.p.name))
	var loose int64
	for _, c := range append(older[:packAfter], newer[:packAfter]...) {
		loose += int64(len(c))
	}
	rep, err := s.Sweep(SweepPolicy{Referenced: all, Budget: loose + st.Size()})
	if err != nil || rep.Evicted == 0 {
		t.Fatalf("sweep: %+v %v", rep, err)
	}
	if s.Has(a[packAfter]) || !s.Has(b[packAfter]) {
		t.Fatal("want the least recently used pack evicted and the other kept")
	}
	if other.Has(a[packAfter]) {
		t.Fatal("the other store still finds a member of the evicted pack")
	}
	if _, err := other.Open(a[packAfter+1]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the other store opens a member of the evicted pack: %v", err)
	}
	holdsExactly(t, other, b[packAfter:], newer[packAfter:])
}

// A file named as its index's digest whose sizes do not match its bytes
// is no pack either: none of its "members" is found.
func TestAPackWithItsNameButABadLayoutIsNotAPack(t *testing.T) {
	a, b := []byte("hello"), []byte("world")
	// A pack file of a's and b's digests with sizes, holding data.
	pack := func(data []byte, sizes ...uint64) (string, []byte) {
		var index []byte
		for i, n := range sizes {
			k := sha256.Sum256([][]byte{a, b}[i])
			index = append(index, k[:]...)
			index = binary.BigEndian.AppendUint64(index, n)
		}
		f := append(bytes.Clone(data), index...)
		f = binary.BigEndian.AppendUint64(f, uint64(len(sizes)))
		f = append(f, packMagic...)
		sum := sha256.Sum256(index)
		return hex.EncodeToString(sum[:]), f
	}
	for _, c := range []struct {
		data  []byte
		sizes []uint64
		good  bool
	}{
		{[]byte("helloworld!"), []uint64{5, 5}, false},         // a byte no member holds
		{[]byte("helloworl"), []uint64{5, 5}, false},           // a member past the index
		{[]byte("helloworld"), []uint64{5, 1<<64 - 1}, false},  // a size that wraps
		{[]byte("helloworld"), []uint64{1<<64 - 1, 11}, false}, // one that wraps first
		{[]byte("helloworld"), []uint64{5, 5}, true},           // the same done right
	} {
		dir := t.TempDir()
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		name, f := pack(c.data, c.sizes...)
		os.MkdirAll(filepath.Join(dir, "packs"), 0o700)
		if err := os.WriteFile(filepath.Join(dir, "packs", name), f, 0o400); err != nil {
			t.Fatal(err)
		}
		if c.good {
			holdsExactly(t, s, []string{digestOf(a), digestOf(b)}, [][]byte{a, b})
			continue
		}
		if s.Has(digestOf(a)) || s.Has(digestOf(b)) {
			t.Fatalf("%q %v: a member of a bad pack is found", c.data, c.sizes)
		}
	}
}

// writePack puts a pack of contents, in that order, into dir's packs as
// another writer would, and returns its name.
func writePack(t *testing.T, dir string, contents ...[]byte) string {
	t.Helper()
	var data, index []byte
	for _, c := range contents {
		data = append(data, c...)
		k := sha256.Sum256(c)
		index = append(index, k[:]...)
		index = binary.BigEndian.AppendUint64(index, uint64(len(c)))
	}
	f := append(data, index...)
	f = binary.BigEndian.AppendUint64(f, uint64(len(contents)))
	f = append(f, packMagic...)
	sum := sha256.Sum256(index)
	name := hex.EncodeToString(sum[:])
	os.MkdirAll(filepath.Join(dir, "packs"), 0o700)
	if err := os.WriteFile(filepath.Join(dir, "packs", name), f, 0o400); err != nil {
		t.Fatal(err)
	}
	return name
}

// A member two packs hold is read from the other when one goes, and a
// pack dropped does not lose what only it held to another's look-up.
func TestAMemberOfTwoPacksOutlivesOne(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	a, b, c := []byte("only in the first"), []byte("in both"), []byte("only in the second")
	first := writePack(t, dir, a, b)
	second := writePack(t, dir, b, c)
	holdsExactly(t, s, []string{digestOf(a), digestOf(b), digestOf(c)}, [][]byte{a, b, c})
	// The pack b is read from goes.
	l, _ := s.findPacked(digestOf(b))
	gone, only, rest := first, a, c
	if l.p.name == second {
		gone, only, rest = second, c, a
	}
	if err := os.Remove(filepath.Join(dir, "packs", gone)); err != nil {
		t.Fatal(err)
	}
	holdsExactly(t, s, []string{digestOf(b), digestOf(rest)}, [][]byte{b, rest})
	if s.Has(digestOf(only)) {
		t.Fatal("a member of the removed pack is still found")
	}
}

// A file of its own that does not hold its digest is replaced by the
// packed copy a batch writes: the sound copy is the one read.
func TestACorruptFileGivesWayToAPackedCopy(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		contents := blobContents(packAfter + 5)
		d := digestOf(contents[packAfter+2])
		if _, _, err := s.Put(bytes.NewReader(contents[packAfter+2]), d, -1); err != nil {
			t.Fatal(err)
		}
		p, _ := s.Path(d)
		os.Chmod(p, 0o600)
		bad := bytes.Clone(contents[packAfter+2])
		bad[0] ^= 1
		os.WriteFile(p, bad, 0o600)
		packBatch(t, s, contents)
		if err := s.Verify(d); err != nil {
			t.Fatalf("after the batch: %v", err)
		}
		emptyTemp(t, dir)
	})
}

// A lease on a packed member that no longer checks is taken all the same,
// and an upload of the content then stores a sound copy.
func TestALeaseOnACorruptMemberLetsTheUploadRepairIt(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	good := []byte("the content")
	bad := []byte("the Content")
	name := writePack(t, dir, good)
	raw, _ := os.ReadFile(filepath.Join(dir, "packs", name))
	copy(raw, bad)
	os.Chmod(filepath.Join(dir, "packs", name), 0o600)
	os.WriteFile(filepath.Join(dir, "packs", name), raw, 0o600)
	d := digestOf(good)
	if err := s.Lease(d); err != nil {
		t.Fatalf("Lease: %v", err)
	}
	if !s.Leased(d, time.Hour) {
		t.Fatal("no lease")
	}
	if _, _, err := s.Put(bytes.NewReader(good), d, -1); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(d); err != nil {
		t.Fatalf("after the upload: %v", err)
	}
}

// A batch whose every packed member the store held already in a pack
// syncs that pack and its directory: another writer may not have yet.
func TestAHeldPackIsSynced(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	contents := blobContents(packAfter + 20)
	packBatch(t, s, contents)
	name := packFiles(t, dir)[0]
	st, _ := os.Stat(filepath.Join(dir, "packs", name))
	orig := fsync
	t.Cleanup(func() { fsync = orig })
	var synced atomic.Int32
	fsync = func(fd int) error {
		var fst unix.Stat_t
		if unix.Fstat(fd, &fst) == nil && fst.Ino == st.Sys().(*syscall.Stat_t).Ino {
			synced.Add(1)
		}
		return orig(fd)
	}
	packBatch(t, s, contents)
	if synced.Load() == 0 {
		t.Fatal("the pack holding the batch's members was not synced")
	}
}

// A lease reads no blob (an upload takes it before its bytes are proven):
// a packed member leased is copied out only by the next sweep.
func TestALeaseCopiesNothingUntilASweep(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	a, b := []byte("leased member"), []byte("other member")
	writePack(t, dir, a, b)
	if err := s.Lease(digestOf(a)); err != nil {
		t.Fatal(err)
	}
	if s.hasLoose(digestOf(a)) {
		t.Fatal("Lease copied the member out")
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(dir, "packs", packFiles(t, dir)[0]), old, old)
	if _, err := s.Sweep(SweepPolicy{Referenced: none, LeaseTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if !s.hasLoose(digestOf(a)) || s.Has(digestOf(b)) || len(packFiles(t, dir)) != 0 {
		t.Fatal("after the sweep: want the leased member a file of its own and the pack gone")
	}
	holdsExactly(t, s, []string{digestOf(a)}, [][]byte{a})
}

// A file of its own that could not be checked (here its sync fails) but
// holds its digest is not removed: only a copy known to be wrong is.
func TestASoundFileIsNotRemovedOnAnError(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	contents := blobContents(packAfter + 5)
	c := contents[packAfter+2]
	d := digestOf(c)
	if _, _, err := s.Put(bytes.NewReader(c), d, -1); err != nil {
		t.Fatal(err)
	}
	orig := fsync
	t.Cleanup(func() { fsync = orig })
	fsync = func(fd int) error {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Size == int64(len(c)) {
			return unix.EIO
		}
		return orig(fd)
	}
	b := s.NewBatch()
	for _, x := range contents {
		w, _ := b.NewWriter(-1)
		w.Write(x)
		b.Add(w, "")
	}
	b.Commit()
	fsync = orig
	if !s.hasLoose(d) {
		t.Fatal("a sound file of its own was removed after an error")
	}
}
