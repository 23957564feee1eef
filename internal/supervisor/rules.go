package supervisor

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"sort"
	"strings"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Verdict is the outcome of one check or of a whole assessment: the
// public sandbox.Verdict a signed assessment carries.
type Verdict = sandbox.Verdict

// Verdicts. Inconclusive is never passed.
const (
	Passed       = sandbox.VerdictPassed
	Failed       = sandbox.VerdictFailed
	Inconclusive = sandbox.VerdictInconclusive
)

// Rule names a verdict rule. A CheckResult's reason starts with the name of
// the rule that decided it.
type Rule string

// Rules about the evidence as a whole. When any fires, every check and the
// assessment are inconclusive.
const (
	RuleGraderTimedOut       Rule = "grader_timed_out"        // the grader hit its wall-clock deadline
	RuleGraderOOMKilled      Rule = "grader_oom_killed"       // the grader ran out of memory
	RuleGraderLimitExceeded  Rule = "grader_limit_exceeded"   // the grader hit another limit
	RuleGraderCancelled      Rule = "grader_cancelled"        // the grader job was cancelled
	RuleGraderError          Rule = "grader_error"            // infrastructure failure
	RuleGraderUncertain      Rule = "grader_uncertain"        // the broker cannot prove what happened
	RuleGraderExitMismatch   Rule = "grader_status_exit_code" // status and exit code disagree
	RuleLimitHit             Rule = "limit_hit"               // a limit was hit, e.g. output truncated
	RuleCandidateUnproven    Rule = "candidate_unproven"      // the candidate job's own run is not proven (error, uncertain, cancelled)
	RuleReportMissing        Rule = "report_missing"          // no artifact at the report path
	RuleReportOverCap        Rule = "report_over_cap"         // bigger than the policy's cap
	RuleReportUnavailable    Rule = "report_unavailable"      // listed, but its bytes were not given
	RuleReportDigestMismatch Rule = "report_digest_mismatch"  // the bytes are not the collected artifact
	RuleReportUnparseable    Rule = "report_unparseable"      // not a well-formed report, or refused
	RuleReportEmpty          Rule = "report_empty"            // zero checks
	RuleReportIncomplete     Rule = "report_incomplete"       // cut short: a TAP bail-out or a plan not met
	RuleDuplicateCheck       Rule = "duplicate_check"         // a check name reported more than once
	RuleExitCodeDisagrees    Rule = "exit_code_disagrees"     // all passed ⇔ exit 0 does not hold
	RuleControlMissing       Rule = "control_missing"         // a declared control has no outcome
	RuleControlOtherGrader   Rule = "control_other_grader"    // a control ran under another bundle or image
	RuleControlGoodNotPassed Rule = "control_known_good_not_passed"
	RuleControlBadNotFailed  Rule = "control_known_bad_not_failed"
)

// RuleCandidateOverLimit fails every check: the candidate job ran, proven
// by its signed result, and broke a limit of its own (timed out, ran out
// of memory, hit a limit, or filled its export past output_bytes or
// file_count). That is the candidate's doing, so it is the candidate's
// verdict: failed, whatever the grader made of what was left. A candidate
// cannot move its verdict to inconclusive by breaking its limits.
const RuleCandidateOverLimit Rule = "candidate_over_limit"

// RuleCandidateExportRefused fails every check: the candidate job
// exported a path the bundle's reader rules refuse (a file that would
// shadow the grader's own, say). What the grader made of such an export
// cannot be trusted, and the export is the candidate's doing, so, as for
// RuleCandidateOverLimit, the verdict is failed: never inconclusive, never
// passed.
const RuleCandidateExportRefused Rule = "candidate_export_refused"

// candidateFault is the rule that fails every check because of what the
// candidate job did, and its detail, if one fires.
func candidateFault(ev *Evidence) (Rule, string, bool) {
	c := ev.Candidate
	if c == nil {
		return "", "", false
	}
	switch c.Status {
	case sandbox.StatusTimedOut, sandbox.StatusOOMKilled:
		return RuleCandidateOverLimit, "candidate job " + string(c.Status), true
	case sandbox.StatusLimitExceeded:
		return RuleCandidateOverLimit, "candidate job limit_exceeded (" + c.Limit + ")", true
	}
	for _, l := range c.LimitsHit {
		if l == "output_bytes" || l == "file_count" {
			return RuleCandidateOverLimit, "candidate export truncated at " + l, true
		}
	}
	if ev.ExportRefused != "" {
		return RuleCandidateExportRefused, ev.ExportRefused, true
	}
	return "", "", false
}

