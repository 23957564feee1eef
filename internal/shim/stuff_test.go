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
			if _, err := w.Write(rest[:k]); err != nil {
				t.Fatal(err)
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
