package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"golang.org/x/sys/unix"
)

func TestPutOpenVerify(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, n, err := s.Put(strings.NewReader("hello"), "", -1)
	if err != nil {
		t.Fatal(err)
	}
	const want = "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
	if d != want || n != 5 {
		t.Fatalf("got %s %d, want %s 5", d, n, want)
	}
	if !s.Has(d) {
		t.Fatal("Has = false after Put")
	}
	if err := s.Verify(d); err != nil {
		t.Fatal(err)
	}
	p, _ := s.Path(d)
	os.Chmod(p, 0o600)
	os.WriteFile(p, []byte("hellO"), 0o600)
	if err := s.Verify(d); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Verify after tamper: got %v, want ErrDigestMismatch", err)
	}
}

func TestClaimedDigestMismatchLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	bad := "sha256:" + strings.Repeat("0", 64)
	if _, _, err := s.Put(strings.NewReader("x"), bad, -1); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("got %v, want ErrDigestMismatch", err)
	}
	for _, sub := range []string{"sha256", "tmp"} {
		ents, _ := os.ReadDir(filepath.Join(dir, sub))
		if len(ents) != 0 {
			t.Fatalf("%s holds %d entries after a refused put", sub, len(ents))
		}
	}
}

func TestSizeCap(t *testing.T) {
	s, _ := Open(t.TempDir())
	if _, _, err := s.Put(bytes.NewReader(make([]byte, 11)), "", 10); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	if _, _, err := s.Put(bytes.NewReader(make([]byte, 10)), "", 10); err != nil {
		t.Fatalf("10 bytes under a 10-byte cap: %v", err)
	}
}

func TestConcurrentWritersSameContent(t *testing.T) {
	s, _ := Open(t.TempDir())
	data := bytes.Repeat([]byte("abc"), 100000)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := s.Put(bytes.NewReader(data), "", -1); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	d, _, _ := s.Put(bytes.NewReader(data), "", -1)
	if err := s.Verify(d); err != nil {
		t.Fatal(err)
	}
}

func TestMalformedDigest(t *testing.T) {
	s, _ := Open(t.TempDir())
	for _, d := range []string{"", "sha256:ABC", "md5:00", "sha256:" + strings.Repeat("g", 64), "sha256:../../etc/passwd"} {
		if _, err := s.Open(d); err == nil {
			t.Errorf("Open(%q) succeeded", d)
		}
	}
}

// modes runs a test with unnamed temp files (where the file system has
// them) and with named ones, the fallback.
func modes(t *testing.T, f func(t *testing.T, s *Store, dir string)) {
	for _, unnamed := range []bool{true, false} {
		t.Run(map[bool]string{true: "unnamed", false: "named"}[unnamed], func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if unnamed && !s.unnamed {
				t.Skip("no O_TMPFILE here")
			}
			s.unnamed = unnamed
			f(t, s, dir)
		})
	}
}

// blobContents are distinct contents, small ones kept in memory and large
// ones that go through a temp file from the start.
func blobContents(n int) [][]byte {
	var out [][]byte
	for i := range n {
		size := 100 + i
		if i%5 == 0 {
			size = memSize + 1 + i
		}
		b := bytes.Repeat([]byte{byte(i)}, size)
		copy(b, fmt.Sprintf("blob %d", i))
		out = append(out, b)
	}
	return out
}

func writeBlob(t *testing.T, s *Store, b []byte) *Writer {
	t.Helper()
	w, err := s.NewWriter(int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	// In pieces, so that a large blob moves from memory to a file.
	for len(b) > 0 {
		k := min(len(b), 10_000)
		if _, err := w.Write(b[:k]); err != nil {
			t.Fatal(err)
		}
		b = b[k:]
	}
	return w
}

// emptyTemp fails unless the store's temp directory is empty.
func emptyTemp(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "tmp"))
	if err != nil || len(ents) != 0 {
		t.Fatalf("temp directory: %d entries (%v), want none", len(ents), err)
	}
}

