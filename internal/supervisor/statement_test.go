package supervisor

import (
	"bytes"
	"errors"
	"testing"
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
