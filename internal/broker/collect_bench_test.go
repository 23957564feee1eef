package broker

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// collectRun is a run whose limits admit files artifacts of size bytes.
func collectRun(tb testing.TB, files, size int) *run {
	tb.Helper()
	blobs, err := store.Open(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	l := sandbox.DefaultLimits()
	l.FileCount, l.OutputBytes = int64(files), int64(files*size)
	j := &sandbox.Job{ID: "j", Outputs: []string{"/work/out"}, Limits: l}
	return &run{b: &Broker{blobs: blobs}, job: j, nonce: testNonce}
}

// treeStream is the helper's stream for files distinct files of size bytes.
func treeStream(files, size int) []byte {
	s := new(stream).hello()
	content := make([]byte, size)
	for i := range files {
		copy(content, fmt.Sprintf("file %d ", i))
		s.file(fmt.Sprintf("/work/out/d%03d/f%04d", i/100, i), string(content))
	}
	return s.end(int64(files), int64(files*size)).Bytes()
}

// Every artifact the collector lists is in the blob store, with its
// content, once consume returns: commits run in parallel but never
// outlive it.
func TestCollectorArtifactsDurableOnReturn(t *testing.T) {
	const files, size = 300, 1000
	r := collectRun(t, files, size)
	c := newCollector(r)
	if err := c.consume(bytes.NewReader(treeStream(files, size))); err != nil {
		t.Fatal(err)
	}
	if why := c.incomplete(); why != "" {
		t.Fatalf("incomplete: %s", why)
	}
	var res sandbox.Result
	c.finish(&res)
	if len(res.Artifacts) != files {
		t.Fatalf("got %d artifacts, want %d", len(res.Artifacts), files)
	}
	for _, a := range res.Artifacts {
		if err := r.b.blobs.Verify(a.Digest); err != nil {
			t.Fatalf("artifact %s: got %v, want a stored blob matching its digest", a.Path, err)
		}
	}
}

// An artifact that cannot be stored fails the stream.
func TestCollectorFailsWhenAnArtifactCannotBeStored(t *testing.T) {
	const files, size = 50, 100
	r := collectRun(t, files, size)
	// A file where the blobs' directory should be: no artifact can be put
	// in place.
	dir := filepath.Join(r.b.blobs.Dir(), "sha256")
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCollector(r)
	err := c.consume(bytes.NewReader(treeStream(files, size)))
	if err == nil || !strings.Contains(err.Error(), "store artifacts") {
		t.Fatalf("got %v, want a store failure", err)
	}
}

// BenchmarkCollect5000Files is the broker's side of collecting item 3's
// tree (BENCHMARKS.md): 5,000 files of 20 KiB from the helper's stream
// into the blob store, each made durable.
func BenchmarkCollect5000Files(b *testing.B) {
	const files, size = 5000, 20 << 10
	stream := treeStream(files, size)
	b.SetBytes(int64(files * size))
	for b.Loop() {
		b.StopTimer()
		r := collectRun(b, files, size)
		b.StartTimer()
		c := newCollector(r)
		if err := c.consume(bytes.NewReader(stream)); err != nil {
			b.Fatal(err)
		}
		if why := c.incomplete(); why != "" {
			b.Fatal(why)
		}
	}
}

// BenchmarkCollect5000FilesAgain is BenchmarkCollect5000Files into a
// store that already holds every artifact: a job run again, and every
// round of bench/run's item 3 after the first.
func BenchmarkCollect5000FilesAgain(b *testing.B) {
	const files, size = 5000, 20 << 10
	stream := treeStream(files, size)
	r := collectRun(b, files, size)
	if err := newCollector(r).consume(bytes.NewReader(stream)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(files * size))
	for b.Loop() {
		c := newCollector(r)
		if err := c.consume(bytes.NewReader(stream)); err != nil {
			b.Fatal(err)
		}
		if why := c.incomplete(); why != "" {
			b.Fatal(why)
		}
	}
}
