package junitreport

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/supervisor"
)

// The suites' names, also the classname of their testcases.
const (
	SuiteChecks   = "sandboxd.checks"
	SuiteControls = "sandboxd.controls"
)

// Encode writes the JUnit XML of a (verified) assessment to w.
func Encode(w io.Writer, a supervisor.Assessment) error {
	return encodeDoc(w, build(a))
}

// EncodeJSON is Encode for an assessment's retained JSON.
func EncodeJSON(w io.Writer, assessment []byte) error {
	a, err := supervisor.DecodeAssessment(assessment)
	if err != nil {
		return err
	}
	return Encode(w, a)
}

// WriteFile writes the JUnit XML of an assessment to path atomically: a
// temporary file in the same directory, synced, then renamed over path, so
// that a reader finds the whole file or none (never half of one).
func WriteFile(path string, a supervisor.Assessment) error {
	return writeFile(path, build(a))
}

// Instance is one evaluation of a set (`sandboxd run-set`): its name and
// its verified assessment, or, when it reached none, why not.
type Instance struct {
	Name       string
	Assessment *supervisor.Assessment
	Error      string
}

// EncodeSet writes one document for the instances of a set, in their
// order: an instance's checks are the suite named after it and its
// controls the suite "<name>.controls" (the testcases' classname is their
// suite's name, so CI views group them by instance); an instance without
// an assessment is a suite with one testcase, "evaluation", an <error>
// saying why, never a pass.
func EncodeSet(w io.Writer, set []Instance) error {
	return encodeDoc(w, buildSet(set))
}

// WriteSetFile is EncodeSet to path, atomically as WriteFile.
func WriteSetFile(path string, set []Instance) error {
	return writeFile(path, buildSet(set))
}

