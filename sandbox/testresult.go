package sandbox

import "encoding/json"

// TestResult is a verified in-toto test-result statement: the verdict the
// supervisor signs for one candidate under one bundle when it is not
// inconclusive. It says what was judged (Subject) and by what (Bundle);
// a consumer acting on the verdict compares both with what it expected,
// since a well-signed verdict about another workspace or bundle verifies
// just as well.
type TestResult struct {
	// Result is TestResultPassed or TestResultFailed.
	Result string
	// Subjects are the statement's subjects: one, the candidate's
	// workspace ("candidate-workspace") or job ("candidate-job").
	Subjects []Subject
	// Configuration names what judged the subject ("bundle").
	Configuration []Subject
	// Instance is the task instance the bundle names: the annotation
	// AnnotationInstance of the "bundle" configuration entry, "" when it
	// has none.
	Instance string
	// PassedTests and FailedTests are the checks behind the verdict.
	PassedTests, FailedTests []string
	// KeyIDs are the pinned keys whose signatures verified.
	KeyIDs []string
}

// VerifyTestResult checks a test-result statement's signatures against
// the pinned keys and its shape: an in-toto statement of predicate type
// PredicateTestResult with at least one subject and a verdict that is
// PASSED or FAILED; an instance annotation, if any, is a valid instance id.
func VerifyTestResult(keys KeySet, envelope []byte) (TestResult, error) {
	ve, err := VerifyEnvelope(keys, envelope)
	if err != nil {
		return TestResult{}, err
	}
	if ve.PayloadType != InTotoPayloadType {
		return TestResult{}, verifyErr(CheckPayloadType, "%q, want %q", ve.PayloadType, InTotoPayloadType)
	}
	var st struct {
		Type          string    `json:"_type"`
		PredicateType string    `json:"predicateType"`
		Subject       []Subject `json:"subject"`
		Predicate     struct {
			Result        string             `json:"result"`
			Configuration []configDescriptor `json:"configuration"`
			PassedTests   []string           `json:"passedTests"`
			FailedTests   []string           `json:"failedTests"`
		} `json:"predicate"`
	}
	if err := json.Unmarshal(ve.Payload, &st); err != nil {
		return TestResult{}, verifyErr(CheckMalformed, "statement: %v", err)
	}
	switch {
	case st.Type != StatementType:
		return TestResult{}, verifyErr(CheckStatementType, "%q, want %q", st.Type, StatementType)
	case st.PredicateType != PredicateTestResult:
		return TestResult{}, verifyErr(CheckPredicateType, "%q, want %q", st.PredicateType, PredicateTestResult)
	case len(st.Subject) == 0:
		return TestResult{}, verifyErr(CheckSubject, "the test-result names no subject")
	case st.Predicate.Result != TestResultPassed && st.Predicate.Result != TestResultFailed:
		return TestResult{}, verifyErr(CheckPredicate, "test-result %q is neither %s nor %s", st.Predicate.Result, TestResultPassed, TestResultFailed)
	}
	instance, err := bundleInstance(st.Predicate.Configuration)
	if err != nil {
		return TestResult{}, err
	}
	var config []Subject
	if st.Predicate.Configuration != nil {
		config = make([]Subject, 0, len(st.Predicate.Configuration))
	}
	for _, c := range st.Predicate.Configuration {
		config = append(config, Subject{Name: c.Name, Digest: c.Digest})
	}
	return TestResult{
		Result: st.Predicate.Result, Subjects: st.Subject, Configuration: config, Instance: instance,
		PassedTests: st.Predicate.PassedTests, FailedTests: st.Predicate.FailedTests, KeyIDs: ve.KeyIDs,
	}, nil
}

// configDescriptor is a configuration entry of a test-result: a Subject
// with its annotations (any JSON values, in-toto v1).
type configDescriptor struct {
	Name        string                     `json:"name"`
	Digest      map[string]string          `json:"digest"`
	Annotations map[string]json.RawMessage `json:"annotations"`
}

