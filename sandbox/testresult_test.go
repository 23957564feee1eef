package sandbox_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// A test-result statement verifies only with a pinned key and only in its
// own shape, and says which candidate and which bundle it is about.
func TestVerifyTestResult(t *testing.T) {
	sa, sb := signers(t)
	keys := keySet(t, sa)
	hexOf := func(c string) string { return strings.Repeat(c, 64) }
	sign := func(st sandbox.Statement) []byte {
		t.Helper()
		env, err := sa.SignStatement(st)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	statement := func(result string, subjects []sandbox.Subject, config []sandbox.Subject) sandbox.Statement {
		pred, err := json.Marshal(map[string]any{"result": result, "configuration": config, "passedTests": []string{"a"}, "failedTests": []string{}})
		if err != nil {
			t.Fatal(err)
		}
		return sandbox.Statement{Type: sandbox.StatementType, PredicateType: sandbox.PredicateTestResult, Subject: subjects, Predicate: pred}
	}
	ws := []sandbox.Subject{{Name: "candidate-workspace", Digest: map[string]string{"sha256": hexOf("a")}}}
	bun := []sandbox.Subject{{Name: "bundle", Digest: map[string]string{"sha256": hexOf("b")}}}

	tr, err := sandbox.VerifyTestResult(keys, sign(statement(sandbox.TestResultPassed, ws, bun)))
	if err != nil {
		t.Fatalf("a well-formed test-result: %v", err)
	}
	if name, d := tr.Subject(); name != "candidate-workspace" || d != "sha256:"+hexOf("a") {
		t.Errorf("got subject %s %s, want candidate-workspace sha256:%s", name, d, hexOf("a"))
	}
	if got := tr.Bundle(); got != "sha256:"+hexOf("b") {
		t.Errorf("got bundle %q, want sha256:%s", got, hexOf("b"))
	}
	if tr.Result != sandbox.TestResultPassed || len(tr.PassedTests) != 1 || len(tr.KeyIDs) != 1 {
		t.Errorf("got %+v, want PASSED with one passed test and one key", tr)
	}
	twoBundles := append(append([]sandbox.Subject{}, bun...), sandbox.Subject{Name: "bundle", Digest: map[string]string{"sha256": hexOf("c")}})
	if tr, err := sandbox.VerifyTestResult(keys, sign(statement(sandbox.TestResultFailed, ws, twoBundles))); err != nil || tr.Bundle() != "" {
		t.Errorf("two bundles: got %q (%v), want no bundle", tr.Bundle(), err)
	}
	badDigest := []sandbox.Subject{{Name: "candidate-workspace", Digest: map[string]string{"sha256": "ABC"}}}
	if tr, err := sandbox.VerifyTestResult(keys, sign(statement(sandbox.TestResultPassed, badDigest, bun))); err != nil {
		t.Fatal(err)
	} else if _, d := tr.Subject(); d != "" {
		t.Errorf("a malformed subject digest came back as %q, want none", d)
	}

	other, err := sb.SignStatement(statement(sandbox.TestResultPassed, ws, bun))
	if err != nil {
		t.Fatal(err)
	}
	wrongPredicate := statement(sandbox.TestResultPassed, ws, bun)
	wrongPredicate.PredicateType = sandbox.PredicateAssessment
	for _, c := range []struct {
		name     string
		envelope []byte
		want     error
	}{
		{"another key", other, sandbox.ErrUnknownKey},
		{"another predicate", sign(wrongPredicate), sandbox.ErrPredicateType},
		{"no subject", sign(statement(sandbox.TestResultPassed, nil, bun)), sandbox.ErrSubject},
		{"a verdict that is neither", sign(statement("WARNED", ws, bun)), sandbox.ErrPredicate},
	} {
		if _, err := sandbox.VerifyTestResult(keys, c.envelope); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// The instance a test-result names is the "instance" annotation of its
// bundle entry, a valid instance id; checked against its assessment, it
// must be the assessment's instance, none for none.
func TestTestResultInstance(t *testing.T) {
	sa, _ := signers(t)
	keys := keySet(t, sa)
	ws := sandbox.DigestBytes([]byte("ws"))
	bundle := sandbox.DigestBytes([]byte("bundle"))
	hexOf := func(d string) map[string]string { return map[string]string{"sha256": strings.TrimPrefix(d, "sha256:")} }
	// signed is the test-result of a passed check "a" on ws under bundle,
	// whose bundle entry has annotations (none when nil).
	signed := func(annotations map[string]any) []byte {
		t.Helper()
		entry := map[string]any{"name": "bundle", "digest": hexOf(bundle)}
		if annotations != nil {
			entry["annotations"] = annotations
		}
		pred, err := json.Marshal(map[string]any{"result": sandbox.TestResultPassed, "configuration": []any{entry}, "passedTests": []string{"a"}, "failedTests": []string{}})
		if err != nil {
			t.Fatal(err)
		}
		env, err := sa.SignStatement(sandbox.Statement{Type: sandbox.StatementType, PredicateType: sandbox.PredicateTestResult,
			Subject: []sandbox.Subject{{Name: "candidate-workspace", Digest: hexOf(ws)}}, Predicate: pred})
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	assessment := func(instance string) sandbox.Assessment {
		return sandbox.Assessment{ManifestDigest: bundle, Instance: instance, WorkspaceDigest: ws, Verdict: sandbox.VerdictPassed,
			Checks: []sandbox.AssessedCheck{{Name: "a", Status: sandbox.VerdictPassed}}}
	}
	const id = "astropy__astropy-12907"

	for _, tc := range []struct {
		name        string
		annotations map[string]any
		want        string
	}{
		{"no annotations", nil, ""},
		{"the instance", map[string]any{"instance": id}, id},
		{"the instance among others", map[string]any{"instance": id, "twoPartyReview": false}, id},
		{"other annotations only", map[string]any{"twoPartyReview": false}, ""},
	} {
		tr, err := sandbox.VerifyTestResult(keys, signed(tc.annotations))
		if err != nil || tr.Instance != tc.want || tr.Bundle() != bundle {
			t.Errorf("%s: got instance %q, bundle %q, %v; want %q", tc.name, tr.Instance, tr.Bundle(), err, tc.want)
		}
	}
	for _, bad := range []any{"django/django#123", "", 12907, map[string]any{"id": id}, nil} {
		if _, err := sandbox.VerifyTestResult(keys, signed(map[string]any{"instance": bad})); !errors.Is(err, sandbox.ErrPredicate) {
			t.Errorf("instance annotation %#v: got %v, want sandbox.ErrPredicate", bad, err)
		}
	}

	named, _ := sandbox.VerifyTestResult(keys, signed(map[string]any{"instance": id}))
	other, _ := sandbox.VerifyTestResult(keys, signed(map[string]any{"instance": "astropy__astropy-13033"}))
	none, _ := sandbox.VerifyTestResult(keys, signed(nil))
	for _, tc := range []struct {
		name     string
		instance string
		tr       sandbox.TestResult
		want     error
	}{
		{"the same instance", id, named, nil},
		{"neither names one", "", none, nil},
		{"another instance", id, other, sandbox.ErrPredicate},
		{"an instance the assessment lacks", "", named, sandbox.ErrPredicate},
		{"no instance where the assessment names one", id, none, sandbox.ErrPredicate},
	} {
		a := assessment(tc.instance)
		err := a.CheckTestResult(tc.tr)
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
		if tc.want != nil && err != nil && !strings.Contains(err.Error(), "test-result instance") {
			t.Errorf("%s: %q does not name the instance", tc.name, err)
		}
	}
}
