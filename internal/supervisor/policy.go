package supervisor

import (
	"fmt"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Policy is what a bundle declares about its grader's report: the supervisor
// judges the report only against it, never against anything the candidate
// or the report says about itself.
type Policy struct {
	// Format is the report's format.
	Format Format `json:"format"`
	// ReportPath is the report artifact's path in the grader's sandbox,
	// e.g. "/work/out/report.xml".
	ReportPath string `json:"report_path"`
	// Required names the checks that must be present exactly once and pass.
	// Exactly one of Required and AllReported is set.
	Required []string `json:"required,omitempty"`
	// AllReported makes every check the report names required; a report
	// with no checks is then inconclusive, never vacuously passed.
	AllReported bool `json:"all_reported,omitempty"`
	// Controls are the control runs the bundle declares; each must have an
	// outcome, or the verdict is inconclusive.
	Controls []ControlKind `json:"controls,omitempty"`
	// MaxReportBytes caps the report; 0 means DefaultMaxReportBytes.
	MaxReportBytes int64 `json:"max_report_bytes,omitempty"`
}

// ControlKind names a control candidate that proves the grader's power to
// tell good from bad.
type ControlKind string

// The control kinds a bundle may declare.
const (
	ControlKnownGood ControlKind = "known-good" // must pass
	ControlKnownBad  ControlKind = "known-bad"  // must fail
)

// Validate checks a policy; the error wraps sandbox.ErrInvalid.
func (p Policy) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("policy: %w: %s", sandbox.ErrInvalid, fmt.Sprintf(format, args...))
	}
	if !p.Format.Valid() {
		return bad("unknown report format %q", p.Format)
	}
	if p.ReportPath == "" || !path.IsAbs(p.ReportPath) || path.Clean(p.ReportPath) != p.ReportPath {
		return bad("report path %q is not a clean absolute path", p.ReportPath)
	}
	if p.AllReported == (len(p.Required) > 0) {
		return bad("exactly one of required checks and all-reported must be given")
	}
	seen := map[string]bool{}
	for _, n := range p.Required {
		if strings.TrimSpace(n) == "" || len(n) > maxNameBytes {
			return bad("required check name %q is empty or too long", n)
		}
		if seen[n] {
			return bad("required check %q is listed twice", n)
		}
		seen[n] = true
	}
	kinds := map[ControlKind]bool{}
	for _, k := range p.Controls {
		if k != ControlKnownGood && k != ControlKnownBad {
			return bad("unknown control kind %q", k)
		}
		if kinds[k] {
			return bad("control %q is declared twice", k)
		}
		kinds[k] = true
	}
	if p.MaxReportBytes < 0 {
		return bad("negative report cap")
	}
	return nil
}

func (p Policy) maxReportBytes() int64 {
	if p.MaxReportBytes > 0 {
		return p.MaxReportBytes
	}
	return DefaultMaxReportBytes
}
