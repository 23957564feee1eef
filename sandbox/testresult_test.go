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
