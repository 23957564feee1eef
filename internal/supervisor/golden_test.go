package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// goldenCase is one fixture with the exit code its tool really returned
// (testdata/README.md) and the verdict the rules must reach.
type goldenCase struct {
	file     string
	format   Format
	exit     int
	required []string // nil: all reported
	variant  string
	instance string // the bundle's instance, if any
	want     Verdict
	wantRule Rule // a rule that must be named, if any
}

var goldenCases = []goldenCase{
	{file: "gotest/pass.json", format: FormatGoTestJSON, exit: 0, want: Passed},
	// A bundle naming an instance: the binding and the statement name it.
	{file: "gotest/pass.json", format: FormatGoTestJSON, exit: 0, variant: "instance", instance: "astropy__astropy-12907", want: Passed},
	{file: "gotest/fail.json", format: FormatGoTestJSON, exit: 1, variant: "instance", instance: "astropy__astropy-12907", want: Failed, wantRule: RuleCheckFailed},
	{file: "gotest/fail.json", format: FormatGoTestJSON, exit: 1, want: Failed, wantRule: RuleCheckFailed},
	{file: "gotest/skip.json", format: FormatGoTestJSON, exit: 0, want: Inconclusive, wantRule: RuleRequiredSkipped},
	{file: "gotest/skip.json", format: FormatGoTestJSON, exit: 0, variant: "required", want: Passed,
		required: []string{"example.com/fixtures/skip.TestRuns", "example.com/fixtures/skip.TestSubSkip/runs"}},
	{file: "gotest/panic.json", format: FormatGoTestJSON, exit: 1, want: Failed, wantRule: RuleCheckFailed},
	{file: "gotest/panic.json", format: FormatGoTestJSON, exit: 1, variant: "required", want: Inconclusive, wantRule: RuleRequiredMissing,
		required: []string{"example.com/fixtures/panic.TestBefore", "example.com/fixtures/panic.TestAfter"}},
	{file: "gotest/timeout.json", format: FormatGoTestJSON, exit: 1, want: Inconclusive, wantRule: RuleCheckErrored},
	{file: "gotest/buildfail.json", format: FormatGoTestJSON, exit: 1, want: Inconclusive, wantRule: RuleCheckErrored},
	{file: "gotest/fakepass.json", format: FormatGoTestJSON, exit: 1, want: Failed, wantRule: RuleCheckFailed},
	{file: "gotest/multi.json", format: FormatGoTestJSON, exit: 1, want: Failed, wantRule: RuleCheckFailed},
	{file: "gotest/pass-count2.json", format: FormatGoTestJSON, exit: 0, want: Inconclusive, wantRule: RuleDuplicateCheck},

	{file: "junit/pytest-mixed.xml", format: FormatJUnitXML, exit: 1, want: Inconclusive, wantRule: RuleCheckErrored},
	{file: "junit/pytest-mixed.xml", format: FormatJUnitXML, exit: 1, variant: "required", want: Failed, wantRule: RuleCheckFailed,
		required: []string{"test_sample.test_passes", "test_sample.test_fails", "test_sample.TestGroup.test_in_class"}},
	{file: "junit/pytest-xunit1.xml", format: FormatJUnitXML, exit: 1, want: Inconclusive, wantRule: RuleCheckErrored},
	{file: "junit/pytest-logging.xml", format: FormatJUnitXML, exit: 1, want: Inconclusive, wantRule: RuleCheckErrored},
	{file: "junit/pytest-pass.xml", format: FormatJUnitXML, exit: 0, want: Passed},
	{file: "junit/pytest-empty.xml", format: FormatJUnitXML, exit: 5, want: Inconclusive, wantRule: RuleReportEmpty},
	{file: "junit/gojunit-mixed.xml", format: FormatJUnitXML, exit: 1, want: Inconclusive, wantRule: RuleRequiredSkipped},
	{file: "junit/gojunit-mixed.xml", format: FormatJUnitXML, exit: 1, variant: "required", want: Failed, wantRule: RuleCheckFailed,
		required: []string{"example.com/fixtures/fail.TestGood", "example.com/fixtures/fail.TestBad"}},
	{file: "junit/gojunit-pass.xml", format: FormatJUnitXML, exit: 0, want: Inconclusive, wantRule: RuleRequiredSkipped},
	{file: "junit/gojunit-broken.xml", format: FormatJUnitXML, exit: 1, want: Inconclusive, wantRule: RuleCheckErrored},
	{file: "junit/surefire-mixed.xml", format: FormatJUnitXML, exit: 1, want: Inconclusive, wantRule: RuleCheckErrored},
	{file: "junit/surefire-mixed.xml", format: FormatJUnitXML, exit: 1, variant: "required", want: Failed, wantRule: RuleCheckFailed,
		required: []string{"com.example.CalcTest.adds", "com.example.CalcTest.failsAssertion"}},
	{file: "junit/surefire-pass.xml", format: FormatJUnitXML, exit: 0, want: Passed},

	{file: "tap/perl-mixed.tap", format: FormatTAP, exit: 1, want: Inconclusive, wantRule: RuleRequiredSkipped},
	{file: "tap/perl-mixed.tap", format: FormatTAP, exit: 1, variant: "required", want: Failed, wantRule: RuleCheckFailed,
		required: []string{"loads", "adds wrongly", "grouped checks/inner one"}},
	{file: "tap/perl-pass.tap", format: FormatTAP, exit: 0, want: Passed},
	{file: "tap/perl-bail.tap", format: FormatTAP, exit: 255, want: Inconclusive, wantRule: RuleReportIncomplete},
	{file: "tap/perl-short.tap", format: FormatTAP, exit: 255, want: Inconclusive, wantRule: RuleReportIncomplete},
	// A report cut short is inconclusive even when every required check it
	// did report passed and the grader's non-zero exit agrees with its
	// synthetic error checks.
	{file: "tap/perl-bail.tap", format: FormatTAP, exit: 255, variant: "required", want: Inconclusive, wantRule: RuleReportIncomplete,
		required: []string{"before bail"}},
	{file: "tap/perl-short.tap", format: FormatTAP, exit: 255, variant: "required", want: Inconclusive, wantRule: RuleReportIncomplete,
		required: []string{"one", "two"}},
	{file: "tap/tap14.tap", format: FormatTAP, exit: 0, want: Inconclusive, wantRule: RuleExitCodeDisagrees},
	{file: "tap/node-tap-mixed.tap", format: FormatTAP, exit: 1, want: Inconclusive, wantRule: RuleRequiredSkipped},
	{file: "tap/node-tap-pass.tap", format: FormatTAP, exit: 0, want: Passed},

	{file: "intoto/passed.json", format: FormatInTotoTestResult, exit: 0, want: Passed},
	{file: "intoto/failed.json", format: FormatInTotoTestResult, exit: 1, want: Failed, wantRule: RuleCheckFailed},
	{file: "intoto/spec-example.json", format: FormatInTotoTestResult, exit: 0, want: Passed},

	{file: "malformed/billion-laughs.xml", format: FormatJUnitXML, exit: 0, want: Inconclusive, wantRule: RuleReportUnparseable},
	{file: "malformed/xxe.xml", format: FormatJUnitXML, exit: 0, want: Inconclusive, wantRule: RuleReportUnparseable},
	{file: "malformed/undeclared-entity.xml", format: FormatJUnitXML, exit: 0, want: Inconclusive, wantRule: RuleReportUnparseable},
	{file: "malformed/pytest-mixed-truncated.xml", format: FormatJUnitXML, exit: 1, want: Inconclusive, wantRule: RuleReportUnparseable},
	{file: "malformed/pytest-mixed-miscounted.xml", format: FormatJUnitXML, exit: 1, want: Inconclusive, wantRule: RuleReportUnparseable},
	{file: "malformed/gotest-fail-truncated.json", format: FormatGoTestJSON, exit: 1, want: Inconclusive, wantRule: RuleReportUnparseable},
	{file: "malformed/gotest-pass-plaintext.json", format: FormatGoTestJSON, exit: 0, want: Inconclusive, wantRule: RuleReportUnparseable},
	{file: "malformed/node-tap-mixed-truncated.tap", format: FormatTAP, exit: 1, want: Inconclusive, wantRule: RuleReportUnparseable},
	{file: "malformed/intoto-failed-without-failures.json", format: FormatInTotoTestResult, exit: 1, want: Inconclusive, wantRule: RuleReportUnparseable},
	{file: "malformed/intoto-unknown-predicate.json", format: FormatInTotoTestResult, exit: 0, want: Inconclusive, wantRule: RuleReportUnparseable},
}

