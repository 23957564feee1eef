package supervisor

import (
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Format names a grader report format, as a bundle declares it.
type Format string

// The report formats the supervisor parses.
const (
	FormatGoTestJSON       Format = "go-test-json"        // go test -json (test2json events)
	FormatJUnitXML         Format = "junit-xml"           // pytest, go-junit-report, Maven Surefire, …
	FormatTAP              Format = "tap"                 // TAP 13 and 14
	FormatInTotoTestResult Format = "in-toto-test-result" // https://in-toto.io/attestation/test-result/v0.1
)

// Valid reports whether f is a format the supervisor parses.
func (f Format) Valid() bool {
	switch f {
	case FormatGoTestJSON, FormatJUnitXML, FormatTAP, FormatInTotoTestResult:
		return true
	}
	return false
}

// CheckStatus is the normalized outcome of one check as the report states it.
type CheckStatus string

// Normalized check statuses. Error means the check did not produce a result
// of its own (a crash, a build failure, a setup error, a test that never
// ended); it is never read as passed.
const (
	CheckPassed  CheckStatus = "passed"
	CheckFailed  CheckStatus = "failed"
	CheckSkipped CheckStatus = "skipped"
	CheckError   CheckStatus = "error"
)

// Check is one test result in normalized form.
type Check struct {
	// Name identifies the check: "<suite>.<test>" where the format has a
	// suite (go package, JUnit classname), subtests joined with "/".
	Name     string        `json:"name"`
	Status   CheckStatus   `json:"status"`
	Duration time.Duration `json:"duration_ns"`
	// Message is the report's own short explanation, truncated. It is for
	// people and never decides a verdict.
	Message string `json:"message,omitempty"`
}

// Report is a parsed grader report.
type Report struct {
	Format Format  `json:"format"`
	Checks []Check `json:"checks"`
	// Incomplete says why the report itself shows it was cut short (a TAP
	// "Bail out!", a plan the tests did not meet); such a report decides
	// nothing, whichever checks a policy requires.
	Incomplete string `json:"incomplete,omitempty"`
}

// ParseLimits bound what a parser reads and keeps. The zero value of a field
// means its default.
type ParseLimits struct {
	MaxBytes    int64 // bytes read from the report
	MaxDepth    int   // XML element nesting, TAP subtest nesting
	MaxElements int   // XML elements (start tags)
	MaxChecks   int   // checks in a report
	MaxLine     int   // bytes in one line of a line-based format
}

// Default parser limits.
const (
	DefaultMaxReportBytes = 64 << 20
	DefaultMaxDepth       = 32
	DefaultMaxElements    = 1_000_000
	DefaultMaxChecks      = 100_000
	DefaultMaxLine        = 1 << 20
	maxNameBytes          = 4096
	maxMessageBytes       = 512
)

func (l ParseLimits) withDefaults() ParseLimits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxReportBytes
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	if l.MaxElements <= 0 {
		l.MaxElements = DefaultMaxElements
	}
	if l.MaxChecks <= 0 {
		l.MaxChecks = DefaultMaxChecks
	}
	if l.MaxLine <= 0 {
		l.MaxLine = DefaultMaxLine
	}
	return l
}

// Errors a parser returns. Both make a verdict inconclusive.
var (
	// ErrUnparseable marks a report that is not well-formed in its format,
	// or that is refused (a DTD, an entity declaration, an inconsistency).
	// It matches sandbox.ErrInvalid.
	ErrUnparseable = sandbox.NewSentinel("unparseable report", sandbox.ErrInvalid)
	// ErrTooLarge marks a report over one of the parser's limits. It
	// matches sandbox.ErrTooLarge.
	ErrTooLarge = sandbox.NewSentinel("report over limit", sandbox.ErrTooLarge)
)

func unparseable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnparseable, fmt.Sprintf(format, args...))
}

func tooLarge(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrTooLarge, fmt.Sprintf(format, args...))
}

// Parse reads a report of the given format from r within lim.
func Parse(format Format, r io.Reader, lim ParseLimits) (Report, error) {
	switch format {
	case FormatGoTestJSON:
		return ParseGoTestJSON(r, lim)
	case FormatJUnitXML:
		return ParseJUnitXML(r, lim)
	case FormatTAP:
		return ParseTAP(r, lim)
	case FormatInTotoTestResult:
		return ParseInTotoTestResult(r, lim)
	}
	return Report{}, fmt.Errorf("unknown report format %q", format)
}

// cappedReader fails once more than max bytes have been read, so that a
// parser never sees past the cap and the caller learns why it stopped.
type cappedReader struct {
	r   io.Reader
	max int64
	n   int64
}

func newCappedReader(r io.Reader, max int64) *cappedReader {
	return &cappedReader{r: io.LimitReader(r, max+1), max: max}
}

// exceeded reports whether the reader has refused bytes over its cap; a
// parser checks it before blaming a cut-off last line on the report.
func (c *cappedReader) exceeded() bool { return c.n > c.max }

// overOr returns the cap's error if the cap was reached, else err.
func (c *cappedReader) overOr(err error) error {
	if c.exceeded() {
		return tooLarge("more than %d bytes", c.max)
	}
	return err
}

func (c *cappedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		over := int(c.n - c.max)
		return n - over, tooLarge("more than %d bytes", c.max)
	}
	return n, err
}

// collector accumulates checks under the MaxChecks limit.
type collector struct {
	checks []Check
	max    int
}

func (c *collector) add(ch Check) error {
	if len(c.checks) >= c.max {
		return tooLarge("more than %d checks", c.max)
	}
	if ch.Name == "" {
		return unparseable("a check without a name")
	}
	if len(ch.Name) > maxNameBytes {
		return unparseable("a check name of %d bytes (at most %d)", len(ch.Name), maxNameBytes)
	}
	if !utf8.ValidString(ch.Name) {
		return unparseable("a check name that is not UTF-8")
	}
	ch.Message = shorten(ch.Message)
	c.checks = append(c.checks, ch)
	return nil
}

// shorten trims s to its first line and at most maxMessageBytes, on a rune
// boundary, so that messages stay small and printable.
func shorten(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[:i])
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxMessageBytes {
		return s
	}
	cut := maxMessageBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func joinName(suite, name string) string {
	if suite == "" {
		return name
	}
	if name == "" {
		return suite
	}
	return suite + "." + name
}
