package shim

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// The helper's stream is byte-stuffed so that it holds no newline. The
// engine's log driver (which keeps the stream for a broker that restarts)
// splits what a container writes at every newline and stores each piece
// as a record with about 26 bytes of its own: a stream of newlines (an
// artifact full of them, say) would take 27 times its size in the log and
// hit its max-size long before the job's output limit. Without newlines
// the driver stores 16 KiB records (under 1% more), and the log can be
// sized from the job's limits (see StreamBound).
const (
	stuffEsc     byte = 0x1b
	stuffNewline byte = 0x01 // ESC 0x01 stands for '\n'
	stuffSelf    byte = 0x02 // ESC 0x02 stands for ESC
)

// StuffWriter writes p to w with every '\n' and ESC escaped. Each Write
// makes one Write on w, so frames written whole stay whole.
type StuffWriter struct {
	w   io.Writer
	buf []byte
}

// NewStuffWriter returns a writer that stuffs what it is given into w.
func NewStuffWriter(w io.Writer) *StuffWriter { return &StuffWriter{w: w} }

func (s *StuffWriter) Write(p []byte) (int, error) {
	s.buf = s.buf[:0]
	for rest := p; len(rest) > 0; {
		k := special(rest)
		if k < 0 {
			s.buf = append(s.buf, rest...)
			break
		}
		s.buf = append(s.buf, rest[:k]...)
		if rest[k] == '\n' {
			s.buf = append(s.buf, stuffEsc, stuffNewline)
		} else {
			s.buf = append(s.buf, stuffEsc, stuffSelf)
		}
		rest = rest[k+1:]
	}
	if _, err := s.w.Write(s.buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// specialWindow is how far special looks for one byte before it looks
// for the other: far enough for the vector search to pay, near enough
// that a stream dense in one of them is not searched again and again for
// the other.
const specialWindow = 512

// special returns the index of the first newline or escape in b, or -1.
func special(b []byte) int {
	for off := 0; off < len(b); off += specialWindow {
		w := b[off:min(off+specialWindow, len(b))]
		k := bytes.IndexByte(w, stuffEsc)
		if k >= 0 {
			w = w[:k]
		}
		if j := bytes.IndexByte(w, '\n'); j >= 0 {
			return off + j
		}
		if k >= 0 {
			return off + k
		}
	}
	return -1
}

// ErrStuffing is returned for a stream that is not validly stuffed: a raw
// newline, or an escape followed by anything but its two codes.
var ErrStuffing = errors.New("stream is not byte-stuffed")

// UnstuffReader undoes StuffWriter.
type UnstuffReader struct {
	r *bufio.Reader
}

// NewUnstuffReader reads the stuffed stream r.
func NewUnstuffReader(r io.Reader) *UnstuffReader {
	return &UnstuffReader{r: bufio.NewReaderSize(r, 64<<10)}
}

func (u *UnstuffReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	// At least two bytes, so that an escape and its code are seen together.
	buf, err := u.r.Peek(2)
	if len(buf) == 0 {
		return 0, err
	}
	buf, _ = u.r.Peek(u.r.Buffered())
	n, i := 0, 0
	for i < len(buf) && n < len(p) {
		run := buf[i:]
		if k := special(run); k >= 0 {
			run = run[:k]
		}
		m := copy(p[n:], run)
		n, i = n+m, i+m
		if n == len(p) || i == len(buf) {
			break
		}
		if buf[i] == '\n' {
			u.r.Discard(i)
			return n, fmt.Errorf("raw newline: %w", ErrStuffing)
		}
		if i+1 == len(buf) {
			if n == 0 {
				// Only an escape is left: the stream ends in it.
				u.r.Discard(i)
				return 0, fmt.Errorf("stream ends in an escape: %w", ErrStuffing)
			}
			break
		}
		switch buf[i+1] {
		case stuffNewline:
			p[n] = '\n'
		case stuffSelf:
			p[n] = stuffEsc
		default:
			u.r.Discard(i)
			return n, fmt.Errorf("escape followed by %#x: %w", buf[i+1], ErrStuffing)
		}
		n, i = n+1, i+2
	}
	u.r.Discard(i)
	return n, nil
}
