// Package supervisor turns a grader's structured test report into verdicts.
//
// It parses the report formats graders really write (go test -json, JUnit
// XML, TAP 13/14 and the in-toto test-result predicate) into one normalized
// form, corroborates the report with what the broker observed from outside
// (status, exit code, limits hit, the report artifact's digest and size, and
// control runs), and reduces the evidence with named, fail-closed rules to
// one CheckResult per check and an overall verdict: passed, failed or
// inconclusive. Inconclusive is never passed. Assessments are canonical JSON,
// bound to the digests they were computed from, and retained so that asking
// again returns the same bytes.
//
// The supervisor never reads stdout or stderr. Its API takes no log bytes at
// all: logs are evidence for people, and a candidate can write anything to
// them. It also never imports the container engine client.
package supervisor
