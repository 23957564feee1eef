package server

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/store"
)

// A recovered job proven never run is queued again in its acceptance
// order: ahead of the jobs accepted after it (requeued at the restart,
// or submitted since), behind those accepted before it.
func TestAJobThatNeverRanIsQueuedInItsPlace(t *testing.T) {
	dir := t.TempDir()
	jr, err := journal.Open(filepath.Join(dir, "journal.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jr.Close() })
	blobs, _ := store.Open(filepath.Join(dir, "blobs"))
	signer, _ := receipt.NewEphemeralSigner()
	cfg := Default()
	cfg.Broker, cfg.Blobs, cfg.Journal, cfg.Signer = newFake(), blobs, jr, signer
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	recs := map[string]journal.Record{}
	at := time.Now()
	for i, id := range []string{"a", "b", "c", "d", "e"} {
		j := newJob(t, id, "true")
		canon, err := j.CanonicalJSON()
		if err != nil {
			t.Fatal(err)
		}
		rec, _, err := jr.Accept(j, canon, []byte("receipt"), at.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		recs[id] = rec
	}
	// a and d requeued at the restart, e submitted since; c's recovery
	// proved it never ran.
	s.queue = []string{"a", "d", "e"}
	s.enqueueInOrder(recs["c"])
	if want := []string{"a", "c", "d", "e"}; !slices.Equal(s.queue, want) {
		t.Fatalf("queue %v, want %v", s.queue, want)
	}
	// With nothing accepted after it queued, it goes last.
	s.queue = []string{"a"}
	s.enqueueInOrder(recs["b"])
	if want := []string{"a", "b"}; !slices.Equal(s.queue, want) {
		t.Fatalf("queue %v, want %v", s.queue, want)
	}
}
