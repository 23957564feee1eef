package junitreport

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/supervisor"
)

// golden reads an assessment the supervisor wrote for its own golden
// tests: real Judge output, not a hand-typed one.
func golden(t *testing.T, name string) supervisor.Assessment {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "supervisor", "testdata", "golden", name+".assessment.json"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := supervisor.DecodeAssessment(b)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// withControls is a golden assessment as it would be with both controls
// declared: known-good passed and known-bad as given.
func withControls(t *testing.T, name string, knownBad supervisor.Verdict) supervisor.Assessment {
	a := golden(t, name)
	a.Policy.Controls = []supervisor.ControlKind{supervisor.ControlKnownBad, supervisor.ControlKnownGood}
	d := "sha256:" + strings.Repeat("ab", 32)
	a.Controls = []supervisor.ControlOutcome{
		{Kind: supervisor.ControlKnownBad, BundleDigest: a.Binding.BundleDigest, ImageID: a.Binding.ImageID, Verdict: knownBad, Assessment: d},
		{Kind: supervisor.ControlKnownGood, BundleDigest: a.Binding.BundleDigest, ImageID: a.Binding.ImageID, Verdict: supervisor.Passed, Assessment: d},
	}
	return a
}

// want is what a consumer must read: testcases by suite, each with its
// JUnit result.
type want struct {
	tests, failures, errors int
	cases                   map[string]string // suite/name → passed|failure|error
}

func expected(a supervisor.Assessment) want {
	w := want{cases: map[string]string{}}
	for _, c := range a.Checks {
		r := map[supervisor.Verdict]string{supervisor.Passed: "passed", supervisor.Failed: "failure", supervisor.Inconclusive: "error"}[c.Status]
		w.cases[SuiteChecks+"/"+c.Name] = r
	}
	for _, k := range a.Policy.Controls {
		r := "passed"
		for _, c := range a.Controls {
			if c.Kind == k && (c.Verdict == supervisor.Passed) != (k == supervisor.ControlKnownGood) {
				r = "error"
			}
		}
		w.cases[SuiteControls+"/"+string(k)] = r
	}
	for _, r := range w.cases {
		w.tests++
		switch r {
		case "failure":
			w.failures++
		case "error":
			w.errors++
		}
	}
	return w
}

var cases = []struct {
	name string
	a    func(t *testing.T) supervisor.Assessment
}{
	{"passed", func(t *testing.T) supervisor.Assessment { return golden(t, "gotest__pass") }},
	{"failed", func(t *testing.T) supervisor.Assessment { return golden(t, "gotest__fail") }},
	{"inconclusive", func(t *testing.T) supervisor.Assessment { return golden(t, "gotest__panic__required") }},
	{"junit-mixed", func(t *testing.T) supervisor.Assessment { return golden(t, "junit__gojunit-mixed__required") }},
	{"controls-ok", func(t *testing.T) supervisor.Assessment { return withControls(t, "gotest__pass", supervisor.Failed) }},
	{"known-bad-passed", func(t *testing.T) supervisor.Assessment { return withControls(t, "gotest__pass", supervisor.Passed) }},
}

func encode(t *testing.T, a supervisor.Assessment) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "junit.xml")
	if err := WriteFile(path, a); err != nil {
		t.Fatal(err)
	}
	return path
}

// The supervisor's own JUnit parser reads every check back with its
// status: passed, failed, and inconclusive as an error.
func TestRoundTripSupervisorParser(t *testing.T) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.a(t)
			w := expected(a)
			f, err := os.Open(encode(t, a))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			rep, err := supervisor.ParseJUnitXML(f, supervisor.ParseLimits{})
			if err != nil {
				t.Fatalf("the supervisor does not parse the file: %v", err)
			}
			got := map[string]string{}
			for _, c := range rep.Checks {
				suite, name, _ := strings.Cut(c.Name, ".checks.")
				if suite == "sandboxd" {
					suite = SuiteChecks
				} else {
					suite, name, _ = strings.Cut(c.Name, ".controls.")
					suite = SuiteControls
				}
				got[suite+"/"+name] = map[supervisor.CheckStatus]string{supervisor.CheckPassed: "passed", supervisor.CheckFailed: "failure", supervisor.CheckError: "error"}[c.Status]
			}
			compareCases(t, got, w.cases)
		})
	}
}

