package supervisor

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// TestStatementRoundTrip: the statement of a passed or failed assessment is
// a test-result v0.1 statement that this package's own parser reads back to
// the same checks; an inconclusive one has none.
func TestStatementRoundTrip(t *testing.T) {
	cases := []struct {
		fixture string
		exit    int
		want    string
	}{
		{"gotest/pass.json", 0, TestResultPassed},
		{"gotest/fail.json", 1, TestResultFailed},
		{"gotest/timeout.json", 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.fixture, func(t *testing.T) {
			a := mustJudge(t, evidence(Policy{Format: FormatGoTestJSON, AllReported: true}, readFixture(t, tc.fixture), tc.exit))
			data, err := a.StatementJSON()
			if tc.want == "" {
				if !errors.Is(err, ErrInconclusive) || data != nil {
					t.Fatalf("got %q, %v; want no statement and ErrInconclusive", data, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rep, err := ParseInTotoTestResult(bytes.NewReader(data), ParseLimits{})
			if err != nil {
				t.Fatalf("own statement does not parse: %v", err)
			}
			st, _ := a.Statement()
			if st.Predicate.Result != tc.want {
				t.Errorf("result: got %s, want %s", st.Predicate.Result, tc.want)
			}
			if len(rep.Checks) != len(a.Checks) {
				t.Errorf("checks: got %d back, want %d", len(rep.Checks), len(a.Checks))
			}
			got := map[string]CheckStatus{}
			for _, c := range rep.Checks {
				got[c.Name] = c.Status
			}
			for _, c := range a.Checks {
				if string(got[c.Name]) != string(c.Status) {
					t.Errorf("%s: got %s back, want %s", c.Name, got[c.Name], c.Status)
				}
			}
			if st.Predicate.Configuration[0].Digest["sha256"] != testBundle[len("sha256:"):] {
				t.Errorf("configuration: got %+v, want the bundle first", st.Predicate.Configuration)
			}
		})
	}
}

// A bundle's instance is in the binding and, as the annotation "instance"
// of the bundle's configuration entry, in the statement; without one
// neither has a trace of it (the goldens hold the bytes of both), and an
// instance that is no instance id cannot be bound.
func TestStatementNamesTheInstance(t *testing.T) {
	ev := evidence(Policy{Format: FormatGoTestJSON, AllReported: true}, readFixture(t, "gotest/pass.json"), 0)
	plain := mustJudge(t, ev)
	ev.Report = bytes.NewReader(readFixture(t, "gotest/pass.json"))
	ev.Instance = "astropy__astropy-12907"
	named := mustJudge(t, ev)
	if named.Binding.Instance != ev.Instance || plain.Binding.Instance != "" {
		t.Errorf("binding instance: got %q and %q, want %q and none", named.Binding.Instance, plain.Binding.Instance, ev.Instance)
	}
	if named.Binding.Key() != plain.Binding.Key() {
		t.Error("the instance changed the retention key; the bundle digest already fixes it")
	}

	st, err := named.Statement()
	if err != nil {
		t.Fatal(err)
	}
	bundle := st.Predicate.Configuration[0]
	if bundle.Name != "bundle" || len(bundle.Annotations) != 1 || bundle.Annotations["instance"] != ev.Instance {
		t.Errorf("bundle entry %+v, want the annotation instance=%s", bundle, ev.Instance)
	}
	if img := st.Predicate.Configuration[1]; img.Annotations != nil {
		t.Errorf("image entry %+v, want no annotations", img)
	}
	withJSON, _ := named.StatementJSON()
	entry := `{"annotations":{"instance":"astropy__astropy-12907"},"digest":{"sha256":"` + testBundle[len("sha256:"):] + `"},"name":"bundle"}`
	if !bytes.Contains(withJSON, []byte(`"configuration":[`+entry+`,`)) {
		t.Errorf("statement %s: want the bundle entry annotated, in canonical order", withJSON)
	}
	// Our own statement still parses as a report (in-toto v1 annotations
	// may hold any JSON value; the parser ignores them).
	if _, err := ParseInTotoTestResult(bytes.NewReader(withJSON), ParseLimits{}); err != nil {
		t.Errorf("the annotated statement does not parse: %v", err)
	}
	plainJSON, _ := plain.StatementJSON()
	if bytes.Contains(plainJSON, []byte("annotations")) || bytes.Contains(plainJSON, []byte("instance")) {
		t.Errorf("statement without an instance: %s", plainJSON)
	}

	for _, bad := range []string{"django/django#123", "a b", "-x", strings.Repeat("a", 129)} {
		ev.Report = bytes.NewReader(readFixture(t, "gotest/pass.json"))
		ev.Instance = bad
		if _, err := Judge(ev); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("instance %q: got %v, want sandbox.ErrInvalid", bad, err)
		}
	}
}