// bundleInstance returns the instance annotation of the "bundle" entries,
// "" when none has one: a string that is a valid instance id, the same in
// every entry that has one.
func bundleInstance(config []configDescriptor) (string, error) {
	instance := ""
	for _, c := range config {
		raw, ok := c.Annotations[AnnotationInstance]
		if c.Name != "bundle" || !ok {
			continue
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil || !ValidInstance(s) || (instance != "" && s != instance) {
			return "", verifyErr(CheckPredicate, "the bundle's instance annotation %.140q is not one instance id", raw)
		}
		instance = s
	}
	return instance, nil
}

// CheckTestResult checks that a verified test-result statement says what
// the assessment a it came with says: the same verdict (passed or failed;
// an inconclusive assessment has none), the same subject (the workspace,
// or the candidate job where the assessment names no workspace), the same
// bundle and instance, and the same passed and failed checks. A signature
// alone proves only who signed: a well-signed statement about another
// candidate or bundle verifies as well.
func (a *Assessment) CheckTestResult(t TestResult) error {
	want := ""
	switch a.Verdict {
	case VerdictPassed:
		want = TestResultPassed
	case VerdictFailed:
		want = TestResultFailed
	default:
		return verifyErr(CheckPredicate, "a test-result for an assessment that is %s", a.Verdict)
	}
	if t.Result != want {
		return verifyErr(CheckPredicate, "test-result %s for an assessment that is %s", t.Result, a.Verdict)
	}
	wantName, wantDigest := "candidate-workspace", a.WorkspaceDigest
	if wantDigest == "" {
		wantName, wantDigest = "candidate-job", a.CandidateDigest
	}
	if name, digest := t.Subject(); len(t.Subjects) != 1 || name != wantName || digest != wantDigest {
		return verifyErr(CheckSubject, "test-result subject %s %s, want %s %s", name, digest, wantName, wantDigest)
	}
	if b := t.Bundle(); b != a.ManifestDigest {
		return verifyErr(CheckPredicate, "test-result bundle %q, want %s", b, a.ManifestDigest)
	}
	if t.Instance != a.Instance {
		return verifyErr(CheckPredicate, "test-result instance %q, want %q", t.Instance, a.Instance)
	}
	var passed, failed []string
	for _, c := range a.Checks {
		switch c.Status {
		case VerdictPassed:
			passed = append(passed, c.Name)
		case VerdictFailed:
			failed = append(failed, c.Name)
		}
	}
	if !sameNames(t.PassedTests, passed) || !sameNames(t.FailedTests, failed) {
		return verifyErr(CheckPredicate, "test-result checks (passed %v, failed %v) are not the assessment's (passed %v, failed %v)", t.PassedTests, t.FailedTests, passed, failed)
	}
	return nil
}

// sameNames reports whether a and b hold the same names, in any order.
func sameNames(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, n := range a {
		seen[n]++
	}
	for _, n := range b {
		if seen[n]--; seen[n] < 0 {
			return false
		}
	}
	return true
}

// Subject returns the name and digest of the statement's first subject;
// the digest is "" unless it is exactly one valid sha256 digest.
func (t TestResult) Subject() (name, digest string) {
	if len(t.Subjects) == 0 {
		return "", ""
	}
	return t.Subjects[0].Name, descriptorDigest(t.Subjects[0].Digest)
}

// Bundle returns the digest of the configuration entry "bundle", or ""
// unless there is exactly one such entry with a valid sha256 digest.
func (t TestResult) Bundle() string {
	var d []string
	for _, c := range t.Configuration {
		if c.Name == "bundle" {
			d = append(d, descriptorDigest(c.Digest))
		}
	}
	if len(d) != 1 {
		return ""
	}
	return d[0]
}

// descriptorDigest turns in-toto's {"sha256": "<hex>"} into
// "sha256:<hex>", or "" unless it is exactly one valid sha256 digest.
func descriptorDigest(m map[string]string) string {
	if len(m) != 1 {
		return ""
	}
	if d := "sha256:" + m["sha256"]; ValidDigest(d) {
		return d
	}
	return ""
}
