package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Reporter starts steps. A nil Reporter is valid and reports nothing (use
// Start, which accepts it).
type Reporter interface {
	// Start begins a step named for a person ("ingesting workspace w/").
	Start(name string) Step
}

// Step is one long step. Its methods may be called from any goroutine.
type Step interface {
	// Update says which phase the step is in and how far it got: bytes
	// and files so far (a negative count is not shown).
	Update(phase string, bytes, files int64)
	// End ends the step with its outcome ("done", "failed: …").
	End(outcome string)
}

// Start begins a step on r; on a nil Reporter the step reports nothing.
func Start(r Reporter, name string) Step {
	if r == nil {
		return nop{}
	}
	return r.Start(name)
}

type nop struct{}

func (nop) Update(string, int64, int64) {}
func (nop) End(string)                  {}

// Options configure a Reporter.
type Options struct {
	// Terminal makes each step one line updated in place; otherwise a
	// line is written when a step starts, changes phase and ends.
	Terminal bool
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Every is the least time between two redraws of a terminal line
	// (100 ms when zero); a new phase and the end are always drawn.
	Every time.Duration
}

// New is a Reporter writing to w (stderr in the commands).
func New(w io.Writer, o Options) Reporter {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Every == 0 {
		o.Every = 100 * time.Millisecond
	}
	return &writer{w: w, o: o}
}

// IsTerminal reports whether w is a terminal (a character device), the
// test the commands use to choose Options.Terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Counting returns a writer that passes everything to w and reports the
// bytes written so far as the step's phase.
func Counting(st Step, phase string, w io.Writer) io.Writer {
	return &counting{st: st, phase: phase, w: w}
}

type counting struct {
	st    Step
	phase string
	w     io.Writer
	n     int64
}

func (c *counting) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.st.Update(c.phase, c.n, -1)
	return n, err
}

// writer is the Reporter of New. Steps share its writer: one step's line
// is drawn at a time, and a step that starts while another's line is
// shown ends that line first.
type writer struct {
	w  io.Writer
	o  Options
	mu sync.Mutex
	// open is the step whose updating line is on the terminal, if any.
	open *step
}

func (wr *writer) Start(name string) Step {
	s := &step{wr: wr, name: name, start: wr.o.Now(), bytes: -1, files: -1}
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if wr.o.Terminal {
		wr.draw(s, false)
	} else {
		fmt.Fprintf(wr.w, "sandboxd: %s\n", name)
	}
	return s
}

type step struct {
	wr           *writer
	name, phase  string
	start, drawn time.Time
	bytes, files int64
	ended        bool
}

func (s *step) Update(phase string, bytes, files int64) {
	wr := s.wr
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if s.ended {
		return
	}
	newPhase := phase != s.phase
	s.phase, s.bytes, s.files = phase, bytes, files
	if !wr.o.Terminal {
		if newPhase {
			fmt.Fprintf(wr.w, "sandboxd: %s: %s\n", s.name, phase)
		}
		return
	}
	if newPhase || wr.open != s || wr.o.Now().Sub(s.drawn) >= wr.o.Every {
		wr.draw(s, false)
	}
}

func (s *step) End(outcome string) {
	wr := s.wr
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	s.phase = outcome
	if wr.o.Terminal {
		wr.draw(s, true)
		return
	}
	fmt.Fprintf(wr.w, "sandboxd: %s: %s\n", s.name, s.line())
}

// draw shows s on the terminal line: \r and erase-line, then the text;
// final ends the line.
func (wr *writer) draw(s *step, final bool) {
	if wr.open != nil && wr.open != s {
		io.WriteString(wr.w, "\n") // keep the other step's last state
	}
	s.drawn = wr.o.Now()
	text := "sandboxd: " + s.name
	if l := s.line(); l != "" {
		text += ": " + l
	}
	io.WriteString(wr.w, "\r\x1b[K"+text)
	wr.open = s
	if final {
		io.WriteString(wr.w, "\n")
		wr.open = nil
	}
}

// line is a step's phase, amounts and elapsed time.
func (s *step) line() string {
	var parts []string
	if s.phase != "" {
		parts = append(parts, s.phase)
	}
	if s.files >= 0 {
		parts = append(parts, fmt.Sprintf("%d files", s.files))
	}
	if s.bytes >= 0 {
		parts = append(parts, Bytes(s.bytes))
	}
	parts = append(parts, fmt.Sprintf("%.1fs", s.wr.o.Now().Sub(s.start).Seconds()))
	return strings.Join(parts, ", ")
}

// Bytes formats a byte count for a person: 512 B, 3.4 KiB, 12.0 MiB.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
