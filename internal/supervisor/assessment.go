package supervisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/sandboxd/sandboxd/sandbox"
)

// Revision identifies the supervisor's rules and parsers. It is part of
// every assessment and of its retention key: a new revision may judge the
// same evidence again, but one revision never changes a retained verdict.
const Revision = "sandboxd-supervisor/3"

// AssessmentSchema is the schema of the assessments this package writes.
const AssessmentSchema = "sandboxd.assessment/v1"

// Binding names the evidence an assessment was computed from.
type Binding struct {
	BundleDigest       string `json:"bundle_digest"`
	Instance           string `json:"instance,omitempty"` // the bundle's task instance, "" for none
	ImageID            string `json:"image_id"`
	GraderJobDigest    string `json:"grader_job_digest"`
	GraderResultDigest string `json:"grader_result_digest"`
	CandidateJobDigest string `json:"candidate_job_digest"`
	WorkspaceDigest    string `json:"workspace_digest,omitempty"`
}

// Key is the retention key of an assessment: the digest of the bundle,
// grader job, grader result and candidate job digests and the supervisor
// revision. The same key never holds two different assessments. The
// instance is not in it: the bundle digest fixes it, as it fixes the image.
func (b Binding) Key() string {
	canon, err := sandbox.CanonicalJSON(struct {
		Bundle       string `json:"bundle"`
		GraderJob    string `json:"grader_job"`
		GraderResult string `json:"grader_result"`
		CandidateJob string `json:"candidate_job"`
		Revision     string `json:"revision"`
	}{b.BundleDigest, b.GraderJobDigest, b.GraderResultDigest, b.CandidateJobDigest, Revision})
	if err != nil {
		panic(err) // strings only: cannot fail
	}
	return sandbox.DigestBytes(canon)
}

// ReportRef describes the report the checks were read from.
type ReportRef struct {
	Path   string `json:"path"`
	Format Format `json:"format"`
	Digest string `json:"digest,omitempty"`
	Size   int64  `json:"size"`
	// Checks counts the report's checks by status (when it parsed).
	Checks map[CheckStatus]int `json:"checks"`
}

// CheckResult is the verdict on one check, as a signed assessment carries
// it (sandbox.AssessedCheck): the check's name, its status, the deciding
// rule's name, a colon and the detail, and the digests of what the verdict
// rests on (the grader result, the report artifact, control assessments).
type CheckResult = sandbox.AssessedCheck

// Assessment is the supervisor's judgement of one grader run.
type Assessment struct {
	Schema             string    `json:"schema"`
	SupervisorRevision string    `json:"supervisor_revision"`
	Binding            Binding   `json:"binding"`
	Policy             Policy    `json:"policy"`
	Report             ReportRef `json:"report"`
	Verdict            Verdict   `json:"verdict"`
	// Reasons are the evidence rules that fired, as "rule: detail".
	Reasons  []string         `json:"reasons"`
	Checks   []CheckResult    `json:"checks"`
	Controls []ControlOutcome `json:"controls"`
}

