package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// fakeClock moves only when told to.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }
func (c *fakeClock) tick()          { c.t = c.t.Add(time.Second) }

func clock() func() time.Time { return (&fakeClock{time.Unix(0, 0)}).now }

// steps reports two steps, a second passing between any two calls.
func steps(newReporter func(now func() time.Time) Reporter) {
	c := &fakeClock{time.Unix(0, 0)}
	r := newReporter(c.now)
	s := Start(r, "ingesting workspace w")
	c.tick()
	s.Update("reading", 512, 2)
	c.tick()
	s.Update("reading", 4096, 3)
	c.tick()
	s.End("done")
	j := Start(r, "job run-1-grader")
	c.tick()
	j.Update("staging", 2<<20, -1)
	c.tick()
	j.Update("running", -1, -1)
	c.tick()
	j.Update("collecting", 100, 1)
	c.tick()
	j.End("succeeded")
}

func TestPlainLines(t *testing.T) {
	var b bytes.Buffer
	steps(func(now func() time.Time) Reporter { return New(&b, Options{Now: now}) })
	want := []string{
		"sandboxd: ingesting workspace w",
		"sandboxd: ingesting workspace w: reading",
		"sandboxd: ingesting workspace w: done, 3 files, 4.0 KiB, 3.0s",
		"sandboxd: job run-1-grader",
		"sandboxd: job run-1-grader: staging",
		"sandboxd: job run-1-grader: running",
		"sandboxd: job run-1-grader: collecting",
		"sandboxd: job run-1-grader: succeeded, 1 files, 100 B, 4.0s",
	}
	if got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("plain output:\n%s\nwant:\n%s", b.String(), strings.Join(want, "\n"))
	}
	if strings.ContainsAny(b.String(), "\r\x1b") {
		t.Errorf("plain output has terminal controls: %q", b.String())
	}
}

func TestTerminalLineUpdates(t *testing.T) {
	var b bytes.Buffer
	steps(func(now func() time.Time) Reporter { return New(&b, Options{Terminal: true, Now: now}) })
	out := b.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("terminal output has %d lines, want one per step (2): %q", len(lines), out)
	}
	redraws := strings.Split(lines[1], "\r\x1b[K")
	last := redraws[len(redraws)-1]
	if len(redraws) < 5 || last != "sandboxd: job run-1-grader: succeeded, 1 files, 100 B, 4.0s" {
		t.Errorf("job line redrawn %d times ending %q: %q", len(redraws)-1, last, lines[1])
	}
	if !strings.Contains(lines[1], "sandboxd: job run-1-grader: staging, 2.0 MiB,") {
		t.Errorf("no staging state with its bytes in %q", lines[1])
	}
}

func TestNilReporterAndCounting(t *testing.T) {
	s := Start(nil, "x")
	s.Update("y", 1, 1)
	s.End("done")
	var b, sink bytes.Buffer
	st := Start(New(&b, Options{Now: clock()}), "pack")
	w := Counting(st, "writing", &sink)
	w.Write(make([]byte, 1500))
	w.Write(make([]byte, 548))
	st.End("done")
	if !strings.Contains(b.String(), "pack: done, 2.0 KiB") || sink.Len() != 2048 {
		t.Errorf("counting: %q (sink %d)", b.String(), sink.Len())
	}
	if got := Bytes(3 << 30); got != "3.0 GiB" {
		t.Errorf("Bytes(3 GiB) = %q", got)
	}
}
