package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"testing"
)

// keepAll is a hashingWriter that keeps what it is given, and fails once
// it holds more than failAfter bytes (if failAfter > 0).
type keepAll struct {
	hashOnly
	buf       bytes.Buffer
	failAfter int
	writes    int
}

func (k *keepAll) Write(p []byte) (int, error) {
	k.writes++
	if k.failAfter > 0 && k.buf.Len()+len(p) > k.failAfter {
		return 0, errors.New("disk full")
	}
	k.buf.Write(p)
	return k.hashOnly.Write(p)
}

func TestWriteBehindPassesEverythingOnInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sizes := range [][]int{
		nil,
		{0},
		{1},
		{behindChunk},
		{behindChunk - 1, 1, 1},
		{3*behindChunk + 17},
		{512, 20 << 10, 0, 512, 5 << 20, 100, behindChunk, 3},
	} {
		inner := &keepAll{hashOnly: *newHashOnly()}
		b := writeBehind(inner)
		var want bytes.Buffer
		for _, n := range sizes {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(rng.UintN(256))
			}
			want.Write(p)
			if m, err := b.Write(p); err != nil || m != n {
				t.Fatalf("%v: Write(%d) = %d, %v", sizes, n, m, err)
			}
			if b.Size() != int64(want.Len()) {
				t.Fatalf("%v: Size %d after %d bytes", sizes, b.Size(), want.Len())
			}
		}
		sum := sha256.Sum256(want.Bytes())
		if got, wantD := b.Digest(), "sha256:"+hex.EncodeToString(sum[:]); got != wantD {
			t.Errorf("%v: Digest %s, want %s", sizes, got, wantD)
		}
		if err := b.close(); err != nil {
			t.Errorf("%v: close: %v", sizes, err)
		}
		if !bytes.Equal(inner.buf.Bytes(), want.Bytes()) {
			t.Errorf("%v: the inner writer got %d bytes, not the %d written, in order", sizes, inner.buf.Len(), want.Len())
		}
		if _, err := b.Write([]byte("x")); err == nil {
			t.Errorf("%v: a Write after close was accepted", sizes)
		}
	}
}

func TestWriteBehindStopsAtTheInnerWritersError(t *testing.T) {
	inner := &keepAll{hashOnly: *newHashOnly(), failAfter: 2*behindChunk + 5}
	b := writeBehind(inner)
	p := make([]byte, behindChunk/2)
	var werr error
	for range 64 { // 32 MiB: far past the failure
		if _, werr = b.Write(p); werr != nil {
			break
		}
	}
	cerr := b.close()
	if cerr == nil || cerr.Error() != "disk full" {
		t.Fatalf("close = %v, want the inner writer's error", cerr)
	}
	if werr != nil && werr.Error() != "disk full" {
		t.Errorf("Write = %v, want the inner writer's error", werr)
	}
	if inner.buf.Len() != 2*behindChunk || inner.writes != 3 {
		t.Errorf("the inner writer holds %d bytes after %d writes; want two chunks, and nothing passed on after the failed third", inner.buf.Len(), inner.writes)
	}
	if err := b.close(); err == nil {
		t.Error("a second close forgot the error")
	}
}
