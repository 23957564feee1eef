package supervisor

import (
	"errors"
	"strings"
	"testing"
)

// TestParseEdges covers syntax the fixtures do not: each input is small
// and written here because it is about one rule of the format.
func TestParseEdges(t *testing.T) {
	type want struct {
		checks string // "name=status;…", in report order
		err    error
	}
	cases := []struct {
		name   string
		format Format
		in     string
		want   want
	}{
		// go test -json
		{"go: output never counts", FormatGoTestJSON,
			`{"Action":"run","Package":"p","Test":"T"}
{"Action":"output","Package":"p","Test":"T","Output":"--- PASS: T (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"T","Elapsed":0.5}
{"Action":"fail","Package":"p","Elapsed":0.6}`,
			want{checks: "p.T=failed"}},
		{"go: package failed with all tests passing", FormatGoTestJSON,
			`{"Action":"run","Package":"p","Test":"T"}
{"Action":"pass","Package":"p","Test":"T"}
{"Action":"fail","Package":"p","Elapsed":0.1}`,
			want{checks: "p.T=passed;p=error"}},
		{"go: no test files", FormatGoTestJSON,
			`{"Action":"start","Package":"p"}
{"Action":"output","Package":"p","Output":"?   \tp\t[no test files]\n"}
{"Action":"skip","Package":"p","Elapsed":0}`,
			want{checks: ""}},
		{"go: attr and artifacts are not results", FormatGoTestJSON,
			`{"Action":"run","Package":"p","Test":"T"}
{"Action":"attr","Package":"p","Test":"T","Key":"k","Value":"v"}
{"Action":"artifacts","Package":"p","Test":"T","Path":"/tmp/x"}
{"Action":"pass","Package":"p","Test":"T"}
{"Action":"pass","Package":"p"}`,
			want{checks: "p.T=passed"}},
		{"go: unknown action", FormatGoTestJSON, `{"Action":"win","Package":"p","Test":"T"}`, want{err: ErrUnparseable}},
		{"go: negative elapsed", FormatGoTestJSON, `{"Action":"pass","Package":"p","Test":"T","Elapsed":-1}`, want{err: ErrUnparseable}},
		{"go: package ends twice", FormatGoTestJSON, "{\"Action\":\"pass\",\"Package\":\"p\"}\n{\"Action\":\"fail\",\"Package\":\"p\"}", want{err: ErrUnparseable}},

		// JUnit
		{"junit: nested suites and error beats failure", FormatJUnitXML,
			`<testsuites><testsuite name="outer"><testsuite name="inner" tests="2">
<testcase name="a"><failure message="f"/><error message="e"/></testcase>
<testcase classname="k" name="b"><skipped/></testcase></testsuite></testsuite></testsuites>`,
			want{checks: "inner.a=error;k.b=skipped"}},
		{"junit: flaky pass is an error", FormatJUnitXML,
			`<testsuite name="s"><testcase classname="c" name="t"><flakyFailure message="first try"/></testcase></testsuite>`,
			want{checks: "c.t=error"}},
		{"junit: rerun failure is failed", FormatJUnitXML,
			`<testsuite name="s"><testcase classname="c" name="t"><failure/><rerunFailure/></testcase></testsuite>`,
			want{checks: "c.t=failed"}},
		{"junit: wrong root", FormatJUnitXML, `<html><testcase name="x"/></html>`, want{err: ErrUnparseable}},
		{"junit: mismatched tags", FormatJUnitXML, `<testsuite name="s"><testcase name="x"></testsuite></testcase>`, want{err: ErrUnparseable}},
		{"junit: testcase without a name", FormatJUnitXML, `<testsuite name="s"><testcase classname="c"/></testsuite>`, want{err: ErrUnparseable}},
		{"junit: non-UTF-8 charset", FormatJUnitXML, `<?xml version="1.0" encoding="ISO-8859-1"?><testsuite name="s"/>`, want{err: ErrUnparseable}},
		{"junit: ENTITY inside a DOCTYPE", FormatJUnitXML, `<!DOCTYPE t [<!ENTITY a "b">]><testsuite name="s"/>`, want{err: ErrUnparseable}},
		{"junit: two roots", FormatJUnitXML, `<testsuite name="a"/><testsuite name="b"/>`, want{err: ErrUnparseable}},

		// TAP
		{"tap: unnumbered points and pragma", FormatTAP, "TAP version 14\n1..2\npragma +strict\nok - a\nnot ok\n", want{checks: "a=passed;test 2=failed"}},
		{"tap: plan at the end", FormatTAP, "ok 1 a\nok 2 b\n1..2\n", want{checks: "a=passed;b=passed"}},
		{"tap: todo that passes is not a pass", FormatTAP, "1..1\nok 1 - later # TODO not yet\n", want{checks: "later=skipped"}},
		{"tap: skip directive variants", FormatTAP, "1..2\nok 1 - a # skipped no db\nnot ok 2 - b # SKIP\n", want{checks: "a=skipped;b=skipped"}},
		{"tap: hash without directive", FormatTAP, "1..1\nok 1 - a # time=3ms\n", want{checks: "a=passed"}},
		{"tap: bail out inside a subtest", FormatTAP, "1..2\nok 1 - a\n# Subtest: s\n    1..2\n    ok 1 - x\nBail out! broken\n", want{checks: "Bail out!=error;a=passed;s/x=passed;s/(plan)=error;(plan)=error"}},
		{"tap: missing plan", FormatTAP, "ok 1 - a\n", want{checks: "a=passed;(plan)=error"}},
		{"tap: too many points", FormatTAP, "1..1\nok 1 - a\nok 2 - b\n", want{checks: "a=passed;b=passed;(plan)=error"}},
		{"tap: unknown lines are ignored", FormatTAP, "1..1\nokay then\n  ok 9 - two-space indent\nok 1 - a\n", want{checks: "a=passed"}},
		{"tap: version 12 refused", FormatTAP, "TAP version 12\n1..0\n", want{err: ErrUnparseable}},
		{"tap: out of sequence", FormatTAP, "1..2\nok 2 - a\nok 1 - b\n", want{err: ErrUnparseable}},
		{"tap: unclosed YAML", FormatTAP, "1..1\nnot ok 1 - a\n  ---\n  message: x\n", want{err: ErrUnparseable}},

		// in-toto
		{"in-toto: unknown fields ignored", FormatInTotoTestResult,
			`{"_type":"https://in-toto.io/Statement/v1","subject":[],"predicateType":"https://in-toto.io/attestation/test-result/v0.1","predicate":{"result":"WARNED","warnedTests":["w"],"passedTests":["p"],"extra":1},"x":2}`,
			want{checks: "p=passed;w=passed"}},
		{"in-toto: passed with failures", FormatInTotoTestResult,
			`{"_type":"https://in-toto.io/Statement/v1","predicateType":"https://in-toto.io/attestation/test-result/v0.1","predicate":{"result":"PASSED","failedTests":["f"]}}`,
			want{err: ErrUnparseable}},
		{"in-toto: old statement type", FormatInTotoTestResult,
			`{"_type":"https://in-toto.io/Statement/v0.1","predicateType":"https://in-toto.io/attestation/test-result/v0.1","predicate":{"result":"PASSED"}}`,
			want{err: ErrUnparseable}},
		{"in-toto: two documents", FormatInTotoTestResult,
			`{"_type":"https://in-toto.io/Statement/v1","predicateType":"https://in-toto.io/attestation/test-result/v0.1","predicate":{"result":"PASSED"}} {}`,
			want{err: ErrUnparseable}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Parse(tc.format, strings.NewReader(tc.in), ParseLimits{})
			if tc.want.err != nil {
				if !errors.Is(err, tc.want.err) {
					t.Fatalf("got err %v (checks %+v), want %v", err, rep.Checks, tc.want.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("got err %v, want none", err)
			}
			var parts []string
			for _, c := range rep.Checks {
				parts = append(parts, c.Name+"="+string(c.Status))
			}
			if got := strings.Join(parts, ";"); got != tc.want.checks {
				t.Errorf("got %q, want %q", got, tc.want.checks)
			}
		})
	}
}
