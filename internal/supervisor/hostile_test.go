package supervisor

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// genReader streams head, then unit repeated, then tail, size bytes in all,
// without holding more than one unit in memory.
type genReader struct {
	head, unit, tail []byte
	size, off        int64
}

func newGen(head, unit, tail string, size int64) *genReader {
	return &genReader{head: []byte(head), unit: []byte(unit), tail: []byte(tail), size: size}
}

func (g *genReader) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && g.off < g.size {
		var b byte
		bodyEnd := g.size - int64(len(g.tail))
		switch {
		case g.off < int64(len(g.head)):
			b = g.head[g.off]
		case g.off >= bodyEnd:
			b = g.tail[g.off-bodyEnd]
		default:
			b = g.unit[(g.off-int64(len(g.head)))%int64(len(g.unit))]
		}
		p[n] = b
		n++
		g.off++
	}
	return n, nil
}

// peakHeap runs f and returns the largest HeapAlloc seen above the level
// before it, sampled every 5 ms, and the bytes f allocated in all.
func peakHeap(f func()) (peak, total uint64) {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var mu sync.Mutex
	max := before.HeapAlloc
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				mu.Lock()
				if ms.HeapAlloc > max {
					max = ms.HeapAlloc
				}
				mu.Unlock()
			}
		}
	}()
	f()
	close(done)
	wg.Wait()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if after.HeapAlloc > max {
		max = after.HeapAlloc
	}
	if max < before.HeapAlloc {
		return 0, after.TotalAlloc - before.TotalAlloc
	}
	return max - before.HeapAlloc, after.TotalAlloc - before.TotalAlloc
}

const gib = int64(1) << 30

// TestHostileXML: each document ends in a parser error, which Judge
// turns into an inconclusive verdict, within a memory bound.
func TestHostileXML(t *testing.T) {
	cases := []struct {
		name      string
		r         func() io.Reader
		wantErr   error
		peakBound uint64
	}{
		{"billion laughs", func() io.Reader { return bytes.NewReader(readFixture(t, "malformed/billion-laughs.xml")) }, ErrUnparseable, 1 << 20},
		{"external entity", func() io.Reader { return bytes.NewReader(readFixture(t, "malformed/xxe.xml")) }, ErrUnparseable, 1 << 20},
		{"doctype after a comment", func() io.Reader {
			return strings.NewReader("<?xml version=\"1.0\"?><!-- hi --><!DOCTYPE x SYSTEM \"http://example.invalid/x.dtd\"><testsuites/>")
		}, ErrUnparseable, 1 << 20},
		{"nested a million deep (10 MB)", func() io.Reader {
			return newGen("<testsuites>", "<testsuite>", "", 10<<20)
		}, ErrTooLarge, 4 << 20},
		{"1 GiB of test cases", func() io.Reader {
			return newGen(`<testsuites><testsuite name="big">`, `<testcase classname="c" name="t"/>`, `</testsuite></testsuites>`, gib)
		}, ErrTooLarge, 128 << 20},
		{"1 GiB of captured output", func() io.Reader {
			return newGen(`<testsuites><testsuite name="big"><system-out>`, "lol ", `</system-out></testsuite></testsuites>`, gib)
		}, ErrTooLarge, 256 << 20},
		{"1 GiB of elements", func() io.Reader {
			return newGen(`<testsuites><testsuite name="big"><properties>`, `<property name="a" value="b"/>`, `</properties></testsuite></testsuites>`, gib)
		}, ErrTooLarge, 128 << 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			peak, total := peakHeap(func() { _, err = ParseJUnitXML(tc.r(), ParseLimits{}) })
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("got err %v, want %v", err, tc.wantErr)
			}
			t.Logf("error %q; peak heap +%.1f MiB, allocated %.1f MiB", err, float64(peak)/(1<<20), float64(total)/(1<<20))
			if peak > tc.peakBound {
				t.Errorf("peak heap: got %d bytes, want at most %d", peak, tc.peakBound)
			}
		})
	}
}

