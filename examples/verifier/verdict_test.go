package verifier

import "testing"

// The check result is passed only when exactly the required checks were
// judged and every one passed.
func TestVerdict(t *testing.T) {
	req := []string{"a", "b"}
	c := func(n string, s Status) SupervisedCheck { return SupervisedCheck{Name: n, Status: s} }
	for _, tc := range []struct {
		name   string
		checks []SupervisedCheck
		want   Status
	}{
		{"all passed", []SupervisedCheck{c("a", StatusPassed), c("b", StatusPassed)}, StatusPassed},
		{"one failed", []SupervisedCheck{c("a", StatusPassed), c("b", StatusFailed)}, StatusFailed},
		{"one inconclusive, one failed", []SupervisedCheck{c("a", StatusInconclusive), c("b", StatusFailed)}, StatusInconclusive},
		{"one missing", []SupervisedCheck{c("a", StatusPassed)}, StatusInconclusive},
		{"another in its place", []SupervisedCheck{c("a", StatusPassed), c("z", StatusPassed)}, StatusInconclusive},
		{"one more", []SupervisedCheck{c("a", StatusPassed), c("b", StatusPassed), c("z", StatusPassed)}, StatusInconclusive},
		{"twice", []SupervisedCheck{c("a", StatusPassed), c("a", StatusPassed)}, StatusInconclusive},
		{"unknown status", []SupervisedCheck{c("a", StatusPassed), c("b", "skipped")}, StatusInconclusive},
		{"none", nil, StatusInconclusive},
	} {
		if got, reason := verdict(tc.checks, req); got != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.name, got, reason, tc.want)
		}
	}
}
