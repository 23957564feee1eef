package fleet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
)

// cutCoordinator serves one blob whose first read is cut as a stream
// leader's loss cuts it: the object store's pipe times out mid-read.
type cutCoordinator struct {
	Coordinator
	content []byte
	opens   int
}

func (c *cutCoordinator) Blob(ctx context.Context, digest string) (io.ReadCloser, error) {
	c.opens++
	if c.opens > 1 {
		return &checkedReader{r: bytes.NewReader(c.content), h: sha256.New(), want: digest, done: func() {}}, nil
	}
	a, b := net.Pipe()
	go func() { b.Write(c.content[:3]) }()
	a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	return &checkedReader{r: a, h: sha256.New(), want: digest, done: func() { a.Close(); b.Close() }}, nil
}

func TestBlobReadCutByTimeoutIsUnavailable(t *testing.T) {
	content := []byte("stdout of a job")
	sum := sha256.Sum256(content)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	co := &cutCoordinator{content: content}

	if _, err := readBlob(context.Background(), co, digest, 1<<10); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a read cut by a pipe timeout: got %v, want an error wrapping ErrUnavailable", err)
	}

	co.opens = 0
	r := NewRunner(co, sandbox.KeySet{})
	got, err := r.Blob(context.Background(), digest, 1<<10)
	if err != nil {
		t.Fatalf("runner Blob across one cut read: %v", err)
	}
	if !bytes.Equal(got, content) || co.opens != 2 {
		t.Errorf("runner Blob = %q after %d opens, want %q after 2", got, co.opens, content)
	}
}
