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
	// PassedTests and FailedTests are the checks behind the verdict.
	PassedTests, FailedTests []string
	// KeyIDs are the pinned keys whose signatures verified.
	KeyIDs []string
}

// VerifyTestResult checks a test-result statement's signatures against
// the pinned keys and its shape: an in-toto statement of predicate type
// PredicateTestResult with at least one subject and a verdict that is
// PASSED or FAILED.
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
			Result        string    `json:"result"`
			Configuration []Subject `json:"configuration"`
			PassedTests   []string  `json:"passedTests"`
			FailedTests   []string  `json:"failedTests"`
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
	return TestResult{
		Result: st.Predicate.Result, Subjects: st.Subject, Configuration: st.Predicate.Configuration,
		PassedTests: st.Predicate.PassedTests, FailedTests: st.Predicate.FailedTests, KeyIDs: ve.KeyIDs,
	}, nil
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