// Every blob a batch took is in the store, whole and read-only, when
// Commit returns.
func TestBatchBlobsDurableOnCommit(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		contents := blobContents(100)
		b := s.NewBatch()
		var digests []string
		for _, c := range contents {
			d, n, err := b.Add(writeBlob(t, s, c), "")
			if err != nil {
				t.Fatal(err)
			}
			if want := digestOf(c); d != want || n != int64(len(c)) {
				t.Fatalf("Add = %s %d, want %s %d", d, n, want, len(c))
			}
			digests = append(digests, d)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		for i, d := range digests {
			if err := s.Verify(d); err != nil {
				t.Fatalf("blob %d: %v", i, err)
			}
			p, _ := s.Path(d)
			if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o400 || st.Size() != int64(len(contents[i])) {
				t.Fatalf("blob %d: %v %v, want a read-only file of %d bytes", i, st, err, len(contents[i]))
			}
		}
		emptyTemp(t, dir)
		if _, _, err := b.Add(writeBlob(t, s, []byte("late")), ""); err == nil {
			t.Fatal("Add after Commit succeeded")
		}
		if err := b.Commit(); err == nil {
			t.Fatal("second Commit succeeded")
		}
	})
}

// A blob that cannot be made durable fails the batch: Commit (or the next
// Add) reports it, the blob is not in the store, and every blob that is
// in the store is whole.
func TestBatchFailureInTheMiddle(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		const failSize = 777
		orig := fsync
		t.Cleanup(func() { fsync = orig })
		fsync = func(fd int) error {
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && st.Size == failSize {
				return unix.EIO
			}
			return orig(fd)
		}
		contents := blobContents(40)
		contents[20] = bytes.Repeat([]byte("f"), failSize)
		b := s.NewBatch()
		var failed string
		var addErr error
		for i, c := range contents {
			d, _, err := b.Add(writeBlob(t, s, c), "")
			if err != nil {
				addErr = err
				break
			}
			if i == 20 {
				failed = d
			}
		}
		err := b.Commit()
		if addErr != nil {
			err = addErr
		}
		if !errors.Is(err, unix.EIO) {
			t.Fatalf("got %v, want the sync's EIO", err)
		}
		if s.Has(failed) {
			t.Fatal("the blob whose sync failed is in the store")
		}
		for _, c := range contents {
			if d := digestOf(c); s.Has(d) {
				if err := s.Verify(d); err != nil {
					t.Fatal(err)
				}
			}
		}
		emptyTemp(t, dir)
	})
}

// The same content twice in a batch, or content the store already holds,
// is one blob; a stored copy that does not hold its digest is replaced.
func TestBatchDuplicates(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		small, large := []byte("same small content"), bytes.Repeat([]byte("L"), memSize+10)
		for _, c := range [][]byte{small, large} {
			if _, _, err := s.Put(bytes.NewReader(c), "", -1); err != nil {
				t.Fatal(err)
			}
		}
		b := s.NewBatch()
		for range 3 {
			for _, c := range [][]byte{small, large, []byte("new")} {
				if _, _, err := b.Add(writeBlob(t, s, c), ""); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, c := range [][]byte{small, large, []byte("new")} {
			if err := s.Verify(digestOf(c)); err != nil {
				t.Fatal(err)
			}
		}
		ents, _ := os.ReadDir(filepath.Join(dir, "sha256"))
		if len(ents) != 3 {
			t.Fatalf("%d blobs, want 3", len(ents))
		}
		// Tampered copies: same size other bytes (the last one: the whole
		// copy is checked), and another size.
		for _, c := range [][]byte{small, large} {
			p, _ := s.Path(digestOf(c))
			os.Chmod(p, 0o600)
			bad := bytes.Clone(c)
			bad[len(bad)-1] ^= 1
			os.WriteFile(p, bad, 0o600)
		}
		p, _ := s.Path(digestOf([]byte("new")))
		os.Chmod(p, 0o600)
		os.WriteFile(p, []byte("newer"), 0o600)
		b = s.NewBatch()
		for _, c := range [][]byte{small, large, []byte("new")} {
			if _, _, err := b.Add(writeBlob(t, s, c), ""); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, c := range [][]byte{small, large, []byte("new")} {
			if err := s.Verify(digestOf(c)); err != nil {
				t.Fatalf("after a repairing batch: %v", err)
			}
		}
		emptyTemp(t, dir)
	})
}

// A claimed digest that the content does not have is refused by Add;
// nothing is kept and the batch goes on.
func TestBatchClaimedDigestMismatch(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		b := s.NewBatch()
		bad := "sha256:" + strings.Repeat("0", 64)
		if _, _, err := b.Add(writeBlob(t, s, []byte("x")), bad); !errors.Is(err, ErrDigestMismatch) {
			t.Fatalf("got %v, want ErrDigestMismatch", err)
		}
		d, _, err := b.Add(writeBlob(t, s, []byte("y")), digestOf([]byte("y")))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		ents, _ := os.ReadDir(filepath.Join(dir, "sha256"))
		if len(ents) != 1 || !s.Has(d) {
			t.Fatalf("%d blobs, want only %s", len(ents), d)
		}
		emptyTemp(t, dir)
	})
}

