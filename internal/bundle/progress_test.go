package bundle

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
)

// Ingest and PackProgress report the canonical bytes they write; the last
// report is the whole blob.
func TestProgressReportsBytes(t *testing.T) {
	dir := t.TempDir()
	buildTree(t, dir, []node{{path: "a.txt", data: "hello\n"}, {path: "sub/b.txt", data: "world\n"}})
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	calls := 0
	sum, err := Ingest(context.Background(), st, dir, Options{Progress: func(n int64) { last, calls = n, calls+1 }})
	if err != nil {
		t.Fatal(err)
	}
	if calls == 0 || last != sum.Size {
		t.Errorf("ingest: %d reports, last %d bytes, want the canonical tar's %d", calls, last, sum.Size)
	}

	last, calls = 0, 0
	b, err := PackProgress(context.Background(), filepath.Join("testdata", "example-bundle"), filepath.Join(t.TempDir(), "layout"), DefaultLimits(), func(n int64) { last, calls = n, calls+1 })
	if err != nil {
		t.Fatal(err)
	}
	if calls == 0 || last != b.LayerSize {
		t.Errorf("pack: %d reports, last %d bytes, want the layer's %d", calls, last, b.LayerSize)
	}
}
