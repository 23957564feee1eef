package supervisor

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"unicode/utf8"
)

// Seeds live in testdata/fuzz/<FuzzName>/ (copies of the real fixtures and
// the malformed variants); go test runs them as ordinary cases.

func FuzzParseGoTestJSON(f *testing.F)       { fuzzParser(f, FormatGoTestJSON) }
func FuzzParseJUnitXML(f *testing.F)         { fuzzParser(f, FormatJUnitXML) }
func FuzzParseTAP(f *testing.F)              { fuzzParser(f, FormatTAP) }
func FuzzParseInTotoTestResult(f *testing.F) { fuzzParser(f, FormatInTotoTestResult) }

// fuzzParser checks, for any input: no panic; an error is one of the two
// parser errors; a report keeps the limits, has named checks with known
// statuses and is the same when parsed twice; and the rules never pass a
// report that has anything but passed checks.
func fuzzParser(f *testing.F, format Format) {
	lim := ParseLimits{MaxBytes: 1 << 20, MaxDepth: 16, MaxElements: 10_000, MaxChecks: 1_000, MaxLine: 1 << 16}
	f.Fuzz(func(t *testing.T, data []byte) {
		rep, err := Parse(format, bytes.NewReader(data), lim)
		if err != nil {
			if !errors.Is(err, ErrUnparseable) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v is neither ErrUnparseable nor ErrTooLarge", err)
			}
			return
		}
		if len(rep.Checks) > lim.MaxChecks {
			t.Fatalf("%d checks over the limit %d", len(rep.Checks), lim.MaxChecks)
		}
		allPassed := len(rep.Checks) > 0
		names := map[string]bool{}
		for _, c := range rep.Checks {
			if c.Name == "" || len(c.Name) > maxNameBytes || !utf8.ValidString(c.Name) {
				t.Fatalf("bad check name %q", c.Name)
			}
			switch c.Status {
			case CheckPassed:
			case CheckFailed, CheckSkipped, CheckError:
				allPassed = false
			default:
				t.Fatalf("unknown status %q", c.Status)
			}
			if names[c.Name] {
				allPassed = false
			}
			names[c.Name] = true
			if len(c.Message) > maxMessageBytes+len("…") {
				t.Fatalf("message of %d bytes", len(c.Message))
			}
		}
		again, err := Parse(format, bytes.NewReader(data), lim)
		if err != nil || !reflect.DeepEqual(again, rep) {
			t.Fatalf("second parse differs: %v", err)
		}

		ev := evidence(Policy{Format: format, AllReported: true, MaxReportBytes: lim.MaxBytes}, data, 0)
		a, err := Judge(ev)
		if err != nil {
			t.Fatalf("Judge: %v", err)
		}
		if a.Verdict == Passed && !allPassed {
			t.Fatalf("passed a report with checks %+v", rep.Checks)
		}
	})
}
