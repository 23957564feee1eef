package supervisor

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRules has one case per verdict rule: each case starts from sound
// evidence, breaks one thing, and checks the verdict and that the rule is
// named in the reasons.
func TestRules(t *testing.T) {
	pass := readFixture(t, "gotest/pass.json")
	fail := readFixture(t, "gotest/fail.json")
	skip := readFixture(t, "gotest/skip.json")
	timeout := readFixture(t, "gotest/timeout.json")
	count2 := readFixture(t, "gotest/pass-count2.json")
	goPolicy := func(required ...string) Policy {
		for i, r := range required {
			required[i] = "example.com/fixtures/" + r
		}
		return Policy{Format: FormatGoTestJSON, Required: required}
	}
	good := func() Evidence { return evidence(goPolicy("pass.TestAdd", "pass.TestTable/one"), pass, 0) }
	withStatus := func(st sandbox.Status, exit int, f func(*sandbox.Result)) Evidence {
		ev := good()
		ev.Grader.Status, ev.Grader.ExitCode = st, exit
		if f != nil {
			f(&ev.Grader)
		}
		return ev
	}
	control := func(kind ControlKind, v Verdict) ControlOutcome {
		return ControlOutcome{Kind: kind, BundleDigest: testBundle, ImageID: testImage, Verdict: v,
			Assessment: sandbox.DigestBytes([]byte(string(kind) + string(v)))}
	}
	withControls := func(outs ...ControlOutcome) Evidence {
		ev := good()
		ev.Policy.Controls = []ControlKind{ControlKnownGood, ControlKnownBad}
		ev.Controls = outs
		return ev
	}
	tap := func(s string) Evidence {
		return evidence(Policy{Format: FormatTAP, AllReported: true}, []byte(s), 0)
	}

	cases := []struct {
		rule Rule
		ev   Evidence
		want Verdict
	}{
		{RuleGraderTimedOut, withStatus(sandbox.StatusTimedOut, -1, nil), Inconclusive},
		{RuleGraderOOMKilled, withStatus(sandbox.StatusOOMKilled, 137, nil), Inconclusive},
		{RuleGraderLimitExceeded, withStatus(sandbox.StatusLimitExceeded, 0, func(r *sandbox.Result) { r.Limit = "pids" }), Inconclusive},
		{RuleGraderCancelled, withStatus(sandbox.StatusCancelled, 0, nil), Inconclusive},
		{RuleGraderError, withStatus(sandbox.StatusError, 0, func(r *sandbox.Result) { r.Cause = "engine unreachable" }), Inconclusive},
		{RuleGraderUncertain, withStatus(sandbox.StatusUncertain, 0, nil), Inconclusive},
		{RuleGraderExitMismatch, withStatus(sandbox.StatusSucceeded, 3, nil), Inconclusive},
		{RuleLimitHit, withStatus(sandbox.StatusSucceeded, 0, func(r *sandbox.Result) { r.LimitsHit = []string{"output_bytes"} }), Inconclusive},
		{RuleCandidateUnproven, func() Evidence {
			ev := good()
			c := graderResult(nil, 0)
			c.JobDigest, c.Status = testCandJob, sandbox.StatusUncertain
			ev.Candidate = &c
			return ev
		}(), Inconclusive},
		{RuleCandidateOverLimit, func() Evidence {
			ev := good()
			c := graderResult(nil, 0)
			c.JobDigest, c.Status, c.ExitCode = testCandJob, sandbox.StatusTimedOut, 137
			ev.Candidate = &c
			return ev
		}(), Failed},
		{RuleCandidateOverLimit, func() Evidence {
			ev := good()
			c := graderResult(nil, 2)
			c.JobDigest, c.Status, c.Limit, c.LimitsHit = testCandJob, sandbox.StatusLimitExceeded, "pids", []string{"pids"}
			ev.Candidate = &c
			return ev
		}(), Failed},
		{RuleCandidateOverLimit, func() Evidence {
			ev := good()
			c := graderResult(nil, 1)
			c.JobDigest, c.Status, c.LimitsHit = testCandJob, sandbox.StatusFailed, []string{"file_count"}
			ev.Candidate = &c
			return ev
		}(), Failed},
		{RuleCandidateOverLimit, func() Evidence {
			// Over its limits, whatever the grader did: still failed.
			ev := withStatus(sandbox.StatusError, 0, func(r *sandbox.Result) { r.Cause = "engine unreachable" })
			c := graderResult(nil, 137)
			c.JobDigest, c.Status = testCandJob, sandbox.StatusOOMKilled
			ev.Candidate = &c
			return ev
		}(), Failed},
		{RuleCandidateExportRefused, func() Evidence {
			// Every check the grader reported passed: still failed.
			ev := good()
			c := graderResult(nil, 0)
			c.JobDigest = testCandJob
			ev.Candidate, ev.ExportRefused = &c, `"export/conftest.py" (pattern "conftest.py"): refused path`
			return ev
		}(), Failed},
		{RuleCandidateExportRefused, func() Evidence {
			ev := withStatus(sandbox.StatusTimedOut, -1, nil)
			c := graderResult(nil, 0)
			c.JobDigest = testCandJob
			ev.Candidate, ev.ExportRefused = &c, "refused"
			return ev
		}(), Failed},
		{RuleReportMissing, withStatus(sandbox.StatusSucceeded, 0, func(r *sandbox.Result) { r.Artifacts = nil }), Inconclusive},
		{RuleReportOverCap, func() Evidence { ev := good(); ev.Policy.MaxReportBytes = 100; return ev }(), Inconclusive},
		{RuleReportUnavailable, func() Evidence { ev := good(); ev.Report = nil; return ev }(), Inconclusive},
		{RuleReportDigestMismatch, func() Evidence {
			ev := good()
			ev.Report = bytes.NewReader(bytes.Replace(pass, []byte(`"pass"`), []byte(`"fail"`), 1))
			return ev
		}(), Inconclusive},
		{RuleReportUnparseable, tap("TAP version 99\n1..1\nok 1 - x\n"), Inconclusive},
		{RuleReportEmpty, tap("1..0 # SKIP nothing to do\n"), Inconclusive},
		{RuleReportIncomplete, evidence(Policy{Format: FormatTAP, Required: []string{"a"}}, []byte("1..2\nok 1 - a\nBail out! no fixtures\n"), 255), Inconclusive},
		{RuleReportIncomplete, evidence(Policy{Format: FormatTAP, Required: []string{"a"}}, []byte("1..3\nok 1 - a\n"), 255), Inconclusive},
		{RuleReportIncomplete, evidence(Policy{Format: FormatTAP, Required: []string{"s/x"}}, []byte("1..1\n    1..2\n    ok 1 - x\nnot ok 1 - s\n"), 1), Inconclusive},
		{RuleDuplicateCheck, evidence(goPolicy("pass.TestAdd"), count2, 0), Inconclusive},
		{RuleExitCodeDisagrees, evidence(goPolicy("pass.TestAdd"), pass, 1), Inconclusive},
		{RuleControlMissing, withControls(control(ControlKnownBad, Failed)), Inconclusive},
		{RuleControlOtherGrader, func() Evidence {
			g := control(ControlKnownGood, Passed)
			g.BundleDigest = testCandJob
			return withControls(g, control(ControlKnownBad, Failed))
		}(), Inconclusive},
		{RuleControlGoodNotPassed, withControls(control(ControlKnownGood, Inconclusive), control(ControlKnownBad, Failed)), Inconclusive},
		{RuleControlBadNotFailed, withControls(control(ControlKnownGood, Passed), control(ControlKnownBad, Passed)), Inconclusive},
		{RuleRequiredMissing, evidence(goPolicy("pass.TestAdd", "pass.TestNotThere"), pass, 0), Inconclusive},
		{RuleRequiredSkipped, evidence(goPolicy("skip.TestRuns", "skip.TestSkipped"), skip, 0), Inconclusive},
		{RuleCheckErrored, evidence(goPolicy("timeout.TestQuick", "timeout.TestHangs"), timeout, 1), Inconclusive},
		{RuleCheckFailed, evidence(goPolicy("fail.TestGood", "fail.TestBad"), fail, 1), Failed},
		{RuleCheckPassed, withControls(control(ControlKnownGood, Passed), control(ControlKnownBad, Failed)), Passed},
	}

	covered := map[Rule]bool{}
	for _, tc := range cases {
		t.Run(string(tc.rule), func(t *testing.T) {
			covered[tc.rule] = true
			a := mustJudge(t, tc.ev)
			if a.Verdict != tc.want {
				t.Errorf("verdict: got %s, want %s (reasons %q, checks %+v)", a.Verdict, tc.want, a.Reasons, a.Checks)
			}
			if !hasReason(a, tc.rule) {
				t.Errorf("reasons: got %q and checks %+v, want rule %s named", a.Reasons, a.Checks, tc.rule)
			}
			if tc.want != Passed {
				if _, err := a.Statement(); tc.want == Inconclusive && !errors.Is(err, ErrInconclusive) {
					t.Errorf("statement of an inconclusive assessment: got err %v, want ErrInconclusive", err)
				}
			}
		})
	}
	all := []Rule{RuleCandidateOverLimit, RuleCandidateExportRefused, RuleRequiredMissing, RuleRequiredSkipped, RuleCheckErrored, RuleCheckFailed, RuleCheckPassed}
	for _, r := range evidenceRules {
		all = append(all, r.name)
	}
	for _, r := range all {
		if !covered[r] {
			t.Errorf("rule %s has no case in TestRules", r)
		}
	}
}