// Rules about one check, applied only when the evidence is sound.
const (
	RuleRequiredMissing Rule = "required_check_missing" // inconclusive
	RuleRequiredSkipped Rule = "required_check_skipped" // inconclusive (also TODO, xfail)
	RuleCheckErrored    Rule = "check_errored"          // inconclusive: no result of its own
	RuleCheckFailed     Rule = "check_failed"           // failed
	RuleCheckPassed     Rule = "check_passed"           // passed
)

// ControlOutcome is the verdict a control run got under a grader.
type ControlOutcome struct {
	Kind ControlKind `json:"kind"`
	// BundleDigest and ImageID are those the control's grader ran from;
	// they must be the candidate's.
	BundleDigest string  `json:"bundle_digest"`
	ImageID      string  `json:"image_id"`
	Verdict      Verdict `json:"verdict"`
	// Assessment is the digest of the control's retained assessment.
	Assessment string `json:"assessment"`
}

// ControlFrom makes the outcome of a control run from its assessment and
// that assessment's retained bytes.
func ControlFrom(kind ControlKind, a Assessment, retained []byte) ControlOutcome {
	return ControlOutcome{
		Kind:         kind,
		BundleDigest: a.Binding.BundleDigest,
		ImageID:      a.Binding.ImageID,
		Verdict:      a.Verdict,
		Assessment:   sandbox.DigestBytes(retained),
	}
}

// Evidence is everything an assessment is computed from. There is no field
// for stdout or stderr: the supervisor never reads them.
type Evidence struct {
	// BundleDigest and ImageID name the evaluator bundle and image.
	BundleDigest string
	ImageID      string
	// Instance is the task instance the bundle names (bundle.json's
	// instance), "" for none. It is carried into the binding and the
	// statement, never judged: the bundle digest already fixes it.
	Instance string
	// CandidateJobDigest is the digest of the candidate's job; if Candidate
	// is set, its JobDigest must match.
	CandidateJobDigest string
	// WorkspaceDigest is the candidate workspace's digest as sandboxd
	// computed it; it becomes the subject of the in-toto statement.
	// Optional: without it the subject is the candidate job.
	WorkspaceDigest string
	// Policy is the bundle's declaration about the report.
	Policy Policy
	// Grader is the broker's result of the grader job.
	Grader sandbox.Result
	// Report is the content of the grader's report artifact, fetched from
	// the blob store by the digest in Grader.Artifacts; nil if it could not
	// be fetched. It is read at most to the policy's cap, and its digest
	// and size are checked against the artifact.
	Report io.Reader
	// Candidate is the broker's result of the candidate job, if it ran as a
	// job of its own.
	Candidate *sandbox.Result
	// ExportRefused is why the bundle's reader rules refuse what the
	// candidate job exported (the grader was given it all the same); ""
	// when they do not, or there is no candidate job.
	ExportRefused string
	// Controls are the outcomes of the bundle's control runs.
	Controls []ControlOutcome
}

// reportOutcome is what reading the report showed.
type reportOutcome struct {
	artifact    sandbox.Artifact
	found       bool
	overCap     string // detail when over the cap
	unavailable bool
	mismatch    string // detail when the bytes are not the artifact
	parseErr    error
	report      Report
}

// evalState is the input of the rules.
type evalState struct {
	ev     *Evidence
	rep    reportOutcome
	counts map[string]int
	byName map[string]Check
}

// evidenceRule is one named rule over the whole evidence: it returns a
// detail when it fires.
type evidenceRule struct {
	name  Rule
	fires func(s *evalState) (detail string, fired bool)
}

func statusRule(name Rule, st sandbox.Status) evidenceRule {
	return evidenceRule{name, func(s *evalState) (string, bool) {
		g := s.ev.Grader
		if g.Status != st {
			return "", false
		}
		d := "grader job " + string(st)
		if g.Limit != "" {
			d += " (" + g.Limit + ")"
		}
		if g.Cause != "" {
			d += ": " + g.Cause
		}
		return d, true
	}}
}

