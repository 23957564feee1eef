package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
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
