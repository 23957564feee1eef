package shim

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

func TestStuffRoundTripHasNoNewline(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := [][]byte{
		{}, {'\n'}, {stuffEsc}, {stuffEsc, stuffNewline}, bytes.Repeat([]byte{'\n'}, 70000),
		bytes.Repeat([]byte{stuffEsc, '\n', 'a'}, 30000),
	}
	for range 20 {
		b := make([]byte, rng.IntN(200000))
		for i := range b {
			b[i] = []byte{'\n', stuffEsc, stuffNewline, stuffSelf, 'x', byte(rng.UintN(256))}[rng.IntN(6)]
		}
		inputs = append(inputs, b)
	}
	for _, in := range inputs {
		var enc bytes.Buffer
		w := NewStuffWriter(&enc)
		// Written in uneven pieces, read in one-byte and odd-sized reads.
		for rest := in; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(5000))
			if n, err := w.Write(rest[:k]); err != nil || n != k {
				t.Fatalf("Write of %d bytes = %d, %v", k, n, err)
			}
			rest = rest[k:]
		}
		if bytes.IndexByte(enc.Bytes(), '\n') >= 0 {
			t.Fatal("the stuffed stream holds a newline")
		}
		for _, r := range []io.Reader{bytes.NewReader(enc.Bytes()), iotest.OneByteReader(bytes.NewReader(enc.Bytes())), iotest.HalfReader(bytes.NewReader(enc.Bytes()))} {
			got, err := io.ReadAll(NewUnstuffReader(r))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, in) {
				t.Fatalf("round trip of %d bytes gave %d different bytes", len(in), len(got))
			}
		}
	}
}

func TestUnstuffRefusesWhatStuffingNeverWrites(t *testing.T) {
	for _, in := range []string{"ab\ncd", "ab\x1b", "\x1b", "ab\x1b\x03cd", "\x1b\x1b"} {
		_, err := io.ReadAll(NewUnstuffReader(iotest.OneByteReader(bytes.NewReader([]byte(in)))))
		if !errors.Is(err, ErrStuffing) {
			t.Errorf("%q: got %v, want ErrStuffing", in, err)
		}
		_, err = io.ReadAll(NewUnstuffReader(bytes.NewReader([]byte(in))))
		if !errors.Is(err, ErrStuffing) {
			t.Errorf("%q (one read): got %v, want ErrStuffing", in, err)
		}
	}
}

// special finds the first newline or escape wherever it is: in the first
// window or a later one, before or after the other byte.
func TestSpecialFindsTheFirstOfEither(t *testing.T) {
	naive := func(b []byte) int { return bytes.IndexAny(b, "\n\x1b") }
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		b := bytes.Repeat([]byte{'x'}, rng.IntN(4*specialWindow))
		for range rng.IntN(3) {
			if len(b) > 0 {
				b[rng.IntN(len(b))] = []byte{'\n', stuffEsc}[rng.IntN(2)]
			}
		}
		if got, want := special(b), naive(b); got != want {
			t.Fatalf("special = %d, want %d (len %d)", got, want, len(b))
		}
	}
}

// Stuffing and unstuffing random bytes (about one byte in 128 escaped):
// the collector reads every artifact through this.
func BenchmarkUnstuffRandom(b *testing.B) {
	in := make([]byte, 8<<20)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range in {
		in[i] = byte(rng.UintN(256))
	}
	var enc bytes.Buffer
	NewStuffWriter(&enc).Write(in)
	b.Run("stuff", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		w := NewStuffWriter(io.Discard)
		for b.Loop() {
			w.Write(in)
		}
	})
	b.Run("unstuff", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		buf := make([]byte, 32<<10)
		for b.Loop() {
			r := NewUnstuffReader(bytes.NewReader(enc.Bytes()))
			for {
				if _, err := r.Read(buf); err != nil {
					break
				}
			}
		}
	})
}