// evidenceRules are evaluated in this order; every rule that fires is
// recorded, the first decides the reason given to each check.
var evidenceRules = []evidenceRule{
	statusRule(RuleGraderTimedOut, sandbox.StatusTimedOut),
	statusRule(RuleGraderOOMKilled, sandbox.StatusOOMKilled),
	statusRule(RuleGraderLimitExceeded, sandbox.StatusLimitExceeded),
	statusRule(RuleGraderCancelled, sandbox.StatusCancelled),
	statusRule(RuleGraderError, sandbox.StatusError),
	statusRule(RuleGraderUncertain, sandbox.StatusUncertain),
	{RuleGraderExitMismatch, func(s *evalState) (string, bool) {
		g := s.ev.Grader
		switch {
		case g.Status == sandbox.StatusSucceeded && g.ExitCode != 0:
			return fmt.Sprintf("status succeeded with exit code %d", g.ExitCode), true
		case g.Status == sandbox.StatusFailed && g.ExitCode == 0:
			return "status failed with exit code 0", true
		}
		return "", false
	}},
	{RuleLimitHit, func(s *evalState) (string, bool) {
		if len(s.ev.Grader.LimitsHit) == 0 {
			return "", false
		}
		return "grader hit " + strings.Join(sortedNames(s.ev.Grader.LimitsHit), ", "), true
	}},
	{RuleCandidateUnproven, func(s *evalState) (string, bool) {
		c := s.ev.Candidate
		if c == nil {
			return "", false
		}
		switch c.Status {
		case sandbox.StatusError, sandbox.StatusUncertain, sandbox.StatusCancelled:
			// What it ran is not proven (the broker's doing, not the
			// candidate's); over its own limits it fails instead
			// (RuleCandidateOverLimit).
			return "candidate job " + string(c.Status), true
		}
		return "", false
	}},
	{RuleReportMissing, func(s *evalState) (string, bool) {
		if s.rep.found {
			return "", false
		}
		return "no artifact at " + s.ev.Policy.ReportPath, true
	}},
	{RuleReportOverCap, func(s *evalState) (string, bool) {
		return s.rep.overCap, s.rep.overCap != ""
	}},
	{RuleReportUnavailable, func(s *evalState) (string, bool) {
		return "the report's bytes were not given", s.rep.unavailable
	}},
	{RuleReportDigestMismatch, func(s *evalState) (string, bool) {
		return s.rep.mismatch, s.rep.mismatch != ""
	}},
	{RuleReportUnparseable, func(s *evalState) (string, bool) {
		if s.rep.parseErr == nil {
			return "", false
		}
		return s.rep.parseErr.Error(), true
	}},
	{RuleReportIncomplete, func(s *evalState) (string, bool) {
		if !s.parsed() || s.rep.report.Incomplete == "" {
			return "", false
		}
		return "the report was cut short: " + s.rep.report.Incomplete, true
	}},
	{RuleReportEmpty, func(s *evalState) (string, bool) {
		return "the report has no checks", s.parsed() && len(s.rep.report.Checks) == 0
	}},
	{RuleDuplicateCheck, func(s *evalState) (string, bool) {
		var dup []string
		for n, c := range s.counts {
			if c > 1 {
				dup = append(dup, fmt.Sprintf("%q ×%d", n, c))
			}
		}
		if len(dup) == 0 {
			return "", false
		}
		sort.Strings(dup)
		if len(dup) > 5 {
			dup = append(dup[:5], fmt.Sprintf("and %d more", len(dup)-5))
		}
		return strings.Join(dup, ", "), true
	}},
	{RuleExitCodeDisagrees, func(s *evalState) (string, bool) {
		g := s.ev.Grader
		if !s.parsed() || len(s.rep.report.Checks) == 0 {
			return "", false
		}
		if g.Status != sandbox.StatusSucceeded && g.Status != sandbox.StatusFailed {
			return "", false
		}
		bad := 0
		for _, c := range s.rep.report.Checks {
			if c.Status == CheckFailed || c.Status == CheckError {
				bad++
			}
		}
		switch {
		case bad == 0 && g.ExitCode != 0:
			return fmt.Sprintf("no check failed but the grader exited %d", g.ExitCode), true
		case bad > 0 && g.ExitCode == 0:
			return fmt.Sprintf("%d checks failed or errored but the grader exited 0", bad), true
		}
		return "", false
	}},
	{RuleControlMissing, func(s *evalState) (string, bool) {
		var missing []string
		for _, k := range s.ev.Policy.Controls {
			if len(s.controls(k)) == 0 {
				missing = append(missing, string(k))
			}
		}
		return strings.Join(missing, ", "), len(missing) > 0
	}},
	{RuleControlOtherGrader, func(s *evalState) (string, bool) {
		for _, c := range s.ev.Controls {
			if c.BundleDigest != s.ev.BundleDigest || c.ImageID != s.ev.ImageID {
				return fmt.Sprintf("%s control ran under bundle %s image %s", c.Kind, c.BundleDigest, c.ImageID), true
			}
		}
		return "", false
	}},
	{RuleControlGoodNotPassed, func(s *evalState) (string, bool) {
		for _, c := range s.controls(ControlKnownGood) {
			if c.Verdict != Passed {
				return "known-good control was " + string(c.Verdict), true
			}
		}
		return "", false
	}},
	{RuleControlBadNotFailed, func(s *evalState) (string, bool) {
		for _, c := range s.controls(ControlKnownBad) {
			if c.Verdict != Failed {
				return "known-bad control was " + string(c.Verdict), true
			}
		}
		return "", false
	}},
}