func (c goldenCase) name() string {
	n := strings.ReplaceAll(strings.TrimSuffix(c.file, filepath.Ext(c.file)), "/", "__")
	if c.variant != "" {
		n += "__" + c.variant
	}
	return n
}

func (c goldenCase) policy() Policy {
	p := Policy{Format: c.format, ReportPath: testReport, Required: c.required}
	p.AllReported = len(c.required) == 0
	return p
}

// TestGolden checks each fixture's parsed report, retained assessment and
// (for passed and failed verdicts) in-toto statement against
// testdata/golden, and the verdict against the table above.
func TestGolden(t *testing.T) {
	covered := map[string]bool{}
	for _, gc := range goldenCases {
		covered[gc.file] = true
		t.Run(gc.name(), func(t *testing.T) {
			data := readFixture(t, gc.file)

			rep, perr := Parse(gc.format, bytes.NewReader(data), ParseLimits{})
			var repJSON []byte
			if perr != nil {
				repJSON = []byte(`{"error":` + quoteJSON(perr.Error()) + "}\n")
			} else {
				var err error
				if repJSON, err = json.MarshalIndent(rep, "", "  "); err != nil {
					t.Fatal(err)
				}
				repJSON = append(repJSON, '\n')
			}
			checkGolden(t, gc.name()+".report.json", repJSON)

			sup := New(NewMemoryStore())
			ev := evidence(gc.policy(), data, gc.exit)
			ev.Instance = gc.instance
			a, got, err := sup.Assess(context.Background(), ev)
			if err != nil {
				t.Fatalf("Assess: %v", err)
			}
			if a.Verdict != gc.want {
				t.Errorf("verdict: got %s, want %s (reasons %q)", a.Verdict, gc.want, a.Reasons)
			}
			if gc.wantRule != "" && !hasReason(a, gc.wantRule) {
				t.Errorf("rule %s not named: reasons %q, checks %+v", gc.wantRule, a.Reasons, a.Checks)
			}
			checkGolden(t, gc.name()+".assessment.json", append(bytes.Clone(got), '\n'))

			// Asking again returns the same bytes.
			ev.Report = bytes.NewReader(data)
			_, again, err := sup.Assess(context.Background(), ev)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("second Assess: got %d bytes, err %v; want the %d retained bytes", len(again), err, len(got))
			}

			st, err := a.StatementJSON()
			switch {
			case a.Verdict == Inconclusive:
				if !errors.Is(err, ErrInconclusive) {
					t.Errorf("statement: got err %v, want ErrInconclusive", err)
				}
			case err != nil:
				t.Errorf("statement: %v", err)
			default:
				checkGolden(t, gc.name()+".statement.json", append(st, '\n'))
			}
		})
	}
	// Every fixture has a golden.
	for _, dir := range []string{"gotest", "junit", "tap", "intoto", "malformed"} {
		files, _ := filepath.Glob(filepath.Join("testdata", dir, "*"))
		for _, f := range files {
			rel, _ := filepath.Rel("testdata", f)
			if !covered[filepath.ToSlash(rel)] {
				t.Errorf("fixture %s has no golden case", rel)
			}
		}
	}
}

func quoteJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run with -update)", name, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("golden %s differs:\ngot  %s\nwant %s", name, got, want)
	}
}