func encodeDoc(w io.Writer, doc testsuites) error {
	b, err := marshal(doc)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func marshal(doc testsuites) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(xml.Header)
	enc := xml.NewEncoder(&b)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("junit: %w", err)
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

func writeFile(path string, doc testsuites) error {
	b, err := marshal(doc)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("junit %s: %w", path, err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("junit %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		return fail(err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("junit %s: %w", path, err)
	}
	// The rename is durable once the directory is.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

type testsuites struct {
	XMLName  xml.Name    `xml:"testsuites"`
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Suites   []testsuite `xml:"testsuite"`
}

type testsuite struct {
	Name       string     `xml:"name,attr"`
	Tests      int        `xml:"tests,attr"`
	Failures   int        `xml:"failures,attr"`
	Errors     int        `xml:"errors,attr"`
	Skipped    int        `xml:"skipped,attr"`
	Properties []property `xml:"properties>property"`
	Cases      []testcase `xml:"testcase"`
}

type property struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type testcase struct {
	Name      string   `xml:"name,attr"`
	Classname string   `xml:"classname,attr"`
	Failure   *problem `xml:"failure"`
	Error     *problem `xml:"error"`
	SystemOut *text    `xml:"system-out"`
}

// text is character data written as CDATA, so that its lines stay lines.
type text struct {
	Text string `xml:",cdata"`
}

type problem struct {
	Type    string `xml:"type,attr"`
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func build(a supervisor.Assessment) testsuites {
	doc := testsuites{Name: "sandboxd"}
	doc.add(suites(a, SuiteChecks, SuiteControls)...)
	return doc
}

func buildSet(set []Instance) testsuites {
	doc := testsuites{Name: "sandboxd.set"}
	for _, in := range set {
		if in.Assessment == nil {
			tc := testcase{Name: "evaluation", Classname: in.Name, Error: newProblem(in.Error), SystemOut: systemOut(supervisor.Inconclusive, in.Error, nil)}
			doc.add(testsuite{Name: in.Name, Tests: 1, Errors: 1, Cases: []testcase{tc}})
			continue
		}
		doc.add(suites(*in.Assessment, in.Name, in.Name+".controls")...)
	}
	return doc
}

// add appends suites to the document and counts them in its totals.
func (doc *testsuites) add(ss ...testsuite) {
	for _, s := range ss {
		doc.Suites = append(doc.Suites, s)
		doc.Tests += s.Tests
		doc.Failures += s.Failures
		doc.Errors += s.Errors
	}
}

// suites are an assessment's checks suite, named checksName, and, when its
// policy declares controls, its controls suite, named controlsName.
func suites(a supervisor.Assessment, checksName, controlsName string) []testsuite {
	bind := bindingProperties(a)
	checks := testsuite{Name: checksName, Properties: slices.Clone(bind)}
	var evidence []string
	for _, c := range a.Checks {
		tc := testcase{Name: c.Name, Classname: checksName, SystemOut: systemOut(c.Status, c.Reason, c.Evidence)}
		switch c.Status {
		case supervisor.Passed:
		case supervisor.Failed:
			tc.Failure = newProblem(c.Reason)
			checks.Failures++
		default: // inconclusive, or anything unknown: never a pass
			tc.Error = newProblem(c.Reason)
			checks.Errors++
		}
		checks.Cases = append(checks.Cases, tc)
		evidence = appendNew(evidence, c.Evidence...)
	}
	for i, d := range evidence {
		checks.Properties = append(checks.Properties, property{"evidence." + strconv.Itoa(i), d})
	}
	checks.Tests = len(checks.Cases)
	out := []testsuite{checks}
	if len(a.Policy.Controls) > 0 {
		out = append(out, controlsSuite(a, bind, controlsName))
	}
	return out
}

// controlsSuite has one testcase per control the policy declares, judged
// by the outcome the assessment recorded for it.
func controlsSuite(a supervisor.Assessment, bind []property, name string) testsuite {
	s := testsuite{Name: name, Properties: slices.Clone(bind)}
	for _, kind := range a.Policy.Controls {
		want := supervisor.Passed
		if kind == supervisor.ControlKnownBad {
			want = supervisor.Failed
		}
		tc := testcase{Name: string(kind), Classname: name}
		var got []supervisor.ControlOutcome
		for _, c := range a.Controls {
			if c.Kind == kind {
				got = append(got, c)
			}
		}
		// The reasons are the supervisor's rules for controls.
		var reason string
		var digests []string
		if len(got) == 0 {
			reason = fmt.Sprintf("%s: no outcome of the %s control", supervisor.RuleControlMissing, kind)
		}
		for _, c := range got {
			digests = append(digests, c.Assessment)
			s.Properties = append(s.Properties, property{"assessment." + string(kind), c.Assessment})
			if c.Verdict == want || reason != "" {
				continue
			}
			rule := supervisor.RuleControlGoodNotPassed
			if kind == supervisor.ControlKnownBad {
				rule = supervisor.RuleControlBadNotFailed
			}
			reason = fmt.Sprintf("%s: %s control was %s", rule, kind, c.Verdict)
		}
		status := supervisor.Passed
		if reason != "" {
			status = supervisor.Inconclusive
			tc.Error = newProblem(reason)
			s.Errors++
		} else {
			reason = fmt.Sprintf("%s control was %s, as expected", kind, want)
		}
		tc.SystemOut = systemOut(status, reason, digests)
		s.Cases = append(s.Cases, tc)
	}
	s.Tests = len(s.Cases)
	return s
}

func bindingProperties(a supervisor.Assessment) []property {
	ps := []property{
		{"verdict", string(a.Verdict)},
		{"supervisor_revision", a.SupervisorRevision},
		{"bundle_digest", a.Binding.BundleDigest},
		{"image_id", a.Binding.ImageID},
		{"grader_job_digest", a.Binding.GraderJobDigest},
		{"grader_result_digest", a.Binding.GraderResultDigest},
		{"candidate_job_digest", a.Binding.CandidateJobDigest},
	}
	if a.Binding.WorkspaceDigest != "" {
		ps = append(ps, property{"workspace_digest", a.Binding.WorkspaceDigest})
	}
	if a.Report.Digest != "" {
		ps = append(ps, property{"report_digest", a.Report.Digest})
	}
	for i, r := range a.Reasons {
		ps = append(ps, property{"reason." + strconv.Itoa(i), r})
	}
	return ps
}

// newProblem is a failure or error whose type is the deciding rule (the
// reason up to its colon) and whose message is the whole reason.
func newProblem(reason string) *problem {
	rule, _, _ := strings.Cut(reason, ":")
	return &problem{Type: rule, Message: reason, Text: reason}
}

func systemOut(st supervisor.Verdict, reason string, evidence []string) *text {
	var b strings.Builder
	fmt.Fprintf(&b, "status: %s\nreason: %s\n", st, reason)
	for _, d := range evidence {
		fmt.Fprintf(&b, "evidence: %s\n", d)
	}
	return &text{b.String()}
}

func appendNew(list []string, items ...string) []string {
	for _, it := range items {
		if !slices.Contains(list, it) {
			list = append(list, it)
		}
	}
	return list
}
