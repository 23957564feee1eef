package bundle

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
)

// benchTree writes files distinct files of size random bytes, 100 to a
// directory, as item 3 of BENCHMARKS.md does.
func benchTree(b *testing.B, files, size int) string {
	b.Helper()
	dir := b.TempDir()
	rng := rand.New(rand.NewPCG(7, 8))
	buf := make([]byte, size)
	for i := range files {
		sub := filepath.Join(dir, fmt.Sprintf("d%02d", i/100))
		if i%100 == 0 {
			if err := os.Mkdir(sub, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		for j := range buf {
			buf[j] = byte(rng.UintN(256))
		}
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%04d.bin", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// Ingesting item 3's workspace (100 MiB in 5,000 files) into a store that
// already holds it, as every round of the bench after the first does.
func BenchmarkIngest5000Files(b *testing.B) {
	const files, size = 5000, 100 << 20 / 5000
	ws := benchTree(b, files, size)
	st, err := store.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(files * size)
	for b.Loop() {
		if _, err := Ingest(context.Background(), st, ws, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// Checking item 3's workspace as a stored tar, as the broker does for a
// job's input before and while it is staged.
func BenchmarkCheckTar5000Files(b *testing.B) {
	const files, size = 5000, 100 << 20 / 5000
	ws := benchTree(b, files, size)
	var tarball bytes.Buffer
	sum, err := WriteDir(context.Background(), ws, &tarball, DefaultLimits())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(tarball.Len()))
	for b.Loop() {
		if _, err := CheckTar(context.Background(), bytes.NewReader(tarball.Bytes()), DefaultLimits(), sum.Digest); err != nil {
			b.Fatal(err)
		}
	}
}
