package broker

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker/enginefake"
	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/sandbox"
)

// countingReader counts what a fake helper read of its stdin.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// A writable input is re-checked while its sandbox starts: one that no
// longer holds its digest ends the job in an error naming the input, and
// the helper is sent nothing, not even its config frame.
func TestAWritableInputFailingItsCheckSendsNothing(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	var read atomic.Int64
	helper := enginefake.Helper("hi", shim.Status{}, nil)
	// The fake helper reads its whole stdin (config frame and inputs)
	// before it answers.
	eng.Program = func(c *enginefake.Container, stdin io.Reader, out, errw io.Writer) int {
		all, err := io.ReadAll(countingReader{stdin, &read})
		if err != nil {
			return 1
		}
		return helper(c, bytes.NewReader(all), out, errw)
	}
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main // "+strings.Repeat("x", 600)), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := bundle.Ingest(context.Background(), b.blobs, ws, bundle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	job := fakeJob(t, "job-tampered", func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "ws", Digest: sum.Digest, Path: sandbox.WorkPath, Writable: true}}
	})
	if res, _ := runJob(t, b, job); res.Status != sandbox.StatusSucceeded {
		t.Fatalf("with the input intact: %s (%s), want succeeded", res.Status, res.Cause)
	}
	p, _ := b.blobs.Path(sum.Digest)
	raw, _ := os.ReadFile(p)
	raw[1030] ^= 1 // a byte of the file's content
	os.Chmod(p, 0o600)
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	read.Store(0)
	job = fakeJob(t, "job-tampered-2", func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "ws", Digest: sum.Digest, Path: sandbox.WorkPath, Writable: true}}
	})
	done := make(chan sandbox.Result, 1)
	go func() { res, _ := runJob(t, b, job); done <- res }()
	var res sandbox.Result
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the job with a tampered input did not end")
	}
	if res.Status != sandbox.StatusError || !strings.Contains(res.Cause, "input ws") || !strings.Contains(res.Cause, "digest") {
		t.Fatalf("got %s (%s), want an error naming the input and its digest", res.Status, res.Cause)
	}
	if n := read.Load(); n != 0 {
		t.Fatalf("the helper read %d bytes of stdin, want none", n)
	}
	if left := eng.Containers(); len(left) != 0 {
		t.Fatalf("containers left: %v", left)
	}
}
