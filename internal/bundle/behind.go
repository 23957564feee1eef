package bundle

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
)

// behindChunk is how much of the tar is handed over at a time.
const behindChunk = 1 << 20

// behindWriter passes what is written to it on to a hashing writer (the
// store's, which hashes and writes to disk) on a goroutine of its own, a
// chunk at a time: the tree's files are read and framed on one core while
// the tar is hashed and stored on another. Hashing and storing are half of
// an ingest's CPU time.
//
// It is a hashingWriter itself: Digest waits for everything accepted to
// have been passed on. An error of the inner writer is returned by the
// next Write and by close; after one, nothing more reaches it.
type behindWriter struct {
	w    hashingWriter
	base int64  // w.Size() when it was wrapped
	n    int64  // bytes accepted
	cur  []byte // being filled
	full chan []byte
	free chan []byte
	done chan struct{}
	err  error // the inner writer's; read only after done is closed, or through failed
	fail chan struct{}
	shut bool
}

func writeBehind(w hashingWriter) *behindWriter {
	b := &behindWriter{
		w: w, base: w.Size(),
		cur:  make([]byte, 0, behindChunk),
		full: make(chan []byte, 1),
		free: make(chan []byte, 2), // both buffers may come back after close
		done: make(chan struct{}),
		fail: make(chan struct{}),
	}
	b.free <- make([]byte, 0, behindChunk)
	go b.pass()
	return b
}

// pass runs on its own goroutine until full is closed.
func (b *behindWriter) pass() {
	defer close(b.done)
	for p := range b.full {
		if b.err == nil {
			if _, err := b.w.Write(p); err != nil {
				b.err = err
				close(b.fail)
			}
		}
		b.free <- p[:0]
	}
}

// failed is the inner writer's error once it had one.
func (b *behindWriter) failed() error {
	select {
	case <-b.fail:
		return b.err // written before fail was closed
	default:
		return nil
	}
}

func (b *behindWriter) Write(p []byte) (int, error) {
	if b.shut {
		return 0, errors.New("write behind: already closed")
	}
	if err := b.failed(); err != nil {
		return 0, err
	}
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), cap(b.cur)-len(b.cur))
		b.cur = append(b.cur, p[:k]...)
		p = p[k:]
		if len(b.cur) == cap(b.cur) {
			b.full <- b.cur
			b.cur = <-b.free
		}
	}
	b.n += int64(n)
	return n, nil
}

// close passes on what is left, waits for the goroutine and returns the
// inner writer's error, if it had one. It may be called more than once.
func (b *behindWriter) close() error {
	if !b.shut {
		b.shut = true
		if len(b.cur) > 0 {
			b.full <- b.cur
			b.cur = nil
		}
		close(b.full)
		<-b.done
	}
	return b.err
}

// Size is what the inner writer held when wrapped and what was accepted since.
func (b *behindWriter) Size() int64 { return b.base + b.n }

// Digest is the inner writer's, once everything accepted reached it: it
// closes the writer (no Write after it). After an error of the inner
// writer it is not the digest of what was accepted: callers check close
// first (toStore does).
func (b *behindWriter) Digest() string {
	b.close()
	return b.w.Digest()
}

// hashOnly is a hashingWriter that keeps nothing: a dry run's sink.
type hashOnly struct {
	h hash.Hash
	n int64
}

func (d *hashOnly) Write(p []byte) (int, error) {
	d.h.Write(p)
	d.n += int64(len(p))
	return len(p), nil
}

func (d *hashOnly) Size() int64    { return d.n }
func (d *hashOnly) Digest() string { return "sha256:" + hex.EncodeToString(d.h.Sum(nil)) }

func newHashOnly() *hashOnly { return &hashOnly{h: sha256.New()} }