// TestInconclusiveNeverPassed: whatever else holds, a check that is not
// passed keeps the assessment from passing, and a fired evidence rule makes
// every check inconclusive.
func TestInconclusiveNeverPassed(t *testing.T) {
	pass := readFixture(t, "gotest/pass.json")
	ev := evidence(Policy{Format: FormatGoTestJSON, AllReported: true}, pass, 0)
	ev.Grader.LimitsHit = []string{"log_bytes"}
	a := mustJudge(t, ev)
	if a.Verdict != Inconclusive {
		t.Fatalf("verdict: got %s, want inconclusive", a.Verdict)
	}
	for _, c := range a.Checks {
		if c.Status != Inconclusive {
			t.Errorf("check %s: got %s, want inconclusive", c.Name, c.Status)
		}
	}
	if len(a.Checks) != 5 {
		t.Errorf("checks: got %d, want the 5 reported", len(a.Checks))
	}
}

// TestFailedAndMissing: a failed check beside a missing one is inconclusive:
// the evidence is not otherwise sound.
func TestFailedAndMissing(t *testing.T) {
	fail := readFixture(t, "gotest/fail.json")
	ev := evidence(Policy{Format: FormatGoTestJSON, Required: []string{"example.com/fixtures/fail.TestBad", "example.com/fixtures/fail.TestGone"}}, fail, 1)
	a := mustJudge(t, ev)
	if a.Verdict != Inconclusive {
		t.Errorf("verdict: got %s, want inconclusive", a.Verdict)
	}
}

