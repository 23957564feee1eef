package supervisor

import (
	"fmt"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Statement returns the in-toto test-result v0.1 statement of a passed or
// failed assessment: result PASSED or FAILED, configuration = the bundle and
// the evaluator image, passedTests and failedTests = the judged checks, and
// the candidate (workspace, else job) as subject. A bundle that names an
// instance has it as the annotation sandbox.AnnotationInstance of its
// configuration entry: the instance is a property of the bundle (its
// digest fixes it), and an annotation is where in-toto v1 puts what a
// descriptor's consumer may check; test-result v0.1 has no field for it.
// Without an instance there is no annotation, and the statement is the
// same bytes as before instances existed. An inconclusive assessment has
// no statement (ErrInconclusive). Signing is internal/receipt's job.
func (a *Assessment) Statement() (TestResultStatement, error) {
	var result string
	switch a.Verdict {
	case Passed:
		result = TestResultPassed
	case Failed:
		result = TestResultFailed
	default:
		return TestResultStatement{}, fmt.Errorf("statement: %w", ErrInconclusive)
	}
	passed, failed := []string{}, []string{}
	for _, c := range a.Checks {
		switch c.Status {
		case Passed:
			passed = append(passed, c.Name)
		case Failed:
			failed = append(failed, c.Name)
		default:
			// Cannot happen for a passed or failed verdict; refuse anyway.
			return TestResultStatement{}, fmt.Errorf("statement: check %q is %s: %w", c.Name, c.Status, ErrInconclusive)
		}
	}
	if result == TestResultPassed && (len(failed) > 0 || len(passed) == 0) {
		return TestResultStatement{}, fmt.Errorf("statement: %w: a passed verdict without passed checks", sandbox.ErrInvalid)
	}
	subject := ResourceDescriptor{Name: "candidate-workspace", Digest: digestMap(a.Binding.WorkspaceDigest)}
	if a.Binding.WorkspaceDigest == "" {
		subject = ResourceDescriptor{Name: "candidate-job", Digest: digestMap(a.Binding.CandidateJobDigest)}
	}
	bundle := ResourceDescriptor{Name: "bundle", Digest: digestMap(a.Binding.BundleDigest)}
	if a.Binding.Instance != "" {
		bundle.Annotations = map[string]any{sandbox.AnnotationInstance: a.Binding.Instance}
	}
	return TestResultStatement{
		Type:          sandbox.StatementType,
		Subject:       []ResourceDescriptor{subject},
		PredicateType: sandbox.PredicateTestResult,
		Predicate: TestResultPredicate{
			Result: result,
			Configuration: []ResourceDescriptor{
				bundle,
				{Name: "image", Digest: digestMap(a.Binding.ImageID)},
			},
			PassedTests: sortedNames(passed),
			WarnedTests: []string{},
			FailedTests: sortedNames(failed),
		},
	}, nil
}

// StatementJSON returns the statement's canonical JSON, the payload that
// internal/receipt signs into a DSSE envelope.
func (a *Assessment) StatementJSON() ([]byte, error) {
	st, err := a.Statement()
	if err != nil {
		return nil, err
	}
	return sandbox.CanonicalJSON(st)
}

// digestMap turns "sha256:<hex>" into in-toto's {"sha256": "<hex>"}.
func digestMap(d string) map[string]string {
	alg, hexd, ok := strings.Cut(d, ":")
	if !ok {
		return map[string]string{}
	}
	return map[string]string{alg: hexd}
}