// Debian's python3-junitparser, a consumer CI tooling uses, reads the
// counts, names and results.
func TestJunitparserReads(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import junitparser").Run(); err != nil {
		need(t, "python3-junitparser (scripts/setup installs it)")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.a(t)
			w := expected(a)
			out, err := exec.Command(py, "testdata/junitparser_summary.py", encode(t, a)).Output()
			if err != nil {
				t.Fatalf("junitparser: %v %s", err, stderrOf(err))
			}
			var s struct {
				Tests, Failures, Errors, Skipped int
				Suites                           []struct {
					Name       string
					Properties map[string]string
					Cases      []struct{ Name, Classname, Result, Message string }
				}
			}
			if err := json.Unmarshal(out, &s); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if s.Tests != w.tests || s.Failures != w.failures || s.Errors != w.errors || s.Skipped != 0 {
				t.Errorf("junitparser counts tests=%d failures=%d errors=%d skipped=%d, want %d %d %d 0",
					s.Tests, s.Failures, s.Errors, s.Skipped, w.tests, w.failures, w.errors)
			}
			got := map[string]string{}
			reasons := map[string]string{}
			for _, c := range a.Checks {
				reasons[c.Name] = c.Reason
			}
			for _, su := range s.Suites {
				if su.Properties["verdict"] != string(a.Verdict) || su.Properties["bundle_digest"] != a.Binding.BundleDigest {
					t.Errorf("suite %s properties %v: no verdict %s or bundle digest", su.Name, su.Properties, a.Verdict)
				}
				values := map[string]bool{}
				for _, v := range su.Properties {
					values[v] = true
				}
				var digests []string
				switch su.Name {
				case SuiteChecks:
					for _, c := range a.Checks {
						digests = append(digests, c.Evidence...)
					}
					if _, ok := su.Properties["assessment.known-good"]; ok {
						t.Errorf("suite %s has a control's property", su.Name)
					}
				case SuiteControls:
					for _, c := range a.Controls {
						digests = append(digests, c.Assessment)
					}
				}
				for _, d := range digests {
					if !values[d] {
						t.Errorf("suite %s: evidence %s is not a property (%v)", su.Name, d, su.Properties)
					}
				}
				for _, c := range su.Cases {
					if c.Classname != su.Name {
						t.Errorf("case %s: classname %q, want its suite %q", c.Name, c.Classname, su.Name)
					}
					got[su.Name+"/"+c.Name] = c.Result
					if su.Name == SuiteChecks && c.Result != "passed" && c.Message != reasons[c.Name] {
						t.Errorf("case %s: message %q, want the reason %q", c.Name, c.Message, reasons[c.Name])
					}
				}
			}
			compareCases(t, got, w.cases)
		})
	}
}

// Every file validates against the published schema kept in testdata.
func TestValidatesAgainstJenkinsSchema(t *testing.T) {
	if _, err := exec.LookPath("xmllint"); err != nil {
		need(t, "xmllint (libxml2-utils; scripts/setup installs it)")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command("xmllint", "--noout", "--schema", "testdata/junit-10.xsd", encode(t, tc.a(t))).CombinedOutput()
			if err != nil {
				t.Fatalf("xmllint --schema: %v\n%s", err, out)
			}
		})
	}
}

// The schema check can fail: a testcase-level <properties>, which the
// schema does not allow, is refused.
func TestSchemaCheckCatchesAnInvalidFile(t *testing.T) {
	if _, err := exec.LookPath("xmllint"); err != nil {
		need(t, "xmllint (libxml2-utils; scripts/setup installs it)")
	}
	var b bytes.Buffer
	if err := Encode(&b, golden(t, "gotest__pass")); err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(b.String(), "<system-out>", "<properties><property name=\"x\" value=\"y\"></property></properties><system-out>", 1)
	path := filepath.Join(t.TempDir(), "bad.xml")
	os.WriteFile(path, []byte(bad), 0o644)
	if out, err := exec.Command("xmllint", "--noout", "--schema", "testdata/junit-10.xsd", path).CombinedOutput(); err == nil {
		t.Fatalf("xmllint accepted a testcase with properties:\n%s", out)
	}
}