// TestHugeReportBoundedMemory streams a 1 GiB report through Judge: an
// artifact that says it is 1 GiB is refused unread; one that claims to be
// small but streams 1 GiB is read only to the cap. Both are inconclusive.
func TestHugeReportBoundedMemory(t *testing.T) {
	gen := func() io.Reader {
		return newGen(`<testsuites><testsuite name="big">`, `<testcase classname="c" name="t"/>`, `</testsuite></testsuites>`, gib)
	}
	pol := Policy{Format: FormatJUnitXML, AllReported: true}

	t.Run("artifact says 1 GiB", func(t *testing.T) {
		ev := evidence(pol, nil, 0)
		ev.Grader.Artifacts[0].Size = gib
		g := gen()
		ev.Report = g
		a := mustJudge(t, ev)
		if a.Verdict != Inconclusive || !hasReason(a, RuleReportOverCap) {
			t.Errorf("got %s %q, want inconclusive by %s", a.Verdict, a.Reasons, RuleReportOverCap)
		}
		if n := g.(*genReader).off; n != 0 {
			t.Errorf("read %d bytes of a report over the cap, want 0", n)
		}
	})
	t.Run("artifact lies about its size", func(t *testing.T) {
		ev := evidence(pol, []byte("<testsuites/>"), 0)
		g := gen()
		ev.Report = g
		var a Assessment
		peak, total := peakHeap(func() { a = mustJudge(t, ev) })
		if a.Verdict != Inconclusive {
			t.Errorf("verdict: got %s, want inconclusive", a.Verdict)
		}
		if !hasReason(a, RuleReportOverCap) {
			t.Errorf("reasons: got %q, want %s", a.Reasons, RuleReportOverCap)
		}
		if read := g.(*genReader).off; read > DefaultMaxReportBytes+1 {
			t.Errorf("read %d bytes, want at most the cap %d+1", read, DefaultMaxReportBytes)
		}
		t.Logf("read %d of %d bytes; peak heap +%.1f MiB, allocated %.1f MiB", g.(*genReader).off, gib, float64(peak)/(1<<20), float64(total)/(1<<20))
		if peak > 128<<20 {
			t.Errorf("peak heap: got %d bytes, want at most 128 MiB", peak)
		}
	})
}

// TestParserLimits: every parser stops at its byte, line and check limits.
func TestParserLimits(t *testing.T) {
	cases := []struct {
		name   string
		format Format
		r      io.Reader
		lim    ParseLimits
	}{
		{"go test bytes", FormatGoTestJSON, newGen("", `{"Action":"output","Package":"p","Output":"x"}`+"\n", "", 1<<20), ParseLimits{MaxBytes: 1 << 16}},
		{"go test line", FormatGoTestJSON, newGen(`{"Action":"output","Output":"`, "x", `"}`, 1<<20), ParseLimits{MaxLine: 1 << 12}},
		{"go test checks", FormatGoTestJSON, newGen("", `{"Action":"pass","Package":"p","Test":"T"}`+"\n", "", 1<<20), ParseLimits{MaxChecks: 10}},
		{"tap bytes", FormatTAP, newGen("1..1\n", "# comment\n", "", 1<<20), ParseLimits{MaxBytes: 1 << 16}},
		{"tap checks", FormatTAP, newGen("", "ok\n", "", 1<<20), ParseLimits{MaxChecks: 10}},
		{"tap depth", FormatTAP, newGen("", "    ", "ok\n", 4*1000+3), ParseLimits{}},
		{"in-toto bytes", FormatInTotoTestResult, newGen(`{"passedTests":["`, "x", `"]}`, 1<<20), ParseLimits{MaxBytes: 1 << 16}},
		{"junit depth", FormatJUnitXML, newGen("<testsuites>", "<testsuite>", "", 1<<16), ParseLimits{MaxDepth: 8}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.format, tc.r, tc.lim)
			if !errors.Is(err, ErrTooLarge) {
				t.Errorf("got err %v, want ErrTooLarge", err)
			}
		})
	}
}

// TestParseAllocs measures allocations of parsing a real report, to keep
// the parsers from regressing into reading whole documents twice.
func TestParseAllocs(t *testing.T) {
	data := readFixture(t, "junit/surefire-mixed.xml")
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := ParseJUnitXML(bytes.NewReader(data), ParseLimits{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("ParseJUnitXML(surefire-mixed.xml, %d bytes): %.0f allocs per run", len(data), allocs)
	if allocs > 2000 {
		t.Errorf("allocs: got %.0f, want at most 2000", allocs)
	}
}
