package broker

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
	"time"
)

func TestCopyHashedGivesTheHashWhatItCopies(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, size := range []int{0, 1, copyChunk - 1, copyChunk, 2*copyChunk + 5, 5*copyChunk + 3} {
		src := make([]byte, size)
		for i := range src {
			src[i] = byte(rng.UintN(256))
		}
		for _, r := range []io.Reader{bytes.NewReader(src), iotest.HalfReader(bytes.NewReader(src)), iotest.DataErrReader(bytes.NewReader(src))} {
			var dst bytes.Buffer
			h := sha256.New()
			n, err := copyHashed(&dst, r, h)
			if err != nil || n != int64(size) || !bytes.Equal(dst.Bytes(), src) {
				t.Fatalf("%d bytes: copied %d, %v; the copy is equal: %v", size, n, err, bytes.Equal(dst.Bytes(), src))
			}
			if want := sha256.Sum256(src); !bytes.Equal(h.Sum(nil), want[:]) {
				t.Fatalf("%d bytes: the hash is not of what was copied", size)
			}
		}
	}
}

type failAfter struct{ left int }

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.left {
		n := f.left
		f.left = 0
		return n, errors.New("stdin closed")
	}
	f.left -= len(p)
	return len(p), nil
}

func TestCopyHashedStopsAtAnError(t *testing.T) {
	src := bytes.Repeat([]byte{7}, 4*copyChunk)
	n, err := copyHashed(&failAfter{left: copyChunk + 10}, bytes.NewReader(src), sha256.New())
	if err == nil || err.Error() != "stdin closed" || n != copyChunk+10 {
		t.Fatalf("copied %d, %v; want %d and the writer's error", n, err, copyChunk+10)
	}
	n, err = copyHashed(io.Discard, iotest.TimeoutReader(bytes.NewReader(src)), sha256.New())
	if !errors.Is(err, iotest.ErrTimeout) || n != copyChunk {
		t.Fatalf("copied %d, %v; want one chunk and the reader's error", n, err)
	}
}

// A check that ended (it failed part way) stops the copy: the rest of a
// large input is not sent.
func TestCopyHashedStopsWhenTheHashSideFails(t *testing.T) {
	src := bytes.Repeat([]byte{7}, 16*copyChunk)
	var dst bytes.Buffer
	n, err := copyHashed(&dst, bytes.NewReader(src), &failAfter{left: copyChunk + 10})
	if err == nil || err.Error() != "stdin closed" {
		t.Fatalf("copied %d, %v; want the hash side's error", n, err)
	}
	if n > 4*copyChunk || int64(dst.Len()) != n {
		t.Fatalf("copied %d bytes (%d written) after the hash side failed in the second chunk; want at most a few chunks", n, dst.Len())
	}
}

// zeroEveryOther returns (0, nil) every other call, as io.Reader allows.
type zeroEveryOther struct {
	r    io.Reader
	zero bool
}

func (z *zeroEveryOther) Read(p []byte) (int, error) {
	z.zero = !z.zero
	if z.zero {
		return 0, nil
	}
	return z.r.Read(p)
}

// slowHash takes its time with each chunk, so that a buffer still being
// hashed would be overwritten by a copy that reused it too early.
type slowHash struct{ h io.Writer }

func (s slowHash) Write(p []byte) (int, error) {
	time.Sleep(2 * time.Millisecond)
	return s.h.Write(p)
}

// A read that returns nothing does not hand over a buffer: the hash gets
// exactly the bytes sent, however the reader paces them.
func TestCopyHashedWithEmptyReads(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6)) // no two chunks alike
	src := make([]byte, 8*copyChunk+3)
	for i := range src {
		src[i] = byte(rng.UintN(256))
	}
	var dst bytes.Buffer
	h := sha256.New()
	r := &zeroEveryOther{r: iotest.HalfReader(bytes.NewReader(src)), zero: true} // data first
	if _, err := copyHashed(&dst, r, slowHash{h}); err != nil {
		t.Fatal(err)
	}
	if want := sha256.Sum256(src); !bytes.Equal(dst.Bytes(), src) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("the hash is not of the bytes copied")
	}
}