// Writer.Commit works the same in both modes, for small and large blobs,
// and repairs a stored copy that does not hold its digest.
func TestCommitModes(t *testing.T) {
	modes(t, func(t *testing.T, s *Store, dir string) {
		for _, c := range blobContents(10) {
			d, n, err := writeBlob(t, s, c).Commit("")
			if err != nil || d != digestOf(c) || n != int64(len(c)) {
				t.Fatalf("Commit = %s %d %v", d, n, err)
			}
			if err := s.Verify(d); err != nil {
				t.Fatal(err)
			}
			p, _ := s.Path(d)
			os.Chmod(p, 0o600)
			os.WriteFile(p, []byte("tampered"), 0o600)
			if _, _, err := s.Put(bytes.NewReader(c), d, -1); err != nil {
				t.Fatal(err)
			}
			if err := s.Verify(d); err != nil {
				t.Fatalf("after a repairing put: %v", err)
			}
		}
		w := writeBlob(t, s, []byte("dropped"))
		w.Abort()
		if _, err := w.Write([]byte("x")); err == nil {
			t.Fatal("Write after Abort succeeded")
		}
		emptyTemp(t, dir)
	})
}

func digestOf(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// sameBytes is what trusts a held copy instead of hashing it: exactly the
// bytes, no fewer, no more, across reads of any size.
func TestSameBytes(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 3*memSize/16+5) // several reads
	flipped := slices.Clone(big)
	flipped[len(flipped)-1] ^= 1
	for _, c := range []struct {
		name      string
		held, new []byte
		same      bool
	}{
		{"empty", []byte{}, []byte{}, true},
		{"equal", []byte("abc"), []byte("abc"), true},
		{"equal, several reads", big, slices.Clone(big), true},
		{"held longer", []byte("abcd"), []byte("abc"), false},
		{"held shorter", []byte("ab"), []byte("abc"), false},
		{"held empty", []byte{}, []byte("abc"), false},
		{"differs", []byte("abd"), []byte("abc"), false},
		{"differs in the last read's last byte", flipped, big, false},
		{"held longer by a read", append(slices.Clone(big), big...), big, false},
	} {
		if got := sameBytes(iotest.OneByteReader(bytes.NewReader(c.held)), c.new); got != c.same {
			t.Errorf("%s, one byte a read: %v, want %v", c.name, got, c.same)
		}
		if got := sameBytes(bytes.NewReader(c.held), c.new); got != c.same {
			t.Errorf("%s: %v, want %v", c.name, got, c.same)
		}
	}
	if sameBytes(iotest.ErrReader(errors.New("I/O error")), []byte{}) {
		t.Error("a read error was taken for an empty copy")
	}
}
