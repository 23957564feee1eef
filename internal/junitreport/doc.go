// Package junitreport writes a supervisor assessment as JUnit XML, the
// format CI systems (GitLab, Jenkins, GitHub test reporters) show in their
// test views. It renders only a verified assessment (the supervisor's
// Assessment value or its retained JSON): it never reads a job's logs, a
// grader's report or anything a candidate wrote, so the file can say
// nothing the signed evidence does not.
//
// The mapping, one testcase per check of the assessment:
//
//   - passed: a testcase with no child;
//   - failed: a <failure> whose message is the check's reason;
//   - inconclusive: an <error> whose message is the reason. JUnit's error
//     means "the test could not be carried out", which is what
//     inconclusive is; every consumer counts errors apart from failures
//     (GitLab shows them as "error", Jenkins and the GitHub reporters as a
//     failure with an error message), and none treats them as a pass, as
//     all do <skipped>.
//
// The declared controls are their own suite, one testcase per control: it
// passes when the control got the verdict its kind expects (known-good
// passed, known-bad failed) and is an <error> otherwise, because a control
// that misbehaves makes the candidate's assessment inconclusive.
//
// The evidence digests are <properties> of each suite (the schema kept in
// testdata, Jenkins' junit-10.xsd, allows properties on suites only) and
// are repeated in each testcase's <system-out>, which the CI systems show
// beside a test.
package junitreport
