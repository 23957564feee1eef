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

// raceHook runs f at one stage of a sweep or writer (see sweepHook) and
// uninstalls it when the test ends.
func raceHook(t *testing.T, f func(stage, d string)) {
	t.Helper()
	sweepHook = f
	t.Cleanup(func() { sweepHook = nil })
}

// oldOrphan stores content as a blob nothing names, last used long ago.
func oldOrphan(t *testing.T, s *Store, content string) string {
	t.Helper()
	d := put(t, s, content)
	p, _ := s.Path(d)
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	return d
}

// A submit pins a blob and finds it while a sweep, which has just found it
// idle, is about to remove it: Pin waits for the removal, and then does not
// find it, or the blob stays. "A blob found after Pin stays."
func TestPinDuringSweepKeepsWhatItFinds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		claim func(s *Store, d string) (found bool)
	}{
		{"Pin then Has", func(s *Store, d string) bool { s.Pin(d); return s.Has(d) }},
		{"Keep (an upload already there)", func(s *Store, d string) bool { return s.Keep(d) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			d := oldOrphan(t, s, "an input "+tc.name)
			found := make(chan bool, 1)
			waiting := make(chan struct{}, 1)
			raceHook(t, func(stage, hd string) {
				switch stage {
				case "waiting":
					// The claim waits for the sweep lock.
					waiting <- struct{}{}
				case "checked":
					// The sweep found d idle and holds the sweep lock:
					// the claim runs now, and either completes or waits.
					go func() { found <- tc.claim(s, d) }()
					select {
					case f := <-found:
						found <- f
					case <-waiting:
					}
				}
			})
			if _, err := s.Sweep(SweepPolicy{Referenced: func(string) bool { return false }, LeaseTTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if <-found && !s.Has(d) {
				t.Errorf("the claim found blob %s during the sweep, and the sweep removed it", d)
			}
		})
	}
}

// An upload of a blob leased after the sweep looked at its lease: the
// sweep looks again under its lock and spares it.
func TestLeaseDuringSweepSparesTheBlob(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := oldOrphan(t, s, "an upload")
	raceHook(t, func(stage, hd string) {
		if stage == "locked" {
			if err := s.Lease(d); err != nil {
				t.Error(err)
			}
		}
	})
	if _, err := s.Sweep(SweepPolicy{Referenced: func(string) bool { return false }, LeaseTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if !s.Has(d) {
		t.Errorf("blob %s, leased before the sweep removed it, is gone", d)
	}
}
