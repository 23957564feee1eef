package store

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
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

func TestSweepEvictsLeastRecentlyUsedWithinBudgetAndSparesWhatJobsNeed(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Five referenced blobs of 100 bytes, used in this order.
	var ds []string
	base := time.Now().Add(-time.Hour)
	for i := range 5 {
		d := put(t, s, strings.Repeat(string(rune('a'+i)), 100))
		p, _ := s.Path(d)
		at := base.Add(time.Duration(i) * time.Minute)
		os.Chtimes(p, at, at)
		ds = append(ds, d)
	}
	unpin := s.Pin(ds[0]) // the oldest: a queued job needs it (Pin marks it used, too)
	p0, _ := s.Path(ds[0])
	os.Chtimes(p0, base, base)
	all := func(string) bool { return true }
	rep, err := s.Sweep(SweepPolicy{Referenced: all, LeaseTTL: time.Hour, Budget: 250})
	if err != nil {
		t.Fatal(err)
	}
	// Over budget by 250: the least recently used that no job needs go
	// (1, 2, 3), never the pinned one.
	want := map[string]bool{ds[0]: true, ds[1]: false, ds[2]: false, ds[3]: false, ds[4]: true}
	for d, held := range want {
		if s.Has(d) != held {
			t.Errorf("blob %d: held %v, want %v", slices.Index(ds, d), s.Has(d), held)
		}
	}
	if rep.Evicted != 3 || rep.Bytes != 200 || rep.Blobs != 2 {
		t.Errorf("got %+v, want 3 evicted and 200 bytes in 2 blobs held", rep)
	}
	unpin()
	// A hold spares what was written or touched since it began, even
	// unreferenced: a running job's artifacts before its result names them.
	release := s.Hold()
	fresh := put(t, s, "an artifact being collected")
	again := ds[4]
	if _, err := s.PutBytes([]byte(strings.Repeat("e", 100))); err != nil { // the same bytes again: touched
		t.Fatal(err)
	}
	if _, err := s.Sweep(SweepPolicy{Referenced: func(string) bool { return false }, LeaseTTL: time.Hour, Budget: 1}); err != nil {
		t.Fatal(err)
	}
	if !s.Has(fresh) || !s.Has(again) || s.Has(ds[0]) {
		t.Errorf("under a hold: fresh %v, rewritten %v, old %v; want true, true, false", s.Has(fresh), s.Has(again), s.Has(ds[0]))
	}
	release()
	if _, err := s.Sweep(SweepPolicy{Referenced: func(string) bool { return false }, LeaseTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if s.Has(fresh) || s.Has(again) {
		t.Error("orphans outlived the hold that kept them")
	}
}

func TestSweepSparesBlobsUsedWithinMinAge(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fresh := put(t, s, "just put, for a job about to run")
	if _, err := s.Sweep(SweepPolicy{Referenced: func(string) bool { return false }, LeaseTTL: time.Hour, MinAge: time.Hour, Budget: 1}); err != nil {
		t.Fatal(err)
	}
	if !s.Has(fresh) {
		t.Error("a blob used within MinAge was removed")
	}
}
