package supervisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"sort"

	"github.com/sandboxd/sandboxd/sandbox"
)

// The results of a test-result predicate (sandbox.PredicateTestResult).
const (
	TestResultPassed = sandbox.TestResultPassed
	TestResultWarned = sandbox.TestResultWarned
	TestResultFailed = sandbox.TestResultFailed
)

// ResourceDescriptor is the in-toto v1 ResourceDescriptor, with the fields
// sandboxd writes and reads.
type ResourceDescriptor struct {
	Name             string            `json:"name,omitempty"`
	URI              string            `json:"uri,omitempty"`
	Digest           map[string]string `json:"digest,omitempty"`
	DownloadLocation string            `json:"downloadLocation,omitempty"`
	MediaType        string            `json:"mediaType,omitempty"`
	// Annotations may hold any JSON value (in-toto v1); sandboxd writes
	// only sandbox.AnnotationInstance, a string.
	Annotations map[string]any `json:"annotations,omitempty"`
}

// TestResultPredicate is the test-result v0.1 predicate.
type TestResultPredicate struct {
	Result        string               `json:"result"`
	Configuration []ResourceDescriptor `json:"configuration"`
	URL           string               `json:"url,omitempty"`
	PassedTests   []string             `json:"passedTests"`
	WarnedTests   []string             `json:"warnedTests"`
	FailedTests   []string             `json:"failedTests"`
}

// TestResultStatement is an in-toto v1 Statement carrying a TestResultPredicate.
type TestResultStatement struct {
	Type          string               `json:"_type"`
	Subject       []ResourceDescriptor `json:"subject"`
	PredicateType string               `json:"predicateType"`
	Predicate     TestResultPredicate  `json:"predicate"`
}

// ParseInTotoTestResult parses an in-toto v1 Statement whose predicate is a
// test-result v0.1. Unknown fields are ignored, as in-toto's parsing rules
// require, but the statement type, predicate type and result must be known.
// passedTests and warnedTests are passed checks (a warning is a pass with a
// remark), failedTests failed. A report whose result disagrees with its
// lists (PASSED with failures, FAILED without) is refused as inconsistent.
// The predicate names no skipped tests and no durations.
func ParseInTotoTestResult(r io.Reader, lim ParseLimits) (Report, error) {
	lim = lim.withDefaults()
	data, err := io.ReadAll(newCappedReader(r, lim.MaxBytes))
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			return Report{}, err
		}
		return Report{}, unparseable("reading: %v", err)
	}
	var st TestResultStatement
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&st); err != nil {
		return Report{}, unparseable("statement: %v", err)
	}
	if dec.More() {
		return Report{}, unparseable("trailing data after the statement")
	}
	if _, err := dec.Token(); err != io.EOF {
		return Report{}, unparseable("trailing data after the statement")
	}
	if st.Type != sandbox.StatementType {
		return Report{}, unparseable("statement _type %q is not %q", st.Type, sandbox.StatementType)
	}
	if st.PredicateType != sandbox.PredicateTestResult {
		return Report{}, unparseable("predicateType %q is not %q", st.PredicateType, sandbox.PredicateTestResult)
	}
	p := st.Predicate
	switch p.Result {
	case TestResultPassed, TestResultWarned:
		if len(p.FailedTests) > 0 {
			return Report{}, unparseable("result %s with %d failed tests", p.Result, len(p.FailedTests))
		}
	case TestResultFailed:
		if len(p.FailedTests) == 0 {
			return Report{}, unparseable("result FAILED without a failed test")
		}
	default:
		return Report{}, unparseable("result %q is not PASSED, WARNED or FAILED", p.Result)
	}
	col := &collector{max: lim.MaxChecks}
	for _, list := range []struct {
		names  []string
		status CheckStatus
		msg    string
	}{{p.PassedTests, CheckPassed, ""}, {p.WarnedTests, CheckPassed, "warned"}, {p.FailedTests, CheckFailed, ""}} {
		for _, n := range list.names {
			if err := col.add(Check{Name: n, Status: list.status, Message: list.msg}); err != nil {
				return Report{}, err
			}
		}
	}
	return Report{Format: FormatInTotoTestResult, Checks: nonNil(col.checks)}, nil
}

// sortedNames returns names sorted, never nil.
func sortedNames(names []string) []string {
	out := append([]string{}, names...)
	sort.Strings(out)
	return out
}