// EncodeJSON renders retained assessment bytes as Encode renders the value,
// and refuses bytes that are not an assessment.
func TestEncodeJSON(t *testing.T) {
	a := golden(t, "gotest__fail")
	raw, err := a.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var x, y bytes.Buffer
	if err := Encode(&x, a); err != nil {
		t.Fatal(err)
	}
	if err := EncodeJSON(&y, raw); err != nil {
		t.Fatal(err)
	}
	if x.String() != y.String() {
		t.Errorf("EncodeJSON differs from Encode")
	}
	if err := EncodeJSON(&y, []byte(`{"verdict":"passed"}`)); err == nil {
		t.Errorf("EncodeJSON took a document that is not an assessment")
	}
}

// WriteFile replaces a file whole and leaves no temporary file; when it
// cannot write, the old file stays as it was.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "junit.xml")
	os.WriteFile(path, []byte("old"), 0o644)
	if err := WriteFile(path, golden(t, "gotest__pass")); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries after WriteFile, want 1", len(ents))
	}
	b, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(b), "<?xml") {
		t.Errorf("file not replaced: %q", b[:min(len(b), 20)])
	}
	// A directory in place of the file: the rename fails, nothing is left.
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	os.WriteFile(filepath.Join(sub, "x"), nil, 0o644)
	if err := WriteFile(sub, golden(t, "gotest__pass")); err == nil {
		t.Errorf("WriteFile over a non-empty directory succeeded")
	}
	if err := WriteFile(filepath.Join(dir, "missing", "junit.xml"), golden(t, "gotest__pass")); err == nil {
		t.Errorf("WriteFile into a missing directory succeeded")
	}
	ents, _ = os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("directory holds %d entries after failed writes, want 2 (junit.xml, sub)", len(ents))
	}
}

func compareCases(t *testing.T, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("read %d testcases %v, want %d %v", len(got), got, len(want), want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("testcase %s: %q, want %q", k, got[k], w)
		}
	}
}

// need skips a test whose tool is missing, except under CI, where a
// missing tool is a failure.
func need(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is missing (CI=%s: not skipped)", what, os.Getenv("CI"))
	}
	t.Skipf("%s is missing", what)
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// A set's document holds each instance's suites under its name, in the
// set's order; an instance without an assessment is one error, never a
// pass; the totals add up; and the file is valid against the schema.
func TestEncodeSet(t *testing.T) {
	passed, failed := golden(t, "gotest__pass"), withControls(t, "gotest__pass", supervisor.Failed)
	failed.Verdict = supervisor.Failed
	set := []Instance{
		{Name: "inst-a", Assessment: &passed},
		{Name: "inst-b", Assessment: &failed},
		{Name: "inst-c", Error: "bundle bundles/c: does not verify"},
	}
	path := filepath.Join(t.TempDir(), "set.xml")
	if err := WriteSetFile(path, set); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc testsuites
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var names []string
	tests, errs := 0, 0
	for _, s := range doc.Suites {
		names = append(names, s.Name)
		tests += s.Tests
		errs += s.Errors
		for _, c := range s.Cases {
			if c.Classname != s.Name {
				t.Errorf("suite %s: testcase %s has classname %q", s.Name, c.Name, c.Classname)
			}
		}
	}
	if want := []string{"inst-a", "inst-b", "inst-b.controls", "inst-c"}; !slices.Equal(names, want) {
		t.Fatalf("suites %v, want %v", names, want)
	}
	last := doc.Suites[3]
	if len(last.Cases) != 1 || last.Cases[0].Error == nil || last.Cases[0].Error.Message != set[2].Error || last.Errors != 1 {
		t.Fatalf("instance without an assessment: %+v, want one error saying %q", last, set[2].Error)
	}
	if doc.Tests != tests || doc.Errors != errs || doc.Tests != len(passed.Checks)+len(failed.Checks)+len(failed.Policy.Controls)+1 {
		t.Fatalf("totals tests=%d errors=%d, suites add up to %d and %d", doc.Tests, doc.Errors, tests, errs)
	}
	if _, err := exec.LookPath("xmllint"); err != nil {
		need(t, "xmllint (libxml2-utils; scripts/setup installs it)")
	}
	if out, err := exec.Command("xmllint", "--noout", "--schema", "testdata/junit-10.xsd", path).CombinedOutput(); err != nil {
		t.Fatalf("xmllint --schema: %v\n%s", err, out)
	}
}