// Judge applies the verdict rules to the evidence. It reads ev.Report
// (at most to the policy's cap) and nothing else; it returns an error only
// for input that cannot be bound (a bad policy, malformed digests, a
// candidate result of another job), never for bad evidence, which is an
// inconclusive assessment.
func Judge(ev Evidence) (Assessment, error) {
	if err := ev.Policy.Validate(); err != nil {
		return Assessment{}, err
	}
	if err := ev.Grader.Validate(); err != nil {
		return Assessment{}, fmt.Errorf("grader result: %w", err)
	}
	for _, d := range []struct{ name, v string }{
		{"bundle digest", ev.BundleDigest}, {"image id", ev.ImageID}, {"candidate job digest", ev.CandidateJobDigest},
	} {
		if !sandbox.ValidDigest(d.v) {
			return Assessment{}, fmt.Errorf("%s: %w: malformed digest %q", d.name, sandbox.ErrInvalid, d.v)
		}
	}
	if ev.WorkspaceDigest != "" && !sandbox.ValidDigest(ev.WorkspaceDigest) {
		return Assessment{}, fmt.Errorf("workspace digest: %w: malformed digest %q", sandbox.ErrInvalid, ev.WorkspaceDigest)
	}
	if ev.Instance != "" && !sandbox.ValidInstance(ev.Instance) {
		return Assessment{}, fmt.Errorf("instance: %w: %q is not an instance id", sandbox.ErrInvalid, ev.Instance)
	}
	if ev.ExportRefused != "" && ev.Candidate == nil {
		return Assessment{}, fmt.Errorf("a refused export without a candidate job: %w", sandbox.ErrInvalid)
	}
	if ev.Candidate != nil {
		if err := ev.Candidate.Validate(); err != nil {
			return Assessment{}, fmt.Errorf("candidate result: %w", err)
		}
		if ev.Candidate.JobDigest != ev.CandidateJobDigest {
			return Assessment{}, fmt.Errorf("candidate result is for job %s, not %s: %w", ev.Candidate.JobDigest, ev.CandidateJobDigest, sandbox.ErrInvalid)
		}
	}
	for i, c := range ev.Controls {
		if (c.Kind != ControlKnownGood && c.Kind != ControlKnownBad) ||
			(c.Verdict != Passed && c.Verdict != Failed && c.Verdict != Inconclusive) ||
			!sandbox.ValidDigest(c.BundleDigest) || !sandbox.ValidDigest(c.ImageID) || !sandbox.ValidDigest(c.Assessment) {
			return Assessment{}, fmt.Errorf("control outcome %d: %w: unknown kind or verdict, or a malformed digest", i, sandbox.ErrInvalid)
		}
	}
	resultDigest, err := sandbox.SealedDigest(&ev.Grader)
	if err != nil {
		return Assessment{}, fmt.Errorf("grader result digest: %w", err)
	}

	s := &evalState{ev: &ev, rep: readReport(&ev), counts: map[string]int{}, byName: map[string]Check{}}
	if s.parsed() {
		for _, c := range s.rep.report.Checks {
			s.counts[c.Name]++
			s.byName[c.Name] = c
		}
	}

	a := Assessment{
		Schema:             AssessmentSchema,
		SupervisorRevision: Revision,
		Binding: Binding{
			BundleDigest:       ev.BundleDigest,
			Instance:           ev.Instance,
			ImageID:            ev.ImageID,
			GraderJobDigest:    ev.Grader.JobDigest,
			GraderResultDigest: resultDigest,
			CandidateJobDigest: ev.CandidateJobDigest,
			WorkspaceDigest:    ev.WorkspaceDigest,
		},
		Policy:   normalizedPolicy(ev.Policy),
		Reasons:  []string{},
		Checks:   []CheckResult{},
		Controls: sortedControls(ev.Controls),
	}
	a.Report = ReportRef{Path: ev.Policy.ReportPath, Format: ev.Policy.Format, Checks: map[CheckStatus]int{}}
	if s.rep.found {
		a.Report.Digest, a.Report.Size = s.rep.artifact.Digest, s.rep.artifact.Size
	}
	if s.parsed() {
		for _, c := range s.rep.report.Checks {
			a.Report.Checks[c.Status]++
		}
	}

	evidence := []string{resultDigest}
	if s.rep.found {
		evidence = append(evidence, s.rep.artifact.Digest)
	}
	for _, c := range a.Controls {
		evidence = append(evidence, c.Assessment)
	}
	evidence = sortedNames(evidence)

	for _, r := range evidenceRules {
		if detail, fired := r.fires(s); fired {
			a.Reasons = append(a.Reasons, reason(r.name, detail))
		}
	}

	var names []string
	if ev.Policy.AllReported {
		for n := range s.counts {
			names = append(names, n)
		}
	} else {
		names = append(names, ev.Policy.Required...)
	}
	sort.Strings(names)

	worst := Passed
	// No names without a fired rule cannot happen (report_empty, or a
	// validated Required list); kept so that nothing passes vacuously.
	if len(a.Reasons) > 0 || len(names) == 0 {
		worst = Inconclusive
	}
	fault, detail, candidateFailed := candidateFault(&ev)
	if candidateFailed {
		a.Reasons = append([]string{reason(fault, detail)}, a.Reasons...)
		worst = Failed
	}
	for _, n := range names {
		cr := CheckResult{Name: n, Evidence: evidence}
		if candidateFailed {
			cr.Status, cr.Reason = Failed, a.Reasons[0]
			a.Checks = append(a.Checks, cr)
			continue
		}
		if len(a.Reasons) > 0 {
			cr.Status, cr.Reason = Inconclusive, a.Reasons[0]
		} else {
			c, present := s.byName[n]
			st, rule, detail := checkRule(c, present)
			cr.Status, cr.Reason = st, reason(rule, detail)
		}
		switch {
		case cr.Status == Inconclusive:
			worst = Inconclusive
		case cr.Status == Failed && worst == Passed:
			worst = Failed
		}
		a.Checks = append(a.Checks, cr)
	}
	a.Verdict = worst
	return a, nil
}

func reason(r Rule, detail string) string {
	if detail == "" {
		return string(r)
	}
	return string(r) + ": " + shorten(detail)
}

func normalizedPolicy(p Policy) Policy {
	p.Required = sortedNames(p.Required)
	if len(p.Required) == 0 {
		p.Required = nil
	}
	ks := append([]ControlKind{}, p.Controls...)
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	if len(ks) == 0 {
		ks = nil
	}
	p.Controls = ks
	if p.MaxReportBytes == 0 {
		p.MaxReportBytes = DefaultMaxReportBytes
	}
	return p
}

func sortedControls(cs []ControlOutcome) []ControlOutcome {
	out := append([]ControlOutcome{}, cs...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Assessment < out[j].Assessment
	})
	return out
}

// CanonicalJSON returns the assessment's canonical encoding, the bytes that
// are retained.
func (a *Assessment) CanonicalJSON() ([]byte, error) {
	return sandbox.CanonicalJSON(a)
}

// DecodeAssessment decodes retained assessment bytes, refusing unknown
// fields and schemas.
func DecodeAssessment(data []byte) (Assessment, error) {
	var a Assessment
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return Assessment{}, fmt.Errorf("assessment: %w: %w", sandbox.ErrInvalid, err)
	}
	if a.Schema != AssessmentSchema {
		return Assessment{}, fmt.Errorf("assessment: %w: unknown schema %q", sandbox.ErrInvalid, a.Schema)
	}
	return a, nil
}

// ErrInconclusive is returned for a statement asked of an inconclusive
// assessment: there is none (it matches sandbox.ErrNotFound), because a
// FAILED statement would claim that tests ran and failed, and PASSED would
// be a lie.
var ErrInconclusive = sandbox.NewSentinel("assessment is inconclusive", sandbox.ErrNotFound)
