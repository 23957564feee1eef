package broker

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker/enginefake"
	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/sandbox"
)

// recordingReader keeps what a fake helper read of its stdin.
type recordingReader struct {
	r   io.Reader
	mu  *sync.Mutex
	got *bytes.Buffer
}

func (c recordingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.mu.Lock()
	c.got.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

// writableInput ingests a workspace of one file, main.go, into b's store
// and returns its digest and a job option giving it as the writable input
// "ws" at the work path.
func writableInput(t *testing.T, b *Broker, content string) (string, func(*sandbox.Job)) {
	t.Helper()
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "main.go"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := bundle.Ingest(context.Background(), b.blobs, ws, bundle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return sum.Digest, func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "ws", Digest: sum.Digest, Path: sandbox.WorkPath, Writable: true}}
	}
}

// afterInput is what followed the one input on a helper's stdin: the
// config frame, the input's length and that many bytes, then this.
func afterInput(t *testing.T, stdin []byte) []byte {
	t.Helper()
	br := bytes.NewReader(stdin)
	if typ, _, err := shim.NewFrameReader(br).Next(); err != nil || typ != shim.FrameConfig {
		t.Fatalf("stdin does not start with the config frame: %v", err)
	}
	rest := stdin[len(stdin)-br.Len():]
	if len(rest) < 8 {
		t.Fatalf("no input header on stdin (%d bytes after the config)", len(rest))
	}
	n := int(binary.BigEndian.Uint64(rest[:8]))
	if len(rest) < 8+n {
		return nil // the input cut short
	}
	return rest[8+n:]
}

// A writable input is checked over the very bytes sent to the helper:
// intact, the go-ahead follows it; one that no longer holds its digest
// ends the job in an error naming the input, and the helper never gets
// the go-ahead (without which it runs nothing).
func TestAWritableInputFailingItsCheckGetsNoGoAhead(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	var mu sync.Mutex
	var stdin bytes.Buffer
	// The fake helper says hello (no input comes before it), reads its
	// whole stdin (config frame, the input and what follows), then
	// answers with the rest of its stream.
	eng.Program = func(c *enginefake.Container, in io.Reader, out, errw io.Writer) int {
		stream := enginefake.Stream(enginefake.Nonce(c), "hi", shim.Status{})
		hello := enginefake.HelloFrame(enginefake.Nonce(c))
		if _, err := out.Write(hello); err != nil {
			return 1
		}
		if _, err := io.ReadAll(recordingReader{in, &mu, &stdin}); err != nil {
			return 1
		}
		if _, err := out.Write(stream[len(hello):]); err != nil {
			return 1
		}
		return 0
	}
	read := func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return bytes.Clone(stdin.Bytes())
	}
	digest, withInput := writableInput(t, b, "package main // "+strings.Repeat("x", 600))
	job := fakeJob(t, "job-tampered", withInput)
	if res, _ := runJob(t, b, job); res.Status != sandbox.StatusSucceeded {
		t.Fatalf("with the input intact: %s (%s), want succeeded", res.Status, res.Cause)
	}
	if rest := afterInput(t, read()); !bytes.Equal(rest, []byte{shim.GoAhead}) {
		t.Fatalf("after the intact input came %q, want the go-ahead alone", rest)
	}
	p, _ := b.blobs.Path(digest)
	raw, _ := os.ReadFile(p)
	raw[1030] ^= 1 // a byte of the file's content
	os.Chmod(p, 0o600)
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	stdin.Reset()
	mu.Unlock()
	job = fakeJob(t, "job-tampered-2", withInput)
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
	if rest := afterInput(t, read()); len(rest) != 0 {
		t.Fatalf("after the tampered input came %q, want nothing (no go-ahead)", rest)
	}
	if left := eng.Containers(); len(left) != 0 {
		t.Fatalf("containers left: %v", left)
	}
}

// A helper that does not say this version's hello (a sandboxd-shim of
// another release, which might run on an input before the go-ahead) is
// sent its config and no input.
func TestAHelperOfAnotherVersionIsSentNoInput(t *testing.T) {
	b, eng := newFakeBroker(t, 0)
	var mu sync.Mutex
	var stdin bytes.Buffer
	eng.Program = func(c *enginefake.Container, in io.Reader, out, errw io.Writer) int {
		old := strings.Replace(string(enginefake.HelloFrame(enginefake.Nonce(c))), shim.Hello, "sandboxd-shim/2 ", 1)
		if _, err := out.Write([]byte(old)); err != nil {
			return 1
		}
		io.ReadAll(recordingReader{in, &mu, &stdin})
		return 0
	}
	_, withInput := writableInput(t, b, "package main")
	job := fakeJob(t, "job-old-helper", withInput)
	res, _ := runJob(t, b, job)
	if res.Status != sandbox.StatusError {
		t.Fatalf("got %s (%s), want an error", res.Status, res.Cause)
	}
	mu.Lock()
	got := bytes.Clone(stdin.Bytes())
	mu.Unlock()
	br := bytes.NewReader(got)
	if typ, _, err := shim.NewFrameReader(br).Next(); err != nil || typ != shim.FrameConfig {
		t.Fatalf("stdin does not start with the config frame: %v", err)
	}
	if br.Len() != 0 {
		t.Fatalf("%d bytes after the config frame, want none (no input)", br.Len())
	}
}
