package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func put(t *testing.T, s *Store, content string) string {
	t.Helper()
	d, err := s.PutBytes([]byte(content))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSweepRemovesOrphansKeepsReferencedAndLeased(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ref, orphan, leased, stale := put(t, s, "referenced"), put(t, s, "orphan"), put(t, s, "leased upload"), put(t, s, "stale upload")
	if err := s.Lease(leased); err != nil {
		t.Fatal(err)
	}
	if err := s.Lease(stale); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(s.Dir(), "leases", stale[len("sha256:"):]), old, old)
	// A temp file a killed writer left.
	os.WriteFile(filepath.Join(s.Dir(), "tmp", "blob-left"), []byte("x"), 0o600)
	if n, err := s.CleanTemp(); err != nil || n != 1 {
		t.Errorf("CleanTemp: got %d, %v, want 1", n, err)
	}
	rep, err := s.Sweep(SweepPolicy{Referenced: func(d string) bool { return d == ref }, LeaseTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string]bool{ref: true, orphan: false, leased: true, stale: false} {
		if s.Has(d) != want {
			t.Errorf("blob %s: held %v, want %v", d, s.Has(d), want)
		}
	}
	if rep.Removed != 2 || rep.RemovedBytes != int64(len("orphan")+len("stale upload")) || rep.Blobs != 2 {
		t.Errorf("got report %+v, want 2 removed (%d bytes), 2 held", rep, len("orphan")+len("stale upload"))
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "leases", stale[len("sha256:"):])); !os.IsNotExist(err) {
		t.Errorf("the expired lease is still there: %v", err)
	}
}