func TestJudgeRefusesUnboundInput(t *testing.T) {
	pass := readFixture(t, "gotest/pass.json")
	base := func() Evidence {
		return evidence(Policy{Format: FormatGoTestJSON, AllReported: true}, pass, 0)
	}
	cases := map[string]func(*Evidence){
		"unknown format":           func(e *Evidence) { e.Policy.Format = "xunit-9" },
		"relative report path":     func(e *Evidence) { e.Policy.ReportPath = "out/report" },
		"required and all":         func(e *Evidence) { e.Policy.Required = []string{"x"} },
		"neither required nor all": func(e *Evidence) { e.Policy.AllReported = false },
		"duplicate required": func(e *Evidence) {
			e.Policy.AllReported, e.Policy.Required = false, []string{"a", "a"}
		},
		"unknown control": func(e *Evidence) { e.Policy.Controls = []ControlKind{"known-ugly"} },
		"bad bundle":      func(e *Evidence) { e.BundleDigest = "sha256:XYZ" },
		"image tag":       func(e *Evidence) { e.ImageID = "busybox:latest" },
		"bad result":      func(e *Evidence) { e.Grader.Schema = "sandboxd.result/v0" },
		"bad workspace":   func(e *Evidence) { e.WorkspaceDigest = "md5:00" },
		"candidate of another job": func(e *Evidence) {
			c := graderResult(nil, 0)
			e.Candidate = &c
		},
		"refused export without a candidate job": func(e *Evidence) { e.ExportRefused = "refused" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			ev := base()
			mutate(&ev)
			_, err := Judge(ev)
			if !errors.Is(err, sandbox.ErrInvalid) {
				t.Errorf("got err %v, want one wrapping sandbox.ErrInvalid", err)
			}
		})
	}
}

func TestReasonsNameRuleAndDetail(t *testing.T) {
	fail := readFixture(t, "gotest/fail.json")
	a := mustJudge(t, evidence(Policy{Format: FormatGoTestJSON, Required: []string{"example.com/fixtures/fail.TestBad"}}, fail, 1))
	got := a.Checks[0].Reason
	if !strings.HasPrefix(got, string(RuleCheckFailed)+": ") {
		t.Errorf("reason: got %q, want it to start with %q", got, RuleCheckFailed)
	}
	want := []string{a.Binding.GraderResultDigest, a.Report.Digest}
	if len(a.Checks[0].Evidence) != 2 || !contains(a.Checks[0].Evidence, want[0]) || !contains(a.Checks[0].Evidence, want[1]) {
		t.Errorf("evidence: got %q, want %q", a.Checks[0].Evidence, want)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