func (s *evalState) parsed() bool {
	return s.rep.found && s.rep.overCap == "" && !s.rep.unavailable && s.rep.mismatch == "" && s.rep.parseErr == nil
}

func (s *evalState) controls(k ControlKind) []ControlOutcome {
	var out []ControlOutcome
	for _, c := range s.ev.Controls {
		if c.Kind == k {
			out = append(out, c)
		}
	}
	return out
}

// checkRule decides one check of sound evidence.
func checkRule(c Check, present bool) (Verdict, Rule, string) {
	if !present {
		return Inconclusive, RuleRequiredMissing, "not in the report"
	}
	detail := string(c.Status)
	if c.Message != "" {
		detail += ": " + c.Message
	}
	switch c.Status {
	case CheckPassed:
		return Passed, RuleCheckPassed, "passed"
	case CheckFailed:
		return Failed, RuleCheckFailed, detail
	case CheckSkipped:
		return Inconclusive, RuleRequiredSkipped, detail
	}
	return Inconclusive, RuleCheckErrored, detail
}

// readReport finds the report artifact, reads at most the cap from r while
// hashing, parses it, and checks digest and size.
func readReport(ev *Evidence) reportOutcome {
	var out reportOutcome
	out.artifact, out.found = ev.Grader.Artifact(ev.Policy.ReportPath)
	if !out.found {
		return out
	}
	limit := ev.Policy.maxReportBytes()
	if out.artifact.Size > limit {
		out.overCap = fmt.Sprintf("the artifact is %d bytes, the cap %d", out.artifact.Size, limit)
		return out
	}
	if ev.Report == nil {
		out.unavailable = true
		return out
	}
	h := sha256.New()
	cr := &countingHash{r: io.LimitReader(ev.Report, limit+1), h: h}
	out.report, out.parseErr = Parse(ev.Policy.Format, cr, ParseLimits{MaxBytes: limit})
	// Read what the parser left, still within the cap, so that the digest
	// covers every byte given.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		out.mismatch = "reading the report: " + err.Error()
		return out
	}
	switch {
	case cr.n > limit:
		out.overCap = fmt.Sprintf("more than %d bytes were given", limit)
	case cr.n != out.artifact.Size:
		out.mismatch = fmt.Sprintf("%d bytes given, the artifact is %d", cr.n, out.artifact.Size)
	case "sha256:"+hex.EncodeToString(h.Sum(nil)) != out.artifact.Digest:
		out.mismatch = "the bytes given do not hash to " + out.artifact.Digest
	}
	if out.overCap != "" || out.mismatch != "" {
		out.parseErr = nil
		out.report = Report{}
	}
	return out
}

type countingHash struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (c *countingHash) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.h.Write(p[:n])
	return n, err
}
